"""The scoring path on its own Kafka consumer: whole fetched batches in, batched produce
out, offsets committed once every output of them is acknowledged.

Scoring needs no table, so it runs on plain aiokafka rather than a faust agent: a consumer
in the group ``<app_id>-score`` (:func:`score_group`) reads the features topic, each
``getmany`` is scored as one batch by :meth:`~service.stream.scoring.scorer.Scorer.decide`, and a
:class:`~service.stream.kafka.produce.BatchProducer` writes its records with one produce
batch per topic partition (acks=all). Batches are pipelined: the next one is scored while
the broker acknowledges the last, and a separate task commits, in order, the offsets of
every batch whose records are all acknowledged. So a committed offset always means every
output before it is durable; after a crash the uncommitted rest is scored again, with the
same coins, so the same decisions (at-least-once, as before).

- A produce that fails (broker away past the request timeout) commits nothing: the loop
  waits for the batches in flight, seeks back to the last committed offsets and scores
  from there again.
- On a rebalance the revoked partitions' batches in flight are awaited and committed
  before the partitions go (:meth:`ScoreLoop.revoked`), so the next owner starts where this
  worker's acknowledged outputs end.
- its :class:`~service.stream.kafka.loop.LoopView` shows the consumer to liveness
  (:mod:`service.stream.health.liveness`).
- A batch of the features topic that cannot be read (a codec, a CRC, a record that does not
  parse) stops its partition there, loudly, while the others go on
  (:class:`~service.stream.kafka.unreadable.Reader`); an operator's skip order moves it past
  the batch, and the offset after it is committed like a scored batch's.
- The offsets committed are the consumer's positions after a batch: past the control record
  that ends a transaction too (with ``isolation_level = read_committed``, the default, events
  of an aborted transaction are never fetched).

An assigned partition is paused until Kafka says where it starts
(:class:`~service.stream.kafka.groups.Starts`): the score group's commit, else where the worker's
faust group (``<app_id>``, which consumed the features topic before this path existed)
committed, else (neither group ever committed) the earliest offset. While Kafka cannot
say, the partition is not consumed and the worker is not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from service.config import Settings
from service.stream.kafka.groups import (
    Rebalance,
    Starts,
    commit,
    fetched_ends,
    raw_message,
    record_seconds,
    seek_committed,
)
from service.stream.kafka.loop import LoopView, Progress
from service.stream.kafka.produce import BatchProducer
from service.stream.kafka.unreadable import FetchFailed, Reader, SkipBook, Unreadable
from service.stream.scoring.batch import Messages
from service.stream.scoring.scorer import Scorer

__all__ = ["ScoreLoop", "score_group"]

log = logging.getLogger(__name__)

#: batches scored and sent but not yet acknowledged, at most (back-pressure)
MAX_IN_FLIGHT = 8
#: seconds between attempts after the broker failed a fetch or a produce
RETRY_SECONDS = 1.0


def _messages(fetched: dict[TopicPartition, list[Any]]) -> Messages:
    """A fetched batch as :class:`Messages`: its values and partitions as columns, no
    message object per record (one is made for a record only when asked for: a dead
    letter)."""
    records = [r for rs in fetched.values() for r in rs]
    return Messages(
        records,
        raw_message,
        values=[r.value or b"" for r in records],
        partitions=[r.partition for r in records],
        timestamps=lambda: [record_seconds(r) for r in records],
    )


def score_group(app_id: str) -> str:
    """The consumer group of the scoring path.

    >>> score_group("abstain")
    'abstain-score'
    """
    return f"{app_id}-score"


@dataclass(slots=True)
class _InFlight:
    acked: asyncio.Future[Any]
    offsets: dict[TopicPartition, int]  # next offset to consume, per partition


@dataclass(slots=True)
class _State:
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    in_flight: deque[_InFlight] = field(default_factory=deque)
    rewind: bool = False  # a produce failed: score again from the committed offsets
    rebalancing: bool = False
    generation: int = 0


class ScoreLoop:
    """Consume -> :meth:`Scorer.decide` -> :class:`BatchProducer` -> commit (see the module
    docstring). :meth:`run` until cancelled; the consumer and producer are made by
    ``consumer_factory`` / ``producer_factory`` when it starts."""

    def __init__(
        self,
        settings: Settings,
        scorer: Scorer,
        progress: Progress,
        *,
        consumer_factory: Callable[[ConsumerRebalanceListener], AIOKafkaConsumer],
        producer_factory: Callable[[], AIOKafkaProducer],
        admin_factory: Callable[[], AIOKafkaAdminClient] | None = None,
        unreadable: Unreadable | None = None,
        skips: SkipBook | None = None,
    ) -> None:
        self.settings = settings
        self.scorer = scorer
        self.progress = progress
        self.consumer_factory = consumer_factory
        self.producer_factory = producer_factory
        self.admin_factory = admin_factory
        self.unreadable = unreadable if unreadable is not None else Unreadable()
        self.skips = skips if skips is not None else SkipBook()
        self.consumer: AIOKafkaConsumer | None = None
        self.reader: Reader | None = None
        self.producer: BatchProducer | None = None
        self.state = _State()
        self.lock = asyncio.Lock()  # one batch scored/sent at a time; rebalances wait for it
        self.commit_lock = asyncio.Lock()  # one commit at a time, offsets never go back
        self.sent = asyncio.Event()  # a batch joined the in-flight queue
        self.starts = Starts(settings.app_id, admin_factory)
        self.view = LoopView(self)
        #: the last fetch was full (more events are waiting): the learner defers to scoring
        self.backlogged = False

    async def run(self, ready: asyncio.Event) -> None:
        """Start the clients once ``ready`` (models read), then score until cancelled;
        on the way out, wait for what is in flight and commit it."""
        await ready.wait()
        producer = self.producer_factory()
        await producer.start()
        self.producer = BatchProducer(producer, pipelined=True)
        consumer = self.consumer = self.consumer_factory(self.listener())
        await consumer.start()
        committer = asyncio.create_task(self._commit_forever())
        try:
            while True:
                await self._round(consumer)
        finally:
            committer.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._drain(), 10.0)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await consumer.stop()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await producer.stop()

    async def _round(self, consumer: AIOKafkaConsumer) -> None:
        """One fetched batch: scored, sent, queued for the committer."""
        if self.state.rewind:
            await self._rewind(consumer)
        if self.starts.unknown:
            await self._start(consumer)
        reader = self._reader(consumer)
        if reader.to_release:
            await self._skip_ordered(reader)
        try:
            fetched = await reader.getmany(timeout_ms=100, max_records=self.settings.batch_size)
        except (KafkaError, FetchFailed) as exc:
            log.warning("fetching features failed: %r", exc)
            self.backlogged = False
            await asyncio.sleep(RETRY_SECONDS)
            return
        self.backlogged = sum(map(len, fetched.values())) >= self.settings.batch_size
        if not fetched:
            return
        while len(self.state.in_flight) >= MAX_IN_FLIGHT:
            await asyncio.wait([self.state.in_flight[0].acked])
        async with self.lock:
            assigned = consumer.assignment()
            fetched = {tp: rs for tp, rs in fetched.items() if tp in assigned}
            if not fetched or self.state.rewind:
                return
            ends = await fetched_ends(consumer, fetched)
            _, records = self.scorer.decide(_messages(fetched))
            assert self.producer is not None  # noqa: S101 - started in run()
            try:
                acked = await self.producer.send_many(records)
            except KafkaError as exc:
                log.warning("producing decisions failed: %r; scoring again", exc)
                self.state.rewind = True
                return
            self._queue(acked, ends)

    def _queue(self, acked: asyncio.Future[Any], ends: dict[TopicPartition, int]) -> None:
        """``ends`` (the offset after what was handled, per partition) to be committed once
        ``acked`` is done, in order (under :attr:`lock`)."""
        self.state.in_flight.append(_InFlight(acked, ends))
        self.sent.set()
        for tp, end in ends.items():
            self.progress.mark(tp.topic, tp.partition, end - 1)

    def _reader(self, consumer: AIOKafkaConsumer) -> Reader:
        self.reader = Reader.of(self.reader, consumer, self.unreadable, self.skips)
        return self.reader

    async def _skip_ordered(self, reader: Reader) -> None:
        """Move past the stopped batches an operator's order names; their ends are committed
        in turn, like a scored batch's."""
        async with self.lock:
            moved = reader.release(self.skips)
            if moved:
                done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                done.set_result(None)
                self._queue(done, moved)

    async def _start(self, consumer: AIOKafkaConsumer) -> None:
        """Resume the partitions whose start Kafka told (:class:`Starts`); the others stay
        paused, and are asked about again a second later. A partition started again is read
        again from its start: a batch it stopped at is met (and stopped at) anew."""
        async with self.lock:
            started = await self.starts.learn(consumer, self.state.committed)
            if started:
                self._reader(consumer).forget(started)
                consumer.resume(*started)

    async def _commit_forever(self) -> None:
        """Commit, oldest first, the offsets of every batch whose outputs are all
        acknowledged (several at once when they are)."""
        while True:
            if not self.state.in_flight:
                self.sent.clear()
                await self.sent.wait()
                continue
            await asyncio.wait([self.state.in_flight[0].acked])
            async with self.lock:
                offsets = self._take_acknowledged()
            await self._commit(offsets)

    def _take_acknowledged(self) -> dict[TopicPartition, int]:
        """The offsets of the acknowledged batches at the head of the in-flight queue,
        taken off it (under :attr:`lock`). A failed batch stops there and sets
        :attr:`_State.rewind`: it and every later batch are scored again."""
        offsets: dict[TopicPartition, int] = {}
        queue = self.state.in_flight
        while queue and queue[0].acked.done():
            item = queue.popleft()
            if item.acked.cancelled() or item.acked.exception() is not None:
                error = None if item.acked.cancelled() else item.acked.exception()
                log.warning("producing decisions failed: %r; scoring again", error)
                self.state.rewind = True
                queue.clear()
                break
            offsets.update(item.offsets)
        return offsets

    async def _commit(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` of partitions still assigned, never below what was committed."""
        assert self.consumer is not None  # noqa: S101 - started in run()
        async with self.commit_lock:  # a failure is covered by the next commit
            await commit(self.consumer, offsets, self.state.committed, "scored")

    async def _drain(self) -> None:
        """Wait for every batch in flight, then commit what was acknowledged."""
        async with self.lock:
            pending = [item.acked for item in self.state.in_flight]
            if pending:
                await asyncio.wait(pending)
            offsets = self._take_acknowledged()
            await self._commit(offsets)

    async def _rewind(self, consumer: AIOKafkaConsumer) -> None:
        """After a failed produce: wait for what is in flight, then seek every assigned
        partition back to its committed offset (the earliest when none) and go on."""
        async with self.lock:
            pending = [item.acked for item in self.state.in_flight]
            if pending:
                await asyncio.wait(pending)
            self.state.in_flight.clear()
            await asyncio.sleep(RETRY_SECONDS)
            assigned = consumer.assignment()
            self._reader(consumer).forget(assigned)  # read again from the commit: met anew
            seek_committed(consumer, assigned, self.state.committed, self.starts)
            self.state.rewind = False

    def listener(self) -> ConsumerRebalanceListener:
        """The rebalance listener the consumer must be subscribed with."""
        return Rebalance(self)

    async def revoked(self, revoked: AbstractSet[TopicPartition]) -> None:
        """Before partitions go: their batches in flight acknowledged and committed. The
        stream counts as paused only while that lasts: the group may then wait for a broker
        that is away, and liveness must still see that (readiness follows the broker)."""
        self.state.rebalancing = True
        self.state.generation += 1
        try:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._drain(), self.settings.session_timeout_seconds / 2)
            for tp in revoked:
                self.state.committed.pop(tp, None)
            self.starts.forget(revoked)
            self.unreadable.release(revoked)  # the next owner meets the batch itself
        finally:
            self.state.rebalancing = False

    async def assigned(self, assigned: AbstractSet[TopicPartition]) -> None:
        """New partitions: paused until :class:`Starts` learns where they start (those the
        score group never committed start where the worker's faust group, the features
        consumer of earlier versions, did, if it did)."""
        if self.consumer is not None:
            self.starts.hold(self.consumer, assigned)

    def pause(self) -> list[TopicPartition]:
        """Stop fetching every assigned partition (what a stalled consumer looks like)."""
        assert self.consumer is not None  # noqa: S101
        tps = sorted(self.consumer.assignment())
        self.consumer.pause(*tps)
        return tps

    def resume(self) -> list[TopicPartition]:
        assert self.consumer is not None  # noqa: S101
        assigned = self.consumer.assignment()
        stopped = {batch.tp for batch in self.unreadable.of(assigned)}
        tps = sorted(assigned - self.starts.unknown - stopped)
        self.consumer.resume(*tps)
        return tps
