"""Plain aiokafka clients for what faust does not do: group-less readers, topic metadata,
one-off produce, and faust's credentials from the settings.

Every client here reads the same size limit (:attr:`service.config.Settings.fetch_bytes`)
and the same security settings, so a record the worker may write can always be read back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.partitioner import murmur2

from service.config import KafkaSecurity, Settings
from service.stream.errors import TopicError

__all__ = [
    "broker_credentials",
    "partition_for",
    "produce_one",
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


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as faust and aiokafka producers
    use) gives ``key`` among ``partitions``.

    >>> partition_for(b"default", 1), 0 <= partition_for(b"fraud", 8) < 8
    (0, True)
    """
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


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
        **settings.security.aiokafka_kwargs(),
    )
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


async def read_topic(settings: Settings, topic: str, *, timeout: float = 10.0) -> list[Any]:
    """Every record of ``topic`` up to its current end (assign, no consumer group); [] if
    the topic does not exist."""
    kwargs = settings.security.aiokafka_kwargs()
    try:
        tps = await topic_partitions(settings.bootstrap_servers, topic, client_kwargs=kwargs,
                                     attempts=1)  # fmt: skip
    except TopicError:
        return []
    consumer = reader(
        settings.bootstrap_servers,
        f"{settings.app_id}-reader",
        max_partition_fetch_bytes=settings.fetch_bytes,
        client_kwargs=kwargs,
    )
    await consumer.start()
    try:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= end[tp] for pos, tp in zip(positions, tps, strict=True)):
                break
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                out.extend(records)
        return out
    finally:
        await consumer.stop()
