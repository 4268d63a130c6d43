"""Liveness: a consumed partition with lag and no progress for ``stall_seconds`` fails
``/healthz`` (faust consumers that silently stop: faust #175, #640, #523).

Lag is the high-water mark (fresh end offsets: a paused partition is not fetched, so the
cached mark goes stale) minus the next offset still to process (after the last processed
one, else after the last committed one, else the consumer's position). While faust pauses
the stream on purpose (rebalance, table recovery) nothing counts as stalled and the stall
clock restarts, so a long recovery never makes Kubernetes restart every worker at once --
unless the recovery itself stops: no changelog record read for ``stall_seconds`` while
records remain and the broker answers (faust can hang there, faust-streaming#74).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.errors import KafkaError

from service.stream.runtime import PartitionStatus, Runtime, stalled_partitions

__all__ = ["liveness_check"]

log = logging.getLogger(__name__)


def liveness_check(app: Any, rt: Runtime, watched: set[str]) -> Callable[[float], Awaitable[None]]:
    """The check the one-second timer runs: updates lag / progress gauges, ``rt.live``,
    ``rt.stalled`` and ``abstain_live``; drops the series of revoked partitions."""
    known_tps: set[tuple[str, int]] = set()

    def _paused() -> bool:
        """True while faust pauses the stream on purpose: rebalance or table recovery."""
        recovery: Any = app.tables.recovery
        return (
            bool(app.rebalancing)
            or bool(getattr(recovery, "in_recovery", False))
            or not recovery.completed.is_set()
        )

    async def _highwaters(tps: list[Any]) -> dict[Any, int]:
        """Fresh end offsets (a paused partition is not fetched, so the cached high-water
        mark would go stale); the cached ones if the broker does not answer in time."""
        try:
            highs = dict(await asyncio.wait_for(app.consumer.highwaters(*tps), timeout=5.0))
        except (KafkaError, OSError) as exc:  # TimeoutError is an OSError
            if rt.broker_reachable:
                log.warning("broker unreachable (%r): not ready until it answers", exc)
            rt.broker_reachable = False  # readiness follows the broker (liveness does not)
            return {tp: app.consumer.highwater(tp) for tp in tps}
        if not rt.broker_reachable:
            log.warning("broker reachable again")
        rt.broker_reachable = True
        return highs

    async def _position(tp: Any) -> int | None:
        """Next offset still to process: after the last processed one, else after the last
        committed one, else where the consumer stands."""
        done = rt.progress.offsets.get((tp.topic, tp.partition))
        if done is not None:
            return done + 1
        committed = app.consumer._committed_offset.get(tp)  # noqa: SLF001
        if committed is not None:  # faust keeps the committed *next* offset
            return int(committed)
        position = await app.consumer.position(tp)
        return None if position is None else int(position)

    async def _recovery_stalled(now: float, tps: list[Any]) -> list[str]:
        """Table recovery that has read nothing for ``stall_seconds`` while changelog
        records remain (and the broker answers: an outage is not the worker's fault)."""
        recovery: Any = app.tables.recovery
        if not getattr(recovery, "in_recovery", False) or recovery.completed.is_set():
            rt.recovery_watch.reset()
            return []
        remaining = sum(max(0, int(v)) for v in recovery.active_remaining().values())
        note = rt.recovery_watch.check(recovery.active_offsets, remaining=remaining, now=now,
                                       stall_seconds=rt.settings.stall_seconds)  # fmt: skip
        if note is None:
            return []
        probe = tps or sorted(app.consumer.assignment())[:1]
        if probe:
            await _highwaters(probe)  # sets rt.broker_reachable
        return [note] if rt.broker_reachable else []

    async def _liveness(now: float) -> None:
        paused = _paused()
        tps = [tp for tp in app.consumer.assignment() if tp.topic in watched]
        current = {(tp.topic, tp.partition) for tp in tps}
        for key in current - rt.progress.times.keys():
            rt.progress.times[key] = now  # assignment counts as progress
        if paused:
            rt.progress.hold(current, now)
            highs = {tp: app.consumer.highwater(tp) for tp in tps}
        else:
            probe = tps or sorted(app.consumer.assignment())[:1]  # any partition will do
            highs = await _highwaters(probe) if probe else {}
            if not rt.broker_reachable:  # nothing can be consumed: not a stalled consumer
                paused = True  # (readiness reports the outage; a restart would not help)
                rt.progress.hold(current, now)
        statuses = []
        for tp in tps:
            high = highs.get(tp)
            status = PartitionStatus(
                tp.topic,
                tp.partition,
                high=None if high is None else int(high),
                position=await _position(tp),
                last_progress=rt.progress.times[(tp.topic, tp.partition)],
            )
            rt.metrics.set_partition(tp.topic, tp.partition, lag=status.lag,
                                  progress_ts=status.last_progress)  # fmt: skip
            statuses.append(status)
        for topic, partition in known_tps - current:
            rt.metrics.remove_partition(topic, partition)
            rt.progress.offsets.pop((topic, partition), None)
            rt.progress.times.pop((topic, partition), None)
        known_tps.clear()
        known_tps.update(current)
        rt.stalled = stalled_partitions(
            statuses, now=now, stall_seconds=rt.settings.stall_seconds, paused=paused
        ) + await _recovery_stalled(now, tps)
        rt.live = not rt.stalled
        rt.metrics.live.set(1 if rt.live else 0)

    return _liveness
