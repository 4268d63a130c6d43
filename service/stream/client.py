"""A small Kafka client for tools around the service (demo, benchmarks, operators' scripts):
produce JSON to a topic, and follow topics without a consumer group.

Kept here so that :mod:`service.stream` stays the only package that talks to Kafka.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from service.config import Settings
from service.records import dumps
from service.stream.kafka import topic_partitions

__all__ = ["Client", "Received"]


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
            bootstrap_servers=self.settings.bootstrap_servers, linger_ms=5, **self._kwargs
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
            **self._kwargs,
        )
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
                batch = await consumer.getmany(timeout_ms=poll_ms)
                for records in batch.values():
                    for r in records:
                        yield Received(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp)
                await asyncio.sleep(0)
        finally:
            await consumer.stop()
