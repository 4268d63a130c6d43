"""Liveness rules over the partitions a worker consumes, as pure functions and values (no
Kafka): :class:`PartitionStatus` and :func:`stalled_partitions` (lag without progress) and
:class:`RecoveryWatch` (table recovery that stops reading its changelogs).

:class:`~service.stream.health.liveness.LivenessMonitor` feeds them from the loops' consumers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["PartitionStatus", "RecoveryWatch", "stalled_partitions"]


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One consumed partition as liveness sees it.

    ``high``: the high-water mark (next offset to be written; None if unknown);
    ``position``: the next offset this worker still has to process (None if unknown)."""

    topic: str
    partition: int
    high: int | None
    position: int | None
    last_progress: float

    @property
    def lag(self) -> int:
        """Messages written but not yet processed (0 when either end is unknown).

        >>> PartitionStatus("t", 0, high=10, position=7, last_progress=0.0).lag
        3
        >>> PartitionStatus("t", 0, high=None, position=7, last_progress=0.0).lag
        0
        """
        if self.high is None or self.high < 0 or self.position is None:
            return 0
        return max(0, self.high - self.position)


def stalled_partitions(
    statuses: Iterable[PartitionStatus], *, now: float, stall_seconds: float, paused: bool
) -> list[str]:
    """Partitions with lag and no progress for more than ``stall_seconds`` (faust consumers
    that silently stop). None while ``paused``: table recovery and rebalances pause the
    stream on purpose, and failing liveness then would restart every worker at once.

    >>> s = PartitionStatus("t", 1, high=5, position=2, last_progress=0.0)
    >>> stalled_partitions([s], now=61.0, stall_seconds=60.0, paused=False)
    ['t[1] lag=3']
    >>> stalled_partitions([s], now=61.0, stall_seconds=60.0, paused=True)
    []
    """
    if paused:
        return []
    return [
        f"{st.topic}[{st.partition}] lag={st.lag}"
        for st in statuses
        if st.lag > 0 and now - st.last_progress > stall_seconds
    ]


@dataclass
class RecoveryWatch:
    """Table recovery that stops reading its changelogs while records remain (a reader can
    hang there: faust's did, faust-streaming#74). Recovery that moves, however slowly, is
    fine.

    >>> w = RecoveryWatch()
    >>> w.check({"c0": 3}, remaining=7, now=0.0, stall_seconds=60.0) is None
    True
    >>> w.check({"c0": 3}, remaining=7, now=61.0, stall_seconds=60.0)
    'table recovery: 7 changelog records left, none read for 61 s'
    >>> w.check({"c0": 4}, remaining=6, now=62.0, stall_seconds=60.0) is None
    True
    """

    last: tuple[tuple[str, int], ...] | None = None
    since: float = 0.0

    def check(
        self, offsets: Mapping[Any, Any], *, remaining: int, now: float, stall_seconds: float
    ) -> str | None:
        """A reason to fail liveness, or None. ``offsets``: changelog offsets read so far
        (the learner's ``Recovery.offsets``); ``remaining``: records still to read."""
        snapshot = tuple(sorted((str(k), int(v or 0)) for k, v in offsets.items()))
        if remaining <= 0 or snapshot != self.last:
            self.last, self.since = snapshot, now
            return None
        if now - self.since > stall_seconds:
            return (
                f"table recovery: {remaining} changelog records left, "
                f"none read for {now - self.since:.0f} s"
            )
        return None

    def reset(self) -> None:
        self.last = None
