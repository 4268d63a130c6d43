"""Where the stream's records go: one object that encodes each record, picks its topic and
key, and counts what must be counted on the way out.

The scorer takes the records (:class:`OutRecord`) and its loop writes them in produce
batches. What is written one record at a time goes through a :class:`Sink`: the learner's
own producer in a worker (its snapshots and dead letters; the model follower's dead letters
go through faust's), an in-memory one in tests. ``send`` hands a record to the producer's
buffer without waiting for the broker; ``flush`` returns once everything sent so far is
acknowledged (durable, acks=all). The learner flushes where the order of two writes matters
(:class:`~service.stream.labels.joiner.LabelJoiner`) and before it commits the offsets of a batch.
"""

from __future__ import annotations

from typing import Protocol

from service.config import Topics
from service.metrics import Metrics
from service.records import (
    SIGNATURE_HEADER,
    BadMessage,
    DeadLetter,
    Decision,
    LabelRequest,
    RawMessage,
    Signer,
)
from service.records.champions import CHAMPIONS_KEY
from service.records.reasons import Source
from service.stream.kafka.produce import Headers, OutRecord
from service.stream.kafka.unreadable import UnreadableBatch

__all__ = ["Outputs", "Sink"]


class Sink(Protocol):
    """Records out to Kafka."""

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None
    ) -> None:
        """Queue one record (not awaited to the broker)."""

    async def flush(self) -> None:
        """Wait until every queued record is acknowledged."""


class Outputs:
    """The stream's output topics, by record type."""

    def __init__(
        self, sink: Sink, topics: Topics, metrics: Metrics, *, signer: Signer | None = None
    ) -> None:
        self.sink = sink
        self.topics = topics
        self.metrics = metrics
        self.signer = signer

    def decision_record(self, decision: Decision, partition: int | None = None) -> OutRecord:
        """A decision (key: event id); ``partition``: the scoring path writes it to the
        partition of its event's features partition (None: by key)."""
        return OutRecord(self.topics.decisions, decision.id.encode(), decision.to_json(), partition)

    def label_request_record(self, request: LabelRequest) -> OutRecord:
        """A label request (key: model, so it lands where the model's labels do)."""
        return OutRecord(self.topics.label_requests, request.model.encode(), request.to_json())

    def dead_letter_record(self, letter: DeadLetter, partition: int | None = None) -> OutRecord:
        """A refused input, counted (key: none; the record says where it was)."""
        self.metrics.dead_letters.labels(source=letter.source, reason=letter.reason).inc()
        return OutRecord(self.topics.dead_letters, None, letter.to_json(), partition)

    async def dead_letter(self, letter: DeadLetter) -> None:
        """Count and publish a refused input (key: none; the record says where it was)."""
        r = self.dead_letter_record(letter)
        await self.sink.send(r.topic, r.key, r.value)

    async def skipped_batch(self, source: Source, batch: UnreadableBatch) -> None:
        """Dead-letter a record batch that was skipped because it cannot be read."""
        await self.dead_letter(batch.dead_letter(source))

    async def refused_snapshot(self, message: RawMessage, bad: BadMessage) -> None:
        """Dead-letter a record of the models topic that was not served."""
        await self.dead_letter(DeadLetter.of(Source.MODELS, message, bad.reason, bad.detail))

    async def model(self, name: str, encoded: bytes) -> None:
        """Publish a model version (``encoded``: a checked :class:`ModelEnvelope`) to the
        compacted models topic (key: model name), signed when a key is configured."""
        key = name.encode()
        headers = None
        if self.signer is not None:
            headers = [(SIGNATURE_HEADER, self.signer.sign(key, encoded))]
        await self.sink.send(self.topics.models, key, encoded, headers)

    async def champions(self, raw: bytes) -> None:
        """Publish the champions record ``raw`` (one a reader took: its format and, with a
        key, its signature checked) again, signed with the current key."""
        key = CHAMPIONS_KEY.encode()
        headers = None
        if self.signer is not None:
            headers = [(SIGNATURE_HEADER, self.signer.sign(key, raw))]
        await self.sink.send(self.topics.models, key, raw, headers)

    async def durable(self) -> None:
        """Return once everything sent so far (table changelogs included) is acknowledged."""
        await self.sink.flush()
