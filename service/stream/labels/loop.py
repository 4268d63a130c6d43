"""The learner on its own Kafka consumer: label requests and labels in whole fetched batches,
table writes sent with the batch produce API, offsets committed once those are durable.

A consumer in the group ``<app_id>-learn`` (:func:`learn_group`) reads the label-requests
and labels topics. Both are keyed by model and have the same partition count, and the
group's range assignment gives one member the same partition numbers of both: one learner
owns a model's pending requests, its labels and its (w, rho), as before.

- **Assigned:** the new partitions are paused, the changelogs of each
  (:mod:`service.stream.labels.tables`) are read to their end into memory, then the partitions
  resume and the joiner owns their models (:meth:`~service.stream.labels.joiner.LabelJoiner.own`).
  Not a record of a partition is handled before its tables are whole.
- **A batch:** for each partition, its label requests, then its labels, go through
  :meth:`~service.stream.labels.joiner.LabelJoiner.handle` with table writes going to that
  partition's changelogs. The writes collect in :class:`~service.stream.labels.tables.Writes`;
  at the end of the batch, and of each ``label_group_ms`` of it (and wherever the joiner
  asks for durability: the applied mark before the model write) they are sent as one
  produce batch per changelog partition, acks=all, together with a flush of the learner's
  other outputs. Only then may the batch's
  offsets be committed (every ``commit_interval_seconds``, and before partitions go): the
  order is :mod:`~service.stream.labels.checkpoint`'s. A request costs a dictionary write
  and a record appended to a batch, not a produce call of its own.
- **A produce or fetch that fails:** nothing of the batch is committed; every owned
  partition is read again from its changelogs and consumed again from its committed
  offset. That is exactly a restart after kill -9, which the learn protocol is made for.
- **A group that must be applied again** (:class:`~service.stream.labels.protocol.StrictRedo`:
  its newest version of a model fails a check, or a label of it is refused where the version
  before it was never made): the same, at once, with that model's labels applied one at a
  time for a while (:meth:`~service.stream.labels.joiner.LabelJoiner.strictly`).
- **Caught up:** a label-requests partition handled up to the high-water mark of the last
  fetch is reported to the joiner (:meth:`~service.stream.labels.joiner.LabelJoiner.caught_up`):
  a label parked there waits for nothing more than ``orphan_label_seconds``.
- **Revoked:** the batch in hand is finished, flushed and committed first; then the
  partitions' entries leave memory.
- **Corrections:** between batches the loop takes the derivations of corrections that are
  done and starts the ones due (:meth:`~service.stream.labels.corrector.Corrector.tick`);
  while one is in flight it fetches with a shorter wait, so a derivation that lands is
  applied within ~50 ms. The derivations run in a process of their own.
- **What the changelogs held that fails its check** (with ``snapshot_key``: unsigned or
  mis-signed, :mod:`~service.stream.labels.tables`) is dead-lettered once the partitions are
  read (``source: changelogs``) and superseded on the changelog before a record is handled.
- **A batch that cannot be read** (a codec, a CRC, a record that does not parse) stops its
  partition there, loudly, while the others go on
  (:class:`~service.stream.kafka.unreadable.Reader`); an operator's skip order moves it past,
  and the offset after the batch is committed in turn. Offsets committed are the consumer's
  positions after a batch (past a transaction's control record).

An assigned partition is not consumed before Kafka says where it starts
(:class:`~service.stream.kafka.groups.Starts`): the learn group's commit, else where the worker's
faust group (``<app_id>``, whose agent consumed these topics before this path existed)
committed, else (neither ever committed) the first record. While Kafka cannot say, the
partition stays paused and the worker is not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from service.config import Settings
from service.records import DeadLetter, Reason
from service.records.reasons import Source
from service.records.state import Stale
from service.stream.kafka.groups import (
    Rebalance,
    Starts,
    fetched_ends,
    raw_message,
    seek_committed,
)
from service.stream.kafka.loop import LoopView, Progress, RecoveryState
from service.stream.kafka.produce import BatchProducer
from service.stream.kafka.unreadable import (
    FetchFailed,
    Reader,
    SkipBook,
    Unreadable,
    UnreadableBatch,
)
from service.stream.labels.checkpoint import Checkpoint
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.protocol import StrictRedo
from service.stream.labels.tables import ChangelogTable, Recovery, Refused, recover

__all__ = ["LearnLoop", "LearnView", "learn_group"]

log = logging.getLogger(__name__)

#: seconds between attempts after the broker failed a fetch or a produce
RETRY_SECONDS = 1.0
#: most records handled (and made durable) together
MAX_RECORDS = 1000
#: while the scoring path has a backlog (its last fetch was full), the learner's share of
#: the worker's CPU: it sleeps (1 - share) / share times the CPU its last batch took.
#: Decisions wait for nobody; label requests are stored once the burst is decided.
LEARN_SHARE = 0.1
#: the longest such pause: labels (each waits for its mark to be durable) still apply
#: within about a second under a sustained backlog
MAX_DEFER_SECONDS = 1.0
#: the clock of a group's length (``label_group_ms``)
_now = time.monotonic


def learn_group(app_id: str) -> str:
    """The consumer group of the learner.

    >>> learn_group("abstain")
    'abstain-learn'
    """
    return f"{app_id}-learn"


@dataclass(slots=True)
class _State:
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    unrecovered: set[int] = field(default_factory=set)  # assigned, changelogs not read yet
    owned: frozenset[int] = frozenset()  # partitions whose tables are in memory
    assigned_once: bool = False
    rebalancing: bool = False
    generation: int = 0


class LearnLoop:
    """Consume -> recover -> :meth:`LabelJoiner.handle` -> durable -> commit (see the module
    docstring). :meth:`run` until cancelled."""

    def __init__(
        self,
        settings: Settings,
        joiner: LabelJoiner,
        tables: Sequence[ChangelogTable],
        checkpoint: Checkpoint,
        progress: Progress,
        *,
        consumer_factory: Callable[[ConsumerRebalanceListener], AIOKafkaConsumer],
        producer_factory: Callable[[], AIOKafkaProducer],
        reader_factory: Callable[[], AIOKafkaConsumer],
        admin_factory: Callable[[], AIOKafkaAdminClient] | None = None,
        defer: Callable[[], bool] = lambda: False,
        unreadable: Unreadable | None = None,
        skips: SkipBook | None = None,
    ) -> None:
        self.settings = settings
        self.joiner = joiner
        self.tables = list(tables)
        self.checkpoint = checkpoint
        self.progress = progress
        self.consumer_factory = consumer_factory
        self.producer_factory = producer_factory
        self.reader_factory = reader_factory
        self.admin_factory = admin_factory
        self.defer = defer
        self.unreadable = unreadable if unreadable is not None else Unreadable()
        self.skips = skips if skips is not None else SkipBook()
        self._handled_for = 0.0  # seconds the last batch took to handle
        self.consumer: AIOKafkaConsumer | None = None
        self.reader: Reader | None = None
        #: a changelog batch that cannot be read is skipped (the tables are read back from
        #: the start at every assignment) and handed here: its dead letter
        self.on_skip: Callable[[UnreadableBatch], Awaitable[None]] | None = None
        self.producer: BatchProducer | None = None
        self.state = _State()
        self.recovery = Recovery()
        self.lock = asyncio.Lock()  # one batch (or recovery) at a time; revokes wait for it
        self.commit_lock = asyncio.Lock()
        self.starts = Starts(settings.app_id, admin_factory)
        self.view = LearnView(self)

    async def run(self) -> None:
        """Start the clients, then learn until cancelled; on the way out, make what was
        handled durable and commit it."""
        producer = self.producer_factory()
        await producer.start()
        self.producer = BatchProducer(producer)
        self.checkpoint.start(self.producer)
        runner = self.joiner.corrector.runner
        start = getattr(runner, "start", None)
        if start is not None:  # the derivation process imports while the loop starts
            start()
        consumer = self.consumer = self.consumer_factory(Rebalance(self))
        await consumer.start()
        try:
            while True:
                await self._round(consumer)
        finally:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._settle(), 10.0)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await consumer.stop()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await producer.stop()
            runner.close()

    async def _round(self, consumer: AIOKafkaConsumer) -> None:
        """Recover what is new, then one fetched batch: handled, durable, committed."""
        if self.starts.unknown:
            async with self.lock:
                await self.starts.learn(consumer, self.state.committed)
        if self.state.unrecovered:
            await self._recover(consumer)
        if self.defer():  # decisions are waiting: the learner takes its share, no more
            pause = self._handled_for * (1.0 - LEARN_SHARE) / LEARN_SHARE
            await asyncio.sleep(min(MAX_DEFER_SECONDS, pause))
        reader = self._reader(consumer)
        if reader.to_release:
            await self._skip_ordered(reader)
        await self._corrections(consumer)
        wait = 50 if self.joiner.corrector.busy() else 200
        try:
            fetched = await reader.getmany(timeout_ms=wait, max_records=MAX_RECORDS)
        except (KafkaError, FetchFailed) as exc:
            log.warning("fetching label topics failed: %r", exc)
            await asyncio.sleep(RETRY_SECONDS)
            return
        if not fetched:
            self._caught_up(consumer)  # an idle partition is caught up too
            await self._commit()  # what the last batches made durable, once the interval is up
            return
        async with self.lock:
            owned = self.state.owned
            fetched = {
                tp: rs
                for tp, rs in fetched.items()
                if tp.partition in owned and tp in consumer.assignment()
            }
            if not fetched:
                return
            ends = await fetched_ends(consumer, fetched)
            try:
                started = time.thread_time()  # CPU: waits for the broker do not count
                self.joiner.stage(self.checkpoint.writes.partition)  # one flush per batch
                try:
                    await self._handle(fetched)
                    self._handled_for = time.thread_time() - started
                    await self.joiner.commit()
                finally:
                    self.joiner.unstage()  # nothing is left after a commit; else dropped
                await self.checkpoint.durable()
            except KafkaError as exc:
                log.warning("storing the learner's state failed (%r): reading it again", exc)
                await self._reset(consumer)
                return
            except StrictRedo as exc:
                log.warning("%s: applying the group again, one label at a time", exc)
                self.joiner.strictly(exc.model)
                self.joiner.metrics.groups_redone.labels(model=exc.model).inc()
                await self._reset(consumer, pause=False)
                return
            except Stale:
                log.exception("a model state was lost: applying the group again, strictly")
                self.joiner.strictly(None)
                await self._reset(consumer, pause=False)
                return
            self._handled(ends)
        self._caught_up(consumer)
        await self._commit()

    async def _corrections(self, consumer: AIOKafkaConsumer) -> None:
        """Apply the corrections whose derivations landed; start the ones due."""
        async with self.lock:
            try:
                await self.joiner.corrector.tick()
            except KafkaError as exc:
                log.warning("applying a correction failed (%r): reading the state again", exc)
                await self._reset(consumer)

    async def read_labels(
        self, partition: int, offsets: Collection[int]
    ) -> dict[int, bytes | None]:
        """The values of the labels topic's records at ``offsets`` of ``partition`` (what
        a history read back is checked against): None for an offset the topic no longer
        holds (below its first offset: retention), left out for one it never held."""
        wanted = set(offsets)
        if not wanted:
            return {}
        tp = TopicPartition(self.settings.topics.labels, partition)
        consumer = self.reader_factory()
        out: dict[int, bytes | None] = {}
        await consumer.start()
        try:
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            first = (await consumer.beginning_offsets([tp]))[tp]
            out.update({o: None for o in wanted if o < first})
            wanted -= set(out)
            if not wanted:
                return out
            consumer.seek(tp, min(wanted))
            last = min(max(wanted) + 1, end)
            while await consumer.position(tp) < last:
                fetched = await consumer.getmany(tp, timeout_ms=500, max_records=10_000)
                for record in fetched.get(tp, []):
                    if record.offset in wanted and record.value is not None:
                        out[record.offset] = record.value
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()
        return out

    def _handled(self, ends: dict[TopicPartition, int]) -> None:
        """Partitions done up to ``ends`` (their effects durable): committed in turn."""
        for tp, end in ends.items():
            self.checkpoint.handled(tp, end)
            self.progress.mark(tp.topic, tp.partition, end - 1)

    def _reader(self, consumer: AIOKafkaConsumer) -> Reader:
        self.reader = Reader.of(self.reader, consumer, self.unreadable, self.skips)
        return self.reader

    async def _skip_ordered(self, reader: Reader) -> None:
        """Move past the stopped batches an operator's order names."""
        async with self.lock:
            self._handled(reader.release(self.skips))

    async def _handle(self, fetched: dict[TopicPartition, list[Any]]) -> None:
        requests = self.settings.topics.label_requests
        order = sorted(fetched, key=lambda tp: (tp.partition, tp.topic != requests))
        group = self.settings.label_group_ms / 1000.0
        began = _now()
        for tp in order:
            with self.checkpoint.writes.partition(tp.partition):
                for r in fetched[tp]:
                    await self.joiner.handle(raw_message(r))
                    if _now() - began >= group:
                        # the labels applied so far are made durable and their versions
                        # written: a long batch is served group by group, not at its end
                        await self.joiner.commit_group()
                        began = _now()
                    # a turn for the scoring path between records: a staged label waits for
                    # no broker, so a batch would otherwise hold the event loop to its end
                    await asyncio.sleep(0)

    def _caught_up(self, consumer: AIOKafkaConsumer) -> None:
        """Tell the joiner which of its label-requests partitions have nothing left to read
        (handled up to the high-water mark of the last fetch): a label parked there waits
        for nothing more than its time (:meth:`LabelJoiner.caught_up`)."""
        requests, now = self.settings.topics.label_requests, self.joiner.clock()
        held = consumer.paused() | self.starts.unknown  # a paused partition's mark is stale
        for tp in consumer.assignment():
            if tp.topic != requests or tp.partition not in self.state.owned or tp in held:
                continue
            high = consumer.highwater(tp)
            done = self.progress.offsets.get((tp.topic, tp.partition))
            position = self.state.committed.get(tp) if done is None else done + 1
            if high is not None and high >= 0 and position is not None and position >= high:
                self.joiner.caught_up(tp.partition, now)

    async def _commit(self, *, force: bool = False) -> None:
        """What the checkpoint made durable, committed (:meth:`Checkpoint.commit`)."""
        consumer = self.consumer
        if consumer is None:
            return
        async with self.commit_lock:
            await self.checkpoint.commit(consumer, self.state.committed, force=force)

    async def _settle(self) -> None:
        async with self.lock:
            await self.checkpoint.durable()
        await self._commit(force=True)

    async def _recover(self, consumer: AIOKafkaConsumer) -> None:
        """Read the changelogs of the partitions assigned and not read yet whose starts
        are known, then resume them."""
        async with self.lock:
            wanted = self.state.unrecovered - {tp.partition for tp in self.starts.unknown}
            if not wanted:
                return
            count = await recover(
                self.reader_factory,
                self.tables,
                wanted,
                self.recovery,
                on_skip=self.on_skip,
                unreadable=self.unreadable,
            )
            assigned = {tp.partition for tp in consumer.assignment()}
            now = wanted & assigned
            for table in self.tables:
                table.drop(wanted - assigned)  # revoked while it was read
            try:
                await self._repair()
            except KafkaError as exc:
                log.warning("superseding refused changelog records failed (%r); again", exc)
                await self.checkpoint.forget()
                return
            self.state.unrecovered -= wanted
            self._own((self.state.owned | now) & assigned)
            tps = [
                tp
                for tp in consumer.assignment()
                if tp.partition in now and tp not in self.unreadable
            ]
            consumer.resume(*tps)
            log.info("learner partitions %s: %d changelog records read", sorted(now), count)

    async def _repair(self) -> None:
        """Dead-letter what the changelogs held that failed its check, and make durable the
        records that supersede it (:meth:`ChangelogTable.repair`) before a record of the
        partitions is handled."""
        refused: list[Refused] = []
        for table in self.tables:
            refused += table.repair()
        legacy = [r for r in refused if r.legacy]
        if legacy:
            log.warning(
                "%d unsigned changelog records written before the learner signed its "
                "changelogs were not taken (%s)",
                len(legacy),
                sorted({r.topic for r in legacy}),
            )
        for r in refused:
            if r.legacy:
                continue
            log.error(
                "refused %s record of %s[%s]@%s (key %r)",
                r.reason,
                r.topic,
                r.partition,
                r.offset,
                r.key[:80],
            )
            detail = f"a changelog record that is {r.reason}: not taken, superseded"
            await self.joiner.outputs.dead_letter(
                DeadLetter(
                    Source.CHANGELOGS,
                    r.topic,
                    r.partition,
                    r.offset,
                    Reason(r.reason),
                    detail,
                    r.value or b"",
                )
            )
        await self.checkpoint.durable()

    def _own(self, partitions: frozenset[int] | set[int]) -> None:
        """The partitions whose tables are in memory now: the joiner owns their models."""
        self.state.owned = frozenset(partitions)
        self.joiner.own(self.state.owned)

    async def _reset(self, consumer: AIOKafkaConsumer, *, pause: bool = True) -> None:
        """After a failed produce or fetch (``pause``: waiting first), or a group to apply
        again: forget the batch and the memory, read every owned partition's changelogs
        again and consume from the committed offsets (a restart)."""
        await self.checkpoint.forget()
        if pause:
            await asyncio.sleep(RETRY_SECONDS)
        owned = set(self.state.owned)
        tps = sorted(tp for tp in consumer.assignment() if tp.partition in owned)
        self._reader(consumer).forget(tps)  # read again from the commit: met anew
        if tps:
            consumer.pause(*tps)
        seek_committed(consumer, tps, self.state.committed, self.starts)
        self._own(frozenset())
        self.state.unrecovered |= owned

    async def revoked(self, revoked: AbstractSet[TopicPartition]) -> None:
        """Before partitions go: the batch in hand durable and committed, then their
        entries out of memory."""
        self.state.rebalancing = True
        self.state.generation += 1
        try:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._settle(), self.settings.session_timeout_seconds / 2)
            gone = {tp.partition for tp in revoked}
            async with self.lock:
                for tp in revoked:
                    self.state.committed.pop(tp, None)
                self.starts.forget(revoked)
                self.unreadable.release(revoked)  # the next owner meets the batch itself
                for table in self.tables:
                    table.drop(gone)
                self.state.unrecovered -= gone
                self._own(self.state.owned - gone)
        finally:
            self.state.rebalancing = False

    async def assigned(self, assigned: AbstractSet[TopicPartition]) -> None:
        """New partitions: paused until Kafka says where they start (:class:`Starts`;
        those the group never committed start where the faust group did, if it did) and
        their changelogs are read (the next rounds)."""
        self.state.assigned_once = True
        consumer = self.consumer
        if consumer is None or not assigned:
            return
        self.starts.hold(consumer, assigned)
        self.state.unrecovered |= {tp.partition for tp in assigned}

    def pause(self) -> list[TopicPartition]:
        """Stop fetching every assigned partition (what a stalled consumer looks like)."""
        assert self.consumer is not None  # noqa: S101
        tps = sorted(self.consumer.assignment())
        self.consumer.pause(*tps)
        return tps

    def resume(self) -> list[TopicPartition]:
        assert self.consumer is not None  # noqa: S101
        stopped = {batch.tp for batch in self.unreadable.of(self.consumer.assignment())}
        tps = sorted(
            tp
            for tp in self.consumer.assignment() - self.starts.unknown - stopped
            if tp.partition not in self.state.unrecovered
        )
        self.consumer.resume(*tps)
        return tps


class LearnView(LoopView):
    """:class:`~service.stream.kafka.loop.ConsumerView` of the learner's consumer: paused
    during a rebalance and while changelogs are read; recovery is what :func:`recover`
    reports."""

    def __init__(self, loop: LearnLoop) -> None:
        super().__init__(loop)
        self._learn = loop

    @property
    def paused(self) -> bool:
        return self._learn.state.rebalancing or self.recovery().pauses_stream

    def recovery(self) -> RecoveryState:
        state, progress = self._learn.state, self._learn.recovery
        reading = bool(state.unrecovered)
        return RecoveryState(
            in_recovery=reading,
            completed=state.assigned_once and not reading,
            offsets=dict(progress.offsets) if reading else {},
            remaining=sum(progress.remaining.values()) if reading else 0,
        )
