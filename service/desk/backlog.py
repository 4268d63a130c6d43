"""The desk's view of the label queue: which requests are open, in which order.

Fed by three topics, each from its beginning (:mod:`service.desk.feeds`), every record
checked first as the learner checks it (:class:`service.records.admission.Admission`), so
the desk offers what the learner would apply an answer to:

- label-requests: a request the learner takes is a candidate (:meth:`DeskQueue.offer`):
  the learner holds a request only once it read it there;
- the learner's pending changelog: an entry marked ``applied`` closes its request
  (answered), a delete closes it (expired, swept or dropped); an entry alone opens nothing
  (the learner wrote none for a request it did not read);
- labels: a label for a request closes it (answered; the learner applies the first), unless
  it names another model than the request (the learner refuses that one).

Open = seen, not closed, not past ``expires_at``. Closed ids are remembered until their
request has expired (then nothing could reopen them), so the three topics may be read in
any interleaving. Order: highest ``priority`` first, then the soonest to expire.

Charts (:mod:`service.desk.charts`): per model, the queue depth (a request counts from its
``requested_at`` until the time of the record that closed it, or its expiry) and the answers
(at the label's time) over the last hours: the records' times, so a restart draws the same.

Cost: nothing here walks every open request. The order is kept sorted per model (taking
the most urgent reads from the front); the team view's counts (open, oldest, expired and
answers in the last hour / day, claim-to-answer medians) are kept as records arrive, and
what runs out (expiries, closed ids, the hour and the day) leaves through heaps ordered by
time, each entry popped once.

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
import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable, Collection, Hashable, Iterator
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

from service.desk.charts import Timeline
from service.desk.leases import AnswerTiming
from service.records import Label, LabelRequest, PendingEntry

__all__ = ["Answer", "AnswerCounts", "DeskQueue", "Why"]

Why = Literal["answered", "applied", "removed", "expired"]
_HOUR: Final = 3600.0
_DAY: Final = 24 * _HOUR
_REMEMBER_UNKNOWN: Final = 2 * 86400.0  # a closed id whose request was never seen

Key = tuple[float, float, str]  # (-priority, expires_at, id): most urgent first
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Answer:
    """A label seen on the labels topic."""

    request_id: str
    model: str
    label: int
    by: str
    at: float


@dataclass(frozen=True, slots=True)
class AnswerCounts:
    """Answers in the last hour / day (labels topic) and claim-to-answer medians."""

    hour_by_model: Counter[str]
    hour_by_person: Counter[str]
    day_by_person: Counter[str]
    median_seconds: dict[str, float]  # person -> median claim-to-answer time (last day)
    hour_total: int


class _Window(Generic[K]):
    """How many times each key was seen in the last ``span`` seconds (by the time given
    with it). Adding and pruning are O(log n); each entry is pruned once."""

    def __init__(self, span: float) -> None:
        self.span = span
        self.counts: Counter[K] = Counter()
        self._heap: list[tuple[float, int, K]] = []
        self._seq = itertools.count()

    def add(self, at: float, key: K, *, now: float) -> bool:
        if at <= now - self.span:
            return False
        heapq.heappush(self._heap, (at, next(self._seq), key))
        self.counts[key] += 1
        return True

    def prune(self, now: float) -> Iterator[K]:
        """Drop what is older than the span; yields the keys dropped."""
        while self._heap and self._heap[0][0] <= now - self.span:
            _, _, key = heapq.heappop(self._heap)
            self.counts[key] -= 1
            if self.counts[key] <= 0:
                del self.counts[key]
            yield key


class DeskQueue:
    """Open requests in urgency order, and what the team view counts."""

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.requests: dict[str, LabelRequest] = {}  # open candidates
        self._order: dict[str, list[Key]] = {}  # per model, sorted: the most urgent first
        self._expiry: list[tuple[float, str]] = []  # heap: (expires_at, id) of requests
        self._oldest: dict[str, list[tuple[float, str]]] = {}  # per model heap (requested_at, id)
        self.closed: dict[str, float] = {}  # id -> forget after
        self._forget: list[tuple[float, str]] = []  # heap: (forget after, id) of closed ids
        self.answered_by: dict[str, str] = {}  # request id -> labelled_by (while closed)
        self.answered: set[str] = set()  # ids closed by a label or the applied mark
        # request id -> the models named by the labels that closed it before it was seen:
        # a request of another model is not closed by them (the learner refuses those)
        self._labelled_as: dict[str, set[str]] = {}
        self._expired: _Window[str] = _Window(_HOUR)  # model, by expires_at
        self._hour_models: _Window[str] = _Window(_HOUR)  # model, by the label's time
        self._hour_people: _Window[str] = _Window(_HOUR)  # person
        self._day_people: _Window[str] = _Window(_DAY)  # person
        self._day_times: _Window[tuple[str, float]] = _Window(_DAY)  # (person, seconds)
        self._times: dict[str, list[float]] = {}  # person -> sorted seconds (last day)
        # the labels topic and the leases topic are read in any interleaving: a label and
        # its claim-to-answer time wait (a day at most) for each other
        self._untimed: dict[str, tuple[str, float]] = {}  # id -> (by, at) of a label
        self._unlabelled: dict[str, AnswerTiming] = {}  # id -> timing of an answer record
        self._waiting: deque[tuple[float, str]] = deque()  # (arrived, id) of both
        self.depth: dict[str, Timeline] = {}  # model -> open requests over time
        self.answers: dict[str, Timeline] = {}  # model -> answers over time
        # told of a request closed as answered (the review's book keeps it for its label)
        self.on_answered: Callable[[LabelRequest], None] | None = None

    @staticmethod
    def _key(request: LabelRequest) -> Key:
        return (-request.priority, request.expires_at, request.request_id)

    def offer(self, request: LabelRequest) -> bool:
        """Make ``request`` a candidate; False if it is known, closed or over."""
        rid = request.request_id
        if rid in self.requests:
            return False
        if rid in self.closed:
            if request.model in self._labelled_as.get(rid, {request.model}):
                return False
            del self.closed[rid]  # closed by labels the learner refuses: still open
            self._labelled_as.pop(rid, None)
            self.answered_by.pop(rid, None)
            self.answered.discard(rid)
        if self.long_over(request):  # (recent: counted as expired by the sweep)
            self._remember_closed(rid, request.expires_at)
            return False
        self.requests[rid] = request
        self.depth.setdefault(request.model, Timeline()).add(request.requested_at, 1)
        bisect.insort(self._order.setdefault(request.model, []), self._key(request))
        heapq.heappush(self._expiry, (request.expires_at, rid))
        heapq.heappush(self._oldest.setdefault(request.model, []), (request.requested_at, rid))
        return True

    def long_over(self, request: LabelRequest) -> bool:
        """``request`` expired more than an hour ago: it is not even counted as expired."""
        return request.expires_at <= self.clock() - _HOUR

    def on_pending(
        self, request_id: str, entry: PendingEntry | None, *, at: float | None = None
    ) -> None:
        """A pending-changelog record (written at ``at``): an entry (applied: closes; open:
        nothing to do, the request came from the label-requests topic) or a delete
        (closes)."""
        if entry is None:
            request = self.requests.get(request_id)
            over = request is not None and request.expires_at <= self.clock()
            self.close(request_id, "expired" if over else "removed", when=at)
        elif entry.applied:
            self.close(request_id, "applied", by=entry.labelled_by, when=entry.applied_at or at)

    def on_label(self, label: Label, *, at: float) -> None:
        """A label on the labels topic: its request is answered."""
        request = self.requests.get(label.request_id)
        if request is not None and request.model != label.model:
            return  # the learner refuses it: the request stays open
        answer = Answer(
            label.request_id, label.model, label.label, label.labelled_by, label.ts or at
        )
        self._count(answer)
        rid = label.request_id
        if request is None and (rid not in self.closed or rid in self._labelled_as):
            self._labelled_as.setdefault(rid, set()).add(label.model)
        self.close(label.request_id, "answered", by=label.labelled_by, when=answer.at)

    def _count(self, a: Answer) -> None:
        now = self.clock()
        self.answers.setdefault(a.model, Timeline()).add(a.at, 1)
        self._hour_models.add(a.at, a.model, now=now)
        if not a.by:
            return
        self._hour_people.add(a.at, a.by, now=now)
        if not self._day_people.add(a.at, a.by, now=now):
            return
        timing = self._unlabelled.get(a.request_id)
        if timing is not None and timing.holder == a.by:
            del self._unlabelled[a.request_id]
            self._timed(a.by, a.at, timing.seconds, now=now)
        elif a.request_id not in self._untimed:
            self._untimed[a.request_id] = (a.by, a.at)
            self._waiting.append((now, a.request_id))

    def on_timing(self, request_id: str, timing: AnswerTiming) -> None:
        """An ``answer`` record folded on the leases topic: how long its holder held the
        request before answering (joined with the label, whichever is read first)."""
        label = self._untimed.get(request_id)
        if label is not None and label[0] == timing.holder:
            del self._untimed[request_id]
            self._timed(label[0], label[1], timing.seconds, now=self.clock())
        else:
            if request_id not in self._unlabelled:
                self._waiting.append((self.clock(), request_id))
            self._unlabelled[request_id] = timing

    def _timed(self, person: str, at: float, seconds: float, *, now: float) -> None:
        if self._day_times.add(at, (person, seconds), now=now):
            bisect.insort(self._times.setdefault(person, []), seconds)

    def close(
        self,
        request_id: str,
        why: Why,
        *,
        at: float | None = None,
        by: str = "",
        when: float | None = None,
    ) -> None:
        """Take ``request_id`` out of the queue (remembered until it would have expired);
        ``when``: the time of the record that closed it (its expiry, if it expired)."""
        now = self.clock() if at is None else at
        if why != "answered":  # closed for good, whatever model a label named
            self._labelled_as.pop(request_id, None)
        request = self.requests.pop(request_id, None)
        if request is not None:
            self._drop(request)
            closed_at = request.expires_at if why == "expired" else when or now
            self.depth[request.model].add(min(closed_at, request.expires_at), -1)
            if why == "expired":
                self._expired.add(request.expires_at, request.model, now=now)
            elif why in ("answered", "applied") and self.on_answered is not None:
                self.on_answered(request)
        if by:
            self.answered_by[request_id] = by
        if why in ("answered", "applied"):
            self.answered.add(request_id)
        forget = request.expires_at if request is not None else now + _REMEMBER_UNKNOWN
        self._remember_closed(request_id, max(self.closed.get(request_id, 0.0), forget))

    def _remember_closed(self, request_id: str, until: float) -> None:
        if self.closed.get(request_id) != until:
            self.closed[request_id] = until
            heapq.heappush(self._forget, (until, request_id))

    def _drop(self, request: LabelRequest) -> None:
        order = self._order.get(request.model, [])
        key = self._key(request)
        i = bisect.bisect_left(order, key)
        if i < len(order) and order[i] == key:
            del order[i]

    def is_open(self, request_id: str, *, now: float) -> bool:
        request = self.requests.get(request_id)
        return request is not None and request.expires_at > now

    def ordered(
        self, *, now: float, min_left: float = 0.0, models: Collection[str] | None = None
    ) -> Iterator[LabelRequest]:
        """Open requests (of ``models``, default all), most urgent first, with more than
        ``min_left`` seconds to go. Lazy: take what you need without awaiting in between
        (the order may change while the desk awaits)."""
        chosen = self._order if models is None else {m: self._order.get(m, []) for m in models}
        lists = [order for order in chosen.values() if order]
        keys = lists[0] if len(lists) == 1 else heapq.merge(*lists)
        for _, expires_at, rid in keys:
            request = self.requests.get(rid)
            if request is not None and expires_at - now > min_left:
                yield request

    def sweep(self) -> None:
        """Close what has expired; forget closed ids and statistics that can no longer
        matter (called once a second, once the topics are read up to their end: a label
        read later must not find its request counted as expired)."""
        now = self.clock()
        while self._expiry and self._expiry[0][0] <= now:
            expires_at, rid = heapq.heappop(self._expiry)
            request = self.requests.get(rid)
            if request is not None and request.expires_at == expires_at:
                self.close(rid, "expired", at=now)
        while self._forget and self._forget[0][0] <= now - _HOUR:
            until, rid = heapq.heappop(self._forget)
            if self.closed.get(rid) == until:
                del self.closed[rid]
                self.answered_by.pop(rid, None)
                self.answered.discard(rid)
                self._labelled_as.pop(rid, None)
        self._prune(now)

    def _prune(self, now: float) -> None:
        for window in (self._expired, self._hour_models, self._hour_people, self._day_people):
            for _ in window.prune(now):
                pass
        for person, seconds in self._day_times.prune(now):
            times = self._times[person]
            del times[bisect.bisect_left(times, seconds)]
            if not times:
                del self._times[person]
        while self._waiting and self._waiting[0][0] <= now - _DAY:
            _, rid = self._waiting.popleft()
            self._untimed.pop(rid, None)
            self._unlabelled.pop(rid, None)

    def open_counts(self, *, now: float) -> Counter[str]:
        """Open requests per model (as of the last :meth:`sweep`)."""
        return Counter({m: len(order) for m, order in self._order.items() if order})

    def oldest_age(self, *, now: float) -> dict[str, float]:
        """Per model, the age of its oldest open request (seconds)."""
        out: dict[str, float] = {}
        for model, heap in self._oldest.items():
            while heap and not self._open_since(heap[0]):
                heapq.heappop(heap)
            if heap:
                out[model] = max(0.0, now - heap[0][0])
        return out

    def _open_since(self, entry: tuple[float, str]) -> bool:
        request = self.requests.get(entry[1])
        return request is not None and request.requested_at == entry[0]

    def expired_last_hour(self, *, now: float) -> Counter[str]:
        self._prune(now)
        return Counter(self._expired.counts)

    def charts(self, model: str, *, now: float) -> tuple[list[float], list[float]]:
        """``model``'s open requests at the end of each bucket of the last hours, and its
        answers in each (:mod:`service.desk.charts`)."""
        depth, answers = self.depth.get(model), self.answers.get(model)
        empty = Timeline().counts(now)
        return (
            empty if depth is None else depth.levels(now),
            empty if answers is None else answers.counts(now),
        )

    def answer_counts(self, *, now: float) -> AnswerCounts:
        """Answers in the last hour per model and person, in the last day per person, and
        each person's median claim-to-answer time over the last day."""
        self._prune(now)
        medians = {person: _median(times) for person, times in self._times.items()}
        hour_models = Counter(self._hour_models.counts)
        return AnswerCounts(
            hour_by_model=hour_models,
            hour_by_person=Counter(self._hour_people.counts),
            day_by_person=Counter(self._day_people.counts),
            median_seconds=medians,
            hour_total=sum(hour_models.values()),
        )


def _median(ordered: list[float]) -> float:
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
