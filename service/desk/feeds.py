"""Kafka for the desk: one group-less reader of every topic it follows, and the writers
(:class:`KafkaLeaseLog`, :class:`KafkaLabelSink` behind :mod:`service.desk.core`,
:class:`KafkaRevocationLog` behind logging out).

The reader assigns every partition of the label-requests and labels topics, the learner's
pending changelog (``<app_id>-pending-changelog``), the leases topic and the revocations
topic, and reads them from the beginning: after a restart the desk rebuilds its queue, the
leases and the logged-out sessions from the topics, and is ready once it has read each to
the end it had at start. A topic that does not exist yet (no learner ran) is looked for
again every few seconds.

Every record is input: the label topics and the changelog are checked as the learner
checks them (:func:`admission`, :class:`service.records.admission.Admission`), lease and
revocation records by their parsers; what does not pass is skipped (and counted in
``abstain_desk_records_skipped_total{topic}``), never offered to a person. Corrections and
second opinions on the labels topic must carry the signature of ``snapshot_key`` when one is
set (``unsigned``, ``bad_signature``, as the learner refuses them), and follow the rules of
the desk's book of answers (:mod:`service.desk.review`); so must a request for review on the
leases topic. :class:`KafkaLabelsLog` writes corrections and opinions, signed, and returns
once the reader has folded them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from service.config import Settings
from service.desk.auth.sessions import Sessions
from service.desk.backlog import DeskQueue
from service.desk.core import Desk
from service.desk.errors import Refused, Unavailable
from service.desk.leases import LeaseBook, LeaseRecord, parse_lease_record
from service.desk.review import ReviewBook
from service.records import (
    SIGNATURE_HEADER,
    BadMessage,
    Correction,
    Label,
    Opinion,
    Signer,
    parse_label_request,
)
from service.records.labels import parse_labels_record
from service.records.state import parse_pending_entry
from service.stream.errors import DATA_ERRORS, TopicError
from service.stream.kafka import topics as catalogue
from service.stream.kafka.clients import (
    consumer_options,
    producer_options,
    reader,
    topic_partitions,
)
from service.stream.kafka.groups import START_TIMEOUT_SECONDS
from service.stream.kafka.guard import TopicLayoutError, default_replication_factor
from service.stream.kafka.unreadable import FetchFailed, Reader
from service.stream.labels.admission import admission
from service.stream.models.book import signer_for

__all__ = [
    "Feeds",
    "KafkaLabelSink",
    "KafkaLabelsLog",
    "KafkaLeaseLog",
    "KafkaRevocationLog",
    "admission",
    "ensure_desk_topics",
    "make_producer",
]

log = logging.getLogger(__name__)


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
        **producer_options(settings),
    )


#: how long a revocation is kept: longer than any session can last (desk.session_seconds
#: is at most 7 days), so a logged-out cookie is refused until it ends anyway
REVOCATION_RETENTION_SECONDS = 8 * 86400.0


def desk_topics(settings: Settings) -> dict[str, dict[str, str]]:
    """The desk's own topics and the configuration it creates them with (one partition
    each): the leases topic keeps time, not compaction (docs/operate/desk.md: first-claim-wins is a
    fold over the history) and dates records by the broker (``LogAppendTime``: a writer
    cannot date a claim); the revocations topic keeps the last record per session, for
    longer than a session lasts."""
    leases_ms = int(max(2 * 86400.0, 4 * settings.request_ttl_seconds) * 1000)
    return {
        settings.desk.leases_topic: {
            "cleanup.policy": "delete",
            "retention.ms": str(leases_ms),
            "message.timestamp.type": "LogAppendTime",
        },
        settings.desk.revocations_topic: {
            "cleanup.policy": "compact,delete",
            "retention.ms": str(int(REVOCATION_RETENTION_SECONDS * 1000)),
        },
    }


async def ensure_desk_topics(settings: Settings) -> None:
    """Create the desk's topics (:func:`desk_topics`) that are missing, with the replicas of
    ``topic_policy`` (the brokers' default when unset). With ``topic_policy.creation:
    check`` nothing is created: a missing topic is refused
    (:class:`~service.stream.kafka.guard.TopicLayoutError`, naming it and how to create it)."""
    policy, wanted = settings.topic_policy, desk_topics(settings)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers, **settings.security.aiokafka_kwargs()
    )
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = {name: configs for name, configs in wanted.items() if name not in existing}
        if not missing:
            return
        if policy.creation == "check":
            raise TopicLayoutError(
                "; ".join(
                    f"{name} (a topic of the label desk) does not exist; create it with 1 "
                    f"partition and {', '.join(f'{k}={v}' for k, v in configs.items())}"
                    for name, configs in missing.items()
                )
                + " - or set topic_policy.creation: create"
            )
        replicas = policy.replication_factor or await default_replication_factor(admin)
        for name, configs in missing.items():
            configs = dict(configs)
            if policy.min_insync_replicas is not None:
                configs["min.insync.replicas"] = str(policy.min_insync_replicas)
            topic = NewTopic(
                name, num_partitions=1, replication_factor=replicas, topic_configs=configs
            )
            with contextlib.suppress(TopicAlreadyExistsError):  # another replica made it
                await admin.create_topics([topic])
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
        await _acked(
            self.producer.send_and_wait(
                self.settings.topics.labels, label.to_json(), key=label.model.encode()
            ),
            timeout,
        )


class KafkaLeaseLog:
    """Writes a lease record and waits until the reader has folded it (its outcome)."""

    def __init__(
        self,
        settings: Settings,
        producer: AIOKafkaProducer,
        book: LeaseBook,
        folded: asyncio.Condition,
    ) -> None:
        self.settings, self.producer, self.book, self.folded = settings, producer, book, folded

    async def publish(self, record: LeaseRecord) -> bool:
        timeout = self.settings.desk.ack_timeout_seconds + 1.0
        meta = await _acked(
            self.producer.send_and_wait(
                self.settings.desk.leases_topic, record.to_json(), key=record.request_id.encode()
            ),
            timeout,
        )
        offset = int(meta.offset)

        async def folded() -> None:
            async with self.folded:
                await self.folded.wait_for(lambda: self.book.position > offset)

        await _acked(folded(), timeout)
        return bool(self.book.outcome(offset))


class KafkaLabelsLog:
    """Writes a correction or a second opinion to the labels topic (key = its model, signed
    with ``snapshot_key`` when set, acks=all) and waits until the reader has folded it:
    None if the desk's book took it, else the book's refusal (another replica's record
    came first). Read back late (the reader is behind): None, the record is saved."""

    def __init__(
        self,
        settings: Settings,
        producer: AIOKafkaProducer,
        book: ReviewBook,
        folded: asyncio.Condition,
    ) -> None:
        self.settings, self.producer, self.book, self.folded = settings, producer, book, folded
        self.signer: Signer | None = signer_for(settings)

    async def publish(self, record: Correction | Opinion) -> Refused | None:
        timeout = self.settings.desk.ack_timeout_seconds + 1.0
        key, value = record.model.encode(), record.to_json()
        headers = None
        if self.signer is not None:
            headers = [(SIGNATURE_HEADER, self.signer.sign(key, value))]
        send = self.producer.send_and_wait(
            self.settings.topics.labels, value, key=key, headers=headers
        )
        meta = await _acked(send, timeout)
        partition, offset = int(meta.partition), int(meta.offset)

        async def folded() -> None:
            async with self.folded:
                await self.folded.wait_for(lambda: self.book.positions.get(partition, 0) > offset)

        try:
            await asyncio.wait_for(folded(), timeout)
        except TimeoutError:
            log.warning(
                "desk: %s at labels[%s]@%s not read back within %ss",
                type(record).__name__,
                partition,
                offset,
                timeout,
            )
            return None
        return self.book.result(partition, offset)[1]


class KafkaRevocationLog:
    """Writes the revocation of a session (key = its id) to the revocations topic,
    acknowledged by every in-sync replica: every replica reads it and refuses the cookie."""

    def __init__(self, settings: Settings, producer: AIOKafkaProducer) -> None:
        self.settings, self.producer = settings, producer

    async def publish(self, value: bytes, sid: str) -> None:
        timeout = self.settings.desk.ack_timeout_seconds + 1.0
        await _acked(
            self.producer.send_and_wait(
                self.settings.desk.revocations_topic, value, key=sid.encode()
            ),
            timeout,
        )


class Feeds:
    """Follows the five topics into the desk's queue, lease book and sessions."""

    def __init__(
        self,
        settings: Settings,
        desk: Desk,
        folded: asyncio.Condition,
        sessions: Sessions,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings, self.desk, self.folded, self.clock = settings, desk, folded, clock
        self.sessions = sessions
        s = settings
        self.pending_changelog = catalogue.table_topic(s, "pending")
        # the catalogue's topics the desk follows, then its own
        self.topics = (*catalogue.desk_topics(s), s.desk.leases_topic, s.desk.revocations_topic)
        self.admission = admission(settings)
        self.kwargs = settings.security.aiokafka_kwargs()
        self.assigned: list[TopicPartition] = []
        self.ends: dict[TopicPartition, int] = {}  # where "read up to the start" ends
        self.missing = set(self.topics)
        self.unstarted: set[str] = set()  # they exist, but Kafka did not say their offsets
        self.signer: Signer | None = signer_for(settings)
        # the topics whose records a writer waits for (its lease, its correction)
        self.folding = {s.desk.leases_topic, s.topics.labels}

    @property
    def queue(self) -> DeskQueue:
        return self.desk.queue

    async def run(self) -> None:
        """Read forever (until cancelled)."""
        s = self.settings
        consumer = reader(
            s.bootstrap_servers,
            f"{s.app_id}-desk",
            client_kwargs=consumer_options(s),
            max_partition_fetch_bytes=s.fetch_bytes,
        )
        fetch = Reader(consumer, policy="skip")  # read from the start again at every start
        await consumer.start()
        try:
            looked = 0.0
            while True:
                if self.missing and time.monotonic() - looked > 3.0:
                    looked = time.monotonic()
                    await self._assign(consumer)
                try:
                    batch = await fetch.getmany(timeout_ms=200, max_records=2000)
                except FetchFailed as exc:
                    log.warning("reading the desk's topics failed: %r; again", exc)
                    await asyncio.sleep(1.0)
                    continue
                for tp, records in batch.items():
                    for rec in records:
                        self.handle(
                            tp.topic,
                            tp.partition,
                            rec.offset,
                            rec.key,
                            rec.value,
                            timestamp_ms=rec.timestamp,
                            headers=rec.headers,
                        )
                if any(tp.topic in self.folding for tp in batch):
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
                found += await topic_partitions(
                    self.settings.bootstrap_servers, topic, client_kwargs=self.kwargs, attempts=1
                )
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
            log.warning(
                "desk cannot learn the offsets of %s (%r): not reading them yet",
                sorted({tp.topic for tp in found}),
                exc,
            )
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
        desk = self.settings.desk
        if {desk.leases_topic, desk.revocations_topic} & self.missing or self.unstarted:
            return
        for tp, end in self.ends.items():
            if await consumer.position(tp) < end:
                return
        self.desk.ready = True
        log.info("desk ready: %d open requests", len(self.queue.requests))

    def handle(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        *,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> None:
        """One record of one of the followed topics; records that do not pass the checks
        are skipped (and counted)."""
        s = self.settings
        at = self._time(timestamp_ms)
        try:
            if topic == s.desk.leases_topic:
                self._lease(offset, value, timestamp_ms)
            elif topic == s.desk.revocations_topic:
                if value is not None:
                    self.sessions.on_revocation(value)
            elif topic == self.pending_changelog:
                self._pending(partition, key, value, at)
            elif topic == s.topics.labels:
                self._labels(partition, offset, key, value, headers, at)
            elif value is None:
                raise BadMessage("not_json", "a tombstone")
            elif topic == s.topics.label_requests:
                request = parse_label_request(value, max_bytes=s.max_message_bytes)
                request = self.admission.label_request(request, key=key, partition=partition)
                offered = self.queue.offer(request)
                review = self.desk.review
                if review is not None:  # an answer read before (or after) its request
                    review.book.on_request(request)
                    rid = request.request_id
                    if not offered and (
                        rid in self.queue.answered or self.queue.long_over(request)
                    ):
                        review.book.hold(request)
        except (BadMessage, Refused) as bad:
            self.desk.metrics.skipped.labels(topic=_role(s, topic)).inc()
            log.debug("desk skips %s[%s]@%s: %s", topic, partition, offset, bad)
        except DATA_ERRORS:  # a bug met by odd data: say where, skip it, keep reading
            self.desk.metrics.skipped.labels(topic=_role(s, topic)).inc()
            log.exception("desk skips %s[%s]@%s", topic, partition, offset)

    def _time(self, timestamp_ms: int | None) -> float:
        """A record's time: its Kafka timestamp, never after now (else now)."""
        now = self.clock()
        if timestamp_ms is None or timestamp_ms < 0:
            return now
        return min(timestamp_ms / 1000.0, now)

    def _lease(self, offset: int, value: bytes | None, timestamp_ms: int | None) -> None:
        """Fold a lease record at its Kafka time; an unreadable one is folded as nothing
        (the fold moves past it: a writer waiting for its offset is not held up)."""
        at = None if timestamp_ms is None or timestamp_ms < 0 else timestamp_ms / 1000.0
        try:
            record = None if value is None else parse_lease_record(value)
        except BadMessage:
            self.desk.leases.apply(offset, None, at=at)
            raise
        taken = self.desk.leases.apply(offset, record, at=at)
        if record is not None and record.kind == "flag" and not taken:
            raise Refused(
                409,
                "refused",
                f"a request for review of {record.request_id[:12]!r} "
                "by someone who may not ask for one (or of an answer withdrawn or "
                "decided)",
            )

    def _labels(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]] | None,
        at: float,
    ) -> None:
        """A record of the labels topic: a label (an answer; a later one for the same
        request changes nothing), a correction or a second opinion (checked, then folded
        into the book of answers; the writer learns how), an order (no answer)."""
        review, record = self.desk.review, None
        refused: Refused | None = None
        try:
            if value is None:
                raise BadMessage("not_json", "a tombstone")
            record = parse_labels_record(value, max_bytes=self.settings.max_message_bytes)
            if isinstance(record, Label):
                self.admission.label(record, key=key, partition=partition)
                rid, queue = record.request_id, self.queue
                # no answer for the learner: a request it expired or dropped before
                dead = rid in queue.closed and rid not in queue.answered
                if review is not None and not dead:
                    request = queue.requests.get(rid)
                    review.book.on_label(
                        record, partition=partition, offset=offset, at=at, request=request
                    )
                self.queue.on_label(record, at=at)
            elif isinstance(record, Correction | Opinion):
                self._review(record, key, partition, value, headers, at)
                if isinstance(record, Correction):  # taken: waits for the learner
                    self.desk.waiting.add(record.model, partition, offset)
        except BadMessage as bad:
            refused = Refused(400, str(bad.reason), bad.detail)
            raise
        except Refused as bad:
            refused = bad
            raise
        finally:
            if review is not None:
                review.book.advance(
                    partition,
                    offset,
                    refused=refused,
                    review=isinstance(record, Correction | Opinion),
                )

    def _review(
        self,
        record: Correction | Opinion,
        key: bytes | None,
        partition: int,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] | None,
        at: float,
    ) -> None:
        """A correction or a second opinion: placed like its model's labels, signed with a
        key, then folded by the book of answers (:class:`Refused` if it breaks a rule)."""
        self.admission.deciding(record.model)
        self.admission.placement(record.model, key=key, partition=partition)
        kind = type(record).__name__.lower()
        if self.signer is not None:
            reason = self.signer.verify(key or b"", value, _signature(headers))
            if reason is not None:
                raise BadMessage(reason, f"{kind} of {record.request_id[:12]!r} is {reason}")
        book = None if self.desk.review is None else self.desk.review.book
        if book is None:
            return
        open_now = record.request_id in self.queue.requests
        if isinstance(record, Correction):
            book.on_correction(record, at=at, open_now=open_now)
        else:
            book.on_opinion(record, at=at, open_now=open_now)

    def _pending(self, partition: int, key: bytes | None, value: bytes | None, at: float) -> None:
        """A record of the learner's pending changelog: an entry checked as the learner
        writes them, or a delete on the partition of the request's model."""
        try:
            rid = (key or b"").decode("utf-8")
        except UnicodeDecodeError:
            raise BadMessage("bad_key", f"changelog key {key!r} is not UTF-8") from None
        if value is not None:
            entry = self.admission.pending(parse_pending_entry(value), key=key, partition=partition)
            self.queue.on_pending(rid, entry, at=at)
            return
        known = self.queue.requests.get(rid)
        if not rid or (
            known is not None and partition != self.admission.partitions.get(known.model)
        ):
            raise BadMessage("wrong_partition", f"a delete of {rid!r} on partition {partition}")
        self.queue.on_pending(rid, None, at=at)


def _signature(headers: Sequence[tuple[str, bytes]] | None) -> bytes | None:
    for name, value in headers or ():
        if name == SIGNATURE_HEADER:
            return value
    return None


def _role(settings: Settings, topic: str) -> str:
    """A closed name for a followed topic (the metric's label)."""
    s = settings
    roles = {
        s.topics.label_requests: "label_requests",
        s.topics.labels: "labels",
        catalogue.table_topic(s, "pending"): "pending_changelog",
        s.desk.leases_topic: "leases",
        s.desk.revocations_topic: "revocations",
    }
    return roles.get(topic, "other")
