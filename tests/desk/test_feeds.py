"""The desk's reader before it reads: a topic whose offsets Kafka does not give is not read
(nor counted as read up to its end) until Kafka does, and the desk is not ready meanwhile."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaTimeoutError

from service.desk import feeds
from service.desk.auth.sessions import Sessions
from service.desk.feeds import Feeds

from .fakes import request
from .test_core import make_desks


@dataclass
class FakeReader:
    """A group-less consumer; ``ends`` fails while ``down``."""

    down: bool = True
    assigned: list[TopicPartition] = field(default_factory=list)
    positions: dict[TopicPartition, int] = field(default_factory=dict)

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        if self.down:
            raise KafkaTimeoutError("no answer")
        return {tp: 3 for tp in tps}

    async def position(self, tp: TopicPartition) -> int:
        return self.positions.get(tp, 0)

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = list(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    async def seek_to_beginning(self, *tps: TopicPartition) -> None:
        for tp in tps:
            self.positions[tp] = 0


@pytest.fixture
def one_partition_each(monkeypatch: pytest.MonkeyPatch) -> None:
    async def partitions(bootstrap: Any, topic: str, **_: Any) -> list[TopicPartition]:
        return [TopicPartition(topic, 0)]

    monkeypatch.setattr(feeds, "topic_partitions", partitions)


@pytest.mark.usefixtures("one_partition_each")
async def test_a_topic_whose_offsets_kafka_does_not_give_is_not_read_and_not_ready() -> None:
    (desk,), *_ = make_desks()
    desk.ready = False  # a desk that just started
    reader = FakeReader()
    sessions = Sessions(b"k" * 32, lifetime=60.0, clock=lambda: 0.0)
    feed = Feeds(desk.settings, desk, asyncio.Condition(), sessions)
    await feed._assign(reader)
    assert reader.assigned == []  # nothing read from a start nobody confirmed
    assert feed.missing == set(feed.topics)  # looked for again
    await feed._check_ready(reader)
    assert not desk.ready
    reader.down = False
    await feed._assign(reader)
    assert sorted(tp.topic for tp in reader.assigned) == sorted(feed.topics)
    await feed._check_ready(reader)
    assert not desk.ready  # read from the start, not yet up to the ends it was given
    for tp in reader.assigned:
        reader.positions[tp] = 3
    await feed._check_ready(reader)
    assert desk.ready


def test_a_record_that_trips_a_bug_is_skipped_and_the_reader_reads_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (desk,), *_ = make_desks()
    sessions = Sessions(b"k" * 32, lifetime=60.0, clock=lambda: 0.0)
    feed = Feeds(desk.settings, desk, asyncio.Condition(), sessions)

    def broken(request: object) -> bool:
        raise ArithmeticError("odd data")

    monkeypatch.setattr(desk.queue, "offer", broken)
    req = request("e1")
    feed.handle(desk.settings.topics.label_requests, 0, 0, b"m", req.to_json())
    skipped = desk.metrics.registry.get_sample_value(
        "abstain_desk_records_skipped_total", {"topic": "label_requests"}
    )
    assert skipped == 1
