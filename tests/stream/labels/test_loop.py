"""The learn loop without a broker: when it tells the joiner a label-requests partition is
caught up (what lets a parked label be given up after its wait)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from service.records import RawMessage
from service.stream.kafka.loop import Progress
from service.stream.kafka.topics import changelog_topic
from service.stream.labels import loop as loop_module
from service.stream.labels.checkpoint import Checkpoint
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.loop import LearnLoop
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore
from service.stream.labels.tables import ChangelogTable, Writes
from service.stream.models.served import initial_envelope

from ..memory import MemoryKafka, outputs, settings

REQUESTS, LABELS = "abstain.label-requests", "abstain.labels"


@dataclass
class Consumer:
    """What the loop reads of its consumer here: assignment, pauses, high-water marks."""

    assigned: set[TopicPartition]
    highs: dict[TopicPartition, int] = field(default_factory=dict)
    held: set[TopicPartition] = field(default_factory=set)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def paused(self) -> set[TopicPartition]:
        return set(self.held)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.highs.get(tp)

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        return {}  # nothing new


@dataclass
class Caught:
    """The joiner's clock and what it was told."""

    now: float = 500.0
    told: list[tuple[int, float]] = field(default_factory=list)


def loop(**kw: object) -> tuple[LearnLoop, Caught]:
    s = settings(**kw)
    kafka, caught = MemoryKafka(), Caught()
    out = outputs(kafka, s, CollectorRegistry())
    writes = Writes()
    tables = [ChangelogTable(changelog_topic("app", n), writes) for n in ("p", "o", "m")]
    initial = {n: initial_envelope(n, c) for n, c in s.models.items()}
    joiner = LabelJoiner(
        s,
        pending=PendingStore(kafka.table("pending")),
        parked=ParkedStore(kafka.table("orphans")),
        models=ModelStore(kafka.table("models"), initial),
        outputs=out,
        metrics=out.metrics,
        clock=lambda: caught.now,
    )
    joiner.caught_up = lambda partition, now: caught.told.append((partition, now))  # type: ignore[method-assign]
    never: Any = None
    learn = LearnLoop(
        s,
        joiner,
        tables,
        Checkpoint(writes, commit_interval=1.0),
        Progress(lambda: 0.0),
        consumer_factory=never,
        producer_factory=never,
        reader_factory=never,
    )
    return learn, caught


def test_a_requests_partition_handled_up_to_its_mark_is_caught_up() -> None:
    learn, caught = loop()
    r0, r1, l0 = TopicPartition(REQUESTS, 0), TopicPartition(REQUESTS, 1), TopicPartition(LABELS, 0)
    learn.state.owned = frozenset({0, 1})
    learn.state.committed = {r0: 4, r1: 0, l0: 0}
    learn.progress.mark(REQUESTS, 0, 9)  # handled up to offset 9: position 10
    consumer = Consumer({r0, r1, l0}, highs={r0: 10, r1: 3, l0: 0})
    learn._caught_up(consumer)  # type: ignore[arg-type]
    assert caught.told == [(0, 500.0)]  # partition 1 has 3 records left; labels do not count


def test_a_partition_paused_not_owned_or_without_a_mark_is_not_reported() -> None:
    learn, caught = loop()
    tps = [TopicPartition(REQUESTS, p) for p in range(4)]
    learn.state.owned = frozenset({0, 1, 2})  # 3: its tables are still being read
    learn.state.committed = {tp: 5 for tp in tps}
    consumer = Consumer(set(tps), highs={tps[0]: 5, tps[1]: -1, tps[3]: 5}, held={tps[0]})
    learn._caught_up(consumer)  # type: ignore[arg-type]
    assert caught.told == []  # 0 paused (its mark is stale), 1 unknown mark, 2 none, 3 not owned


async def test_an_idle_requests_partition_is_caught_up_when_a_fetch_brings_nothing() -> None:
    learn, caught = loop()
    r0 = TopicPartition(REQUESTS, 0)
    learn.state.owned = frozenset({0})
    learn.state.committed = {r0: 12}
    await learn._round(Consumer({r0}, highs={r0: 12}))  # type: ignore[arg-type]
    assert caught.told == [(0, 500.0)]


@dataclass
class Record:
    """A fetched record, as the loop reads it."""

    topic: str
    partition: int
    offset: int
    key: bytes = b"m"
    value: bytes = b"{}"
    timestamp: int = 1
    headers: tuple[tuple[str, bytes], ...] = ()


@pytest.mark.parametrize(("group_ms", "commits"), [(100.0, [3, 6, 9]), (10_000.0, [])])
async def test_a_long_batch_is_made_durable_and_served_group_by_group(
    monkeypatch: pytest.MonkeyPatch, group_ms: float, commits: list[int]
) -> None:
    """Each record takes 40 ms here: with ``label_group_ms`` 100 what the records staged is
    committed after every third record (written then, not at the batch's end; the last
    record is left to the batch's own commit); with a group longer than the batch, only the
    batch's own commit writes it."""
    learn, _ = loop(label_group_ms=group_ms)
    clock = [0.0]
    monkeypatch.setattr(loop_module, "_now", lambda: clock[0])
    handled: list[int] = []
    committed: list[int] = []

    async def handle(message: RawMessage) -> None:
        clock[0] += 0.04
        handled.append(message.offset)

    async def commit_group() -> None:
        committed.append(len(handled))

    learn.joiner.handle = handle  # type: ignore[method-assign]
    learn.joiner.commit_group = commit_group  # type: ignore[method-assign]
    requests = [Record(REQUESTS, 0, o) for o in range(4)]
    labels = [Record(LABELS, 0, o) for o in range(6)]
    await learn._handle({TopicPartition(LABELS, 0): labels, TopicPartition(REQUESTS, 0): requests})
    assert handled == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5]  # requests first, then labels
    assert committed == commits  # records handled at each group's commit
