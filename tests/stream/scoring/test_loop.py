"""The scoring loop over fake aiokafka clients (no broker): offsets are committed only once
every output of their batch is acknowledged, a failed produce scores again from the last
commit, a rebalance waits for what is in flight, records land on the right partitions."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError, NodeNotReadyError
from prometheus_client import CollectorRegistry

from service.records import Champions
from service.stream.kafka import groups
from service.stream.kafka.loop import Progress
from service.stream.kafka.produce import BatchProducer, OutRecord, partition_for
from service.stream.models.served import ServedModel
from service.stream.scoring.loop import ScoreLoop, score_group
from service.stream.scoring.scorer import Scorer

from ..memory import CFG, MemoryKafka, outputs, settings, trained

FEATURES, DECISIONS, REQUESTS = "abstain.features", "abstain.decisions", "abstain.label-requests"
TP0, TP1 = TopicPartition(FEATURES, 0), TopicPartition(FEATURES, 1)


@dataclass
class Record:
    """What aiokafka's consumer hands out (the fields the loop reads)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int = 1_000
    headers: tuple[tuple[str, bytes], ...] = ()


def event(tp: TopicPartition, offset: int) -> Record:
    body = orjson.dumps({"id": f"e{tp.partition}-{offset}", "features": [offset, 1.0, -1.0]})
    return Record(tp.topic, tp.partition, offset, None, body)


@dataclass
class FakeConsumer:
    fetches: list[dict[TopicPartition, list[Record]]]
    assigned: set[TopicPartition] = field(default_factory=lambda: {TP0, TP1})
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)
    seeks: list[tuple[TopicPartition, int]] = field(default_factory=list)
    stored: dict[TopicPartition, int] = field(default_factory=dict)
    paused: set[TopicPartition] = field(default_factory=set)
    firsts: dict[TopicPartition, int] = field(default_factory=dict)
    positions: dict[TopicPartition, int] = field(default_factory=dict)

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None) -> Any:
        if self.fetches:
            fetched = self.fetches.pop(0)
            for tp, records in fetched.items():
                if records:
                    self.positions[tp] = records[-1].offset + 1
            return fetched
        await asyncio.sleep(timeout_ms / 1000)
        return {}

    async def position(self, tp: TopicPartition) -> int:
        return self.positions.get(tp, 0)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))
        self.stored.update(offsets)

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.stored.get(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))
        self.positions[tp] = offset

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self.seeks += [(tp, 0) for tp in tps]

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.firsts.get(tp, 0) for tp in tps}

    def pause(self, *tps: TopicPartition) -> None:
        self.paused |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused -= set(tps)


class FakeBatch:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.records: list[tuple[bytes | None, bytes]] = []

    def append(self, *, key: bytes | None, value: bytes, timestamp: Any, headers: Any) -> Any:
        if len(self.records) >= self.limit or len(value) > 10_000:
            return None
        self.records.append((key, value))
        return object()

    def record_count(self) -> int:
        return len(self.records)


@dataclass
class FakeProducer:
    """Batches are acknowledged when the test resolves their futures (``ack``/``fail``)."""

    limit: int = 1000
    counts: dict[str, int] = field(default_factory=lambda: {DECISIONS: 4, REQUESTS: 2})
    batches: list[tuple[str, int, FakeBatch, asyncio.Future[Any]]] = field(default_factory=list)
    singles: list[tuple[str, int, bytes]] = field(default_factory=list)
    auto_ack: bool = True

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.counts.get(topic, 1)))

    def create_batch(self) -> FakeBatch:
        return FakeBatch(self.limit)

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.auto_ack:
            fut.set_result(None)
        self.batches.append((topic, partition, batch, fut))
        return fut

    async def send(
        self, topic: str, value: bytes, *, key: Any, partition: int, headers: Any
    ) -> Any:
        self.singles.append((topic, partition, value))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    def records(self, topic: str) -> list[tuple[int, bytes | None, bytes]]:
        return [(p, k, v) for t, p, b, _ in self.batches if t == topic for k, v in b.records]

    def ack(self, error: Exception | None = None) -> None:
        for *_, fut in self.batches:
            if not fut.done():
                fut.set_exception(error) if error else fut.set_result(None)


def loop_with(
    fetches: list[dict[TopicPartition, list[Record]]], served: ServedModel | None = None
) -> tuple[ScoreLoop, FakeConsumer, FakeProducer]:
    s = settings(partitions={"features": 2, "decisions": 4})
    out = outputs(MemoryKafka(), s, CollectorRegistry())
    model = {"m": served or trained(CFG, 30)}
    scorer = Scorer(s, lambda: (model, Champions()), out, out.metrics, clock=lambda: 50.0)
    consumer, producer = FakeConsumer(fetches), FakeProducer()
    loop = ScoreLoop(
        s,
        scorer,
        Progress(lambda: 50.0),
        consumer_factory=lambda _: consumer,
        producer_factory=lambda: producer,
    )  # type: ignore[arg-type,return-value]
    return loop, consumer, producer


async def run_until(loop: ScoreLoop, done: Any, timeout: float = 5.0) -> asyncio.Task[None]:
    ready = asyncio.Event()
    ready.set()
    task = asyncio.create_task(loop.run(ready))
    deadline = asyncio.get_running_loop().time() + timeout
    while not done() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert done(), "condition not reached"
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_the_score_group_is_the_app_id_with_a_suffix() -> None:
    assert score_group("fraud") == "fraud-score"


async def test_offsets_are_committed_only_once_every_output_of_the_batch_is_acknowledged() -> None:
    loop, consumer, producer = loop_with(
        [{TP0: [event(TP0, 0), event(TP0, 1)], TP1: [event(TP1, 7)]}]
    )
    producer.auto_ack = False
    task = await run_until(loop, lambda: producer.batches)
    await asyncio.sleep(0.05)
    assert consumer.commits == []  # scored and sent, not yet acknowledged
    producer.ack()
    await asyncio.sleep(0.05)
    assert consumer.commits == [{TP0: 2, TP1: 8}]
    assert loop.progress.offsets == {(FEATURES, 0): 1, (FEATURES, 1): 7}
    await stop(task)


async def test_decisions_follow_their_events_partition_and_requests_their_models_key() -> None:
    fetched = {TP0: [event(TP0, o) for o in range(5)], TP1: [event(TP1, o) for o in range(5)]}
    loop, _, producer = loop_with([fetched], served=ServedModel.initial("m", CFG))
    task = await run_until(loop, lambda: producer.batches)
    decisions = producer.records(DECISIONS)
    assert len(decisions) == 10
    for partition, key, value in decisions:
        assert key is not None
        assert key.decode() == orjson.loads(value)["id"]
        assert partition == int(key.decode()[1])  # "e<partition>-<offset>"
    requests = producer.records(REQUESTS)
    assert requests  # a fresh model asks
    assert {p for p, _, _ in requests} == {partition_for(b"m", 2)}
    await stop(task)


async def test_a_failed_produce_commits_nothing_and_scores_again_from_the_last_commit() -> None:
    loop, consumer, producer = loop_with([{TP0: [event(TP0, 0), event(TP0, 1)]}])
    producer.auto_ack = False
    task = await run_until(loop, lambda: producer.batches)
    producer.ack()
    await asyncio.sleep(0.05)
    assert consumer.commits == [{TP0: 2}]
    sent = len(producer.batches)
    consumer.fetches.append({TP0: [event(TP0, 2), event(TP0, 3)]})
    while len(producer.batches) == sent:
        await asyncio.sleep(0.01)
    producer.ack(KafkaTimeoutError())  # the broker never acknowledges the second batch
    await asyncio.sleep(1.5)  # RETRY_SECONDS, then the rewind
    assert consumer.commits == [{TP0: 2}]  # nothing past the failure
    assert (TP0, 2) in consumer.seeks  # scored again from the committed offset
    await stop(task)


async def test_a_rebalance_waits_for_the_batches_in_flight_and_commits_them() -> None:
    loop, consumer, producer = loop_with([{TP1: [event(TP1, 0), event(TP1, 1), event(TP1, 2)]}])
    producer.auto_ack = False
    task = await run_until(loop, lambda: producer.batches)
    revoke = asyncio.create_task(loop.revoked(frozenset({TP1})))
    await asyncio.sleep(0.05)
    assert not revoke.done()  # waits for the acknowledgement
    assert loop.view.paused  # on purpose, while it drains
    producer.ack()
    await asyncio.wait_for(revoke, 2)
    assert consumer.commits == [{TP1: 3}]
    assert not loop.view.paused  # waiting for the group (or a broker) is not a pause
    await stop(task)


async def test_records_larger_than_a_batch_go_alone_and_full_batches_are_split() -> None:
    producer = FakeProducer(limit=2)
    batches = BatchProducer(producer)  # type: ignore[arg-type]
    big = b"x" * 20_000
    records = [
        OutRecord(DECISIONS, b"k", b"1", 1),
        OutRecord(DECISIONS, b"k", b"2", 1),
        OutRecord(DECISIONS, b"k", b"3", 5),
        OutRecord(DECISIONS, b"k", big, 1),
    ]
    acked = await batches.send_many(records)
    await acked
    assert [(p, [v for _, v in b.records]) for _, p, b, _ in producer.batches] == [
        (1, [b"1", b"2"]),
        (1, [b"3"]),  # partition 5 of 4 is 1; two per batch
    ]
    assert producer.singles == [(DECISIONS, 1, big)]


async def test_pause_and_resume_cover_every_assigned_partition() -> None:
    loop, consumer, _ = loop_with([])
    task = await run_until(loop, lambda: loop.consumer is not None)
    assert loop.pause() == [TP0, TP1]
    assert consumer.paused == {TP0, TP1}
    loop.resume()
    assert consumer.paused == set()
    await stop(task)


@dataclass
class FakeAdmin:
    """The faust group's offsets; ``failures``: how many calls fail first (Kafka away)."""

    offsets: dict[TopicPartition, int]
    asked: list[str] = field(default_factory=list)
    failures: int = 0

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def list_consumer_group_offsets(self, group: str, partitions: Any) -> Any:
        self.asked.append(group)
        if self.failures:
            self.failures -= 1
            raise NodeNotReadyError("the coordinator is away")
        return {tp: Meta(o) for tp, o in self.offsets.items() if tp in partitions}


@dataclass
class Meta:
    offset: int


def with_admin(admin: FakeAdmin) -> tuple[ScoreLoop, FakeConsumer]:
    loop, consumer, _ = loop_with([])
    loop.starts.admin_factory = lambda: admin  # type: ignore[assignment,return-value]
    loop.consumer = consumer  # type: ignore[assignment]
    return loop, consumer


async def test_partitions_the_score_group_never_committed_start_where_the_faust_group_did() -> None:
    admin = FakeAdmin({TP0: 42, TP1: 7})
    loop, consumer = with_admin(admin)
    consumer.stored = {TP1: 3}  # the score group has its own offset there: kept
    await loop.assigned(frozenset({TP0, TP1}))
    assert consumer.paused == {TP0, TP1}  # nothing read before the starts are known
    assert not loop.view.recovery().completed
    await loop._start(consumer)  # type: ignore[arg-type]
    assert admin.asked == ["abstain"]  # the worker's faust group (the app id)
    assert sorted(consumer.seeks) == [(TP0, 42), (TP1, 3)]
    assert consumer.paused == set()
    assert loop.view.recovery().completed
    assert loop.view.committed_next(TP1) == 3
    # a rewind before the score group ever committed goes back to the adopted offset
    consumer.seeks.clear()
    loop.state.rewind = True
    await loop._rewind(consumer)  # type: ignore[arg-type]
    assert sorted(consumer.seeks) == [(TP0, 42), (TP1, 3)]


async def test_a_partition_no_group_ever_committed_starts_at_its_first_kept_record() -> None:
    loop, consumer = with_admin(FakeAdmin({}))
    consumer.firsts = {TP0: 5, TP1: 0}
    await loop.assigned(frozenset({TP0, TP1}))
    await loop._start(consumer)  # type: ignore[arg-type]
    assert sorted(consumer.seeks) == [(TP0, 5), (TP1, 0)]
    assert consumer.paused == set()


async def test_a_start_kafka_cannot_tell_is_not_consumed_and_the_worker_is_not_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The faust group's offsets cannot be read (the coordinator is away): the partitions
    stay paused, nobody seeks them to the first record, the view is not complete; the next
    attempt (a second later) that Kafka answers starts them where the faust group was."""
    monkeypatch.setattr(groups, "START_TIMEOUT_SECONDS", 0.3)  # retriable: asked until then
    admin = FakeAdmin({TP0: 42, TP1: 7}, failures=10**6)
    loop, consumer = with_admin(admin)
    clock = [100.0]
    loop.starts.clock = lambda: clock[0]
    await loop.assigned(frozenset({TP0, TP1}))
    await loop._start(consumer)  # type: ignore[arg-type]
    assert consumer.seeks == []
    assert consumer.paused == {TP0, TP1}
    assert loop.resume() == []  # a stall test's resume does not release them either
    assert consumer.paused == {TP0, TP1}
    assert not loop.view.recovery().completed
    assert loop.view.paused
    asked = len(admin.asked)
    await loop._start(consumer)  # type: ignore[arg-type]
    assert len(admin.asked) == asked  # not again within the second: scoring goes on
    admin.failures = 0
    clock[0] += 1.5
    await loop._start(consumer)  # type: ignore[arg-type]
    assert sorted(consumer.seeks) == [(TP0, 42), (TP1, 7)]
    assert consumer.paused == set()
    assert loop.view.recovery().completed
    assert not loop.view.paused


async def test_a_rewind_with_no_known_start_asks_kafka_again_instead_of_the_first_record() -> None:
    loop, consumer = with_admin(FakeAdmin({}))
    loop.state.rewind = True
    await loop._rewind(consumer)  # type: ignore[arg-type]
    assert consumer.seeks == []  # TP0 and TP1 never started: no offset to go back to
    assert loop.starts.unknown == {TP0, TP1}
    assert consumer.paused == {TP0, TP1}


async def test_a_revoked_partition_is_no_longer_waited_for() -> None:
    loop, consumer = with_admin(FakeAdmin({}, failures=10**6))
    await loop.assigned(frozenset({TP0, TP1}))
    consumer.assigned = {TP0}
    await loop.revoked(frozenset({TP1}))
    assert loop.starts.unknown == {TP0}
