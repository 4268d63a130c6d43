"""Kafka for the desk: one group-less reader of every topic it follows, and the two
writers (:class:`KafkaLeaseLog`, :class:`KafkaLabelSink`) behind :mod:`service.desk.core`.

The reader assigns every partition of the label-requests and labels topics, the learner's
pending changelog (``<app_id>-pending-changelog``) and the leases topic, and reads them from
the beginning: after a restart the desk rebuilds its queue and the leases from the topics,
and is ready once it has read each to the end it had at start. A topic that does not exist
yet (no learner ran) is looked for again every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from service.config import Settings
from service.desk.backlog import DeskQueue
from service.desk.core import Desk
from service.desk.errors import Unavailable
from service.desk.leases import LeaseBook, LeaseRecord, parse_lease_record
from service.records import BadMessage, parse_label, parse_label_request, parse_pending_entry
from service.stream.errors import TopicError
from service.stream.groups import START_TIMEOUT_SECONDS
from service.stream.kafka import partition_for, reader, topic_partitions
from service.stream.model import request_id
from service.stream.topics import TopicLayoutError, default_replication_factor

__all__ = ["Feeds", "KafkaLabelSink", "KafkaLeaseLog", "ensure_leases_topic", "make_producer"]

log = logging.getLogger(__name__)


def pending_changelog(settings: Settings) -> str:
    """The learner's pending-table changelog (faust: ``<app id>-<table>-changelog``)."""
    return f"{settings.app_id}-pending-changelog"


def make_producer(settings: Settings) -> AIOKafkaProducer:
    """acks=all, and a request that is not acknowledged within the desk's ack timeout fails
    (it is not retried behind the person's back after they were told it failed)."""
    timeout_ms = int(settings.desk.ack_timeout_seconds * 1000)
    return AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        acks="all",
        request_timeout_ms=timeout_ms,
        retry_backoff_ms=100,
        max_request_size=settings.fetch_bytes,
        **settings.security.aiokafka_kwargs(),
    )


async def ensure_leases_topic(settings: Settings) -> None:
    """Create the leases topic if it is missing: one partition (one order for every claim),
    time retention longer than any request lives (docs/desk.md: why not compacted), records
    dated by the broker (``LogAppendTime``: a writer cannot date a claim), and the
    replicas of ``topic_policy`` (the brokers' default when unset). With
    ``topic_policy.creation: check`` nothing is created: a missing topic is refused
    (:class:`~service.stream.topics.TopicLayoutError`, naming it)."""
    policy, name = settings.topic_policy, settings.desk.leases_topic
    retention_ms = int(max(2 * 86400.0, 4 * settings.request_ttl_seconds) * 1000)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers,
                                **settings.security.aiokafka_kwargs())  # fmt: skip
    await admin.start()
    try:
        if name in await admin.list_topics():
            return
        if policy.creation == "check":
            raise TopicLayoutError(
                f"{name} (the desk's leases topic) does not exist; create it (1 partition, "
                f"cleanup.policy=delete, retention.ms >= {retention_ms}) or set "
                "topic_policy.creation: create"
            )
        replicas = policy.replication_factor or await default_replication_factor(admin)
        configs = {"cleanup.policy": "delete", "retention.ms": str(retention_ms),
                   "message.timestamp.type": "LogAppendTime"}  # fmt: skip
        if policy.min_insync_replicas is not None:
            configs["min.insync.replicas"] = str(policy.min_insync_replicas)
        topic = NewTopic(name, num_partitions=1, replication_factor=replicas,
                         topic_configs=configs)  # fmt: skip
        await admin.create_topics([topic])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()


async def _acked(coro: Any, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(coro, timeout)
    except (KafkaError, TimeoutError) as exc:
        raise Unavailable(f"Kafka did not acknowledge within {timeout:g}s ({exc!r})") from exc


class KafkaLabelSink:
    """Labels to the labels topic (key = model), acknowledged by every in-sync replica."""

    def __init__(self, settings: Settings, producer: AIOKafkaProducer) -> None:
        self.settings, self.producer = settings, producer

    async def send(self, label: Any) -> None:
        timeout = self.settings.desk.ack_timeout_seconds + 1.0
        await _acked(self.producer.send_and_wait(self.settings.topics.labels, label.to_json(),
                                                 key=label.model.encode()), timeout)  # fmt: skip


class KafkaLeaseLog:
    """Writes a lease record and waits until the reader has folded it (its outcome)."""

    def __init__(self, settings: Settings, producer: AIOKafkaProducer, book: LeaseBook,
                 folded: asyncio.Condition) -> None:  # fmt: skip
        self.settings, self.producer, self.book, self.folded = settings, producer, book, folded

    async def publish(self, record: LeaseRecord) -> bool:
        timeout = self.settings.desk.ack_timeout_seconds + 1.0
        meta = await _acked(self.producer.send_and_wait(
            self.settings.desk.leases_topic, record.to_json(), key=record.request_id.encode()
        ), timeout)  # fmt: skip
        offset = int(meta.offset)

        async def folded() -> None:
            async with self.folded:
                await self.folded.wait_for(lambda: self.book.position > offset)

        await _acked(folded(), timeout)
        return bool(self.book.outcome(offset))


class Feeds:
    """Follows the four topics into the desk's queue and lease book."""

    def __init__(self, settings: Settings, desk: Desk, folded: asyncio.Condition,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.settings, self.desk, self.folded, self.clock = settings, desk, folded, clock
        s = settings
        self.topics = (s.topics.label_requests, s.topics.labels, pending_changelog(s),
                       s.desk.leases_topic)  # fmt: skip
        self.kwargs = settings.security.aiokafka_kwargs()
        self.assigned: list[TopicPartition] = []
        self.ends: dict[TopicPartition, int] = {}  # where "read up to the start" ends
        self.missing = set(self.topics)
        self.unstarted: set[str] = set()  # they exist, but Kafka did not say their offsets

    @property
    def queue(self) -> DeskQueue:
        return self.desk.queue

    async def run(self) -> None:
        """Read forever (until cancelled)."""
        s = self.settings
        consumer = reader(s.bootstrap_servers, f"{s.app_id}-desk", client_kwargs=self.kwargs,
                          max_partition_fetch_bytes=s.fetch_bytes)  # fmt: skip
        await consumer.start()
        try:
            looked = 0.0
            while True:
                if self.missing and time.monotonic() - looked > 3.0:
                    looked = time.monotonic()
                    await self._assign(consumer)
                batch = await consumer.getmany(timeout_ms=200, max_records=2000)
                for tp, records in batch.items():
                    for rec in records:
                        self.handle(tp.topic, tp.partition, rec.offset, rec.key, rec.value,
                                    timestamp_ms=rec.timestamp)  # fmt: skip
                if any(tp.topic == s.desk.leases_topic for tp in batch):
                    async with self.folded:
                        self.folded.notify_all()
                if not self.desk.ready:
                    await self._check_ready(consumer)
        finally:
            await consumer.stop()

    async def _assign(self, consumer: Any) -> None:
        found: list[TopicPartition] = []
        for topic in sorted(self.missing):
            try:
                found += await topic_partitions(self.settings.bootstrap_servers, topic,
                                                client_kwargs=self.kwargs, attempts=1)  # fmt: skip
            except TopicError:
                continue
            self.missing.discard(topic)
        if not found:
            return
        try:  # the ends readiness waits for, and where the partitions already read are
            async with asyncio.timeout(START_TIMEOUT_SECONDS):
                ends = {} if self.desk.ready else await consumer.end_offsets(found)
                positions = {tp: await consumer.position(tp) for tp in self.assigned}
        except (KafkaError, TimeoutError) as exc:
            self.unstarted = {tp.topic for tp in found}  # looked for again; not ready meanwhile
            self.missing |= self.unstarted
            log.warning("desk cannot learn the offsets of %s (%r): not reading them yet",
                        sorted({tp.topic for tp in found}), exc)  # fmt: skip
            return
        self.ends.update(ends)
        self.unstarted = set()
        self.assigned += found
        consumer.assign(self.assigned)
        for tp, offset in positions.items():
            consumer.seek(tp, offset)
        await consumer.seek_to_beginning(*found)
        log.info("desk reads %s", sorted({tp.topic for tp in self.assigned}))

    async def _check_ready(self, consumer: Any) -> None:
        if self.settings.desk.leases_topic in self.missing or self.unstarted:
            return
        for tp, end in self.ends.items():
            if await consumer.position(tp) < end:
                return
        self.desk.ready = True
        log.info("desk ready: %d open requests", len(self.queue.requests))

    def handle(self, topic: str, partition: int, offset: int, key: bytes | None,
               value: bytes | None, *, timestamp_ms: int | None = None) -> None:  # fmt: skip
        """One record of one of the followed topics; unreadable records are skipped. A
        lease record is folded at its Kafka time (``timestamp_ms``)."""
        s = self.settings
        try:
            if topic == s.desk.leases_topic:
                at = None if timestamp_ms is None or timestamp_ms < 0 else timestamp_ms / 1000.0
                try:
                    record = None if value is None else parse_lease_record(value)
                except BadMessage:
                    record = None  # folded as nothing: the fold moves past it
                self.desk.leases.apply(offset, record, at=at)
            elif value is None and topic != pending_changelog(s):
                return
            elif topic == s.topics.label_requests:
                self._request(partition, key, value)
            elif topic == s.topics.labels:
                self.queue.on_label(parse_label(value or b"", max_bytes=s.max_message_bytes),
                                    at=self.clock())  # fmt: skip
            elif key is not None:
                entry = None if value is None else parse_pending_entry(value)
                self.queue.on_pending(key.decode("utf-8", "replace"), entry)
        except BadMessage as bad:
            log.debug("desk skips %s[%s]@%s: %s", topic, partition, offset, bad)

    def _request(self, partition: int, key: bytes | None, value: bytes | None) -> None:
        """Offer a request the learner would accept (the same checks, but for duplicates)."""
        s = self.settings
        request = parse_label_request(value or b"", max_bytes=s.max_message_bytes)
        config = s.models.get(request.model)
        if config is None or len(request.features) != config.n_inputs:
            return
        if request.request_id != request_id(request.model, request.event_id):
            return
        if key != request.model.encode():
            return
        if partition != partition_for(key, s.partitions.labels):
            return
        self.queue.offer(request)
