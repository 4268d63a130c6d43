"""What people do with answers already given: an author undoes or changes theirs within
the grace period (``desk.undo_seconds``) or asks for a review; a second person gives a
blind second opinion; a reviewer decides. Kafka is behind two ports (:class:`LabelsLog`
for corrections and opinions, :class:`~service.desk.leases.LeaseLog` for requests for
review and the leases of second opinions), so this is tested without a broker.

Every action is checked up front with the rules the desk's fold and the learner apply
(:mod:`.rules`) and refused with a reason, writing nothing. What is written is read back:
an action returns once the desk's reader has folded the record, with what it did (another
replica may have written first: then the fold's refusal is the answer).

- **Undo** writes an author's correction ``label: null`` (the model forgets the label; the
  request does not reopen); answering again is a correction with the value, **change**
  one with the other answer. Both within ``undo_seconds`` of the author's last answer to
  it, while the model can still correct the label.
- **Ask for review**: a ``flag`` record on the leases topic; the answer joins the review
  queue on every replica.
- **Second opinion**: an answer the rule chose is offered to people who did not give it,
  leased like a request (:func:`~service.desk.leases.opinion_lease`), without the first
  answer; the answer is an :class:`~service.records.Opinion` on the labels topic.
- **Review**: a reviewer's answer is a correction with ``role: reviewer``, final; equal to
  the label it confirms it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from service.config import Settings
from service.desk.auth.accounts import Person
from service.desk.errors import Refused
from service.desk.leases import LeaseBook, LeaseLog, LeaseRecord
from service.desk.metrics import DeskMetrics
from service.desk.present import answer_names
from service.desk.review.book import ReviewBook
from service.desk.review.item import Item, StepKind
from service.desk.review.rules import (
    beyond_reach,
    check_author,
    check_flag,
    check_reviewer,
    missing,
)
from service.desk.review.stats import ReviewStats, review_stats
from service.desk.review.views import mine_row
from service.records import Correction, Opinion

__all__ = ["LabelsLog", "Offered", "Review"]

_MINE = 10  # answers in "my recent answers"


class LabelsLog(Protocol):
    """The labels topic for corrections and second opinions: write it (signed when a key is
    set, acks=all), wait until the desk's reader has folded it, and return the refusal of
    the fold (None: taken). Raises :class:`~service.desk.errors.Unavailable`."""

    async def publish(self, record: Correction | Opinion) -> Refused | None: ...


@dataclass(frozen=True, slots=True)
class Offered:
    """An answer offered to a person for a second opinion, held until ``lease_expires_at``;
    ``until``: when the chance to give it ends (``within_seconds``, or the model's reach)."""

    item: Item
    lease_expires_at: float
    until: float = math.inf


class Review:
    """The actions (module docstring) over one desk's book of answers. ``models`` gives
    the snapshots the desk follows (name -> served model: what a model can still
    correct); ``is_open`` whether a request is open (a correction of it is refused
    ``not_answered``); ``sent_here`` whether this replica sent a label for it (its
    correction waits until the reader has read it back)."""

    def __init__(
        self,
        settings: Settings,
        *,
        book: ReviewBook,
        leases: LeaseBook,
        lease_log: LeaseLog,
        labels: LabelsLog,
        metrics: DeskMetrics,
        clock: Callable[[], float],
        replica: str = "",
        models: Callable[[], Mapping[str, Any]] = dict,
        folded: asyncio.Condition | None = None,
    ) -> None:
        self.settings, self.book, self.leases, self.lease_log = settings, book, leases, lease_log
        self.labels, self.metrics, self.clock, self.replica = labels, metrics, clock, replica
        self.models = models
        self.is_open: Callable[[str], bool] = lambda rid: False
        self.sent_here: Callable[[str], bool] = lambda rid: False
        # notified when the reader folded records of the labels or leases topics
        self.folded = folded or asyncio.Condition()
        self.skipped: dict[tuple[str, str], float] = {}  # (person, request) -> until
        self._locks: dict[str, asyncio.Lock] = {}
        self.claiming: set[str] = set()
        leases.on_flag = book.on_flag

    # --- what can still be corrected ------------------------------------------------

    def reachable(self, item: Item) -> bool:
        """The model (every member of its group) can still correct ``item``'s label."""
        if item.out_of_reach:
            return False
        served = self.models()
        envelopes = [
            m.envelope
            for name in self.settings.group(item.model)
            if (m := served.get(name)) is not None
        ]
        return not beyond_reach(envelopes, item.partition, item.offset)

    def reach_left(self, item: Item) -> float:
        """Seconds until the model can no longer correct ``item``'s label, as it learns now:
        the labels it may still apply after it (``corrections.reach`` keeps at least that
        many, less the ones that came since) at the rate they came lately; 0 when it
        cannot any more, infinite while no label comes."""
        if not self.reachable(item):
            return 0.0
        reach = self.settings.models[item.model].corrections.reach
        left = reach - 1 - self.book.labels_after(item)
        if left <= 0:
            return 0.0
        rate = self.book.label_rate(item.model, self.clock())
        return math.inf if rate <= 0 else left / rate

    def correctable_from(self, model: str) -> int:
        """The offset of the oldest answer of ``model`` that :meth:`takes_time` (-1: any),
        so the oldest ones, which the reach is about to pass, are not even looked at."""
        reach = self.settings.models[model].corrections.reach
        rate = self.book.label_rate(model, self.clock())
        keeps = math.floor(reach - rate * self.settings.desk.min_time_left_seconds)
        return self.book.first_with(model, keeps)

    def takes_time(self, item: Item) -> bool:
        """``item`` stays correctable long enough to be offered: at least
        ``desk.min_time_left_seconds``, as a request must have to be handed out."""
        return self.reach_left(item) >= self.settings.desk.min_time_left_seconds

    def require_reach(self, item: Item) -> None:
        if not self.reachable(item):
            reach = self.settings.models[item.model].corrections.reach
            raise Refused(
                410,
                "beyond_reach",
                "too late: the model has learned so many labels "
                f"since this answer that it can no longer change it (it keeps its "
                f"last {reach} labels)",
            )

    async def _answer(self, person: Person, rid: str) -> Item:
        """The answer to ``rid``, once the reader has it (a label this replica sent is
        waited for); refused if there is none or ``person`` does not answer its model."""
        item = self.book.items.get(rid)
        if item is None and self.sent_here(rid):
            async with self.folded:
                await asyncio.wait_for(
                    self.folded.wait_for(lambda: rid in self.book.items),
                    self.settings.desk.ack_timeout_seconds,
                )
            item = self.book.items.get(rid)
        if item is None or item.request is None:
            raise missing(rid, open_now=self.is_open(rid))
        if not person.may_answer(item.model):
            raise Refused(403, "out_of_scope", f"you do not answer for model {item.model!r}")
        return item

    async def write(self, rid: str, record: Correction | Opinion) -> None:
        lock = self._locks.setdefault(rid, asyncio.Lock())
        async with lock:
            refused = await self.labels.publish(record)
        if not lock.locked():
            self._locks.pop(rid, None)
        if refused is not None:
            raise refused

    # --- the author -------------------------------------------------------------------

    def grace_until(self, item: Item) -> float:
        """Until when the author may undo or change ``item``."""
        return item.author_at + self.settings.desk.undo_seconds

    async def correct(self, person: Person, rid: str, value: int | None) -> Item:
        """``person``'s correction of their answer: ``None`` withdraws it (undo), +1 / -1
        replaces it (change, or answer again after an undo)."""
        item = await self._answer(person, rid)
        check_author(item, person.name)
        if self.clock() >= self.grace_until(item):
            raise Refused(
                409,
                "grace_over",
                "the time to undo or change this answer is over: ask for a review instead",
            )
        self.require_reach(item)
        if value == item.current:
            raise Refused(409, "unchanged", "that is the answer it has already")
        await self.write(
            rid, Correction(rid, item.model, value, person.name, "author", self.clock())
        )
        kind = "undo" if value is None else "change"
        self.metrics.corrections.labels(model=item.model, kind=kind).inc()
        return item

    async def ask_review(self, person: Person, rid: str) -> Item:
        """``person`` asks a reviewer to look at their answer (a ``flag`` record)."""
        item = await self._answer(person, rid)
        check_flag(item, person.name)
        self.require_reach(item)
        if item.flag is None:
            now = self.clock()
            flag = LeaseRecord(rid, "flag", person.name, at=now, replica=self.replica)
            await self.lease_log.publish(flag)
            if item.flag is None:  # (the book folded it, or said no)
                raise Refused(
                    409,
                    "reviewed",
                    "the desk could not file this request for "
                    "review: reload and look at the answer again",
                )
            self.metrics.review_requests.labels(model=item.model).inc()
        return item

    def mine(self, person: Person, *, limit: int = _MINE) -> list[dict[str, Any]]:
        """``person``'s most recent answers, newest first (:func:`~.views.mine_row`)."""
        now, out = self.clock(), []
        for rid in reversed(self.book.recent.get(person.name, ())):
            item = self.book.items.get(rid)
            if item is None or item.by != person.name or item.request is None:
                continue
            names = answer_names(self.settings.desk.answer_names.get(item.model))
            # the time to undo: the grace period, or less when the model's reach ends first
            until = min(self.grace_until(item), now + self.reach_left(item))
            out.append(
                mine_row(item, names, grace_until=until, now=now, reachable=self.reachable(item))
            )
            if len(out) >= limit:
                break
        return out

    # --- reviewers --------------------------------------------------------------------

    async def decide(self, person: Person, rid: str, value: int) -> StepKind:
        """A reviewer's final answer to ``rid`` (a correction with ``role: reviewer``):
        ``confirmed`` when it is the label as it stands, else ``corrected``."""
        item = await self._answer(person, rid)
        check_reviewer(item, person.name, reviewer=person.reviewer)
        if item.decision is not None:
            raise Refused(409, "reviewed", "a reviewer has decided this answer: it is final")
        self.require_reach(item)
        await self.write(
            rid, Correction(rid, item.model, value, person.name, "reviewer", self.clock())
        )
        assert item.decision is not None  # noqa: S101 - the fold took it
        outcome = item.decision.kind
        self.metrics.corrections.labels(model=item.model, kind="review").inc()
        self.metrics.reviews.labels(model=item.model, outcome=outcome).inc()
        return outcome

    def review_queue(self, person: Person, *, limit: int = 50) -> list[Item]:
        """The answers waiting for a reviewer that ``person`` may decide (not their own),
        oldest first, per model."""
        out: list[Item] = []
        for model in self.models_of(person, None):
            for item in self.book.review_queue(model):
                if person.name not in (item.by, item.opinion_by) and self.takes_time(item):
                    out.append(item)
                    if len(out) >= limit:
                        return out
        return out

    def models_of(self, person: Person, model: str | None) -> Collection[str]:
        deciding = [m for m, cfg in self.settings.models.items() if cfg.champion is None]
        wanted = deciding if model is None else [model]
        return [m for m in wanted if person.may_answer(m)]

    # --- once a second ----------------------------------------------------------------

    def tick(self) -> ReviewStats:
        """Forget and close what ran out (:meth:`ReviewBook.tick`), set the gauges and
        compute the team view's agreement numbers."""
        now = self.clock()
        self.book.tick(now, self.reachable)
        self.skipped = {k: until for k, until in self.skipped.items() if until > now}
        deciding = [m for m, cfg in self.settings.models.items() if cfg.champion is None]
        stats = review_stats(self.book, deciding)
        for row in stats.models:
            self.metrics.opinions_open.labels(model=row.model).set(row.opinions_open)
            self.metrics.reviews_open.labels(model=row.model).set(row.reviews_open)
            self.metrics.corrected_ratio.labels(model=row.model).set(row.corrected_share or 0.0)
        return stats
