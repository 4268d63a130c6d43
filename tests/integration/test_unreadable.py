"""A record batch the client cannot read, on a real broker: where aiokafka fails, and what
:class:`~service.stream.kafka.unreadable.Reader` makes of it. The batch is real: a record
whose header key is not UTF-8, written by kcat (librdkafka); Kafka's broker takes it,
aiokafka cannot parse it. A decompression bomb is real too: a zstd batch written as it is,
refused by the bound before it is inflated whole."""

from __future__ import annotations

import asyncio
import importlib
import json
import resource
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from faults.bombs import write_batch, zstd_bomb
from faults.kafkaio import Out, create_topics, produce_records
from faults.kcat import write_unreadable

from service.records.skips import SkipOrder
from service.stream.kafka import internals
from service.stream.kafka.internals import failed_fetch
from service.stream.kafka.unreadable import Reader, SkipBook, Unreadable, UnreadableBatch

pytestmark = pytest.mark.integration

MIB = 1 << 20


def _bad_record(bootstrap: str, topic: str, partition: int, count: int = 1) -> None:
    """``count`` records in one batch that the client cannot read."""
    write_unreadable(bootstrap, topic, partition, [{"bad": i} for i in range(count)])


def _good(topic: str, partition: int, names: list[str]) -> list[Out]:
    return [Out(n.encode(), json.dumps({"id": n}).encode(), partition=partition) for n in names]


def _topic(bootstrap: str, partitions: int) -> str:
    name = f"unreadable-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, {name: partitions})
    return name


async def _consumer(bootstrap: str, tps: list[TopicPartition]) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    await consumer.start()
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    return consumer


async def _drain(reader: Reader, rounds: int = 30) -> list[Any]:
    out: list[Any] = []
    for _ in range(rounds):
        for records in (await reader.getmany(timeout_ms=300)).values():
            out += records
    return out


async def _until_it_fails(consumer: AIOKafkaConsumer) -> None:
    for _ in range(20):
        await consumer.getmany(timeout_ms=300)


def test_aiokafka_fails_at_the_batch_and_the_failure_says_where(kafka_bootstrap: str) -> None:
    topic = _topic(kafka_bootstrap, 1)
    tp = TopicPartition(topic, 0)
    produce_records(kafka_bootstrap, topic, _good(topic, 0, ["a", "b", "c"]))
    _bad_record(kafka_bootstrap, topic, 0, count=2)
    produce_records(kafka_bootstrap, topic, _good(topic, 0, ["d"]))

    async def run() -> list[Any]:
        consumer = await _consumer(kafka_bootstrap, [tp])
        found = []
        try:
            for _ in range(3):  # the same failure every time, the position where it was
                with pytest.raises(UnicodeDecodeError) as caught:
                    await _until_it_fails(consumer)
                found.append((failed_fetch(caught.value), await consumer.position(tp)))
        finally:
            await consumer.stop()
        return found

    for failed, position in asyncio.run(run()):
        assert failed is not None
        assert (failed.tp, failed.first, failed.end) == (tp, 3, 5)
        assert position == 0  # the three records before it were never handed out


def test_the_reader_returns_every_readable_record_once_and_stops_at_the_batch(
    kafka_bootstrap: str,
) -> None:
    topic = _topic(kafka_bootstrap, 2)
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    produce_records(kafka_bootstrap, topic, _good(topic, 0, [f"a{i}" for i in range(200)]))
    produce_records(kafka_bootstrap, topic, _good(topic, 1, [f"b{i}" for i in range(5)]))
    _bad_record(kafka_bootstrap, topic, 1)
    produce_records(kafka_bootstrap, topic, _good(topic, 1, [f"c{i}" for i in range(5)]))
    produce_records(kafka_bootstrap, topic, _good(topic, 0, [f"d{i}" for i in range(50)]))

    async def run() -> tuple[list[Any], list[Any], Unreadable, set[TopicPartition]]:
        consumer = await _consumer(kafka_bootstrap, [p0, p1])
        unreadable = Unreadable()
        reader = Reader(consumer, policy="stop", unreadable=unreadable)
        try:
            before = await _drain(reader)
            paused = set(consumer.paused())
            books = SkipBook()
            (batch,) = unreadable.of([p1])
            books.add(SkipOrder(topic, 1, batch.first, batch.end))
            assert reader.release(books) == {p1: batch.end}
            after = await _drain(reader, rounds=10)
        finally:
            await consumer.stop()
        return before, after, unreadable, paused

    before, after, unreadable, paused = asyncio.run(run())
    names = [json.loads(r.value)["id"] for r in before]
    assert sorted(names) == sorted(
        [f"a{i}" for i in range(200)] + [f"b{i}" for i in range(5)] + [f"d{i}" for i in range(50)]
    )
    assert paused == {p1}
    assert [json.loads(r.value)["id"] for r in after] == [f"c{i}" for i in range(5)]
    assert unreadable.stopped == {}


def test_the_skip_policy_reads_past_the_batch_and_hands_it_over(kafka_bootstrap: str) -> None:
    topic = _topic(kafka_bootstrap, 1)
    tp = TopicPartition(topic, 0)
    produce_records(kafka_bootstrap, topic, _good(topic, 0, ["a", "b"]))
    _bad_record(kafka_bootstrap, topic, 0, count=3)
    produce_records(kafka_bootstrap, topic, _good(topic, 0, ["c"]))
    skipped: list[UnreadableBatch] = []

    async def on_skip(batch: UnreadableBatch) -> None:
        skipped.append(batch)

    async def run() -> list[Any]:
        consumer = await _consumer(kafka_bootstrap, [tp])
        try:
            return await _drain(Reader(consumer, policy="skip", on_skip=on_skip), rounds=10)
        finally:
            await consumer.stop()

    records = asyncio.run(run())
    assert [json.loads(r.value)["id"] for r in records] == ["a", "b", "c"]
    assert [(b.first, b.end) for b in skipped] == [(2, 5)]
    assert "UnicodeDecodeError" in skipped[0].error


@pytest.fixture
def bounded() -> Iterator[int]:
    """aiokafka's decoders bounded to 16 MiB for the test (its own ones back after)."""
    saved = {
        (m, n): getattr(importlib.import_module(m), n)
        for m, names in internals._DECODING_MODULES.items()
        for n in names
    }
    internals.bound_inflation(16 * MIB)
    yield 16 * MIB
    for (m, n), decode in saved.items():
        setattr(importlib.import_module(m), n, decode)


def test_a_batch_that_inflates_past_the_bound_is_a_batch_that_cannot_be_read(
    kafka_bootstrap: str, bounded: int
) -> None:
    topic = _topic(kafka_bootstrap, 2)
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    produce_records(kafka_bootstrap, topic, _good(topic, 1, ["a", "b"]))
    write_batch(kafka_bootstrap, p1, zstd_bomb(256 * MIB))  # 16 times the bound
    produce_records(kafka_bootstrap, topic, _good(topic, 1, ["c"]))
    produce_records(kafka_bootstrap, topic, _good(topic, 0, [f"z{i}" for i in range(20)]))

    async def run() -> tuple[list[Any], list[Any], Unreadable, int]:
        consumer = await _consumer(kafka_bootstrap, [p0, p1])
        unreadable = Unreadable()
        reader = Reader(consumer, policy="stop", unreadable=unreadable)
        try:
            before = await _drain(reader, rounds=10)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            (batch,) = unreadable.of([p1])
            assert (batch.first, batch.end) == (2, 3)
            assert "InflateRefused" in batch.error
            books = SkipBook()
            books.add(SkipOrder(topic, 1, batch.first, batch.end))
            assert reader.release(books) == {p1: 3}
            after = await _drain(reader, rounds=5)
        finally:
            await consumer.stop()
        return before, after, unreadable, peak

    began = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    before, after, unreadable, peak = asyncio.run(run())
    assert sorted(json.loads(r.value)["id"] for r in before) == sorted(
        ["a", "b"] + [f"z{i}" for i in range(20)]
    )
    assert [json.loads(r.value)["id"] for r in after] == ["c"]
    assert unreadable.stopped == {}
    # inflated whole, the batch would have taken 256 MiB at least (KiB here)
    assert peak - began < 64 * 1024


def test_an_order_read_before_the_batch_is_honoured_when_the_batch_fails_there(
    kafka_bootstrap: str,
) -> None:
    topic = _topic(kafka_bootstrap, 1)
    tp = TopicPartition(topic, 0)
    produce_records(kafka_bootstrap, topic, _good(topic, 0, ["a", "b"]))
    _bad_record(kafka_bootstrap, topic, 0, count=2)
    produce_records(kafka_bootstrap, topic, _good(topic, 0, ["c"]))
    books = SkipBook()
    books.add(SkipOrder(topic, 0, 2, 4, by="ops"))

    async def run() -> tuple[list[Any], dict[TopicPartition, int], Unreadable]:
        consumer = await _consumer(kafka_bootstrap, [tp])
        unreadable = Unreadable()
        reader = Reader(consumer, policy="stop", unreadable=unreadable, orders=books)
        try:
            records = await _drain(reader, rounds=10)
            assert not consumer.paused()
            return records, reader.release(books), unreadable
        finally:
            await consumer.stop()

    records, moved, unreadable = asyncio.run(run())
    assert [json.loads(r.value)["id"] for r in records] == ["a", "b", "c"]
    assert moved == {tp: 4}  # the loop commits the offset after the batch
    assert unreadable.stopped == {}


def test_an_order_that_names_a_batch_that_reads_skips_nothing(kafka_bootstrap: str) -> None:
    topic = _topic(kafka_bootstrap, 1)
    tp = TopicPartition(topic, 0)
    produce_records(kafka_bootstrap, topic, _good(topic, 0, ["a"]))
    produce_records(kafka_bootstrap, topic, _good(topic, 0, ["b", "c"]))  # offsets 1-2
    produce_records(kafka_bootstrap, topic, _good(topic, 0, ["d"]))
    books = SkipBook()
    books.add(SkipOrder(topic, 0, 1, 3, by="forged"))

    async def run() -> tuple[list[Any], dict[TopicPartition, int]]:
        consumer = await _consumer(kafka_bootstrap, [tp])
        reader = Reader(consumer, policy="stop", orders=books)
        try:
            return await _drain(reader, rounds=10), reader.release(books)
        finally:
            await consumer.stop()

    records, moved = asyncio.run(run())
    assert [json.loads(r.value)["id"] for r in records] == ["a", "b", "c", "d"]
    assert moved == {}
