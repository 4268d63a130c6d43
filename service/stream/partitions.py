"""What the worker knows about the partitions it consumes, and the one view of the Kafka
consumer that liveness needs.

- :class:`Progress`: the last offset processed per (topic, partition) and when;
- :class:`PartitionStatus` and :func:`stalled_partitions`: lag without progress;
- :class:`RecoveryWatch`: table recovery that stops reading its changelogs;
- :class:`ConsumerView`: the consumer as liveness (:mod:`service.stream.liveness`) sees
  it. In a worker it is :class:`RoutedView` over the scoring path's
  :class:`~service.stream.scoreloop.ScoreView` and the learner's
  :class:`~service.stream.learnloop.LearnView`; in tests an in-memory fake
  (``tests/stream/fakes.py``), so liveness needs neither Kafka nor faust to be tested.

Nothing here imports faust.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = [
    "TP",
    "ConsumerView",
    "PartitionStatus",
    "Progress",
    "RecoveryState",
    "RecoveryWatch",
    "RoutedView",
    "partition_key",
    "stalled_partitions",
]


class TP(Protocol):
    """A topic partition: anything with ``.topic`` and ``.partition`` that can be hashed
    (faust's ``TP``, aiokafka's ``TopicPartition``)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...


def partition_key(tp: TP) -> tuple[str, int]:
    """``(topic, partition)`` of ``tp``: the key :class:`Progress` and metrics use, and the
    order partitions are visited in.

    >>> from collections import namedtuple
    >>> partition_key(namedtuple("TP", "topic partition")("t", 3))
    ('t', 3)
    """
    return (tp.topic, tp.partition)


@dataclass(frozen=True, slots=True)
class RecoveryState:
    """The learner's table recovery at one moment.

    ``in_recovery``: changelogs are being read; ``completed``: the first recovery after the
    last assignment has finished (until then the stream waits); ``offsets``: changelog
    offset read so far per (topic, partition); ``remaining``: changelog records still to
    read (all partitions)."""

    in_recovery: bool
    completed: bool
    offsets: Mapping[tuple[str, int], int] = field(default_factory=dict)
    remaining: int = 0

    @property
    def pauses_stream(self) -> bool:
        """True while recovery holds the stream back on purpose.

        >>> RecoveryState(in_recovery=False, completed=True).pauses_stream
        False
        >>> RecoveryState(in_recovery=False, completed=False).pauses_stream
        True
        """
        return self.in_recovery or not self.completed

    @property
    def reading(self) -> bool:
        """True while changelogs are being read (what :class:`RecoveryWatch` watches)."""
        return self.in_recovery and not self.completed


class ConsumerView(Protocol):
    """The Kafka consumer of a running worker, as liveness uses it.

    Partitions (``tp``) are those :meth:`assignment` returned. Calls that ask the broker
    (the ``async`` ones) may raise ``aiokafka.errors.KafkaError`` or ``OSError``.
    """

    @property
    def generation(self) -> int:
        """The consumer group generation (changes with every rebalance)."""
        ...

    @property
    def paused(self) -> bool:
        """True while the stream is held back on purpose: a rebalance, or table recovery
        (:attr:`RecoveryState.pauses_stream`)."""
        ...

    def assignment(self) -> AbstractSet[TP]:
        """The partitions assigned to this worker now."""
        ...

    def recovery(self) -> RecoveryState:
        """Table recovery now."""
        ...

    def highwater(self, tp: TP) -> int | None:
        """The cached high-water mark (stale while a partition is not fetched; None or
        negative when unknown)."""
        ...

    async def highwaters(self, tps: Sequence[TP]) -> Mapping[tuple[str, int], int]:
        """Fresh high-water marks of ``tps`` from the broker, by (topic, partition)."""
        ...

    async def position(self, tp: TP) -> int | None:
        """The next offset the consumer will fetch (None if unknown)."""
        ...

    def committed_next(self, tp: TP) -> int | None:
        """The next offset to process according to the consumer's own commit bookkeeping
        (set on assignment and on every commit; None before the first)."""
        ...


@dataclass
class Progress:
    """Last processed offset and when, per (topic, partition): liveness and lag."""

    clock: Callable[[], float]
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    times: dict[tuple[str, int], float] = field(default_factory=dict)

    def mark(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        self.offsets[key] = offset
        self.times[key] = self.clock()

    def hold(self, keys: Iterable[tuple[str, int]], now: float) -> None:
        """Count ``now`` as progress for ``keys``: the stream is paused on purpose (table
        recovery, rebalance), so the stall clock starts again when it resumes."""
        for key in keys:
            self.times[key] = now


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
            return (f"table recovery: {remaining} changelog records left, "
                    f"none read for {now - self.since:.0f} s")  # fmt: skip
        return None

    def reset(self) -> None:
        self.last = None


class RoutedView:
    """One :class:`ConsumerView` over several consumers: calls about a partition go to the
    consumer of its topic (``routes``), the rest to ``default``; the assignment is all of
    theirs, and the stream counts as paused while any of them is."""

    def __init__(self, default: ConsumerView, routes: Mapping[str, ConsumerView]) -> None:
        self.default = default
        self.routes = dict(routes)

    def _of(self, tp: TP) -> ConsumerView:
        return self.routes.get(tp.topic, self.default)

    @property
    def generation(self) -> int:
        return self.default.generation

    @property
    def paused(self) -> bool:
        return self.default.paused or any(v.paused for v in self.routes.values())

    def assignment(self) -> AbstractSet[TP]:
        out: set[TP] = set()
        for topic, view in self.routes.items():
            out |= {tp for tp in view.assignment() if tp.topic == topic}
        out |= {tp for tp in self.default.assignment() if tp.topic not in self.routes}
        return out

    def recovery(self) -> RecoveryState:
        """Complete when every consumer's is; reading while any one reads."""
        states = [self.default.recovery(), *(v.recovery() for v in self.routes.values())]
        offsets: dict[tuple[str, int], int] = {}
        for state in states:
            offsets.update(state.offsets)
        return RecoveryState(
            in_recovery=any(st.in_recovery for st in states),
            completed=all(st.completed for st in states),
            offsets=offsets,
            remaining=sum(st.remaining for st in states),
        )

    def highwater(self, tp: TP) -> int | None:
        return self._of(tp).highwater(tp)

    async def highwaters(self, tps: Sequence[TP]) -> Mapping[tuple[str, int], int]:
        groups: dict[int, tuple[ConsumerView, list[TP]]] = {}
        for tp in tps:
            view = self._of(tp)
            groups.setdefault(id(view), (view, []))[1].append(tp)
        out: dict[tuple[str, int], int] = {}
        for view, members in groups.values():
            out.update(await view.highwaters(members))
        return out

    async def position(self, tp: TP) -> int | None:
        return await self._of(tp).position(tp)

    def committed_next(self, tp: TP) -> int | None:
        return self._of(tp).committed_next(tp)
