"""Liveness: a consumed partition with lag and no progress for ``stall_seconds`` fails
``/healthz`` (faust consumers that silently stop: faust #175, #640, #523).

Lag is the high-water mark (fresh end offsets: a paused partition is not fetched, so the
cached mark goes stale) minus the next offset still to process (after the last processed
one, else after the last committed one, else the consumer's position). While a loop pauses
on purpose (rebalance, table recovery, a start Kafka has not told yet) nothing counts as
stalled and the stall clock restarts, so a long recovery never makes Kubernetes restart
every worker at once -- unless the recovery itself stops: no changelog record read for
``stall_seconds`` while records remain and the broker answers.

A broker that does not answer is not the worker's fault either: nothing counts as stalled
then (a restart would not bring the broker back), and :attr:`LivenessReport.broker_reachable`
says so, for readiness.

A partition stopped at a batch the worker cannot read
(:class:`~service.stream.kafka.unreadable.Unreadable`) is stalled at once, named with its
offsets and the command that moves it on (:attr:`LivenessReport.unreadable`; readiness fails
too): waiting ``stall_seconds`` would only delay the alarm.

A partition whose last stable offset has stood behind its high watermark for more than
``pinned_seconds`` (:class:`~service.stream.health.stalls.PinnedWatch`: a transaction neither
committed nor aborted) is named in :attr:`LivenessReport.pinned`, with both offsets. Its lag
reads 0 meanwhile (under ``read_committed`` the end offsets are the last stable offset), and
it is not stalled: the worker reads every other partition, and a restart would not end the
producer's transaction (the broker does, at its timeout, or an operator with
``kafka-transactions.sh abort``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from aiokafka.errors import KafkaError

from service.metrics import Metrics
from service.stream.health.stalls import (
    PartitionStatus,
    PinnedWatch,
    RecoveryWatch,
    stalled_partitions,
)
from service.stream.kafka.loop import (
    TP,
    ConsumerView,
    Progress,
    RecoveryState,
    StableMarks,
    partition_key,
)
from service.stream.kafka.unreadable import Unreadable

__all__ = ["LivenessMonitor", "LivenessReport"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LivenessReport:
    """One liveness check.

    ``live``: nothing stalled; ``stalled``: why not (a partition with its lag, or a table
    recovery that reads nothing); ``broker_reachable``: the last end-offset request was
    answered in time (readiness follows it); ``partitions``: the watched partitions;
    ``unreadable``: partitions stopped at a batch that cannot be read (also in ``stalled``);
    ``pinned``: partitions whose last stable offset an open transaction holds back (not in
    ``stalled``: they do not make the worker not live)."""

    live: bool
    stalled: tuple[str, ...]
    broker_reachable: bool
    partitions: tuple[PartitionStatus, ...]
    unreadable: tuple[str, ...] = ()
    pinned: tuple[str, ...] = ()


class LivenessMonitor:
    """Decides liveness once a second (:meth:`check`) and keeps the lag, progress and
    ``abstain_live`` gauges.

    ``view``: the consumer; ``progress``: what the loops processed (a partition newly
    assigned counts as progress, and a revoked one is forgotten); ``watched``: the topics
    whose partitions must not stall; ``stall_seconds``: how long lag without progress is
    tolerated; ``answer_timeout``: how long the broker has to give end offsets;
    ``unreadable``: the partitions the loops stopped at a batch they cannot read;
    ``pinned_seconds``: how long a last stable offset may stand behind the high watermark
    before its partition is reported as pinned.
    """

    def __init__(
        self,
        view: ConsumerView,
        progress: Progress,
        metrics: Metrics,
        *,
        watched: Iterable[str],
        stall_seconds: float,
        answer_timeout: float = 5.0,
        unreadable: Unreadable | None = None,
        pinned_seconds: float = 30.0,
    ) -> None:
        self.view = view
        self.unreadable = unreadable if unreadable is not None else Unreadable()
        self.progress = progress
        self.metrics = metrics
        self.watched = frozenset(watched)
        self.stall_seconds = stall_seconds
        self.answer_timeout = answer_timeout
        self.broker_reachable = True  # the last end-offset request was answered in time
        self.recovery_watch = RecoveryWatch()
        self.pinned_seconds = pinned_seconds
        self.pinned_watch = PinnedWatch()
        self._pinned: set[tuple[str, int]] = set()  # partitions reported pinned
        self._known: set[tuple[str, int]] = set()  # partitions with gauge series

    async def check(self, now: float) -> LivenessReport:
        """Update the gauges and decide liveness at ``now``."""
        paused = self.view.paused
        recovery = self.view.recovery()
        assigned = sorted(self.view.assignment(), key=partition_key)
        tps = [tp for tp in assigned if tp.topic in self.watched]
        probe = tps or assigned[:1]  # any partition will do to ask the broker
        current = {partition_key(tp) for tp in tps}
        for key in current - self.progress.times.keys():
            self.progress.times[key] = now  # assignment counts as progress
        highs: Mapping[tuple[str, int], int]
        if paused:
            highs = self._cached_highwaters(tps)
        else:
            highs = await self._highwaters(probe) if probe else {}
            paused = not self.broker_reachable  # nothing can be consumed: not a stall
        if paused:
            self.progress.hold(current, now)
        statuses = [await self._status(tp, highs.get(partition_key(tp))) for tp in tps]
        pinned = self._pinned_partitions(tps)
        self._forget_revoked(current)
        unreadable = self.unreadable.lines()
        waiting = [st for st in statuses if (st.topic, st.partition) not in self.unreadable.stopped]
        stalled = (
            unreadable
            + stalled_partitions(waiting, now=now, stall_seconds=self.stall_seconds, paused=paused)
            + await self._recovery_stalled(now, recovery, probe)
        )
        self.metrics.live.set(0 if stalled else 1)
        return LivenessReport(
            live=not stalled,
            stalled=tuple(stalled),
            broker_reachable=self.broker_reachable,
            partitions=tuple(statuses),
            unreadable=tuple(unreadable),
            pinned=tuple(pinned),
        )

    def _pinned_partitions(self, tps: Iterable[TP]) -> list[str]:
        """Partitions whose last stable offset has stood behind the high watermark for more
        than ``pinned_seconds``, named with both offsets; also set as their gauges."""
        lines: dict[tuple[str, int], str] = {}
        for tp in tps:
            key = partition_key(tp)
            marks = self.view.stable_marks(tp)
            if marks is None:  # no fetch answered yet
                self.pinned_watch.forget([key])
                seconds, past = 0.0, 0
            else:
                seconds = self.pinned_watch.seconds(
                    key, high=marks.high, stable=marks.stable, fetched_at=marks.fetched_at
                )
                past = marks.unstable
            self.metrics.set_stable(tp.topic, tp.partition, pinned=seconds, past_stable=past)
            if marks is not None and seconds > self.pinned_seconds:
                lines[key] = _pinned_line(tp, marks, seconds)
        for key in sorted(lines.keys() - self._pinned):
            log.warning("%s", lines[key])
        for topic, partition in sorted(self._pinned - lines.keys()):
            log.warning("%s[%d]: its last stable offset moves again", topic, partition)
        self._pinned = set(lines)
        return list(lines.values())

    def _cached_highwaters(self, tps: Iterable[TP]) -> dict[tuple[str, int], int]:
        """The consumer's cached marks (no broker request while the stream is paused)."""
        highs = {partition_key(tp): self.view.highwater(tp) for tp in tps}
        return {key: high for key, high in highs.items() if high is not None}

    async def _highwaters(self, tps: Sequence[TP]) -> Mapping[tuple[str, int], int]:
        """Fresh end offsets (a paused partition is not fetched, so the cached high-water
        mark would go stale); the cached ones if the broker does not answer in time, which
        also sets :attr:`broker_reachable`."""
        try:
            highs = await asyncio.wait_for(self.view.highwaters(tps), self.answer_timeout)
        except (KafkaError, OSError) as exc:  # TimeoutError is an OSError
            if self.broker_reachable:
                log.warning("broker unreachable (%r): not ready until it answers", exc)
            self.broker_reachable = False
            return self._cached_highwaters(tps)
        if not self.broker_reachable:
            log.warning("broker reachable again")
        self.broker_reachable = True
        return highs

    async def _status(self, tp: TP, high: int | None) -> PartitionStatus:
        """``tp`` now, also set as its lag and progress gauges."""
        key = partition_key(tp)
        status = PartitionStatus(
            tp.topic,
            tp.partition,
            high=high,
            position=await self._next_to_process(tp),
            last_progress=self.progress.times[key],
        )
        self.metrics.set_partition(
            tp.topic, tp.partition, lag=status.lag, progress_ts=status.last_progress
        )
        return status

    async def _next_to_process(self, tp: TP) -> int | None:
        """Next offset still to process: after the last processed one, else after the last
        committed one; where the consumer stands if that is further (offsets of records it
        skips without handing them out: the control record that ends a transaction, a
        transaction aborted under ``read_committed``)."""
        done = self.progress.offsets.get(partition_key(tp))
        known = done + 1 if done is not None else self.view.committed_next(tp)
        position = await self.view.position(tp)
        if known is None or position is None:
            return position if known is None else known
        return max(known, position)

    def _forget_revoked(self, current: set[tuple[str, int]]) -> None:
        """Drop the gauge series and the progress of partitions no longer assigned."""
        for topic, partition in sorted(self._known - current):
            self.metrics.remove_partition(topic, partition)
            self.progress.offsets.pop((topic, partition), None)
            self.progress.times.pop((topic, partition), None)
        self.pinned_watch.forget(self._known - current)
        self._pinned &= current
        self._known = set(current)

    async def _recovery_stalled(
        self, now: float, recovery: RecoveryState, probe: Sequence[TP]
    ) -> list[str]:
        """Table recovery that has read nothing for ``stall_seconds`` while changelog
        records remain (and the broker answers: an outage is not the worker's fault)."""
        if not recovery.reading:
            self.recovery_watch.reset()
            return []
        note = self.recovery_watch.check(
            recovery.offsets,
            remaining=recovery.remaining,
            now=now,
            stall_seconds=self.stall_seconds,
        )
        if note is None:
            return []
        if probe:
            await self._highwaters(probe)  # sets broker_reachable
        return [note] if self.broker_reachable else []


def _pinned_line(tp: TP, marks: StableMarks, seconds: float) -> str:
    """What ``/healthz`` says of a pinned partition, with Kafka's commands that name the
    producer and end its transaction (the transaction starts at the last stable offset).

    >>> from collections import namedtuple
    >>> tp = namedtuple("TP", "topic partition")("f", 0)
    >>> line = _pinned_line(tp, StableMarks(high=9, stable=4, fetched_at=0.0), 31.2)
    >>> line.split(" (")[0]
    'f[0] last stable offset 4 behind high watermark 9 for 31 s'
    >>> line.split("`")[3].split(" abort ")[1]
    '--topic f --partition 0 --start-offset 4'
    """
    where = f"--topic {tp.topic} --partition {tp.partition}"
    tool = "kafka-transactions.sh --bootstrap-server <broker>"
    return (
        f"{tp.topic}[{tp.partition}] last stable offset {marks.stable} behind high watermark "
        f"{marks.high} for {seconds:.0f} s (a transaction neither committed nor aborted holds "
        f"back {marks.unstable} records): `{tool} describe-producers {where}` names its "
        f"producer, `{tool} abort {where} --start-offset {marks.stable}` ends it"
    )
