"""HTTP endpoints as plain functions: request parts in, :class:`Reply` out.

The stream package mounts them on faust's web server (``/metrics``, ``/healthz``,
``/readyz``, ``/labels``); keeping them free of the web framework lets them be tested
directly.

``/labels`` holds personal data (the feature vectors of the events asked about): reading the
queue (``GET``) and answering it (``POST``) both need ``Authorization: Bearer <token>``,
compared in constant time. No or a wrong token: 401; no token configured: 403 (the label
API is off). A refused request reads and produces nothing.

``GET /labels?limit=N&cursor=C`` answers one page of the queue, highest priority first,
then the oldest: ``limit`` 1..500 (default 50; more is cut to 500), and the page's ``next``
cursor (null on the last page) continues after its last request, however the queue changed
in between. The page is taken from the store's in-memory queue and only its entries are
decoded, a slice of 50 at a time; a :class:`Pacer` spaces the renders out so that hammering
clients cannot take the event loop that scores events (429 and ``Retry-After`` when the wait
would be too long).

``POST /labels`` answers 202 only once Kafka has acknowledged the label (the producer waits
for every in-sync replica, ``acks=all``): the label is durable. If no acknowledgement comes
within the timeout, 503 ``{"error": "... not saved, try again"}``. Retrying is safe: the
record may still reach Kafka from the producer's buffer, and a second answer to a request
the learner has already applied is dead-lettered as ``already_applied``, never applied twice.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import html
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from service.errors import AbstainError
from service.records import BadMessage, Label, PendingEntry
from service.records.codec import decode_json, dumps
from service.records.wire import label_from_dict

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "LabelQueue",
    "Pacer",
    "QueueKey",
    "Reply",
    "authorize",
    "decode_cursor",
    "encode_cursor",
    "health",
    "labels_get",
    "labels_post",
    "metrics",
    "models",
    "ready",
]

JSON = "application/json"
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
#: a request's place in the label queue: (-priority, requested_at, request_id)
QueueKey = tuple[float, float, str]
_SLICES = 2 * MAX_LIMIT // DEFAULT_LIMIT  # a page's reads, expired stretches included
_NO_STORE = (("Cache-Control", "no-store"),)  # the label queue is personal data
_HTML_COLUMNS = ("request_id", "model", "event_id", "decided_label", "score", "priority")


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer: status, content type, body and extra headers."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class LabelQueue(Protocol):
    """The open label requests in queue order (``service.stream.labels.state.PendingStore``)."""

    def page(
        self, *, after: QueueKey | None, limit: int, now: float
    ) -> tuple[list[PendingEntry], QueueKey | None]: ...


def _json(status: int, value: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, JSON, dumps(value), headers)


def metrics(registry: CollectorRegistry) -> Reply:
    """Prometheus text exposition of ``registry``."""
    return Reply(200, CONTENT_TYPE_LATEST, generate_latest(registry))


def health(live: bool, detail: Mapping[str, Any]) -> Reply:
    """Liveness: 200 unless a consumer has stalled (lag and no progress)."""
    return _json(200 if live else 503, {"live": live, **detail})


def ready(is_ready: bool, detail: Mapping[str, Any]) -> Reply:
    """Readiness: 200 once tables are recovered and models are loaded (and while no partition
    stands at a batch that cannot be read)."""
    return _json(200 if is_ready else 503, {"ready": is_ready, **detail})


def models(rows: Sequence[Mapping[str, Any]]) -> Reply:
    """``GET /models``: the live comparison of every group's models (no token: it shows what
    ``/metrics`` already does, no event and no feature)."""
    return _json(200, {"models": list(rows)})


def authorize(authorization: str | None, token: str | None, *, what: str) -> Reply | None:
    """None when ``authorization`` is ``Bearer <token>`` (compared in constant time), else
    the refusal: 403 when no token is configured (``what`` over HTTP is off), 401 otherwise.

    >>> authorize("Bearer a-token-of-16-chars", "a-token-of-16-chars", what="x") is None
    True
    >>> authorize("Bearer wrong", "a-token-of-16-chars", what="x").status
    401
    >>> authorize("Bearer anything", None, what="x").status
    403
    """
    if token is None:
        return _json(403, {"error": f"{what} over HTTP is disabled (no token set)"})
    given = ""
    if authorization and authorization.startswith("Bearer "):
        given = authorization[len("Bearer ") :].strip()
    if not hmac.compare_digest(given.encode(), token.encode()):
        return _json(
            401, {"error": "missing or wrong bearer token"}, (("WWW-Authenticate", "Bearer"),)
        )
    return None


# --------------------------------------------------------------------------- GET /labels


def encode_cursor(key: QueueKey) -> str:
    """An opaque, URL-safe cursor for a queue place.

    >>> decode_cursor(encode_cursor((-0.5, 12.0, "r1")))
    (-0.5, 12.0, 'r1')
    """
    return base64.urlsafe_b64encode(dumps(list(key))).decode().rstrip("=")


def decode_cursor(cursor: str) -> QueueKey:
    """The queue place of a cursor made by :func:`encode_cursor`; ValueError otherwise."""
    if len(cursor) > 1024:
        raise ValueError("cursor too long")
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
        value = decode_json(raw, max_bytes=1024)
    except (binascii.Error, BadMessage) as exc:
        raise ValueError("cursor is not one this server made") from exc
    if not (
        isinstance(value, list)
        and len(value) == 3
        and isinstance(value[2], str)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value[:2])
    ):
        raise ValueError("cursor is not one this server made")
    return (float(value[0]), float(value[1]), value[2])


def _page_request(query: Mapping[str, str]) -> tuple[int, QueueKey | None]:
    """``limit`` (1.., cut to MAX_LIMIT) and the cursor's place; ValueError if malformed."""
    digits = (query.get("limit", "").strip() or str(DEFAULT_LIMIT)).lstrip("0")
    if not (digits.isascii() and digits.isdigit()):  # also refuses 0 (stripped to "")
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    limit = MAX_LIMIT if len(digits) > 4 else min(int(digits), MAX_LIMIT)
    cursor = query.get("cursor", "")
    return limit, decode_cursor(cursor) if cursor else None


class Pacer:
    """Spaces out the renders of an expensive page: each takes ``interval`` seconds (times
    its cost) of a shared schedule; a caller waits for its slot, or is refused (False) when
    the slot is more than ``max_wait`` seconds away.

    The renders run one after the other on the event loop, at most ``1 / interval`` (of unit
    cost) per second, so the loop spends a bounded share on them however many clients ask:
    20 clients in a tight loop each get a page every ``20 * interval`` seconds, and one more
    than ``max_wait / interval`` waiting is told to come back later.

    >>> pacer = Pacer(interval=0.05, max_wait=0.1, clock=lambda: 0.0)
    >>> [pacer.reserve(1.0) for _ in range(4)]
    [0.0, 0.05, 0.1, None]
    """

    def __init__(
        self,
        *,
        interval: float = 0.05,
        max_wait: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if interval <= 0 or max_wait < 0:
            raise ValueError(f"need interval > 0 and max_wait >= 0, got {interval}, {max_wait}")
        self.interval = interval
        self.max_wait = max_wait
        self.clock = clock
        self.sleep = sleep
        self._next = float("-inf")  # when the next slot is free

    def reserve(self, cost: float = 1.0) -> float | None:
        """Book the next slot: seconds to wait for it, or None (refused, nothing booked)."""
        now = self.clock()
        start = max(now, self._next)
        if start - now > self.max_wait:
            return None
        self._next = start + self.interval * max(cost, 1.0)
        return start - now

    async def slot(self, cost: float = 1.0) -> bool:
        """Wait for a slot of ``cost`` units; False (at once) when it is too far away."""
        wait = self.reserve(cost)
        if wait is None:
            return False
        if wait > 0:
            await self.sleep(wait)
        return True


async def labels_get(
    query: Mapping[str, str],
    authorization: str | None,
    *,
    token: str | None,
    queue: LabelQueue,
    clock: Callable[[], float],
    pacer: Pacer | None = None,
    as_html: bool = False,
) -> Reply:
    """One page of the open label requests held by this worker (see the module docstring):
    ``{"pending": [...], "count": n, "limit": l, "next": cursor | null}``, or an HTML table.
    """
    refused = authorize(authorization, token, what="reading label requests")
    if refused is not None:
        return refused
    try:
        limit, after = _page_request(query)
    except ValueError as bad:
        return _json(400, {"error": str(bad)})
    if pacer is not None and not await pacer.slot(limit / DEFAULT_LIMIT):
        return _json(
            429,
            {"error": "too many label-queue requests, try again in a second"},
            (("Retry-After", "1"),),
        )
    rows, nxt = await _read_page(queue, after, limit, clock)
    cursor = None if nxt is None else encode_cursor(nxt)
    if not as_html:
        body = {"pending": rows, "count": len(rows), "limit": limit, "next": cursor}
        return _json(200, body, _NO_STORE)
    return Reply(200, "text/html; charset=utf-8", _queue_html(rows, limit, cursor), _NO_STORE)


async def _read_page(
    queue: LabelQueue, after: QueueKey | None, limit: int, clock: Callable[[], float]
) -> tuple[list[dict[str, Any]], QueueKey | None]:
    """The page, read in slices of at most :data:`DEFAULT_LIMIT` requests with the event loop
    let go between them (decoding a slice takes about a millisecond), so that a page of 500
    never holds the loop for long; at most :data:`_SLICES` slices (a short page then)."""
    rows: list[dict[str, Any]] = []
    for _ in range(_SLICES):
        want = min(DEFAULT_LIMIT, limit - len(rows))
        entries, after = queue.page(after=after, limit=want, now=clock())
        rows += [p.to_dict() for p in entries]
        if after is None or len(rows) >= limit:
            break
        await asyncio.sleep(0)
    return rows, after


def _queue_html(rows: Sequence[Mapping[str, Any]], limit: int, cursor: str | None) -> bytes:
    cells = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(str(p.get(k, '')))}</td>" for k in _HTML_COLUMNS)
        + f"<td>{html.escape(str(p['features'][:8]))}…</td></tr>"
        for p in rows
    )
    link = f"?limit={limit}&amp;cursor={html.escape(cursor or '')}"
    more = "" if cursor is None else f"<p><a href='{link}'>next page</a></p>"
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>abstain label queue</title>"
        "</head><body><h1>Label queue</h1>"
        f"<p>{len(rows)} pending request(s) on this page. Submit with <code>POST /labels</code> "
        '<code>{"request_id": ..., "model": ..., "label": 1 | -1}</code> and a bearer token.'
        "</p><table border='1'><tr><th>request</th><th>model</th><th>event</th>"
        "<th>decided</th><th>score</th><th>priority</th><th>features</th></tr>"
        f"{cells}</table>{more}</body></html>"
    )
    return page.encode()


# --------------------------------------------------------------------------- POST /labels


async def labels_post(
    body: bytes,
    authorization: str | None,
    *,
    token: str | None,
    default_model: str,
    produce: Callable[[Label], Awaitable[None]],
    now: float,
    ack_timeout: float = 5.0,
    max_bytes: int = 65_536,
) -> Reply:
    """Check the bearer token, validate the label, hand it to ``produce`` and answer 202
    once ``produce`` returns (Kafka acknowledged it); 503 if it takes longer than
    ``ack_timeout`` seconds or fails with an :class:`~service.errors.AbstainError`."""
    refused = authorize(authorization, token, what="label submission")
    if refused is not None:
        return refused
    try:
        obj = decode_json(body, max_bytes=max_bytes)
        if not isinstance(obj, dict):
            raise BadMessage("schema", "expected a JSON object")
        obj.setdefault("model", default_model)
        obj.setdefault("labelled_by", "http")
        obj.setdefault("ts", now)
        label = label_from_dict(obj)
    except BadMessage as bad:
        return _json(400, {"error": str(bad), "reason": bad.reason})
    try:
        await asyncio.wait_for(produce(label), ack_timeout)
    except (TimeoutError, AbstainError) as exc:
        why = (
            f"Kafka did not acknowledge the label within {ack_timeout:g} s"
            if isinstance(exc, TimeoutError)
            else "Kafka did not take the label"
        )
        return _json(
            503,
            {
                "error": f"{why}: not saved, try again",
                "request_id": label.request_id,
                "model": label.model,
            },
            (("Retry-After", "1"),),
        )
    return _json(202, {"accepted": True, "request_id": label.request_id, "model": label.model})
