"""Plain aiokafka clients: group-less readers, topic metadata, one-off produce, the clients
of the worker's two loops (:class:`LoopClients`), faust's credentials from the settings, and
a small client for the tools around the service (:class:`Client`: the demo, the benchmarks,
operators' scripts).

Every client here reads the same size limit (:attr:`service.config.Settings.fetch_bytes`)
and the same security settings, so a record the worker may write can always be read back.
Every consumer reads with the configured ``isolation_level`` (:func:`consumer_options`:
``read_committed`` by default, so an aborted transaction's records are never read) and every
producer writes with the configured ``compression`` (:func:`producer_options`); every codec
Kafka has is read whatever that is (aiokafka with its codecs).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import KafkaError

from service.config import KafkaSecurity, Settings
from service.records.codec import dumps
from service.stream.errors import TopicError
from service.stream.kafka.internals import bound_inflation
from service.stream.kafka.unreadable import Reader

__all__ = [
    "Client",
    "LoopClients",
    "Received",
    "broker_credentials",
    "consumer_options",
    "produce_one",
    "producer_options",
    "read_topic",
    "reader",
    "topic_partitions",
]

log = logging.getLogger(__name__)


def broker_credentials(security: KafkaSecurity) -> Any:
    """faust ``broker_credentials`` for the configured security protocol (None = plaintext)."""
    if security.uses_sasl:
        assert security.username is not None  # noqa: S101
        assert security.password is not None  # noqa: S101
        return faust.SASLCredentials(
            username=security.username.get_secret_value(),
            password=security.password.get_secret_value(),
            mechanism=security.sasl_mechanism,
            ssl_context=security.ssl_context(),
        )
    if security.uses_ssl:
        return faust.SSLCredentials(security.ssl_context())
    return None


def consumer_options(settings: Settings) -> dict[str, Any]:
    """What every consumer of ``settings`` is made with besides its own options: security
    and isolation level. Installs ``max_inflated_bytes`` as the bound of every record batch
    the process inflates (:func:`~service.stream.kafka.internals.bound_inflation`), before
    any of its consumers reads.

    >>> consumer_options(Settings())["isolation_level"]
    'read_committed'
    """
    bound_inflation(settings.max_inflated_bytes)
    return {**settings.security.aiokafka_kwargs(), "isolation_level": settings.isolation_level}


def producer_options(settings: Settings) -> dict[str, Any]:
    """What every producer of ``settings`` is made with besides its own options: security
    and compression.

    >>> producer_options(Settings(compression="none"))["compression_type"] is None
    True
    """
    codec = None if settings.compression == "none" else settings.compression
    return {**settings.security.aiokafka_kwargs(), "compression_type": codec}


def reader(
    bootstrap: list[str],
    client_id: str,
    *,
    max_partition_fetch_bytes: int,
    client_kwargs: Mapping[str, Any],
    **options: Any,
) -> AIOKafkaConsumer:
    """A consumer outside any group (partitions are assigned, nothing is ever committed)
    that starts from the earliest offset; not started yet."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id=client_id,
        max_partition_fetch_bytes=max_partition_fetch_bytes,
        **options,
        **client_kwargs,
    )


async def topic_partitions(
    bootstrap: list[str], topic: str, *, client_kwargs: Mapping[str, Any], attempts: int = 120
) -> list[TopicPartition]:
    """All partitions of ``topic``, waiting (up to ``attempts`` half-seconds) for it to exist;
    :class:`TopicError` if it never does."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_kwargs)
    await admin.start()
    try:
        for _ in range(attempts):
            try:
                # listed first: naming a missing topic in a metadata request creates it on
                # a broker with auto.create.topics.enable (Kafka's default), with the
                # broker's defaults (not compacted, one replica) before the worker can
                if topic in await admin.list_topics():
                    (meta,) = await admin.describe_topics([topic])
                else:
                    meta = {}
            except KafkaError as exc:  # pragma: no cover - broker hiccup; retry
                log.warning("describe %s failed: %r", topic, exc)
            else:
                if meta.get("error_code") == 0 and meta.get("partitions"):
                    parts = sorted(p["partition"] for p in meta["partitions"])
                    return [TopicPartition(topic, p) for p in parts]
            await asyncio.sleep(0.5)
    finally:
        await admin.close()
    raise TopicError(f"topic {topic!r} does not exist")


async def produce_one(
    settings: Settings,
    topic: str,
    key: bytes | None,
    value: bytes,
    headers: list[tuple[str, bytes]] | None = None,
) -> None:
    """Write one record and wait until the broker has it (acks=all)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        max_request_size=settings.fetch_bytes,
        acks="all",
        **producer_options(settings),
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


async def read_topic(settings: Settings, topic: str, *, timeout: float = 10.0) -> list[Any]:
    """Every record of ``topic`` up to its current end (assign, no consumer group); [] if
    the topic does not exist. :class:`TopicError` when a fetch brings nothing for
    ``timeout`` seconds before the end is reached: a part of a topic is never returned as
    the whole of it."""
    kwargs = settings.security.aiokafka_kwargs()
    try:
        tps = await topic_partitions(
            settings.bootstrap_servers, topic, client_kwargs=kwargs, attempts=1
        )
    except TopicError:
        return []
    consumer = reader(
        settings.bootstrap_servers,
        f"{settings.app_id}-reader",
        max_partition_fetch_bytes=settings.fetch_bytes,
        client_kwargs=consumer_options(settings),
    )
    fetch = Reader(consumer, policy="skip")
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while True:
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= end[tp] for pos, tp in zip(positions, tps, strict=True)):
                return out
            if time.monotonic() > deadline:
                raise TopicError(
                    f"{topic}: read {len(out)} records, then nothing for "
                    f"{timeout:g}s before its end"
                )
            batch = await fetch.getmany(timeout_ms=200)
            for records in batch.values():
                out.extend(records)
                deadline = time.monotonic() + timeout
    finally:
        await consumer.stop()


@dataclass(frozen=True, slots=True)
class LoopClients:
    """The aiokafka clients of one loop (``group``: its consumer group, also the clients'
    id), made when the loop starts. Offsets are committed by the loop, once what they caused is
    acknowledged by every in-sync replica (acks=all).

    The consumer assigns by range first: each topic's partitions are split among the members
    alike, so a member gets the same partition numbers of every topic of equal count (the
    learner owns a model only with both its label-requests and its labels partition; round
    robin, aiokafka's default, splits them apart unless the counts happen to divide evenly).
    Round robin stays the second choice, so a group still made of members of an earlier
    release agrees on it until the last of them is replaced."""

    s: Settings
    group: str
    topics: tuple[str, ...]
    fetch_max_wait_ms: int = 500  # aiokafka's default

    @property
    def client(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.s.bootstrap_servers, **self.s.security.aiokafka_kwargs()}

    def consumer(self, listener: ConsumerRebalanceListener) -> AIOKafkaConsumer:
        s = self.s
        c = AIOKafkaConsumer(
            group_id=self.group,
            client_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self.fetch_max_wait_ms,
            max_partition_fetch_bytes=s.fetch_bytes,
            fetch_max_bytes=max(s.fetch_bytes, 52_428_800),
            session_timeout_ms=int(s.session_timeout_seconds * 1000),
            heartbeat_interval_ms=int(min(3.0, s.session_timeout_seconds / 3) * 1000),
            partition_assignment_strategy=(RangePartitionAssignor, RoundRobinPartitionAssignor),
            bootstrap_servers=s.bootstrap_servers,
            **consumer_options(s),
        )
        c.subscribe(list(self.topics), listener=listener)
        return c

    def producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            client_id=self.group,
            acks="all",
            max_request_size=self.s.fetch_bytes,
            max_batch_size=min(self.s.fetch_bytes, 1_048_576) - 1024,
            bootstrap_servers=self.s.bootstrap_servers,
            **producer_options(self.s),
        )

    def admin(self) -> AIOKafkaAdminClient:
        return AIOKafkaAdminClient(**self.client)


@dataclass(frozen=True, slots=True)
class Received:
    """One consumed record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int


class Client:
    """Producer plus group-less followers, for ``settings``' broker and security."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._kwargs = settings.security.aiokafka_kwargs()
        self._producer: AIOKafkaProducer | None = None

    async def __aenter__(self) -> Client:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.settings.bootstrap_servers,
            linger_ms=5,
            **producer_options(self.settings),
        )
        await self._producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def send(self, topic: str, key: str | None, value: Any) -> None:
        """Queue one JSON message (``value`` is serialised unless already bytes)."""
        assert self._producer is not None  # noqa: S101 - used inside ``async with``
        body = value if isinstance(value, bytes) else dumps(value)
        await self._producer.send(topic, body, key=None if key is None else key.encode())

    async def flush(self) -> None:
        assert self._producer is not None  # noqa: S101
        await self._producer.flush()

    async def follow(
        self,
        topics: Sequence[str],
        *,
        from_beginning: bool = False,
        poll_ms: int = 200,
        positioned: asyncio.Event | None = None,
    ) -> AsyncIterator[Received]:
        """Yield records of every partition of ``topics`` as they arrive (until cancelled).
        Starts at the current end unless ``from_beginning``; ``positioned`` is set once the
        start offsets are fixed (so nothing produced after that is missed)."""
        tps = []
        for topic in topics:
            tps += await topic_partitions(
                self.settings.bootstrap_servers, topic, client_kwargs=self._kwargs
            )
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            **consumer_options(self.settings),
        )
        fetch = Reader(consumer, policy="skip")
        await consumer.start()
        try:
            consumer.assign(tps)
            if from_beginning:
                await consumer.seek_to_beginning(*tps)
            else:
                await consumer.seek_to_end(*tps)
            for tp in tps:
                await consumer.position(tp)
            if positioned is not None:
                positioned.set()
            while True:
                batch = await fetch.getmany(timeout_ms=poll_ms)
                for records in batch.values():
                    for r in records:
                        yield Received(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp)
                await asyncio.sleep(0)
        finally:
            await consumer.stop()
