"""What a person can do at the desk: take the next request, keep it, answer it, give it
back. Kafka is behind two small ports (:class:`LeaseLog`, :class:`LabelSink`), so this is
tested without a broker.

Rules (docs/operate/desk.md):

- a person holds at most the requests they were given; asking again returns the one they
  hold (a reload or a second tab shows the same request);
- a request is given to one person at a time: the lease is won on the leases topic
  (:mod:`service.desk.leases`), renewed while the page is open, and returns to the queue
  when it runs out or is given back;
- an answer is saved only once Kafka acknowledged the label; the desk sends at most one
  label per request: a second answer (double click, second tab, second person) is refused
  with ``already_answered``; an answer to an expired request with ``expired``.

Many people asking at once: a replica skips the requests it is claiming right now (its
claims in flight), so concurrent ``next`` calls on one replica go for distinct requests,
the most urgent first. A claim lost to another replica (whose people went for the same
requests) is retried at random among the few most urgent free requests, so the replicas
spread out instead of racing for the same one again. The leases topic still decides who
holds a request (:mod:`service.desk.leases`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from service.config import Settings
from service.desk.auth.accounts import Person
from service.desk.backlog import DeskQueue
from service.desk.changes import CorrectionsWaiting
from service.desk.errors import Refused, Unavailable
from service.desk.leases import LeaseBook, LeaseLog, LeaseRecord
from service.desk.metrics import DeskMetrics
from service.desk.review import Offered, Opinions, Review
from service.desk.review.stats import ReviewStats, review_stats
from service.desk.team import TeamStats, team_stats
from service.records import Label, LabelRequest

__all__ = ["Claimed", "Desk", "LabelSink", "LeaseLog"]

GiveBack = Literal["skip", "cant_tell"]
_CLAIM_TRIES = 8  # claims lost to others before "next" gives up for now
_SPREAD = 16  # after a lost claim, the next try is among this many most urgent free ones


class LabelSink(Protocol):
    """The labels topic: returns once Kafka acknowledged (acks=all), or raises
    :class:`~service.desk.errors.Unavailable`."""

    async def send(self, label: Label) -> None: ...


@dataclass(frozen=True, slots=True)
class Claimed:
    """A request handed to a person, and until when it is theirs; ``opinion``: answered by
    someone else already, offered for a second opinion (:mod:`service.desk.review`)."""

    request: LabelRequest
    lease_expires_at: float
    opinion: bool = False
    #: a second opinion: when the chance to give it ends (the request's own expiry else)
    until: float | None = None


class Desk:
    """The desk's decisions (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        queue: DeskQueue,
        leases: LeaseBook,
        log: LeaseLog,
        sink: LabelSink,
        metrics: DeskMetrics,
        clock: Callable[[], float],
        replica: str,
        review: Review | None = None,
    ) -> None:
        self.settings, self.queue, self.leases = settings, queue, leases
        self.log, self.sink, self.metrics = log, sink, metrics
        self.clock, self.replica = clock, replica
        self.ready = False  # the topics are read to the end they had at start
        self.sent: dict[str, Label] = {}  # labels this replica sent (acknowledged)
        self.skipped: dict[tuple[str, str], float] = {}  # (person, request) -> until
        self._sent_order: deque[str] = deque()  # ids of ``sent``, oldest first
        self._attempts: dict[tuple[str, str], str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._asking: dict[str, asyncio.Lock] = {}  # person -> one "next" at a time (kept)
        self._claiming: set[str] = set()  # requests this replica is claiming right now
        self._random = random.Random()  # noqa: S311 - spreading claims, not a secret
        self.team: TeamStats | None = None  # the team view as of the last tick
        self.waiting = CorrectionsWaiting()  # corrections read that models do not hold yet
        self.agreement: ReviewStats | None = None  # the same, of answers after they are given
        # the team view joins answers (labels topic) with their times (leases topic)
        leases.on_answer = queue.on_timing
        self.review = review
        self.opinions = None if review is None else Opinions(review)
        if review is not None:
            review.is_open = lambda rid: rid in queue.requests
            review.sent_here = lambda rid: rid in self.sent
            queue.on_answered = review.book.hold

    @property
    def lease_seconds(self) -> float:
        return self.settings.desk.lease_seconds

    def _record(
        self, rid: str, kind: str, person: Person, attempt: str | None = None
    ) -> LeaseRecord:
        now = self.clock()
        return LeaseRecord(
            rid,
            kind,  # type: ignore[arg-type]
            person.name,
            at=now,
            expires_at=now + self.lease_seconds,
            attempt=attempt,
            replica=self.replica,
        )

    def _usable(self, request: LabelRequest, person: Person, model: str | None) -> bool:
        rid = request.request_id
        return (
            person.may_answer(request.model)
            and (model is None or request.model == model)
            and rid not in self.sent
            and self.skipped.get((person.name, rid), 0.0) <= self.clock()
        )

    async def next(self, person: Person, model: str | None = None) -> Claimed | None:
        """The request ``person`` holds, else the most urgent free one they may answer (won
        on the leases topic); None when there is none."""
        if not self.ready:
            raise Refused(503, "loading", "the desk is still reading the topics; try again")
        lock = self._asking.setdefault(person.name, asyncio.Lock())
        async with lock:  # a second tab asking at the same moment gets the same request
            return await self._next(person, model)

    async def _next(self, person: Person, model: str | None) -> Claimed | None:
        now = self.clock()
        for rid in self.leases.held_by(person.name, now=now):
            request = self.queue.requests.get(rid)
            if (
                request is not None
                and self.queue.is_open(rid, now=now)
                and self._usable(request, person, model)
            ):
                return await self._claim(request, person) or None
            if request is None and self.opinions is not None and rid.endswith("#opinion"):
                held = await self.opinions.held(person, rid)
                if held is not None and (model is None or held.item.model == model):
                    return _offered(held)
        # second opinions first (they close with the reach), but not to a newcomer: a person
        # who has given fewer first answers than second_opinions.after_answers gets a free
        # request first, and a second opinion only when no request is free
        newcomer = self._newcomer(person)
        if self.opinions is not None and not newcomer:
            offered = await self.opinions.next(person, model)
            if offered is not None:
                return _offered(offered)
        claimed = await self._first_answer(person, model)
        if claimed is None and self.opinions is not None and newcomer:
            offered = await self.opinions.next(person, model)
            if offered is not None:
                return _offered(offered)
        return claimed

    def _newcomer(self, person: Person) -> bool:
        """Whether ``person`` has given fewer first answers (over the review's horizon) than
        ``second_opinions.after_answers``."""
        after = self.settings.desk.second_opinions.after_answers
        if not after or self.review is None:
            return False
        tally = self.review.book.people.get(person.name)
        return (0 if tally is None else tally.answers) < after

    async def _first_answer(self, person: Person, model: str | None) -> Claimed | None:
        """The most urgent free request ``person`` may answer, won on the leases topic."""
        for lost in range(_CLAIM_TRIES):
            # the first try takes the most urgent free request; after a loss (another
            # replica's people went for it too) one of the few most urgent, at random
            free = self._free(person, model, now=self.clock(), n=1 if lost == 0 else _SPREAD)
            if not free:
                return None
            request = free[0] if lost == 0 else self._random.choice(free)
            claimed = await self._claim(request, person)
            if claimed is not None:
                return claimed
        return None

    def _free(self, person: Person, model: str | None, *, now: float, n: int) -> list[LabelRequest]:
        """Up to ``n`` of the most urgent requests ``person`` may take: nobody holds them
        and this replica is not claiming them. Reads only the front of the order."""
        if model is not None:
            models: list[str] | None = [model] if person.may_answer(model) else []
        elif person.models is not None:
            models = sorted(person.models)
        else:
            models = None
        out: list[LabelRequest] = []
        min_left = self.settings.desk.min_time_left_seconds
        for request in self.queue.ordered(now=now, min_left=min_left, models=models):
            rid = request.request_id
            if (
                rid not in self._claiming
                and self._usable(request, person, model)
                and self.leases.holder(rid, now=now) is None
            ):
                out.append(request)
                if len(out) >= n:
                    break
        return out

    async def _claim(self, request: LabelRequest, person: Person) -> Claimed | None:
        rid = request.request_id
        record = self._record(rid, "claim", person)
        theirs = rid in self._claiming  # (not for a fresh claim: those skip such requests)
        self._claiming.add(rid)
        try:
            won = await self.log.publish(record)
        finally:
            if not theirs:
                self._claiming.discard(rid)
        if not won:
            self.metrics.claims.labels(outcome="lost").inc()
            return None
        self.metrics.claims.labels(outcome="won").inc()
        return Claimed(request, record.expires_at)

    async def renew(self, person: Person, rid: str) -> float:
        """Extend ``person``'s lease on ``rid``; the new end."""
        lease = self.leases.holder(rid, now=self.clock())
        if lease is None or lease.holder != person.name:
            raise Refused(409, "not_yours", "this request is no longer yours: take the next one")
        self._open_request(rid, person)
        record = self._record(rid, "claim", person)
        if not await self.log.publish(record):
            raise Refused(409, "not_yours", "this request is no longer yours: take the next one")
        return record.expires_at

    def _open_request(self, rid: str, person: Person) -> LabelRequest:
        """The open request ``rid``, or the refusal that says why it cannot be answered."""
        now = self.clock()
        if rid in self.sent or rid in self.queue.answered_by:
            raise Refused(409, "already_answered", "this request is already answered")
        request = self.queue.requests.get(rid)
        if request is None:
            if rid in self.queue.closed:
                raise Refused(410, "expired", "this request has expired or was withdrawn")
            raise Refused(404, "unknown", "no such request")
        if not person.may_answer(request.model):
            raise Refused(403, "out_of_scope", f"you do not answer for model {request.model!r}")
        if request.expires_at <= now:
            raise Refused(410, "expired", "this request has expired")
        lease = self.leases.holder(rid, now=now)
        if lease is not None and lease.holder != person.name:
            raise Refused(409, "not_yours", "someone else holds this request")
        return request

    async def answer(self, person: Person, rid: str, value: int) -> Label:
        """Send ``person``'s label ``value`` (+1 / -1) for ``rid``; returns it once Kafka
        acknowledged it. :class:`Refused` or :class:`Unavailable` otherwise (nothing saved)."""
        if value not in (1, -1):
            raise Refused(400, "bad_answer", "the answer must be +1 or -1")
        lock = self._locks.setdefault(rid, asyncio.Lock())
        async with lock:
            return await self._answer(person, rid, value)

    async def _answer(self, person: Person, rid: str, value: int) -> Label:
        request = self._open_request(rid, person)
        key = (person.name, rid)
        attempt = self._attempts.setdefault(key, secrets.token_hex(8))
        if not await self.log.publish(self._record(rid, "answer", person, attempt)):
            self.metrics.refusals.labels(code="already_answered").inc()
            raise Refused(409, "already_answered", "this request is being answered elsewhere")
        now = self.clock()
        label = Label(rid, request.model, value, person.name, now)
        try:
            await self.sink.send(label)
        except Unavailable:
            self.metrics.send_failures.inc()
            # the lease stays; the failed try no longer blocks a retry (else it ends with
            # the lease)
            with contextlib.suppress(Unavailable):
                await self.log.publish(self._record(rid, "release", person, attempt))
            raise
        self._attempts.pop(key, None)
        self.sent[rid] = label
        self._sent_order.append(rid)
        self.queue.close(rid, "answered", by=person.name)
        self.metrics.answers.labels(model=request.model, answer=str(value)).inc()
        timing = self.leases.answers.get(rid)
        if timing is not None:
            self.metrics.answer_seconds.labels(model=request.model).observe(timing.seconds)
        return label

    async def give_back(self, person: Person, rid: str, why: GiveBack) -> None:
        """``person`` skips ``rid`` (or cannot tell): it returns to the queue for others and
        is not offered to them again before it expires (skip: for ten minutes)."""
        request = self._open_request(rid, person)
        until = request.expires_at if why == "cant_tell" else self.clock() + 600.0
        self.skipped[(person.name, rid)] = until
        self.metrics.give_backs.labels(model=request.model, why=why).inc()
        if self.leases.holder(rid, now=self.clock()) is not None:
            await self.log.publish(self._record(rid, "release", person))

    def tidy(self) -> None:
        """Forget what no longer matters (called once a second). Walks only what is small
        (skips, answers being sent); the rest leaves oldest first."""
        now = self.clock()
        self.skipped = {k: v for k, v in self.skipped.items() if v > now}
        self._locks = {
            k: v for k, v in self._locks.items() if v.locked() or k in self.queue.requests
        }
        keep = max(2 * 3600.0 + self.settings.request_ttl_seconds, 3600.0)
        self.leases.forget(now, keep=keep)
        while self._sent_order:
            label = self.sent.get(self._sent_order[0])
            if label is not None and (label.ts or now) > now - keep:
                break
            self.sent.pop(self._sent_order.popleft(), None)

    def tick(self) -> TeamStats:
        """Once a second, once ready: expire, forget, compute the team view (served to
        every ``GET /team`` until the next tick) and set the gauges."""
        now = self.clock()
        self.queue.sweep()
        self.tidy()
        if self.review is not None:
            self.agreement = self.review.tick()
        self.team = team_stats(self.queue, self.leases, self.settings.models, now=now)
        m = self.metrics
        for row in self.team.models:
            m.open.labels(model=row.model).set(row.open)
            m.oldest.labels(model=row.model).set(row.oldest_age or 0.0)
            m.expired.labels(model=row.model).set(row.expired_last_hour)
        m.leases.set(self.leases.active(now))
        m.ready.set(1)
        return self.team

    def agreement_view(self) -> ReviewStats | None:
        """The team view's agreement numbers as of the last tick (None without a review)."""
        if self.agreement is None and self.review is not None:
            return review_stats(self.review.book, self.settings.models)
        return self.agreement

    def team_view(self) -> TeamStats:
        """The team view as of the last tick (computed now only before the first one)."""
        if self.team is None:
            return team_stats(self.queue, self.leases, self.settings.models, now=self.clock())
        return self.team


def _offered(offered: Offered) -> Claimed:
    """A second opinion as the labelling view shows it (the request, not the answer)."""
    request = offered.item.request
    assert request is not None  # noqa: S101 - only answers joined with a request are offered
    return Claimed(request, offered.lease_expires_at, opinion=True, until=offered.until)
