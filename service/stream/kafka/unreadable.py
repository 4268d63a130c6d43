"""Record batches a consumer cannot read: loud and bounded, never a silent retry loop.

A batch can be impossible to read however often it is fetched: compressed with a codec the
client lacks, failing its CRC, holding a record that does not parse (a header key that is
not UTF-8, which Kafka's own broker takes), inflating beyond ``max_inflated_bytes``
(refused before it is inflated whole: :mod:`service.stream.kafka.inflate`). aiokafka then
raises from every ``getmany`` that reaches it, keeps the partition where it was (so the next
fetch fails the same way), and drops the records the call had already taken from other partitions
(:func:`~service.stream.kafka.internals.failed_fetch`). :class:`Reader` wraps ``getmany``:

- what the failed call took from other partitions is returned (nothing is lost);
- the partition's records before the batch are read and returned too;
- then, by ``policy``:

  * ``stop`` (the inputs whose offsets are committed: features, label requests, labels): the
    partition is paused at the batch and recorded in :class:`Unreadable`. Liveness lists it
    under ``stalled``, readiness fails, ``abstain_unreadable_partitions{topic}`` counts it, and
    the other partitions go on. It moves on only past a batch an operator's skip order names
    exactly (``abstain skip``, :class:`~service.records.SkipOrder`, read from the models
    topic into a :class:`SkipBook`): :meth:`Reader.release`. An order read before the
    partition gets there (the worker that met the batch first was stopped, or killed) is
    honoured when the reader reaches the batch and fails to read it: it moves past it at once,
    without stopping. An order is never a reason to skip by itself: a batch it names that
    reads is read (a forged or mistaken order skips nothing);
  * ``skip`` (what is read from the beginning again at every start: the models topic, the
    learner's changelogs, the desk's topics): the batch is skipped at once and handed to
    ``on_skip`` (a dead letter, a count, an error in the log).

Other fetch errors are the broker's: a ``KafkaError`` is raised as it was; anything else
that no batch explains as :class:`FetchFailed`, which the loops treat the same way (log,
wait a second, fetch again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError

from service.metrics import Metrics
from service.records import DeadLetter, Reason
from service.records.reasons import Source
from service.records.skips import SkipOrder
from service.stream.errors import StreamError
from service.stream.kafka.internals import FailedFetch, failed_fetch

__all__ = [
    "READ_BEFORE_SECONDS",
    "FetchFailed",
    "Reader",
    "SkipBook",
    "Unreadable",
    "UnreadableBatch",
]

log = logging.getLogger(__name__)

#: the longest a reader spends reading a partition's records before a batch it cannot read
#: (the next fetch tries again)
READ_BEFORE_SECONDS = 10.0

Fetched = dict[TopicPartition, list[Any]]


class FetchFailed(StreamError):
    """A fetch failed and no batch explains it (the loop logs it and fetches again)."""


@dataclass(frozen=True, slots=True)
class UnreadableBatch:
    """A batch of ``topic[partition]`` that cannot be read: from offset ``first`` to the one
    before ``end``; ``error``: what the client said."""

    topic: str
    partition: int
    first: int
    end: int
    error: str

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def describe(self) -> str:
        """What the worker says of it (``/healthz``, the log).

        >>> UnreadableBatch("t", 1, 5, 8, "UnicodeDecodeError: ...").describe()
        't[1] offsets 5-7 cannot be read (UnicodeDecodeError: ...)'
        """
        offsets = (
            f"offset {self.first}"
            if self.end == self.first + 1
            else (f"offsets {self.first}-{self.end - 1}")
        )
        return f"{self.topic}[{self.partition}] {offsets} cannot be read ({self.error})"

    def dead_letter(self, source: Source) -> DeadLetter:
        """Its dead letter: the offset range, reason ``unreadable``, what the client said (the
        records stay in the topic until its retention: ``raw`` is empty).

        >>> letter = UnreadableBatch("t", 1, 5, 8, "E: x").dead_letter(Source.FEATURES)
        >>> letter.offset, letter.last_offset, letter.reason
        (5, 7, <Reason.UNREADABLE: 'unreadable'>)
        """
        return DeadLetter(
            source,
            self.topic,
            self.partition,
            self.first,
            Reason.UNREADABLE,
            self.describe(),
            b"",
            last_offset=self.end - 1,
        )

    def named_by(self, order: SkipOrder) -> bool:
        """True when ``order`` names exactly this batch."""
        return (order.topic, order.partition, order.first, order.end) == (
            self.topic,
            self.partition,
            self.first,
            self.end,
        )


class Unreadable:
    """The partitions this worker stopped at a batch it cannot read, by (topic, partition):
    what liveness lists under ``stalled`` and readiness waits on. Keeps the gauge
    ``abstain_unreadable_partitions{topic}`` and counts ``abstain_unreadable_batches_total``."""

    def __init__(self, metrics: Metrics | None = None, *, topics: Iterable[str] = ()) -> None:
        self.stopped: dict[tuple[str, int], UnreadableBatch] = {}
        self.metrics = metrics
        for topic in topics:  # every series shows from the start, at 0
            self._gauge(topic)
            for outcome in ("stopped", "skipped"):
                if metrics is not None:
                    metrics.unreadable_batches.labels(topic=topic, outcome=outcome)

    def stop(self, batch: UnreadableBatch) -> None:
        """Record that ``batch``'s partition stands still at it."""
        self.stopped[(batch.topic, batch.partition)] = batch
        log.error(
            "%s: the partition stops there until `abstain skip %s %s` (the other partitions go on)",
            batch.describe(),
            batch.topic,
            batch.partition,
        )
        self.count(batch.topic, "stopped")
        self._gauge(batch.topic)

    def release(self, tps: Iterable[TopicPartition]) -> list[UnreadableBatch]:
        """Forget the batches of ``tps`` (skipped, revoked, or to be read again)."""
        gone = [b for tp in tps if (b := self.stopped.pop((tp.topic, tp.partition), None))]
        for topic in {b.topic for b in gone}:
            self._gauge(topic)
        return gone

    def of(self, tps: Iterable[TopicPartition]) -> list[UnreadableBatch]:
        """The stopped batches of ``tps``."""
        return [b for tp in tps if (b := self.stopped.get((tp.topic, tp.partition)))]

    def __contains__(self, tp: TopicPartition) -> bool:
        return (tp.topic, tp.partition) in self.stopped

    def lines(self) -> list[str]:
        """One line per stopped partition, with the command that moves it on.

        >>> u = Unreadable()
        >>> u.stop(UnreadableBatch("t", 0, 3, 4, "E"))
        >>> u.lines()
        ['t[0] offset 3 cannot be read (E): `abstain skip t 0` dead-letters it and goes on']
        """
        return [
            f"{b.describe()}: `abstain skip {b.topic} {b.partition}` dead-letters it and goes on"
            for _, b in sorted(self.stopped.items())
        ]

    def count(self, topic: str, outcome: Literal["stopped", "skipped"]) -> None:
        if self.metrics is not None:
            self.metrics.unreadable_batches.labels(topic=topic, outcome=outcome).inc()

    def _gauge(self, topic: str) -> None:
        if self.metrics is not None:
            count = sum(1 for t, _ in self.stopped if t == topic)
            self.metrics.unreadable_partitions.labels(topic=topic).set(count)


class SkipBook:
    """The skip orders this worker has read (checked by the model book), by the batch they
    name."""

    def __init__(self) -> None:
        self.orders: dict[tuple[str, int, int, int], SkipOrder] = {}

    def add(self, order: SkipOrder) -> bool:
        """Keep ``order``; False if it was known."""
        key = (order.topic, order.partition, order.first, order.end)
        known = key in self.orders
        self.orders[key] = order
        return not known

    def order_for(self, batch: UnreadableBatch) -> SkipOrder | None:
        return self.orders.get((batch.topic, batch.partition, batch.first, batch.end))


class Reader:
    """``getmany`` of ``consumer`` that survives a batch it cannot read (module docstring).

    ``policy`` ``stop``: the partition is paused at the batch and recorded in
    ``unreadable``, unless an order of ``orders`` names it: then the consumer seeks past it
    and the offset after it waits in :attr:`ordered` for :meth:`release`; ``skip``: the
    consumer seeks past it and ``on_skip`` is awaited with it."""

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        *,
        policy: Literal["stop", "skip"],
        unreadable: Unreadable | None = None,
        on_skip: Callable[[UnreadableBatch], Awaitable[None]] | None = None,
        orders: SkipBook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.consumer = consumer
        self.policy = policy
        self.unreadable = unreadable if unreadable is not None else Unreadable()
        self.on_skip = on_skip
        self.orders = orders
        #: partitions moved past a batch an order named as the reader met it, with the offset
        #: each goes on from (handed out by the next :meth:`release`)
        self.ordered: dict[TopicPartition, int] = {}
        self.clock = clock

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int | None = None
    ) -> Fetched:
        """``consumer.getmany``; on a batch it cannot read, what could be read (see above)."""
        try:
            fetched: Fetched = await self.consumer.getmany(
                *partitions, timeout_ms=timeout_ms, max_records=max_records
            )
        except Exception as exc:  # any error reading a batch; what is not one is raised again
            failed = failed_fetch(exc)
            if failed is None:
                if isinstance(exc, KafkaError):
                    raise
                raise FetchFailed(
                    f"fetching {sorted(self.consumer.assignment())} failed: {exc!r}"
                ) from exc
            return await self._around(failed, f"{type(exc).__name__}: {exc}")
        return fetched

    async def _around(self, failed: FailedFetch, error: str) -> Fetched:
        out = {tp: list(records) for tp, records in failed.drained.items() if records}
        tp = failed.tp
        before = await self._read_before(tp, failed.first, failed.end)
        if before is None:  # not reached in time: the next fetch meets the batch again
            return out
        records, first, end = before
        if records:
            out[tp] = records
        batch = UnreadableBatch(tp.topic, tp.partition, first, end, error)
        if self.policy == "skip":
            self.consumer.seek(tp, batch.end)
            log.error("%s: skipped", batch.describe())
            self.unreadable.count(batch.topic, "skipped")
            if self.on_skip is not None:
                await self.on_skip(batch)
        elif (order := self._order_for(batch)) is not None:
            self._honour(batch, order)
            self.ordered[tp] = batch.end
        else:
            self.consumer.pause(tp)
            self.unreadable.stop(batch)
        return out

    def _order_for(self, batch: UnreadableBatch) -> SkipOrder | None:
        return None if self.orders is None else self.orders.order_for(batch)

    def _honour(self, batch: UnreadableBatch, order: SkipOrder) -> None:
        self.consumer.seek(batch.tp, batch.end)
        self.unreadable.count(batch.topic, "skipped")
        log.warning(
            "%s: skipped on the order of %s (dead letter written by `abstain skip`)",
            batch.describe(),
            order.by or "an operator",
        )

    async def _read_before(
        self, tp: TopicPartition, first: int, end: int
    ) -> tuple[list[Any], int, int] | None:
        """The records of ``tp`` from its position up to ``first`` (the failed call left the
        position where it was), with the batch's ``first`` and ``end`` (a record before
        ``first`` that fails moves them); None when they are not all read in time, or the
        partition went away."""
        records: list[Any] = []
        deadline = self.clock() + READ_BEFORE_SECONDS
        try:
            position = await self.consumer.position(tp)
            step = first - position  # all of them at once, unless offsets are missing
            while position < first:
                if self.clock() > deadline:
                    log.warning(
                        "%s[%s]: could not read up to offset %s in %ss; trying again",
                        tp.topic,
                        tp.partition,
                        first,
                        READ_BEFORE_SECONDS,
                    )
                    return None
                try:
                    got = await self.consumer.getmany(tp, timeout_ms=200, max_records=step)
                except Exception as exc:  # the batch again (a step too long): one at a time
                    again = failed_fetch(exc)
                    if again is None or again.tp != tp:
                        raise
                    if again.first < first:
                        first, end = again.first, again.end
                    step = 1
                    continue
                records += got.get(tp, [])
                position = await self.consumer.position(tp)
                step = max(1, first - position)
        except (IllegalStateError, KafkaError) as exc:
            log.warning(
                "%s[%s]: reading up to offset %s failed (%r); trying again",
                tp.topic,
                tp.partition,
                first,
                exc,
            )
            return None
        return records, first, end

    def release(self, orders: SkipBook) -> dict[TopicPartition, int]:
        """Move past every stopped batch of this consumer's partitions that an order in
        ``orders`` names; the offset each moved partition goes on from (with those moved
        past an ordered batch as they met it, :attr:`ordered`)."""
        mine = self.consumer.assignment()
        moved = {tp: end for tp, end in self.ordered.items() if tp in mine}
        self.ordered.clear()
        for batch in self.unreadable.of(mine):
            order = orders.order_for(batch)
            if order is None:
                continue
            tp = batch.tp
            self._honour(batch, order)
            self.consumer.resume(tp)
            self.unreadable.release([tp])
            moved[tp] = batch.end
        return moved

    @property
    def to_release(self) -> bool:
        """True when :meth:`release` has something to do (a stopped batch, an ordered one)."""
        return bool(self.ordered or self.unreadable.stopped)

    @classmethod
    def of(
        cls,
        reader: Reader | None,
        consumer: AIOKafkaConsumer,
        unreadable: Unreadable,
        orders: SkipBook | None = None,
    ) -> Reader:
        """``reader`` if it reads ``consumer``, else a new one that stops at an unreadable
        batch unless ``orders`` names it (a loop's consumer is made again when it
        restarts)."""
        if reader is not None and reader.consumer is consumer:
            return reader
        return cls(consumer, policy="stop", unreadable=unreadable, orders=orders)

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Stop watching ``tps`` (revoked, or sought back to be read again): their batches,
        if they are met again, are found again."""
        tps = list(tps)
        gone = self.unreadable.release(tps)
        for tp in tps:
            self.ordered.pop(tp, None)
        mine = self.consumer.assignment()
        for batch in gone:
            if batch.tp in mine:
                self.consumer.resume(batch.tp)
