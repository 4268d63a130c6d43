"""Blocking admin helpers for the topic tests: create topics with partitions, replicas and
configs, look at what a broker holds (topics, configs, end offsets, consumer groups), add
partitions. Each call runs its own short event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.structs import OffsetAndMetadata

from service.stream.kafka.guard import TopicFacts, describe_topics

__all__ = [
    "Wanted",
    "add_partitions",
    "copy_group_offsets",
    "create",
    "end_offsets",
    "facts",
    "groups",
    "topic_names",
    "topics_of",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Wanted:
    """A topic to create."""

    partitions: int
    replicas: int = 1
    configs: Mapping[str, str] = field(default_factory=dict)


def _admin(bootstrap: str, use: Callable[[AIOKafkaAdminClient], Awaitable[T]]) -> T:
    async def run() -> T:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return await use(admin)
        finally:
            await admin.close()

    return asyncio.run(run())


def create(bootstrap: str, topics: Mapping[str, Wanted]) -> None:
    """Create ``topics``; an existing one is an error (each test names its own)."""

    async def use(admin: AIOKafkaAdminClient) -> None:
        new = [
            NewTopic(name, w.partitions, w.replicas, topic_configs=dict(w.configs))
            for name, w in topics.items()
        ]
        response = await admin.create_topics(new, timeout_ms=30_000)
        for name, code, *_ in response.topic_errors:
            assert code in (0, TopicAlreadyExistsError.errno), (name, code)
        for _ in range(100):  # until the broker asked next knows them (metadata propagates)
            if set(topics) <= set(await admin.list_topics()):
                return
            await asyncio.sleep(0.1)

    _admin(bootstrap, use)


def topic_names(bootstrap: str) -> set[str]:
    async def use(admin: AIOKafkaAdminClient) -> set[str]:
        return set(await admin.list_topics())

    return _admin(bootstrap, use)


def topics_of(bootstrap: str, app_id: str, names: Iterable[str]) -> set[str]:
    """The topics that exist of a deployment: ``names`` and any named after its app id."""
    wanted = set(names)
    return {n for n in topic_names(bootstrap) if n in wanted or n.startswith(f"{app_id}-")}


def facts(bootstrap: str, names: Iterable[str]) -> dict[str, TopicFacts]:
    """What the broker holds for those of ``names`` that exist (nothing is auto-created)."""
    wanted = list(names)

    async def use(admin: AIOKafkaAdminClient) -> dict[str, TopicFacts]:
        return await describe_topics(admin, wanted)

    return _admin(bootstrap, use)


def groups(bootstrap: str) -> set[str]:
    async def use(admin: AIOKafkaAdminClient) -> set[str]:
        return {str(g[0]) for g in await admin.list_consumer_groups()}

    return _admin(bootstrap, use)


def add_partitions(bootstrap: str, topic: str, total: int) -> None:
    async def use(admin: AIOKafkaAdminClient) -> Any:
        return await admin.create_partitions({topic: NewPartitions(total)})

    _admin(bootstrap, use)


def end_offsets(bootstrap: str, names: Iterable[str]) -> dict[str, int]:
    """Records ever written to each of ``names`` (sum of end offsets); missing topics left out."""
    present = facts(bootstrap, names)

    async def run() -> dict[str, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        await consumer.start()
        try:
            out = {}
            for name, fact in present.items():
                tps = [TopicPartition(name, p) for p in range(fact.partitions)]
                ends = await consumer.end_offsets(tps)
                out[name] = sum(ends.values())
            return out
        finally:
            await consumer.stop()

    return asyncio.run(run())


def copy_group_offsets(bootstrap: str, source: str, target: str, topic: str) -> dict[int, int]:
    """Commit for group ``target`` the offsets group ``source`` has committed on ``topic``
    (as ``kafka-consumer-groups.sh --reset-offsets --from-file`` would); partition -> offset."""

    async def run() -> dict[int, int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            committed = await admin.list_consumer_group_offsets(source)
        finally:
            await admin.close()
        offsets = {tp: meta.offset for tp, meta in committed.items() if tp.topic == topic}
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=target, enable_auto_commit=False
        )
        await consumer.start()
        try:
            consumer.assign(list(offsets))
            await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in offsets.items()})
        finally:
            await consumer.stop()
        return {tp.partition: o for tp, o in offsets.items()}

    return asyncio.run(run())
