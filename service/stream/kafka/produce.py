"""Records out: :class:`OutRecord`, :class:`BatchProducer` (one produce batch per topic
partition) and :func:`partition_for`, Kafka's default partitioner.

Both loops write through a :class:`BatchProducer` over their own aiokafka producer: the
scorer its decisions, label requests and dead letters, the learner its table writes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

__all__ = ["BatchProducer", "Headers", "OutRecord", "partition_for"]

#: Kafka record headers, as aiokafka takes them
Headers = list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to write: ``partition`` None = by ``key`` (Kafka's default partitioner;
    any partition when the key is None too); ``value`` None: a tombstone (a changelog
    deletion)."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    headers: Headers | None = None


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as faust and aiokafka producers
    use) gives ``key`` among ``partitions``.

    >>> partition_for(b"default", 1), 0 <= partition_for(b"fraud", 8) < 8
    (0, True)
    """
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


class BatchProducer:
    """Records out in one produce batch per topic partition (aiokafka's batch API: no
    future, partitioner call or log record per record)."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self._partitions: dict[str, int] = {}
        self._spread = itertools.count()  # where records without key or partition go

    async def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (asked once, then cached)."""
        count = self._partitions.get(topic)
        if count is None:
            found = await self.producer.partitions_for(topic)
            count = self._partitions[topic] = len(found)
        return count

    async def send_many(self, records: Sequence[OutRecord]) -> asyncio.Future[Any]:
        """Queue ``records``; the returned future is done once the broker acknowledged all
        of them (and fails if any one fails). A record's ``partition`` is taken modulo the
        topic's partition count (the count the topic really has)."""
        counts = {topic: await self.partitions(topic) for topic in {r.topic for r in records}}
        keyed: dict[tuple[bytes, int], int] = {}  # label requests share a few keys (models)
        groups: dict[tuple[str, int], list[OutRecord]] = {}
        for r in records:
            count = counts[r.topic]
            if r.partition is not None:
                p = r.partition % count
            elif r.key is not None:
                p = keyed.get((r.key, count), -1)
                if p < 0:
                    p = keyed[(r.key, count)] = partition_for(r.key, count)
            else:
                p = next(self._spread) % count
            groups.setdefault((r.topic, p), []).append(r)
        futures = []
        for (topic, p), group in groups.items():
            futures += await self._send(topic, p, group)
        return asyncio.gather(*futures)

    async def _send(self, topic: str, partition: int, records: list[OutRecord]) -> list[Any]:
        futures: list[Any] = []
        batch = self.producer.create_batch()
        for r in records:
            headers = r.headers or []
            if batch.append(key=r.key, value=r.value, timestamp=None, headers=headers):
                continue
            if batch.record_count():  # full: send it, start the next
                futures.append(await self.producer.send_batch(batch, topic, partition=partition))
                batch = self.producer.create_batch()
                if batch.append(key=r.key, value=r.value, timestamp=None, headers=headers):
                    continue
            # larger than a batch may be: the record alone (the producer checks its size)
            alone = self.producer.send(topic, r.value, key=r.key, partition=partition,
                                       headers=headers)  # fmt: skip
            futures.append(await alone)
        if batch.record_count():
            futures.append(await self.producer.send_batch(batch, topic, partition=partition))
        return futures
