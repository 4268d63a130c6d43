"""From faust's events to the records an agent processes, with none skipped.

faust can skip records after a restart or a rebalance (:mod:`service.stream.continuity`).
:meth:`Intake.gather` turns a batch of faust events into :class:`~service.records.RawMessage`
records, putting first any the consumer skipped before each event; :meth:`Intake.done`
tells faust the skipped ones are processed (so the committed offset moves past them) and
records the progress liveness watches.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from service.metrics import Metrics
from service.records import RawMessage
from service.stream.continuity import Continuity
from service.stream.partitions import ConsumerView, Progress

__all__ = ["Gathered", "Intake", "raw_message"]


def raw_message(message: Any, value: bytes | None) -> RawMessage:
    """A consumed faust ``message`` (topic, partition, offset, key) with its ``value``; a
    tombstone (no value) becomes an empty record, which parsing refuses (``not_json``)."""
    return RawMessage(value if value is not None else b"", message.topic, message.partition,
                      message.offset, message.key, _seconds(message.timestamp))  # fmt: skip


def _seconds(timestamp: Any) -> float | None:
    return float(timestamp) if isinstance(timestamp, int | float) and timestamp > 0 else None


@dataclass(slots=True)
class Gathered:
    """Records to process, oldest first, and the gaps that were filled in."""

    messages: list[RawMessage] = field(default_factory=list)
    skipped: list[tuple[list[RawMessage], int]] = field(default_factory=list)  # (records, upto)


class Intake:
    """Gap-free records for the agents; progress for liveness."""

    def __init__(
        self, continuity: Continuity, view: ConsumerView, progress: Progress, metrics: Metrics
    ) -> None:
        self.continuity = continuity
        self.view = view
        self.progress = progress
        self.metrics = metrics

    async def gather(self, events: Iterable[Any]) -> Gathered:
        """The records of faust ``events`` (each with ``.message`` and ``.value``), each
        preceded by any the consumer skipped before it."""
        out = Gathered()
        for event in events:
            message = event.message
            missed = await self._missing(message)
            if missed:
                out.messages += missed
                out.skipped.append((missed, message.offset))
            out.messages.append(raw_message(message, event.value))
        return out

    async def _missing(self, message: Any) -> list[RawMessage]:
        topic, partition, offset = message.topic, message.partition, message.offset
        generation = int(message.generation_id or 0)
        if self.continuity.in_order(topic, partition, offset, generation=generation):
            return []
        missed = await self.continuity.missing(topic, partition, offset, generation=generation)
        if missed:
            self.metrics.skipped_recovered.labels(topic=topic).inc(len(missed))
        return missed

    def done(self, gathered: Gathered) -> None:
        """Everything gathered is processed: acknowledge the skipped records, mark progress."""
        for missed, upto in gathered.skipped:
            self.view.acknowledge(missed, upto)
        self.mark(gathered.messages)

    def mark(self, messages: Sequence[RawMessage]) -> None:
        """Record the last processed offset of each partition in ``messages``."""
        last: dict[tuple[str, int], int] = {}
        for m in messages:
            key = (m.topic, m.partition)
            last[key] = max(m.offset, last.get(key, -1))
        for (topic, partition), offset in last.items():
            self.progress.mark(topic, partition, offset)
