"""The desk's view of the label queue: which requests are open, in which order.

Fed by three topics, each from its beginning (:mod:`service.desk.feeds`):

- label-requests: a request the learner would accept (:meth:`DeskQueue.offer`; the caller
  checks it as the learner does) is a candidate;
- the learner's pending changelog: an entry makes its request a candidate too, an entry
  marked ``applied`` closes it (answered), a delete closes it (expired, swept or dropped);
- labels: any label for a request closes it (answered; the learner applies the first).

Open = seen, not closed, not past ``expires_at``. Closed ids are remembered until their
request has expired (then nothing could reopen them), so the three topics may be read in
any interleaving. Order: highest ``priority`` first, then the soonest to expire.

>>> from service.records import LabelRequest
>>> q = DeskQueue(clock=lambda: 0.0)
>>> q.offer(LabelRequest("r1", "e1", "m", [1.0], 0.1, 1.0, 0, 0.5, 3, 0.0, 60.0, 0.2))
True
>>> q.offer(LabelRequest("r2", "e2", "m", [2.0], 0.1, 1.0, 0, 0.5, 3, 0.0, 90.0, 0.9))
True
>>> [r.request_id for r in q.ordered(now=1.0)]
['r2', 'r1']
>>> q.close("r2", "answered", at=2.0); [r.request_id for r in q.ordered(now=3.0)]
['r1']
"""

from __future__ import annotations

import bisect
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

from service.records import Label, LabelRequest, PendingEntry

__all__ = ["Answer", "DeskQueue", "Why"]

Why = Literal["answered", "applied", "removed", "expired"]
_HOUR: Final = 3600.0
_REMEMBER_UNKNOWN: Final = 2 * 86400.0  # a closed id whose request was never seen


@dataclass(frozen=True, slots=True)
class Answer:
    """A label seen on the labels topic."""

    request_id: str
    model: str
    label: int
    by: str
    at: float


class DeskQueue:
    """Open requests in urgency order, and what the team view counts."""

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.requests: dict[str, LabelRequest] = {}  # open candidates
        self._order: list[tuple[float, float, str]] = []  # (-priority, expires_at, id)
        self.closed: dict[str, float] = {}  # id -> forget after
        self.answers: deque[Answer] = deque()  # the last day of labels
        self.expired: deque[tuple[float, str]] = deque()  # (expired at, model), last hour
        self.answered_by: dict[str, str] = {}  # request id -> labelled_by (recent)

    @staticmethod
    def _key(request: LabelRequest) -> tuple[float, float, str]:
        return (-request.priority, request.expires_at, request.request_id)

    def offer(self, request: LabelRequest) -> bool:
        """Make ``request`` a candidate; False if it is known, closed or over."""
        rid = request.request_id
        if rid in self.requests or rid in self.closed:
            return False
        if request.expires_at <= self.clock() - _HOUR:  # long over (recent: counted by sweep)
            self.closed[rid] = request.expires_at
            return False
        self.requests[rid] = request
        bisect.insort(self._order, self._key(request))
        return True

    def on_pending(self, request_id: str, entry: PendingEntry | None) -> None:
        """A pending-changelog record: an entry (open or applied) or a delete."""
        if entry is None:
            request = self.requests.get(request_id)
            over = request is not None and request.expires_at <= self.clock()
            self.close(request_id, "expired" if over else "removed")
        elif entry.applied:
            self.close(request_id, "applied", by=entry.labelled_by)
        else:
            self.offer(entry.request)

    def on_label(self, label: Label, *, at: float) -> None:
        """A label on the labels topic: its request is answered."""
        request = self.requests.get(label.request_id)
        if request is not None and request.model != label.model:
            return  # the learner refuses it: the request stays open
        self.answers.append(Answer(label.request_id, label.model, label.label,
                                   label.labelled_by, label.ts or at))  # fmt: skip
        self.close(label.request_id, "answered", by=label.labelled_by)

    def close(self, request_id: str, why: Why, *, at: float | None = None, by: str = "") -> None:
        """Take ``request_id`` out of the queue (remembered until it would have expired)."""
        now = self.clock() if at is None else at
        request = self.requests.pop(request_id, None)
        if request is not None:
            self._drop(request)
            if why == "expired":
                self.expired.append((request.expires_at, request.model))
        if by:
            self.answered_by[request_id] = by
        forget = request.expires_at if request is not None else now + _REMEMBER_UNKNOWN
        self.closed[request_id] = max(self.closed.get(request_id, 0.0), forget)

    def _drop(self, request: LabelRequest) -> None:
        key = self._key(request)
        i = bisect.bisect_left(self._order, key)
        if i < len(self._order) and self._order[i] == key:
            del self._order[i]

    def is_open(self, request_id: str, *, now: float) -> bool:
        request = self.requests.get(request_id)
        return request is not None and request.expires_at > now

    def ordered(self, *, now: float, min_left: float = 0.0) -> Iterator[LabelRequest]:
        """Open requests, most urgent first, with more than ``min_left`` seconds to go."""
        for _, expires_at, rid in list(self._order):
            request = self.requests.get(rid)
            if request is not None and expires_at - now > min_left:
                yield request

    def sweep(self) -> None:
        """Close what has expired; forget closed ids and statistics that can no longer
        matter (called once a second, once the topics are read up to their end: a label
        read later must not find its request counted as expired)."""
        now = self.clock()
        for rid in [r.request_id for r in self.requests.values() if r.expires_at <= now]:
            self.close(rid, "expired", at=now)
        self.closed = {k: v for k, v in self.closed.items() if v > now - _HOUR}
        while self.answers and self.answers[0].at < now - 24 * _HOUR:
            self.answers.popleft()
        while self.expired and self.expired[0][0] < now - _HOUR:
            self.expired.popleft()
        if len(self.answered_by) > 100_000:
            self.answered_by = {k: v for k, v in self.answered_by.items() if k in self.closed}

    def open_counts(self, *, now: float) -> Counter[str]:
        return Counter(r.model for r in self.requests.values() if r.expires_at > now)

    def oldest_age(self, *, now: float) -> dict[str, float]:
        """Per model, the age of its oldest open request (seconds)."""
        out: dict[str, float] = {}
        for r in self.requests.values():
            if r.expires_at > now:
                out[r.model] = max(out.get(r.model, 0.0), now - r.requested_at)
        return out

    def expired_last_hour(self, *, now: float) -> Counter[str]:
        return Counter(model for at, model in self.expired if now - _HOUR <= at <= now)
