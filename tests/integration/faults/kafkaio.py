"""Blocking helpers around aiokafka for the fault tests: create topics, produce in bulk,
read a topic to its end. Each call runs its own short event loop; nothing here is shared
with the worker under test."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from service.records.packed import is_packed, unpack
from service.stream.labels.loop import learn_group
from service.stream.scoring.loop import score_group

from . import HarnessError

__all__ = [
    "Out",
    "Rec",
    "abandon",
    "create_topics",
    "end_offsets",
    "group_lag",
    "loads",
    "partitions_of",
    "produce",
    "produce_records",
    "read_topic",
    "started_producer",
]

MAX_REQUEST = 8 * 1024 * 1024
#: a producer that has not started, or not had a chunk acknowledged, in this long is replaced
STUCK_SECONDS = 30.0
#: how long a producer is made again while the broker does not answer (an outage of 20 s,
#: then a broker that starts slowly on a busy machine)
BROKER_AWAY_SECONDS = 120.0


def loads(raw: bytes | None) -> Any:
    """Parse JSON the way the service does (``NaN`` / ``Infinity`` allowed), or a model
    version's packed form."""
    if raw is None:
        return None
    return unpack(raw) if is_packed(raw) else json.loads(raw)


@dataclass(frozen=True, slots=True)
class Rec:
    """One record as read back."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp: int = 0  # ms, the broker's (or the writer's) time of the record

    def json(self) -> Any:
        return loads(self.value)


@dataclass(frozen=True, slots=True)
class Out:
    """One record to write: ``value`` None is a tombstone; ``partition`` None lets the
    producer's partitioner choose (by key); ``headers`` as Kafka takes them."""

    key: bytes | None
    value: bytes | None
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def _policy(compacted: bool) -> dict[str, str]:
    return {"cleanup.policy": "compact"} if compacted else {}


def create_topics(
    bootstrap: str, partitions: Mapping[str, int], *, compacted: Iterable[str] = ()
) -> None:
    """Create ``name -> partitions`` (an existing topic is left alone)."""
    compact = set(compacted)

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            new = [
                NewTopic(name, count, 1, topic_configs=_policy(name in compact))
                for name, count in partitions.items()
            ]
            response = await admin.create_topics(new)
            for topic_error in response.topic_errors:
                name, code = topic_error[0], topic_error[1]
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise HarnessError(f"cannot create topic {name}: error {code}")
        finally:
            await admin.close()

    asyncio.run(run())


def produce(
    bootstrap: str,
    topic: str,
    items: Iterable[tuple[bytes | None, bytes]],
    *,
    attempts: int = 30,
) -> list[tuple[int, int]]:
    """Send ``(key, value)`` pairs, waiting for every acknowledgement; returns where each
    landed, ``(partition, offset)``, in order.

    A chunk that fails (broker away) is sent again, up to ``attempts`` times one second
    apart, and a producer that cannot connect is made again for up to
    :data:`BROKER_AWAY_SECONDS`: a retried chunk may land twice, which the fault tests
    tolerate by design."""
    return produce_records(bootstrap, topic, [Out(k, v) for k, v in items], attempts=attempts)


def produce_records(
    bootstrap: str, topic: str, records: Iterable[Out], *, attempts: int = 30
) -> list[tuple[int, int]]:
    """:func:`produce` for :class:`Out` records: tombstones, chosen partitions, headers.

    A producer that has not started, or whose chunk is not acknowledged, within
    :data:`STUCK_SECONDS` is closed and a new one made: aiokafka 0.14.0 can wedge a client
    for good when a broker comes back. Bootstrapped by a broker still starting (or shutting
    down), a client learns no broker (``No broker metadata found in MetadataResponse``) and
    keeps the bootstrap connection as its only way to the cluster; once that connection
    drops, it asks no one for metadata again, and an idempotent producer's start (its
    ``InitProducerIdRequest``) waits for a broker forever. A chunk that fails is sent
    again by a new producer too: an idempotent producer whose batch expired while its
    partition had no leader (the broker back, its leaders not yet elected) has used that
    batch's sequence numbers, and the broker refuses every later batch of the partition
    (``OutOfOrderSequenceNumber``). A new producer bootstraps afresh, with a new producer
    id."""
    batch = list(records)

    async def send(producer: AIOKafkaProducer, out: Out) -> Any:
        return await producer.send(
            topic,
            out.value,
            key=out.key,
            partition=out.partition,
            headers=list(out.headers) or None,
        )

    async def acked(producer: AIOKafkaProducer, chunk: list[Out]) -> list[Any]:
        futures = [await send(producer, out) for out in chunk]
        return list(await asyncio.gather(*futures))

    async def run() -> list[tuple[int, int]]:
        producer = await started_producer(bootstrap)
        where: list[tuple[int, int]] = []
        try:
            for start in range(0, len(batch), 2000):
                chunk = batch[start : start + 2000]
                for attempt in range(attempts):
                    try:
                        metas = await asyncio.wait_for(acked(producer, chunk), STUCK_SECONDS)
                        where += [(m.partition, m.offset) for m in metas]
                        break
                    except (KafkaError, TimeoutError) as exc:
                        if attempt == attempts - 1:
                            raise HarnessError(f"cannot produce to {topic}: {exc!r}") from exc
                        await abandon(producer)
                        await asyncio.sleep(1.0)
                        producer = await started_producer(bootstrap)
        finally:
            await abandon(producer)
        return where

    return asyncio.run(run())


async def started_producer(bootstrap: str, *, linger_ms: int = 5) -> AIOKafkaProducer:
    """A started idempotent producer (acks=all). One that has not started within
    :data:`STUCK_SECONDS` is closed and made again, one second apart, for up to
    :data:`BROKER_AWAY_SECONDS` (see :func:`produce_records`)."""
    deadline = time.monotonic() + BROKER_AWAY_SECONDS
    while True:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            linger_ms=linger_ms,
            max_request_size=MAX_REQUEST,
            acks="all",
            enable_idempotence=True,
        )
        try:
            await asyncio.wait_for(producer.start(), STUCK_SECONDS)
            return producer
        except (KafkaError, TimeoutError) as exc:
            await abandon(producer)
            if time.monotonic() > deadline:
                raise HarnessError(f"cannot connect to {bootstrap}: {exc!r}") from exc
            await asyncio.sleep(1.0)


async def abandon(producer: AIOKafkaProducer) -> None:
    """Stop ``producer``; one that cannot flush what it holds within a few seconds (no
    broker) has its connections closed and is left (its loop ends with the call)."""
    try:
        await asyncio.wait_for(producer.stop(), 5.0)
    except (KafkaError, TimeoutError):
        await producer.client.close()


async def partitions_of(bootstrap: str, topic: str) -> list[TopicPartition]:
    """The partitions of ``topic`` (empty when it does not exist)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (meta,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if meta["error_code"] != 0:
        return []
    return [TopicPartition(topic, p["partition"]) for p in meta["partitions"]]


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """``partition -> end offset`` of ``topic`` (empty if it does not exist)."""

    async def run() -> dict[int, int]:
        tps = await partitions_of(bootstrap, topic)
        if not tps:
            return {}
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        await consumer.start()
        try:
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        return {tp.partition: int(off) for tp, off in ends.items()}

    return asyncio.run(run())


def _headers(record: Any) -> tuple[tuple[str, bytes], ...]:
    return tuple(record.headers or ())


def read_topic(bootstrap: str, topic: str, *, timeout: float = 120.0) -> list[Rec]:
    """Every record of ``topic`` up to its end offsets now, by (partition, offset)."""

    async def run() -> list[Rec]:
        tps = await partitions_of(bootstrap, topic)
        if not tps:
            return []
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            max_partition_fetch_bytes=MAX_REQUEST,
            fetch_max_bytes=4 * MAX_REQUEST,
        )
        await consumer.start()
        out: list[Rec] = []
        try:
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            end = await consumer.end_offsets(tps)
            deadline = time.monotonic() + timeout
            while True:
                positions = {tp: await consumer.position(tp) for tp in tps}
                if all(positions[tp] >= end[tp] for tp in tps):
                    break
                if time.monotonic() > deadline:
                    raise HarnessError(f"reading {topic}: at {positions}, end {end}")
                batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
                for recs in batch.values():
                    out += [
                        Rec(
                            r.topic, r.partition, r.offset, r.key, r.value, _headers(r), r.timestamp
                        )
                        for r in recs
                        if r.offset < end[TopicPartition(r.topic, r.partition)]
                    ]
        finally:
            await consumer.stop()
        return sorted(out, key=lambda r: (r.partition, r.offset))

    return asyncio.run(run())


def group_lag(bootstrap: str, group: str, topics: Iterable[str]) -> dict[str, int]:
    """Per ``topic[partition]``: end offset minus the offset ``group`` has committed
    (an uncommitted partition counts from 0). A worker's app id as ``group`` covers its
    consumer groups: the scoring path's (``<app_id>-score``: the features topic), the
    learner's (``<app_id>-learn``: the label topics) and faust's (``<app_id>``, which read
    both in earlier versions); a partition counts the highest commit (only one of them
    consumes it)."""

    async def run() -> dict[str, int]:
        tps = [tp for topic in topics for tp in await partitions_of(bootstrap, topic)]
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        await admin.start()
        await consumer.start()
        try:
            committed = await admin.list_consumer_group_offsets(group, partitions=tps)
            for other in (score_group(group), learn_group(group)):
                found = await admin.list_consumer_group_offsets(other, partitions=tps)
                for tp, meta in found.items():
                    old = committed.get(tp)
                    if meta.offset >= 0 and (old is None or meta.offset > old.offset):
                        committed[tp] = meta
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
            await admin.close()
        lag: dict[str, int] = {}
        for tp in tps:
            meta = committed.get(tp)
            done = meta.offset if meta is not None and meta.offset >= 0 else 0
            lag[f"{tp.topic}[{tp.partition}]"] = max(0, int(ends[tp]) - int(done))
        return lag

    return asyncio.run(run())
