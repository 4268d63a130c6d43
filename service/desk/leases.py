"""Leases: who holds which request, decided by the order of the leases topic.

Every desk replica writes its claims to one topic (one partition, so one order) and folds
every record of it, its own included, through :meth:`LeaseBook.apply`. The fold is the same
on every replica, so all agree on the holder of each request without talking to each other:
a claim wins unless another person's lease on that request is still running at the claim's
time; the first claim in offset order wins a race. A replica that wrote a claim waits until
its follower has folded that offset and reads the outcome (:meth:`LeaseBook.outcome`).

A record takes effect at its time (the Kafka record's timestamp; the desk creates the topic
with ``message.timestamp.type=LogAppendTime``, so it is the broker's clock, not the
writer's) and for at most ``lease_seconds`` from then, whatever its own ``expires_at`` says:
anyone who may write the topic can still claim a request, but never for longer than a
person could, and a record dated in the future holds nothing before its time.

Kinds of record (JSON, key = request id): ``claim`` (take or renew, until ``expires_at``),
``answer`` (the holder is sending a label: ``attempt`` names the try; a second try is
refused while the first runs, which it does for at most ``answer_seconds`` from its record's
time: the two acknowledgements the desk waits for; a try whose replica died, or that nobody
runs, blocks nothing longer), ``release`` (give the request back; with
``attempt``: that try failed, the lease stays) and ``flag`` (the holder, the author of the
request's answer, asks for a review of it: no lease; the desk's book of answers decides,
:meth:`LeaseBook.on_flag`). A second opinion is leased like a request, under the id
:func:`opinion_lease` of its request.

>>> book = LeaseBook(lease_seconds=120.0)
>>> book.apply(0, LeaseRecord("r1", "claim", "ann", at=0.0, expires_at=120.0))
True
>>> book.apply(1, LeaseRecord("r1", "claim", "bob", at=10.0, expires_at=130.0))
False
>>> book.holder("r1", now=50.0).holder, book.holder("r1", now=121.0)
('ann', None)
>>> book.apply(2, LeaseRecord("r2", "claim", "eve", at=0.0, expires_at=1e12))
True
>>> book.holder("r2", now=121.0) is None  # honoured for lease_seconds, not for ever
True

Cost: folding a record, :meth:`LeaseBook.holder`, :meth:`LeaseBook.held_by` and
:meth:`LeaseBook.live` do not walk the leases of the past (kept for hours): running leases
are indexed by holder, and leases are retired from that index, and later forgotten, through
heaps ordered by their end.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from service.desk.auth.accounts import valid_name
from service.records import BadMessage
from service.records.codec import decode_object, dumps, ident, number

__all__ = [
    "ANSWER_SECONDS",
    "Lease",
    "LeaseBook",
    "LeaseLog",
    "LeaseRecord",
    "opinion_lease",
    "parse_lease_record",
]

Kind = Literal["claim", "answer", "release", "flag"]
_KINDS: Final = ("claim", "answer", "release", "flag")
_OUTCOMES_KEPT: Final = 10_000
_OPINION: Final = "#opinion"
#: how long an answer's try blocks another one by default (the desk passes twice its
#: acknowledgement timeout, plus a second each)
ANSWER_SECONDS: Final = 12.0


def opinion_lease(request_id: str) -> str:
    """The lease id of the second opinion on ``request_id`` (a request's own lease ended
    with its answer; its second opinion is held under this one).

    >>> opinion_lease("r1")
    'r1#opinion'
    """
    return request_id + _OPINION


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One record of the leases topic."""

    request_id: str
    kind: Kind
    holder: str
    at: float
    expires_at: float = 0.0
    attempt: str | None = None
    replica: str = ""

    def to_json(self) -> bytes:
        return dumps(dataclasses.asdict(self))


def parse_lease_record(raw: bytes) -> LeaseRecord:
    """Check and decode a leases-topic value (anyone with access could write one): a known
    kind, a request id and an attempt of the desk's shapes, a holder the desk could have
    signed in (a user name), finite times.

    >>> parse_lease_record(b'{"request_id": "r", "kind": "claim", "holder": "<b>", "at": 0}')
    Traceback (most recent call last):
    ...
    service.records.codec.BadMessage: schema: holder '<b>' is not a user name
    """
    record = decode_object(raw, max_bytes=4096)
    kind = record.get("kind")
    if kind not in _KINDS:
        raise BadMessage("schema", f"kind must be one of {_KINDS}, got {kind!r}")
    attempt = record.get("attempt")
    if attempt is not None and (not isinstance(attempt, str) or not 0 < len(attempt) <= 64):
        raise BadMessage("schema", "attempt must be a string of 1..64 characters")
    holder = ident(record, "holder", max_len=64)
    if not valid_name(holder):
        raise BadMessage("schema", f"holder {holder!r} is not a user name")
    replica = record.get("replica", "")
    return LeaseRecord(
        request_id=ident(record, "request_id"),
        kind=kind,
        holder=holder,
        at=number(record, "at"),
        expires_at=number(record, "expires_at", default=0.0),
        attempt=attempt,
        replica=replica if isinstance(replica, str) and len(replica) <= 256 else "",
    )


class LeaseLog(Protocol):
    """The leases topic: write a record, wait until it is folded, say if it took effect."""

    async def publish(self, record: LeaseRecord) -> bool: ...


@dataclass(frozen=True, slots=True)
class Lease:
    """A running lease: ``since`` is when this holder's unbroken hold began (its first
    record's time); ``attempt`` the answer being sent, if any."""

    holder: str
    expires_at: float
    since: float
    attempt: str | None = None
    attempt_at: float = 0.0  # when the answer's try began (its record's time)

    def live(self, now: float, *, slack: float = 0.0) -> bool:
        """Running at ``now``: begun (up to ``slack`` seconds early: a reader's clock may
        be behind the broker's) and not over."""
        return self.since - slack <= now < self.expires_at


@dataclass(frozen=True, slots=True)
class AnswerTiming:
    """How long a holder held a request before answering (for the team view)."""

    holder: str
    at: float
    seconds: float


class LeaseBook:
    """The fold of the leases topic (module docstring). ``lease_seconds`` (the desk's
    setting, the same on every replica) bounds how long one record holds a request.

    ``on_answer`` (optional) is told of every ``answer`` record that took effect (the team
    view joins these timings with the labels topic); ``on_flag`` (optional) of every
    ``flag`` record (request id, holder, time), and says whether it took effect.
    """

    def __init__(self, *, lease_seconds: float, answer_seconds: float = ANSWER_SECONDS) -> None:
        self.lease_seconds = lease_seconds
        self.answer_seconds = answer_seconds
        self.leases: dict[str, Lease] = {}
        self.answers: dict[str, AnswerTiming] = {}
        self.position = 0  # next offset to fold
        self.on_answer: Callable[[str, AnswerTiming], None] | None = None
        self.on_flag: Callable[[str, str, float], bool] | None = None
        self._outcomes: dict[int, bool] = {}
        self._outcome_order: deque[int] = deque()
        self._running: dict[str, set[str]] = {}  # holder -> requests with a running lease
        self._ends: list[tuple[float, str]] = []  # heap: (lease end, request) to retire
        self._over: list[tuple[float, str]] = []  # heap: (lease end, request) to forget
        self._answer_ats: list[tuple[float, str]] = []  # heap: (answer at, request)

    def apply(self, offset: int, record: LeaseRecord | None, *, at: float | None = None) -> bool:
        """Fold the record at ``offset`` (None: unreadable, skipped); True if it took effect.
        ``at`` is the record's time (its Kafka timestamp, seconds); without one, the time
        the record states. An offset already folded is not folded again (a reader that
        re-reads changes nothing).
        """
        if offset < self.position:
            return bool(self._outcomes.get(offset))
        accepted = False
        if record is not None:
            accepted = self._fold(record, record.at if at is None else at)
        self.position = max(self.position, offset + 1)
        self._outcomes[offset] = accepted
        self._outcome_order.append(offset)
        while len(self._outcome_order) > _OUTCOMES_KEPT:
            self._outcomes.pop(self._outcome_order.popleft(), None)
        return accepted

    def outcome(self, offset: int) -> bool | None:
        """Whether the record at ``offset`` took effect (None: not folded yet, or forgotten)."""
        return self._outcomes.get(offset)

    def _fold(self, r: LeaseRecord, t: float) -> bool:
        """Fold ``r``, whose time is ``t``."""
        if r.kind == "flag":  # no lease: the book of answers decides
            return self.on_flag is not None and self.on_flag(r.request_id, r.holder, t)
        current = self.leases.get(r.request_id)
        live = current if current is not None and current.live(t) else None
        mine = live is not None and live.holder == r.holder
        if r.kind == "release":
            if not mine or live is None:
                return False
            if r.attempt is None:
                del self.leases[r.request_id]
                self._unindex(r.request_id, live.holder)
            elif live.attempt == r.attempt:
                self.leases[r.request_id] = dataclasses.replace(live, attempt=None)
            else:
                return False
            return True
        if live is not None and not mine:
            return False  # someone else's lease runs: the first claim holds
        since = live.since if live is not None else t
        attempt = live.attempt if live is not None else None
        attempt_at = live.attempt_at if live is not None else t
        timing = None
        if r.kind == "answer":
            if (
                attempt is not None
                and attempt != r.attempt
                and t < attempt_at + self.answer_seconds
            ):
                return False  # another try of this answer runs (a second tab, a double click)
            if attempt != r.attempt:
                attempt_at = t
            attempt = r.attempt
            timing = AnswerTiming(r.holder, t, max(0.0, t - since))
            self.answers[r.request_id] = timing
            heapq.heappush(self._answer_ats, (t, r.request_id))
        # never longer than a person's claim from this record's time, whatever it says
        until = min(r.expires_at, t + self.lease_seconds)
        expires = max(until, live.expires_at if live is not None else until)
        if current is not None and current.holder != r.holder:
            self._unindex(r.request_id, current.holder)
        self.leases[r.request_id] = Lease(r.holder, expires, since, attempt, attempt_at)
        self._running.setdefault(r.holder, set()).add(r.request_id)
        heapq.heappush(self._ends, (expires, r.request_id))
        if timing is not None and self.on_answer is not None:
            self.on_answer(r.request_id, timing)
        return True

    def _unindex(self, request_id: str, holder: str) -> None:
        held = self._running.get(holder)
        if held is not None:
            held.discard(request_id)
            if not held:
                del self._running[holder]

    def _retire(self, now: float) -> None:
        """Take leases over at ``now`` out of the running index (amortised: each lease end
        is popped once)."""
        while self._ends and self._ends[0][0] <= now:
            end, rid = heapq.heappop(self._ends)
            lease = self.leases.get(rid)
            if lease is not None and lease.expires_at == end:
                self._unindex(rid, lease.holder)
                heapq.heappush(self._over, (end, rid))

    def _running_at(self, lease: Lease, now: float) -> bool:
        """A lease running at the reader's ``now`` (its clock may lag the broker's that
        dated the record by up to ``lease_seconds``)."""
        return lease.live(now, slack=self.lease_seconds)

    def holder(self, request_id: str, *, now: float) -> Lease | None:
        """The running lease on ``request_id``, if any."""
        lease = self.leases.get(request_id)
        return lease if lease is not None and self._running_at(lease, now) else None

    def live(self, now: float) -> list[tuple[str, Lease]]:
        """Every running lease (request id, lease): as many as requests held right now."""
        self._retire(now)
        out = []
        for held in self._running.values():
            for rid in held:
                lease = self.leases.get(rid)
                if lease is not None and self._running_at(lease, now):
                    out.append((rid, lease))
        return out

    def held_by(self, holder: str, *, now: float) -> list[str]:
        """Requests ``holder`` has a running lease on, the longest held first."""
        self._retire(now)
        mine = []
        for rid in self._running.get(holder, ()):
            lease = self.leases.get(rid)
            if lease is not None and self._running_at(lease, now):
                mine.append((lease.since, rid))
        return [rid for _, rid in sorted(mine)]

    def forget(self, now: float, *, keep: float) -> None:
        """Drop leases over for more than ``keep`` seconds and answer timings older than it."""
        self._retire(now)
        while self._over and self._over[0][0] <= now - keep:
            end, rid = heapq.heappop(self._over)
            lease = self.leases.get(rid)
            if lease is not None and lease.expires_at == end:
                del self.leases[rid]
        while self._answer_ats and self._answer_ats[0][0] <= now - keep:
            at, rid = heapq.heappop(self._answer_ats)
            timing = self.answers.get(rid)
            if timing is not None and timing.at == at:
                del self.answers[rid]

    def active(self, now: float) -> int:
        return len(self.live(now))

    def snapshot(self) -> dict[str, Any]:
        """Counts, for logs and tests."""
        return {"leases": len(self.leases), "position": self.position}
