"""The local broker against the clients the service uses: aiokafka and faust."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from service.localkafka import LocalKafka


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def consume(
    bootstrap: str, topic: str, want: int, timeout: float = 30.0
) -> list[tuple[bytes | None, bytes | None]]:
    """Read ``want`` records of ``topic`` from the beginning, or as many as come in time."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=unique("reader"),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    got: list[tuple[bytes | None, bytes | None]] = []
    try:
        deadline = time.monotonic() + timeout
        while len(got) < want and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            got += [(r.key, r.value) for records in batches.values() for r in records]
    finally:
        await consumer.stop()
    return got


async def describe_topic(admin: AIOKafkaAdminClient, topic: str) -> dict[str, Any]:
    """DescribeTopics, retried while the broker's metadata catches up with a creation."""
    deadline = time.monotonic() + 10.0
    while True:
        (described,) = await admin.describe_topics([topic])
        if described["error_code"] == 0 or time.monotonic() > deadline:
            return dict(described)
        await asyncio.sleep(0.1)


async def topic_configs(admin: AIOKafkaAdminClient, topic: str) -> dict[str, str]:
    """Config name -> value of ``topic`` (DescribeConfigs, retried like describe_topic)."""
    deadline = time.monotonic() + 10.0
    while True:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        resources = [resource for response in responses for resource in response.resources]
        configs = {entry[0]: entry[1] for resource in resources for entry in resource[4]}
        ok = bool(configs) and all(resource[0] == 0 for resource in resources)
        if ok or time.monotonic() > deadline:
            return configs
        await asyncio.sleep(0.1)


def creation_errors(response: Any) -> list[int]:
    """Error codes of a CreateTopics response, one per topic (0 = created)."""
    return [error[1] for error in response.topic_errors]


async def test_produce_then_consume_returns_every_record_in_order(kafka_bootstrap: str) -> None:
    topic = unique("roundtrip")  # created on first use (auto.create.topics.enable)
    sent = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(20)]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for key, value in sent:
            await producer.send_and_wait(topic, value=value, key=key)
    finally:
        await producer.stop()
    assert await consume(kafka_bootstrap, topic, len(sent)) == sent


async def test_admin_creates_topic_with_requested_partitions(kafka_bootstrap: str) -> None:
    topic = unique("partitioned")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(topic, num_partitions=3, replication_factor=1)]
        )
        described = await describe_topic(admin, topic)
        listed = await admin.list_topics()
    finally:
        await admin.close()
    assert creation_errors(response) == [0]
    assert topic in listed
    assert described["error_code"] == 0
    assert sorted(p["partition"] for p in described["partitions"]) == [0, 1, 2]


async def test_compacted_topic_is_created_with_its_cleanup_policy(kafka_bootstrap: str) -> None:
    topic = unique("compacted")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        compacted = NewTopic(
            topic,
            num_partitions=1,
            replication_factor=1,
            topic_configs={"cleanup.policy": "compact"},
        )
        response = await admin.create_topics([compacted])
        configs = await topic_configs(admin, topic)
    finally:
        await admin.close()
    assert creation_errors(response) == [0]
    assert configs["cleanup.policy"] == "compact"


async def test_broker_restart_keeps_records_and_clients_reconnect(
    kafka_broker: LocalKafka,
) -> None:
    topic = unique("durable")
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value=b"before", key=b"k")
        # stop and start off the event loop, with the producer's connections open
        assert await asyncio.to_thread(kafka_broker.stop) is True
        assert kafka_broker.status().running is False
        assert await asyncio.to_thread(kafka_broker.start) is True
        assert kafka_broker.status().answering is True
        await producer.send_and_wait(topic, value=b"after", key=b"k")
    finally:
        await producer.stop()
    assert await consume(kafka_broker.bootstrap, topic, 2) == [(b"k", b"before"), (b"k", b"after")]


async def test_faust_agent_forwards_every_message_and_keeps_a_table(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    import faust

    app_id = unique("smoke")
    app = faust.App(
        app_id,
        broker=f"kafka://{kafka_bootstrap}",
        store="memory://",
        datadir=str(tmp_path / "faust"),  # not the working directory
        web_enabled=False,
        topic_partitions=2,
        autodiscover=False,
    )
    # internal=True: faust creates these topics itself (CreateTopics sent to the controller)
    source = app.topic(
        f"{app_id}-in", key_serializer="raw", value_serializer="raw", partitions=2, internal=True
    )
    sink = app.topic(
        f"{app_id}-out", key_serializer="raw", value_serializer="raw", partitions=2, internal=True
    )
    counts = app.Table("counts", default=int, partitions=2, key_type=bytes, value_type=int)

    @app.agent(source)
    async def forward(stream):  # type: ignore[no-untyped-def]
        async for key, value in stream.items():
            counts[key] += 1
            await sink.send(key=key, value=value)

    sent = [(f"k{i % 5}".encode(), f"m{i}".encode()) for i in range(25)]
    await app.start()
    try:
        await sink.declare()
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for key, value in sent:
                await producer.send_and_wait(source.get_topic_name(), value=value, key=key)
        finally:
            await producer.stop()
        got = await consume(kafka_bootstrap, sink.get_topic_name(), len(sent), timeout=60.0)
        table = {key: counts[key] for key in {k for k, _ in sent}}
    finally:
        await app.stop()
    assert sorted(got) == sorted(sent)
    assert table == {f"k{i}".encode(): 5 for i in range(5)}

    source_name, changelog = source.get_topic_name(), f"{app_id}-counts-changelog"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        described = [await describe_topic(admin, name) for name in (source_name, changelog)]
        configs = await topic_configs(admin, changelog)
    finally:
        await admin.close()
    assert [len(topic["partitions"]) for topic in described] == [2, 2]
    assert configs["cleanup.policy"] == "compact"
