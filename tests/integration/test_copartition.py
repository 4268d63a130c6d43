"""The learner's group gives each member the same partition numbers of the label-requests and
labels topics, whatever the count and the number of members (a model's requests and labels
meet in one learner), on a real broker's group coordinator; and a member of an earlier
release (round robin only) still joins the group."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from faults.kafkaio import create_topics

from service.config import Settings, Topics
from service.stream.kafka.clients import LoopClients
from service.stream.kafka.topics import learned
from service.stream.labels.loop import learn_group

pytestmark = pytest.mark.integration


class _Quiet(ConsumerRebalanceListener):  # type: ignore[misc]
    async def on_partitions_revoked(self, revoked: Any) -> None: ...

    async def on_partitions_assigned(self, assigned: Any) -> None: ...


async def _assignments(
    makers: list[Callable[[], AIOKafkaConsumer]], total: int
) -> list[set[TopicPartition]]:
    """Each member's partitions once all ``total`` are assigned and stay so for 2 s."""
    consumers = [make() for make in makers]  # aiokafka makes its clients in a running loop
    for c in consumers:
        await c.start()
    got: list[set[TopicPartition]] = []
    try:
        stable_since = None
        for _ in range(300):
            await asyncio.gather(*(c.getmany(timeout_ms=100) for c in consumers))
            now = [set(c.assignment()) for c in consumers]
            if now != got or sum(map(len, now)) != total:
                got, stable_since = now, asyncio.get_running_loop().time()
            elif asyncio.get_running_loop().time() - (stable_since or 0.0) > 2.0:
                return got
        raise AssertionError(f"the group did not settle: {got}")
    finally:
        for c in consumers:
            await c.stop()


def _settings(bootstrap: str, labels: int) -> Settings:
    suffix = uuid.uuid4().hex[:8]
    return Settings(
        broker=(bootstrap,),
        app_id=f"copart-{suffix}",
        topics=Topics.prefixed(f"copart-{suffix}"),
        partitions={"labels": labels},
        session_timeout_seconds=6,
    )


@pytest.mark.parametrize(("labels", "members"), [(1, 2), (3, 2), (3, 3), (5, 2)])
def test_every_learner_gets_the_same_partition_numbers_of_both_label_topics(
    kafka_bootstrap: str, labels: int, members: int
) -> None:
    s = _settings(kafka_bootstrap, labels)
    create_topics(kafka_bootstrap, dict.fromkeys(learned(s), labels))
    clients = LoopClients(s, learn_group(s.app_id), learned(s))
    got = asyncio.run(_assignments([lambda: clients.consumer(_Quiet())] * members, 2 * labels))
    requests, labels_topic = learned(s)
    for assigned in got:
        numbers = {t: {tp.partition for tp in assigned if tp.topic == t} for t in learned(s)}
        assert numbers[requests] == numbers[labels_topic], got
    every = {tp for assigned in got for tp in assigned}
    assert len(every) == 2 * labels  # nothing left out


def test_a_member_of_an_earlier_release_still_joins_the_group(kafka_bootstrap: str) -> None:
    s = _settings(kafka_bootstrap, 2)
    create_topics(kafka_bootstrap, dict.fromkeys(learned(s), 2))
    clients = LoopClients(s, learn_group(s.app_id), learned(s))
    earlier = (RoundRobinPartitionAssignor,)  # what members of earlier releases offer

    def old() -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=[kafka_bootstrap],
            group_id=learn_group(s.app_id),
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=2000,
            partition_assignment_strategy=earlier,
        )
        consumer.subscribe(list(learned(s)))
        return consumer

    got = asyncio.run(_assignments([lambda: clients.consumer(_Quiet()), old], 4))
    assert all(got)  # both members have partitions: the group agreed on round robin
    assert sum(map(len, got)) == 4
