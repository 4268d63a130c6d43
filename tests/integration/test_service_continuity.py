"""KafkaGaps on the local broker: the group's committed offset, record ranges read without
joining the group or committing anything."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from service.stream.continuity import KafkaGaps

pytestmark = pytest.mark.integration


async def _topic_with(bootstrap: str, n: int) -> str:
    topic = f"gaps-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(n):
            await producer.send_and_wait(topic, b"v%d" % i, key=b"k%d" % i, partition=0)
    finally:
        await producer.stop()
    return topic


async def _commit(bootstrap: str, group: str, tp: TopicPartition, offset: int) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False)  # fmt: skip
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


def test_committed_offsets_and_ranges_come_from_kafka(kafka_bootstrap: str) -> None:
    async def run() -> None:
        topic = await _topic_with(kafka_bootstrap, 20)
        group = f"g-{uuid.uuid4().hex[:8]}"
        tp = TopicPartition(topic, 0)
        await _commit(kafka_bootstrap, group, tp, 7)
        gaps = KafkaGaps([kafka_bootstrap], group, client_kwargs={})
        try:
            assert await gaps.committed(topic, 0) == 7
            assert await gaps.committed(topic, 1) is None  # nothing committed there

            got = await gaps.fetch(topic, 0, 5, 12)
            assert [r.offset for r in got] == list(range(5, 12))
            assert [(r.key, r.value) for r in got] == [(b"k%d" % i, b"v%d" % i)
                                                       for i in range(5, 12)]  # fmt: skip
            assert {(r.topic, r.partition) for r in got} == {(topic, 0)}

            # a range running past the end: what exists, without waiting out the timeout
            began = time.monotonic()
            assert [r.offset for r in await gaps.fetch(topic, 0, 17, 40)] == [17, 18, 19]
            assert time.monotonic() - began < gaps.timeout
            assert await gaps.fetch(topic, 1, 0, 5) == []  # an empty partition

            # reading changed nothing the group owns
            assert await gaps.committed(topic, 0) == 7
        finally:
            await gaps.close()

    asyncio.run(run())
