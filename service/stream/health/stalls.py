"""Liveness rules over the partitions a worker consumes, as pure functions and values (no
Kafka): :class:`PartitionStatus` and :func:`stalled_partitions` (lag without progress),
:class:`RecoveryWatch` (table recovery that stops reading its changelogs) and
:class:`PinnedWatch` (a last stable offset held back by a transaction that does not end).

:class:`~service.stream.health.liveness.LivenessMonitor` feeds them from the loops' consumers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PartitionStatus", "PinnedWatch", "RecoveryWatch", "stalled_partitions"]


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


@dataclass
class PinnedWatch:
    r"""How long each partition's last stable offset has stood behind its high watermark
    without moving: a producer that opens a transaction and neither commits nor aborts it
    (alive, or killed) holds back every record written after the transaction's first one,
    every producer's, until the broker's transaction timeout aborts it (the producer's
    ``transaction.timeout.ms``, up to the broker's ``transaction.max.timeout.ms``, 15 minutes
    by default). The consumer's end offsets under ``read_committed`` are the last stable
    offset, so its lag reads 0 meanwhile.

    The last stable offset never goes back, so two responses that show the same one behind
    the high watermark mean it stood there in between: the time is measured between fetch
    responses (a partition not fetched for a while is not counted as pinned past its last
    response). A busy transactional producer keeps the last stable offset behind the high
    watermark all the time, but moving: that is not pinned.

    >>> w = PinnedWatch()
    >>> w.seconds(("t", 0), high=9, stable=4, fetched_at=100.0)
    0.0
    >>> w.seconds(("t", 0), high=12, stable=4, fetched_at=131.0)
    31.0
    >>> w.seconds(("t", 0), high=12, stable=9, fetched_at=132.0)
    0.0
    >>> w.seconds(("t", 0), high=12, stable=12, fetched_at=133.0)
    0.0
    """

    since: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)

    def seconds(self, key: tuple[str, int], *, high: int, stable: int, fetched_at: float) -> float:
        """Seconds the last stable offset of ``key`` has stood behind its high watermark,
        from a fetch response (at ``fetched_at``) that gave ``high`` and ``stable``; 0 when
        it is at the high watermark or unknown (negative: ``read_uncommitted``)."""
        if stable < 0 or stable >= high:
            self.since.pop(key, None)
            return 0.0
        held = self.since.get(key)
        if held is None or held[0] != stable:
            self.since[key] = (stable, fetched_at)
            return 0.0
        return max(0.0, fetched_at - held[1])

    def forget(self, keys: Iterable[tuple[str, int]]) -> None:
        """Drop partitions no longer assigned."""
        for key in keys:
            self.since.pop(key, None)
