"""The batch producer over a fake aiokafka producer (no broker): columns go where their
records would, a pipelined producer never waits for the broker and fills the batch that
waits, and every future follows the broker's answer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.errors import KafkaTimeoutError

from service.stream.kafka.produce import BatchProducer, Column, Outgoing, OutRecord, partition_for


class Batch:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.records: list[tuple[bytes | None, bytes | None]] = []
        self.headers: list[Any] = []

    def append(self, *, key: Any, value: Any, timestamp: Any, headers: Any) -> Any:
        if len(self.records) >= self.limit or len(value or b"") > 1000:
            return None
        self.records.append((key, value))
        self.headers.append(headers)
        return object()

    def record_count(self) -> int:
        return len(self.records)


@dataclass
class Broker:
    """aiokafka as the batch producer meets it: ``send_batch`` waits while the partition's
    last batch has not left (here: until the test lets it), each batch is acknowledged when
    the test says so."""

    limit: int = 4
    counts: dict[str, int] = field(default_factory=lambda: {"t": 2, "u": 3})
    handed: list[tuple[str, int, list[tuple[bytes | None, bytes | None]]]] = field(
        default_factory=list
    )
    headers: list[Any] = field(default_factory=list)  # of every record handed, in order
    acks: list[asyncio.Future[Any]] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)  # set: batches leave at once
    fail: Exception | None = None

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.counts[topic]))

    def create_batch(self) -> Batch:
        return Batch(self.limit)

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> Any:
        if self.fail is not None:
            raise self.fail
        if any(t == topic and p == partition for t, p, _ in self.handed):
            await self.gate.wait()  # the last batch of the partition is still waiting
        self.handed.append((topic, partition, batch.records))
        self.headers += batch.headers
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.acks.append(fut)
        return fut

    async def send(self, topic: str, value: Any, *, key: Any, partition: int, headers: Any) -> Any:
        return await self.send_batch(
            Batch(1_000_000).with_record(key, value, headers), topic, partition=partition
        )

    def ack(self) -> None:
        for fut in self.acks:
            if not fut.done():
                fut.set_result(None)


def _with_record(self: Batch, key: Any, value: Any, headers: Any = None) -> Batch:
    self.records.append((key, value))
    self.headers.append(headers)
    return self


Batch.with_record = _with_record  # type: ignore[attr-defined]


async def test_columns_go_where_their_records_go_in_order() -> None:
    broker = Broker(limit=100)
    broker.gate.set()
    columns = Outgoing(
        [
            Column(
                "t",
                [b"a", b"b", b"c", b"d"],
                keys=[b"1", b"2", b"3", b"4"],
                partitions=[0, 3, 2, 1],
            ),
            Column("u", [b"x", b"y"], key=b"m"),
        ],
        [OutRecord("t", None, b"dead", 5)],
    )
    assert [(r.topic, r.key, r.value, r.partition) for r in columns] == [
        ("t", b"1", b"a", 0),
        ("t", b"2", b"b", 3),
        ("t", b"3", b"c", 2),
        ("t", b"4", b"d", 1),
        ("u", b"m", b"x", None),
        ("u", b"m", b"y", None),
        ("t", None, b"dead", 5),
    ]
    plain, piped = Broker(limit=100), Broker(limit=100)
    plain.gate.set()
    piped.gate.set()
    (await BatchProducer(plain).send_many(list(columns))).cancel()
    sent = await BatchProducer(piped, pipelined=True).send_many(columns)
    await asyncio.sleep(0.01)
    by_partition = sorted((t, p, r) for t, p, r in piped.handed)
    assert by_partition == sorted((t, p, r) for t, p, r in plain.handed)
    assert ("t", 1, [(b"2", b"b"), (b"4", b"d"), (None, b"dead")]) in by_partition
    assert ("u", partition_for(b"m", 3), [(b"m", b"x"), (b"m", b"y")]) in by_partition
    piped.ack()
    await sent


async def test_a_pipelined_producer_never_waits_and_fills_the_batch_that_waits() -> None:
    broker = Broker(limit=4)
    producer = BatchProducer(broker, pipelined=True)  # type: ignore[arg-type]
    first = await producer.send_many([OutRecord("t", b"k", b"1", 0)])
    await asyncio.sleep(0.01)
    assert broker.handed == [("t", 0, [(b"k", b"1")])]  # the first batch leaves at once
    second = await producer.send_many([OutRecord("t", b"k", b"2", 0)])
    await asyncio.sleep(0.01)  # taken: it waits for the first batch to leave
    later = [await producer.send_many([OutRecord("t", b"k", v, 0)]) for v in (b"3", b"4")]
    await asyncio.sleep(0.01)
    assert len(broker.handed) == 1  # nobody waited; the records wait together
    broker.gate.set()
    await asyncio.sleep(0.01)
    assert [records for _, _, records in broker.handed] == [
        [(b"k", b"1")],
        [(b"k", b"2")],
        [(b"k", b"3"), (b"k", b"4")],
    ]
    assert not first.done()
    broker.ack()
    await asyncio.gather(first, second, *later)


async def test_a_batch_the_producer_refuses_fails_the_records_in_it() -> None:
    broker = Broker()
    broker.fail = KafkaTimeoutError()
    sent = await BatchProducer(broker, pipelined=True).send_many(  # type: ignore[arg-type]
        [OutRecord("t", b"k", b"1", 0), OutRecord("t", b"k", b"2", 1)]
    )
    with pytest.raises(KafkaTimeoutError):
        await sent


async def test_a_record_too_large_for_a_batch_goes_alone_in_its_place() -> None:
    broker = Broker(limit=2)
    broker.gate.set()
    big = b"x" * 5000
    sent = await BatchProducer(broker, pipelined=True).send_many(  # type: ignore[arg-type]
        [OutRecord("t", b"k", v, 0) for v in (b"1", b"2", b"3", big, b"4")]
    )
    await asyncio.sleep(0.01)
    assert [[v for _, v in records] for _, _, records in broker.handed] == [
        [b"1", b"2"],
        [b"3"],
        [big],
        [b"4"],
    ]
    broker.ack()
    await sent


@pytest.mark.parametrize("pipelined", [False, True])
async def test_every_record_keeps_its_headers_the_first_of_a_partition_too(
    pipelined: bool,
) -> None:
    # the learner's signed table writes: a signature header on some records, none on others
    broker = Broker(limit=100, counts={"t": 1, "u": 3})
    broker.gate.set()
    sig = [("sig", b"1")]
    records = [
        OutRecord("t", b"a", b"1", headers=sig),
        OutRecord("t", b"b", b"2"),
        OutRecord("t", b"c", b"3", headers=[("sig", b"3")]),
        OutRecord("t", b"d", None, headers=[("sig", b"4")]),  # a signed deletion
    ]
    sent = await BatchProducer(broker, pipelined=pipelined).send_many(records)
    await asyncio.sleep(0.01)
    broker.ack()
    await sent
    assert [r for _, _, rs in broker.handed for r in rs] == [(r.key, r.value) for r in records]
    assert broker.headers == [sig, [], [("sig", b"3")], [("sig", b"4")]]
