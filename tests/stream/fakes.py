"""In-memory stand-ins for the streaming layer's interfaces, so its logic is tested without
Kafka or faust. Each fake is a class named after what it fakes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from aiokafka.errors import KafkaConnectionError
from intervaltree import IntervalTree

from service.stream.kafka.loop import TP, ConsumerView, RecoveryState, StableMarks, partition_key

__all__ = ["FakeConsumerView"]

Key = tuple[str, int]


@dataclass
class FakeConsumerView:
    """A :class:`~service.stream.kafka.loop.ConsumerView` whose state the test sets.

    ``highs`` are the broker's end offsets (what :meth:`highwaters` answers) and ``cached``
    the consumer's cached ones (default: -1, stale, as for a paused partition); the
    consumer stands at ``positions`` (default: ``default_position``). The broker
    is away while ``broker`` is ``"down"`` (the request fails) or ``"silent"`` (it never
    answers). What the code under test did is recorded in ``sought``, ``commits`` and
    ``acked``; ``gaps`` are faust's ranges taken for compacted, per partition."""

    assigned: set[TP] = field(default_factory=set)
    generation: int = 1
    rebalancing: bool = False
    recovery_state: RecoveryState = field(
        default_factory=lambda: RecoveryState(in_recovery=False, completed=True)
    )
    highs: dict[Key, int] = field(default_factory=dict)
    cached: dict[Key, int] = field(default_factory=dict)
    broker: str = "up"  # "up" | "down" | "silent"
    positions: dict[Key, int] = field(default_factory=dict)
    default_position: int | None = 0  # of a partition not in ``positions``
    committed: dict[Key, int] = field(default_factory=dict)
    marks: dict[Key, StableMarks] = field(default_factory=dict)
    earliest_offset: int = 0
    gaps: dict[Key, IntervalTree] = field(default_factory=dict)
    sought: list[tuple[Key, int]] = field(default_factory=list)
    commits: list[tuple[Key, int]] = field(default_factory=list)
    acked: list[tuple[Key, int]] = field(default_factory=list)

    @property
    def paused(self) -> bool:
        return self.rebalancing or self.recovery_state.pauses_stream

    def assignment(self) -> AbstractSet[TP]:
        return set(self.assigned)

    def recovery(self) -> RecoveryState:
        return self.recovery_state

    def highwater(self, tp: TP) -> int | None:
        return self.cached.get(partition_key(tp), -1)

    async def highwaters(self, tps: Sequence[TP]) -> Mapping[Key, int]:
        if self.broker == "down":
            raise KafkaConnectionError("broker down")
        if self.broker == "silent":
            await asyncio.Event().wait()  # never answers: the caller's timeout ends it
        return {partition_key(tp): self.highs.get(partition_key(tp), 0) for tp in tps}

    def stable_marks(self, tp: TP) -> StableMarks | None:
        return self.marks.get(partition_key(tp))

    async def position(self, tp: TP) -> int | None:
        return self.positions.get(partition_key(tp), self.default_position)

    def committed_next(self, tp: TP) -> int | None:
        return self.committed.get(partition_key(tp))


_conforms: type[ConsumerView] = FakeConsumerView  # mypy checks the protocol here
