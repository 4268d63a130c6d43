"""HTTP endpoints as plain functions: request parts in, :class:`Reply` out.

The stream package mounts them on faust's web server (``/metrics``, ``/healthz``,
``/readyz``, ``/labels``); keeping them free of the web framework lets them be tested
directly.

``POST /labels`` needs ``Authorization: Bearer <token>`` (compared in constant time); with
no token configured, posting labels over HTTP is disabled (403). A refused request produces
nothing.
"""

from __future__ import annotations

import hmac
import html
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from service.records import BadMessage, Label, PendingEntry, decode_json, dumps, label_from_dict

__all__ = ["Reply", "health", "labels_get", "labels_post", "metrics", "ready"]

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer: status, content type, body."""

    status: int
    content_type: str
    body: bytes


def _json(status: int, value: Any) -> Reply:
    return Reply(status, JSON, dumps(value))


def metrics(registry: CollectorRegistry) -> Reply:
    """Prometheus text exposition of ``registry``."""
    return Reply(200, CONTENT_TYPE_LATEST, generate_latest(registry))


def health(live: bool, detail: Mapping[str, Any]) -> Reply:
    """Liveness: 200 unless a consumer has stalled (lag and no progress)."""
    return _json(200 if live else 503, {"live": live, **detail})


def ready(is_ready: bool, detail: Mapping[str, Any]) -> Reply:
    """Readiness: 200 once tables are recovered and models are loaded."""
    return _json(200 if is_ready else 503, {"ready": is_ready, **detail})


def labels_get(
    pending: Iterable[PendingEntry], *, now: float, as_html: bool = False, limit: int = 500
) -> Reply:
    """Unanswered, unexpired label requests held by this worker, highest priority first."""
    waiting = [p for p in pending if not p.applied and p.request.expires_at >= now]
    waiting.sort(key=lambda p: (-p.request.priority, p.request.requested_at))
    open_ = [p.to_dict() for p in waiting[:limit]]
    if not as_html:
        return _json(200, {"pending": open_, "count": len(open_)})
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(p.get(k, '')))}</td>"
            for k in ("request_id", "model", "event_id", "decided_label", "score", "priority")
        )
        + f"<td>{html.escape(str(p['features'][:8]))}…</td></tr>"
        for p in open_
    )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>abstain label queue</title>"
        "</head><body><h1>Label queue</h1>"
        f"<p>{len(open_)} pending request(s). Submit with <code>POST /labels</code> "
        '<code>{"request_id": ..., "model": ..., "label": 1 | -1}</code> and a bearer token.'
        "</p><table border='1'><tr><th>request</th><th>model</th><th>event</th>"
        "<th>decided</th><th>score</th><th>priority</th><th>features</th></tr>"
        f"{rows}</table></body></html>"
    )
    return Reply(200, "text/html; charset=utf-8", page.encode())


async def labels_post(
    body: bytes,
    authorization: str | None,
    *,
    token: str | None,
    default_model: str,
    produce: Callable[[Label], Awaitable[None]],
    now: float,
    max_bytes: int = 65_536,
) -> Reply:
    """Check the bearer token, validate the label and hand it to ``produce``."""
    if token is None:
        return _json(403, {"error": "label submission over HTTP is disabled (no token set)"})
    given = ""
    if authorization and authorization.startswith("Bearer "):
        given = authorization[len("Bearer ") :].strip()
    if not hmac.compare_digest(given.encode(), token.encode()):
        return _json(401, {"error": "missing or wrong bearer token"})
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
    await produce(label)
    return _json(202, {"accepted": True, "request_id": label.request_id, "model": label.model})
