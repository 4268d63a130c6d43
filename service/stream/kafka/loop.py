"""What the worker's two loops share beyond their clients: how the rest of the worker sees a
loop's consumer, and what a loop has processed.

- :class:`ConsumerView`: a consumer as liveness and readiness see it; :class:`LoopView` is the
  view of a loop (the scoring loop's; the learner's adds its tables' recovery) and
  :class:`RoutedView` one view over both loops (a partition's calls go to the loop that
  consumes its topic). In tests an in-memory fake (``tests/stream/fakes.py``), so liveness
  needs neither Kafka nor faust to be tested;
- :class:`RecoveryState`: the learner's table recovery at one moment;
- :class:`StableMarks`: a partition's high watermark and last stable offset, as a fetch gave
  them;
- :class:`Progress`: the last offset a loop processed per (topic, partition), and when.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from service.stream.kafka.groups import Starts

__all__ = [
    "TP",
    "ConsumerView",
    "LoopState",
    "LoopView",
    "Looping",
    "Progress",
    "RecoveryState",
    "RoutedView",
    "StableMarks",
    "partition_key",
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


@dataclass(frozen=True, slots=True)
class StableMarks:
    """A partition's two ends as one fetch response gave them.

    ``high``: the high watermark (the next offset to be written); ``stable``: the last stable
    offset (the first offset of the oldest transaction not yet ended, else ``high``): under
    ``read_committed`` nothing at or after it is handed out; ``fetched_at``: when the response
    came (seconds)."""

    high: int
    stable: int
    fetched_at: float

    @property
    def unstable(self) -> int:
        """Records at or after the last stable offset (not readable under read_committed);
        0 under read_uncommitted, where the last stable offset reads -1.

        >>> StableMarks(high=12, stable=4, fetched_at=0.0).unstable
        8
        >>> StableMarks(high=12, stable=-1, fetched_at=0.0).unstable
        0
        """
        return max(0, self.high - self.stable) if self.stable >= 0 else 0


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
        """Fresh end offsets of ``tps`` from the broker, by (topic, partition): under
        ``read_committed`` the last stable offset, what the consumer can read up to."""
        ...

    def stable_marks(self, tp: TP) -> StableMarks | None:
        """The high watermark and last stable offset of the consumer's last fetch of ``tp``
        (None before one, or when the broker gave no last stable offset)."""
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


class LoopState(Protocol):
    committed: dict[TopicPartition, int]
    rebalancing: bool
    generation: int


class Looping(Protocol):
    @property
    def consumer(self) -> AIOKafkaConsumer | None: ...

    @property
    def starts(self) -> Starts: ...

    @property
    def state(self) -> LoopState: ...


class LoopView:
    """:class:`ConsumerView` of a loop's consumer: paused while the loop is in a rebalance or
    a partition's start is unknown. Without tables (the scoring loop) nothing is ever
    recovered, but recovery is not complete while a start is unknown; the learner's view
    adds its tables' recovery (:class:`~service.stream.labels.loop.LearnView`)."""

    def __init__(self, loop: Looping) -> None:
        self._loop = loop

    @property
    def generation(self) -> int:
        return self._loop.state.generation

    @property
    def paused(self) -> bool:
        return self._loop.state.rebalancing or bool(self._loop.starts.unknown)

    def assignment(self) -> AbstractSet[TP]:
        consumer = self._loop.consumer
        if consumer is None:
            return frozenset()
        assigned: AbstractSet[TP] = consumer.assignment()
        return assigned

    def recovery(self) -> RecoveryState:
        """Complete once every assigned partition's start is known (nothing to read)."""
        return RecoveryState(in_recovery=False, completed=not self._loop.starts.unknown)

    def highwater(self, tp: TP) -> int | None:
        consumer = self._loop.consumer
        if consumer is None:
            return None
        try:
            high = consumer.highwater(_tp(tp))
        except IllegalStateError:
            return None
        return None if high is None else int(high)

    async def highwaters(self, tps: Sequence[TP]) -> Mapping[tuple[str, int], int]:
        consumer = self._loop.consumer
        if consumer is None or not tps:
            return {}
        ends = await consumer.end_offsets([_tp(tp) for tp in tps])
        return {(tp.topic, tp.partition): int(h) for tp, h in ends.items() if h is not None}

    def stable_marks(self, tp: TP) -> StableMarks | None:
        """From the consumer's fetch responses, which carry both ends whatever the isolation
        level (``end_offsets`` asks with the consumer's own: the last stable offset under
        ``read_committed``). Under ``read_uncommitted`` the last stable offset reads -1."""
        consumer = self._loop.consumer
        part = _tp(tp)
        if consumer is None or part not in consumer.assignment():
            return None
        high, stable = consumer.highwater(part), consumer.last_stable_offset(part)
        fetched_ms = consumer.last_poll_timestamp(part)
        if high is None or stable is None or fetched_ms is None:
            return None
        return StableMarks(high=int(high), stable=int(stable), fetched_at=fetched_ms / 1000.0)

    async def position(self, tp: TP) -> int | None:
        consumer = self._loop.consumer
        if consumer is None:
            return None
        try:
            return int(await asyncio.wait_for(consumer.position(_tp(tp)), 1.0))
        except (IllegalStateError, KafkaError, TimeoutError):
            return None

    def committed_next(self, tp: TP) -> int | None:
        return self._loop.state.committed.get(_tp(tp))


def _tp(tp: TP) -> TopicPartition:
    return tp if isinstance(tp, TopicPartition) else TopicPartition(tp.topic, tp.partition)


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

    def stable_marks(self, tp: TP) -> StableMarks | None:
        return self._of(tp).stable_marks(tp)

    async def position(self, tp: TP) -> int | None:
        return await self._of(tp).position(tp)

    def committed_next(self, tp: TP) -> int | None:
        return self._of(tp).committed_next(tp)
