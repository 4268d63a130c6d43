"""The worker's one-second check: readiness, liveness, gauges, republished snapshots.

:meth:`Housekeeping.check` runs once a second (a faust timer) and returns a
:class:`WorkerStatus`, which is also what ``/healthz`` and ``/readyz`` show:

- ready = table recovery completed, every model snapshot read, the broker answering, and no
  partition stopped at a batch that cannot be read;
- the learner's snapshots published again when the served version differs from the
  learner's for a while, and every ``republish_seconds``;
- the pending, budget and query-rate gauges;
- liveness (:class:`~service.stream.health.liveness.LivenessMonitor`) last.

It reads the learner's state and never writes it: it sees the learner through
:class:`Learner` and :class:`OpenRequests` (which models it owns and at which version, its
open requests); the learner's loop keeps that state (what it owns, what it has read).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from aiokafka.errors import KafkaError

from service.config import Settings
from service.metrics import Metrics
from service.stream.health.liveness import LivenessMonitor
from service.stream.kafka.loop import ConsumerView
from service.stream.models.book import ModelBook
from service.stream.scoring.scorer import Scorer

__all__ = ["REPUBLISH_AFTER", "Housekeeping", "Learner", "OpenRequests", "WorkerStatus"]

#: seconds a model's served version may differ from the learner's before it is republished
#: (longer than it takes the follower to read what the learner just published)
REPUBLISH_AFTER = 5.0

log = logging.getLogger(__name__)


class Learner(Protocol):
    """What housekeeping asks of the learner
    (:class:`~service.stream.labels.joiner.LabelJoiner`)."""

    def versions(self) -> dict[str, int]:
        """The version of each model the learner owns."""
        ...

    async def republish(self, models: Collection[str] | None = None) -> list[str]:
        """Publish the newest snapshot of its ``models`` again; the models published."""
        ...

    async def republish_champions(self, raw: bytes) -> bool:
        """Publish the champions record served again (if this learner does); True if so."""
        ...


class OpenRequests(Protocol):
    """What the gauges read of the pending requests
    (:class:`~service.stream.labels.state.PendingStore`)."""

    def open_requests(self, models: Iterable[str], now: float) -> dict[str, tuple[int, float]]:
        """Per model: (unanswered requests, age in seconds of the oldest)."""
        ...


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """The worker at one check (``/healthz``: ``live``; ``/readyz``: ``ready``)."""

    ready: bool = False
    recovered: bool = False
    models_loaded: bool = False
    broker_reachable: bool = True
    live: bool = True
    stalled: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()
    pinned: tuple[str, ...] = ()


class Housekeeping:
    """What the one-second timer runs (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        view: ConsumerView,
        book: ModelBook,
        pending: OpenRequests,
        scorer: Scorer,
        joiner: Learner,
        liveness: LivenessMonitor,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.view = view
        self.book = book
        self.pending = pending
        self.scorer = scorer
        self.joiner = joiner
        self.republished_at: float | None = None
        self.differs_since: dict[str, float] = {}  # served version != the learner's, since
        self.liveness = liveness
        self.metrics = metrics
        self.status = WorkerStatus()
        self.ready_since: float | None = None  # until models load, records wait on purpose

    async def check(self, now: float) -> WorkerStatus:
        """One round; returns (and keeps in :attr:`status`) the worker's status."""
        recovered = self.view.recovery().completed
        if recovered and self.book.loaded.is_set():
            await self._republish(now)
        self._gauges(now)
        if self.status.ready and self.ready_since is None:
            self.ready_since = now
        elif not self.status.ready:
            self.ready_since = None
        report = await self.liveness.check(now)
        loaded = self.book.loaded.is_set()
        ready = loaded and recovered and report.broker_reachable and not report.unreadable
        self.metrics.ready.set(1 if ready else 0)
        self.status = WorkerStatus(
            ready=ready,
            recovered=recovered,
            models_loaded=loaded,
            broker_reachable=report.broker_reachable,
            live=report.live,
            stalled=report.stalled,
            unreadable=report.unreadable,
            pinned=report.pinned,
        )
        return self.status

    def _gauges(self, now: float) -> None:
        models = self.settings.models
        for model, (count, age) in self.pending.open_requests(models, now).items():
            self.metrics.pending_requests.labels(model=model).set(count)
            self.metrics.oldest_pending_age.labels(model=model).set(age)
        for model, rate in self.scorer.query_rates().items():
            self.metrics.query_rate.labels(model=model).set(rate)
        features = self.settings.topics.features
        mine = sum(1 for tp in self.view.assignment() if tp.topic == features)
        self.scorer.set_share(mine / self.settings.partitions.features)
        self.scorer.budget_gauges()

    async def _republish(self, now: float) -> None:
        """The learner's models again on the models topic: a model whose served version has
        differed from the learner's for :data:`REPUBLISH_AFTER` seconds (a forged, refused or
        deleted record won there), and every model every ``republish_seconds`` (so a rotated
        key re-signs them), with the champions record served (by one learner)."""
        if self.republished_at is None:
            self.republished_at = now  # the first periodic round comes a period after start
        served, mine = self.book.snapshot(), self.joiner.versions()
        differs = {m for m, v in mine.items() if served[m].version != v}
        for model in set(self.differs_since) - differs:
            del self.differs_since[model]
        # an older version than the learner's, held back by this worker's book: a copy of a
        # superseded snapshot, which every book drops once the newest is published again
        copied = {m for m, v in self.book.held().items() if m in mine and v < mine[m]}
        due: list[str] | None = [
            m
            for m in sorted(differs | copied)
            if m in copied or now - self.differs_since.setdefault(m, now) >= REPUBLISH_AFTER
        ]
        if now - self.republished_at >= self.settings.republish_seconds:
            self.republished_at, due = now, None  # every model
        elif not due:
            return
        try:
            published = await self.joiner.republish(due)
            champions = self.book.champions_record
            if due is None and champions is not None:  # the periodic round: it too
                await self.joiner.republish_champions(champions[0])
        except (KafkaError, OSError) as exc:  # the broker is away: try again next time
            log.warning("republishing models failed: %r", exc)
            return
        for model in published:
            self.differs_since.pop(model, None)
        if published:
            log.info("republished models %s", published)
