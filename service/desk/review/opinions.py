"""Second opinions at the desk: an answer the rule chose
(:func:`service.stream.labels.review.second_opinion`) is offered to someone who did not give
it, held for them by a lease (:func:`~service.desk.leases.opinion_lease`) as a request is,
shown without the first answer, and answered with an :class:`~service.records.Opinion` on
the labels topic. Agreement closes it; a disagreement goes to the review queue.

The oldest answers waiting are offered first (they are the closest to leaving the model's
reach), and only while the model can still correct them for at least
``desk.min_time_left_seconds`` (:meth:`~service.desk.review.actions.Review.reach_left`, the
time left the page counts down); a person who skips one is not offered it again before it
closes. An opinion given after the model's reach has passed (it learned faster than
expected) is still taken: it counts toward agreement, and the reply says it can no longer
change the model.
"""

from __future__ import annotations

from service.desk.auth.accounts import Person
from service.desk.errors import Refused
from service.desk.leases import LeaseRecord, opinion_lease
from service.desk.review.actions import Offered, Review
from service.desk.review.item import Item
from service.desk.review.rules import check_opinion, missing
from service.records import Opinion

__all__ = ["Opinions"]

_TRIES = 3  # second opinions tried per "next" before giving up for now


class Opinions:
    """Offer, hold, answer and give back second opinions (module docstring)."""

    def __init__(self, review: Review) -> None:
        self.review = review

    @property
    def lease_seconds(self) -> float:
        return self.review.settings.desk.lease_seconds

    def _claim_record(self, item: Item, person: Person) -> LeaseRecord:
        now = self.review.clock()
        return LeaseRecord(
            opinion_lease(item.request_id),
            "claim",
            person.name,
            at=now,
            expires_at=now + self.lease_seconds,
            replica=self.review.replica,
        )

    def _open(self, item: Item, person: Person, *, now: float, offer: bool = False) -> bool:
        """``item`` still waits for a second opinion that ``person`` may give now; to
        ``offer`` it, with time enough to give it before the model's reach passes."""
        r = self.review
        rid = item.request_id
        return (
            r.book.items.get(rid) is item
            and item.ask is not None
            and item.opinion is None
            and item.current is not None
            and item.decision is None
            and item.flag is None
            and person.name != item.by
            and person.may_answer(item.model)
            and now < item.at + r.settings.desk.second_opinions.within_seconds
            and r.skipped.get((person.name, rid), 0.0) <= now
            and (not offer or self.until(item, now) - now >= r.settings.desk.min_time_left_seconds)
        )

    def until(self, item: Item, now: float) -> float:
        """When the chance to give a second opinion on ``item`` that can change the model
        ends: ``within_seconds`` after the answer, or when the model's reach passes it."""
        within = item.at + self.review.settings.desk.second_opinions.within_seconds
        return min(within, now + self.review.reach_left(item))

    async def held(self, person: Person, lease_id: str) -> Offered | None:
        """The second opinion ``person`` holds under ``lease_id`` (renewed), if it is still
        open; None otherwise."""
        item = self.review.book.items.get(lease_id.removesuffix("#opinion"))
        now = self.review.clock()
        if item is None or not self._open(item, person, now=now):
            return None
        record = self._claim_record(item, person)
        if not await self.review.lease_log.publish(record):
            return None
        return Offered(item, record.expires_at, self.until(item, now))

    async def next(self, person: Person, model: str | None) -> Offered | None:
        """The oldest answer waiting for a second opinion that ``person`` may give, won on
        the leases topic; None when there is none."""
        r = self.review
        tries = 0
        now = r.clock()
        heads = r.book.opinion_heads(
            person.name, r.models_of(person, model), since=r.correctable_from
        )
        for item in heads:
            lease_id = opinion_lease(item.request_id)
            holder = r.leases.holder(lease_id, now=now)
            if (
                lease_id in r.claiming
                or not self._open(item, person, now=now, offer=True)
                or (holder is not None and holder.holder != person.name)
            ):
                continue
            r.claiming.add(lease_id)
            try:
                record = self._claim_record(item, person)
                won = await r.lease_log.publish(record)
            finally:
                r.claiming.discard(lease_id)
            r.metrics.claims.labels(outcome="won" if won else "lost").inc()
            if won:
                return Offered(item, record.expires_at, self.until(item, now))
            tries += 1
            if tries >= _TRIES:
                break
        return None

    def _mine(self, person: Person, rid: str) -> Item:
        """The answer ``rid`` that ``person`` may give a second opinion on now."""
        r = self.review
        item = r.book.items.get(rid)
        if item is None or item.request is None:
            raise missing(rid, open_now=r.is_open(rid))
        if not person.may_answer(item.model):
            raise Refused(403, "out_of_scope", f"you do not answer for model {item.model!r}")
        check_opinion(item, person.name)
        now = r.clock()
        holder = r.leases.holder(opinion_lease(rid), now=now)
        if holder is not None and holder.holder != person.name:
            raise Refused(409, "not_yours", "someone else is giving this second opinion")
        if not self._open(item, person, now=now):
            raise Refused(410, "expired", "the time for a second opinion on this answer is over")
        return item

    async def answer(self, person: Person, rid: str, value: int) -> tuple[bool, bool]:
        """``person``'s second opinion ``value`` on ``rid``: whether it agrees with the
        label (closed; else to the review queue), and whether the model can still be
        corrected (False: it counts toward agreement only)."""
        item = self._mine(person, rid)
        await self.review.write(
            rid, Opinion(rid, item.model, value, person.name, self.review.clock())
        )
        agrees = bool(item.agrees)
        outcome = "agree" if agrees else "disagree"
        self.review.metrics.second_opinions.labels(model=item.model, outcome=outcome).inc()
        return agrees, self.review.reachable(item)

    async def renew(self, person: Person, rid: str) -> float:
        """Extend ``person``'s lease on the second opinion on ``rid``; the new end."""
        item = self._mine(person, rid)
        record = self._claim_record(item, person)
        if not await self.review.lease_log.publish(record):
            raise Refused(409, "not_yours", "this second opinion is no longer yours")
        return record.expires_at

    async def give_back(self, person: Person, rid: str, why: str) -> None:
        """``person`` skips the second opinion on ``rid`` (or cannot tell): offered to
        others, never again to them."""
        item = self._mine(person, rid)
        r = self.review
        r.skipped[(person.name, rid)] = item.at + r.settings.desk.second_opinions.within_seconds
        if r.leases.holder(opinion_lease(rid), now=r.clock()) is not None:
            now = r.clock()
            await r.lease_log.publish(
                LeaseRecord(opinion_lease(rid), "release", person.name, at=now, replica=r.replica)
            )
        r.metrics.give_backs.labels(model=item.model, why=why).inc()
