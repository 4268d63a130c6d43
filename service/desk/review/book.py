"""The desk's book of recent answers: every label read on the labels topic (the first per
request: the one the learner applies) and what happened to it since, folded from the
corrections and second opinions on the labels topic and the requests for review on the
leases topic. Pure: the clock is given, Kafka is the caller's (:mod:`service.desk.feeds`).

Every replica folds the same records in the same order per partition (a correction or an
opinion is keyed like its label, so it comes after it), so every replica, and a desk
restarted on the same topics, holds the same book. A request for review (on the leases
topic, another order) read before its label waits for it. A record that breaks the rules
(:mod:`.rules`) is refused with the reason the desk would give a person, and changes nothing.

What it keeps up to date as records arrive, never by walking the answers:

- the **second-opinion queue**: per model and author, the answers chosen for a second
  opinion (:func:`service.stream.labels.review.second_opinion`) that have none yet, stand,
  and were given less than ``within_seconds`` ago, oldest first;
- the **review queue**: per model, the answers a second opinion disagreed with or whose
  author asked for a review, that no reviewer decided yet;
- the **tallies**: per person, answers, second opinions given, answers checked by a second
  opinion and agreed, answers reviewed and confirmed; per model, labels and labels later
  corrected (withdrawn or changed). An answer leaves the book (and the tallies) after
  ``horizon`` seconds (two days, the leases topic's retention).

Answers a model can no longer correct leave the queues from their front (oldest first),
at :meth:`ReviewBook.tick`, through the ``reachable`` check it is given. How long an answer
still has before that (what the desk offers only with time to spare) comes from how many of
the model's labels came after it (:meth:`ReviewBook.labels_after`) and how fast they come
(:meth:`ReviewBook.label_rate`).

>>> from service.config import load_settings
>>> from service.records import Correction, Label, LabelRequest
>>> book = ReviewBook(load_settings(), clock=lambda: 100.0)
>>> req = LabelRequest("r1", "e1", "default", [0.0], 0.1, 1.0, 0, 0.01, 0, 0.0, 600.0, 0.5)
>>> book.on_label(Label("r1", "default", 1, "ann", 50.0), partition=0, offset=3, at=50.0,
...               request=req)
True
>>> book.items["r1"].ask, [i.request_id for i in book.opinion_queue("default")]
('weight', ['r1'])
>>> book.on_correction(Correction("r1", "default", None, "ann", "author", 60.0), at=60.0)
'withdrew'
>>> book.items["r1"].current, book.opinion_queue("default"), book.models["default"].corrected
(None, [], 1)
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from service.config import REVIEW_HORIZON_SECONDS, Settings
from service.desk.errors import Refused
from service.desk.review.item import Item, Step, StepKind
from service.desk.review.rules import check_author, check_flag, check_opinion, missing
from service.records import Correction, Label, LabelRequest, Opinion
from service.stream.labels.review import second_opinion

__all__ = ["ModelTally", "PersonTally", "ReviewBook"]

_RECENT: Final = 200  # answers listed per person and per model (my answers, the finder)
_RESULTS_KEPT: Final = 10_000
_EARLY_KEPT: Final = 10_000  # requests for review waiting for their label, at most
_EARLY_SECONDS: Final = 3600.0
# a label whose request the desk has not read this long after it (the topics read up to
# their end) is no answer: the learner gives such a label up after orphan_label_seconds
_ALONE_SECONDS: Final = 600.0
_HEADS: Final = 8  # second-opinion candidates looked at per author
#: seconds of labels the label rate of a model is measured over
RATE_SECONDS: Final = 120.0


@dataclass(slots=True)
class PersonTally:
    """One person's answers over the horizon and how others judged them."""

    answers: int = 0
    opinions: int = 0  # second opinions they gave
    checked: int = 0  # their answers that got a second opinion
    agreed: int = 0  # ... that agreed
    reviewed: int = 0  # their answers a reviewer decided
    confirmed: int = 0  # ... and kept

    def empty(self) -> bool:
        return not (self.answers or self.opinions)


class _Waiting:
    """One author's answers waiting for a second opinion, by request id (in the order they
    came) and by their offset on the labels topic (where the model's reach is told)."""

    __slots__ = ("ids", "order")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}  # request id -> offset
        self.order: list[tuple[int, str]] = []  # (offset, request id), sorted

    def add(self, rid: str, offset: int) -> None:
        if rid not in self.ids:
            self.ids[rid] = offset
            bisect.insort(self.order, (offset, rid))

    def discard(self, rid: str) -> None:
        offset = self.ids.pop(rid, None)
        if offset is not None:
            del self.order[bisect.bisect_left(self.order, (offset, rid))]

    def first(self) -> str:
        return next(iter(self.ids))

    def since(self, offset: int, n: int) -> list[str]:
        """The first ``n`` waiting at ``offset`` or later."""
        start = bisect.bisect_left(self.order, (offset, ""))
        return [rid for _, rid in self.order[start : start + n]]

    def __contains__(self, rid: object) -> bool:
        return rid in self.ids

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(slots=True)
class ModelTally:
    labels: int = 0
    corrected: int = 0  # withdrawn or changed since


class ReviewBook:
    """The fold (module docstring); ``clock`` gives the time of the queues' deadlines."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float],
        horizon: float = REVIEW_HORIZON_SECONDS,
    ) -> None:
        self.rule = settings.desk.second_opinions
        self.max_weight = settings.max_importance_weight
        self.clock, self.horizon = clock, horizon
        self.items: dict[str, Item] = {}  # request id -> answer, in the order read
        self.short: dict[str, str] = {}  # the 12 first characters -> request id
        self.recent: dict[str, deque[str]] = {}  # person -> their answers, oldest first
        self.by_model: dict[str, deque[str]] = {}  # model -> its answers, oldest first
        self.people: dict[str, PersonTally] = {}
        self.models: dict[str, ModelTally] = {}
        self.opinions: dict[str, dict[str, _Waiting]] = {}  # model -> author -> answers
        self.reviews: dict[str, dict[str, None]] = {}  # model -> ids
        self.positions: dict[int, int] = {}  # labels partition -> next offset to fold
        # (partition, offset) -> how a correction or opinion there was folded (None: taken)
        self._results: dict[tuple[int, int], Refused | None] = {}
        self._result_order: deque[tuple[int, int]] = deque()
        self._forget: list[tuple[float, str]] = []  # heap: (label time, id)
        self._opinion_ends: list[tuple[float, str]] = []  # heap: (deadline, id)
        self._held: dict[str, LabelRequest] = {}  # answered requests whose label is to come
        self._held_ends: list[tuple[float, str]] = []
        self._unjoined: list[tuple[float, str]] = []  # heap: (label time, id) read alone
        self._early: dict[str, tuple[str, float]] = {}  # id -> (by, at) of a flag
        self._early_order: deque[tuple[float, str]] = deque()
        # (model, labels partition) -> offsets of its answers, sorted (labels after one)
        self._offsets: dict[tuple[str, int], list[int]] = {}
        self._times: dict[str, deque[float]] = {}  # model -> times of its recent labels
        self._partition: dict[str, int] = {}  # model -> labels partition of its latest

    # --- the fold ---------------------------------------------------------------------

    def on_label(
        self,
        label: Label,
        *,
        partition: int,
        offset: int,
        at: float,
        request: LabelRequest | None = None,
    ) -> bool:
        """A label (admitted) at ``offset`` of labels ``partition``, read at time ``at``:
        the first for its request is the answer; a later one changes nothing (False)."""
        rid = label.request_id
        if rid in self.items:
            return False
        item = Item(rid, label.model, label.labelled_by, label.label, at, partition, offset)
        self.items[rid] = item
        self.short.setdefault(rid[:12], rid)
        heapq.heappush(self._forget, (at, rid))
        if item.by:
            self.recent.setdefault(item.by, deque(maxlen=_RECENT)).append(rid)
        self.by_model.setdefault(item.model, deque(maxlen=_RECENT)).append(rid)
        bisect.insort(self._offsets.setdefault((item.model, partition), []), offset)
        self._partition[item.model] = partition
        times = self._times.setdefault(item.model, deque())
        times.append(at)
        while times and times[0] < at - RATE_SECONDS:
            times.popleft()
        request = request or self._held.pop(rid, None)
        if request is not None:
            self._join(item, request)
        else:
            heapq.heappush(self._unjoined, (at, rid))
        early = self._early.pop(rid, None)
        if early is not None:
            self.on_flag(rid, *early)
        return True

    def on_request(self, request: LabelRequest) -> None:
        """A label request (admitted): the answer read before it gets its features."""
        item = self.items.get(request.request_id)
        if item is not None and item.request is None:
            self._join(item, request)

    def hold(self, request: LabelRequest) -> None:
        """A request the queue does not keep, whose label may be read later: closed as
        answered first (the learner's applied mark came first), or over when read (a
        restarted desk reads requests of the last days): kept for its label until it
        would have expired (the first tick after the topics are read forgets those over)."""
        rid = request.request_id
        if rid in self.items:
            self.on_request(request)
        elif rid not in self._held and request.expires_at > self.clock() - self.horizon:
            self._held[rid] = request
            heapq.heappush(self._held_ends, (request.expires_at, rid))

    def _join(self, item: Item, request: LabelRequest) -> None:
        if request.model != item.model or item.at > request.expires_at:
            self._drop(item)  # the learner refuses that label: no answer to follow
            return
        item.request = request
        item.ask = second_opinion(request, item.first, self.rule, max_weight=self.max_weight)
        if item.opinion is not None and item.ask is None:  # read before its request
            item.opinion, item.agrees = None, None
        self._account(item, +1)
        self._refile(item)

    def on_correction(self, c: Correction, *, at: float, open_now: bool = False) -> StepKind:
        """A correction (signature checked by the caller): what it did, or
        :class:`Refused` with the learner's reason (nothing changes)."""
        item = self._item(c.request_id, c.model, open_now=open_now)
        if c.role == "author":
            check_author(item, c.by)
        with self._changing(item):
            before = item.current
            kind: StepKind
            if c.role == "reviewer":
                kind = "confirmed" if c.label == before else "corrected"
                item.decision = Step(kind, c.by, c.label, at)
                item.confirmed = kind == "confirmed"
            else:
                item.author_at = at
                kind = (
                    "withdrew"
                    if c.label is None
                    else "kept"
                    if c.label == before
                    else "again"
                    if before is None
                    else "changed"
                )
            item.current = c.label
            item.steps.append(Step(kind, c.by, c.label, at))
        return kind

    def on_opinion(self, o: Opinion, *, at: float, open_now: bool = False) -> bool:
        """A second opinion: True if it agrees with the label as it stands, else False (to
        the review queue); :class:`Refused` if it breaks a rule."""
        item = self._item(o.request_id, o.model, open_now=open_now)
        check_opinion(item, o.by)
        with self._changing(item):
            item.opinion = Step("opinion", o.by, o.label, at)
            item.agrees = o.label == item.current
            item.steps.append(item.opinion)
        return item.agrees

    def on_flag(self, request_id: str, by: str, at: float) -> bool:
        """A request for review (leases topic): False if it breaks a rule; one read before
        its label waits for it (an hour at most)."""
        item = self.items.get(request_id)
        if item is None:
            if len(self._early) >= _EARLY_KEPT:
                return False
            self._early[request_id] = (by, at)
            self._early_order.append((self.clock(), request_id))
            return True
        try:
            check_flag(item, by)
        except Refused:
            return False
        if item.flag is None:
            with self._changing(item):
                item.flag = Step("flag", by, item.current, at)
                item.steps.append(item.flag)
        return True

    def _item(self, request_id: str, model: str, *, open_now: bool) -> Item:
        item = self.items.get(request_id)
        if item is None:
            raise missing(request_id, open_now=open_now)
        if item.model != model:
            raise Refused(
                409, "unknown_request", f"request {request_id[:12]!r} is not one of model {model!r}"
            )
        return item

    # --- where each Kafka record of the labels topic got to (for the writer) ------------

    def advance(
        self, partition: int, offset: int, *, review: bool = False, refused: Refused | None = None
    ) -> None:
        """The record at ``offset`` of labels ``partition`` is folded; for a correction or
        an opinion (``review``), whether it was ``refused`` (and why)."""
        self.positions[partition] = max(self.positions.get(partition, 0), offset + 1)
        if review:
            self._results[(partition, offset)] = refused
            self._result_order.append((partition, offset))
            while len(self._result_order) > _RESULTS_KEPT:
                self._results.pop(self._result_order.popleft(), None)

    def result(self, partition: int, offset: int) -> tuple[bool, Refused | None]:
        """Whether the correction or opinion at ``offset`` was folded (False: not yet, or
        forgotten), and the refusal if it was refused."""
        key = (partition, offset)
        return key in self._results, self._results.get(key)

    # --- queues and tallies -------------------------------------------------------------

    @contextlib.contextmanager
    def _changing(self, item: Item) -> Iterator[None]:
        self._account(item, -1)
        try:
            yield
        finally:
            self._account(item, +1)
            self._refile(item)

    def _account(self, item: Item, sign: int) -> None:
        """Add (``sign`` +1) or take away (-1) what ``item`` counts in the tallies."""
        if item.request is None:
            return  # not an answer the desk follows yet
        model = self.models.setdefault(item.model, ModelTally())
        model.labels += sign
        model.corrected += sign * item.corrected
        if item.by:
            p = self.people.setdefault(item.by, PersonTally())
            p.answers += sign
            p.checked += sign * (item.agrees is not None)
            p.agreed += sign * bool(item.agrees)
            p.reviewed += sign * (item.decision is not None)
            p.confirmed += sign * bool(item.confirmed)
        if item.opinion is not None:
            self.people.setdefault(item.opinion.by, PersonTally()).opinions += sign

    def _asking(self, item: Item) -> bool:
        """``item`` waits for a second opinion (reach and scope are checked when offered)."""
        return (
            item.request is not None
            and not item.out_of_reach
            and item.ask is not None
            and item.opinion is None
            and item.decision is None
            and item.current is not None
            and item.flag is None
            and self.clock() < item.at + self.rule.within_seconds
        )

    def _refile(self, item: Item) -> None:
        """Put ``item`` in the queues its state says, and out of the others."""
        rid = item.request_id
        authors = self.opinions.setdefault(item.model, {})
        waiting = authors.setdefault(item.by, _Waiting())
        if self._asking(item):
            if rid not in waiting:
                waiting.add(rid, item.offset)
                heapq.heappush(self._opinion_ends, (item.at + self.rule.within_seconds, rid))
        else:
            waiting.discard(rid)
        if not waiting:
            del authors[item.by]
        reviews = self.reviews.setdefault(item.model, {})
        if item.request is not None and not item.out_of_reach and item.disputed:
            reviews.setdefault(rid, None)
        else:
            reviews.pop(rid, None)

    def labels_after(self, item: Item) -> int:
        """How many answers of ``item``'s model came after it on its labels partition (the
        labels the learner applied after it, once it has caught up)."""
        offsets = self._offsets.get((item.model, item.partition), [])
        return len(offsets) - bisect.bisect_right(offsets, item.offset)

    def label_rate(self, model: str, now: float) -> float:
        """Answers of ``model`` per second over the last :data:`RATE_SECONDS`, or since the
        first of them if that is later (at least 5 s: a burst is not stretched thin); 0
        when none came."""
        recent = [t for t in self._times.get(model, ()) if t > now - RATE_SECONDS]
        if not recent:
            return 0.0
        return len(recent) / max(5.0, now - recent[0])

    def _drop(self, item: Item) -> None:
        offsets = self._offsets.get((item.model, item.partition), [])
        i = bisect.bisect_left(offsets, item.offset)
        if i < len(offsets) and offsets[i] == item.offset:
            del offsets[i]
        self._account(item, -1)
        waiting = self.opinions.get(item.model, {}).get(item.by)
        if waiting is not None:
            waiting.discard(item.request_id)
        self.reviews.get(item.model, {}).pop(item.request_id, None)
        del self.items[item.request_id]
        if self.short.get(item.request_id[:12]) == item.request_id:
            del self.short[item.request_id[:12]]

    def opinion_queue(self, model: str) -> list[Item]:
        """Every answer of ``model`` waiting for a second opinion, oldest first (tests and
        small pages: it walks the queue)."""
        waiting = [self.items[r] for ids in self.opinions.get(model, {}).values() for r in ids]
        return sorted(waiting, key=lambda i: (i.at, i.offset))

    def opinion_heads(
        self, person: str, models: Iterable[str], since: Callable[[str], int] = lambda model: -1
    ) -> list[Item]:
        """The oldest answers of ``models`` waiting for a second opinion that ``person``
        did not give, from offset ``since(model)`` on (the oldest the model's reach still
        leaves time for): the first few of each other author, oldest first (what ``next``
        reads: as many as authors, not as many as answers waiting)."""
        heads = []
        for model in models:
            start = since(model)
            for author, waiting in self.opinions.get(model, {}).items():
                if author != person:
                    heads += [self.items[r] for r in waiting.since(start, _HEADS)]
        return sorted(heads, key=lambda i: (i.at, i.offset))

    def first_with(self, model: str, left: int) -> int:
        """The offset of the oldest answer of ``model`` (on the partition of its latest)
        with at most ``left`` - 1 of its answers after it: the oldest a model that keeps
        ``left`` more labels can still correct (-1: every one; beyond the last: none)."""
        partition = self._partition.get(model)
        offsets = [] if partition is None else self._offsets.get((model, partition), [])
        start = len(offsets) - max(0, left)
        if start <= 0:
            return -1
        return offsets[start] if start < len(offsets) else offsets[-1] + 1

    def review_queue(self, model: str) -> Iterator[Item]:
        """The answers of ``model`` waiting for a reviewer, oldest first."""
        return (self.items[r] for r in self.reviews.get(model, {}))

    def open_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Per model: answers waiting for a second opinion, and for a reviewer."""
        opinions = {m: sum(map(len, a.values())) for m, a in self.opinions.items()}
        return opinions, {m: len(ids) for m, ids in self.reviews.items()}

    def tick(self, now: float, reachable: Callable[[Item], bool]) -> None:
        """Once a second: forget what is older than the horizon, close second opinions past
        their time, and take answers a model can no longer correct off the queues' fronts."""
        while self._forget and self._forget[0][0] <= now - self.horizon:
            _, rid = heapq.heappop(self._forget)
            item = self.items.get(rid)
            if item is not None and item.at <= now - self.horizon:
                self._drop(item)
        while self._opinion_ends and self._opinion_ends[0][0] <= now:
            _, rid = heapq.heappop(self._opinion_ends)
            item = self.items.get(rid)
            if item is not None:
                self._refile(item)
        while self._held_ends and self._held_ends[0][0] <= now:
            self._held.pop(heapq.heappop(self._held_ends)[1], None)
        while self._early_order and self._early_order[0][0] <= now - _EARLY_SECONDS:
            self._early.pop(self._early_order.popleft()[1], None)
        while self._unjoined and self._unjoined[0][0] <= now - _ALONE_SECONDS:
            item = self.items.get(heapq.heappop(self._unjoined)[1])
            if item is not None and item.request is None:
                self._drop(item)  # its request never came: the learner refused the label
        self._out_of_reach(reachable)

    def _out_of_reach(self, reachable: Callable[[Item], bool]) -> None:
        for authors in self.opinions.values():
            for waiting in authors.values():
                while waiting and not reachable(item := self.items[waiting.first()]):
                    item.out_of_reach = True
                    waiting.discard(item.request_id)
        for ids in self.reviews.values():
            while ids and not reachable(item := self.items[next(iter(ids))]):
                item.out_of_reach = True
                del ids[item.request_id]
        for authors in self.opinions.values():
            for author in [a for a, ids in authors.items() if not ids]:
                del authors[author]
