"""Records out: :class:`OutRecord`, :class:`BatchProducer` (one produce batch per topic
partition) and :func:`partition_for`, Kafka's default partitioner.

Both loops write through a :class:`BatchProducer` over their own aiokafka producer: the
scorer its decisions, label requests and dead letters, the learner its table writes. The
scorer's records come as :class:`Outgoing`: columns of many records to one topic
(:class:`Column`: the values, and one key for all or one each, or a partition each), so a
batch of decisions is grouped by partition in one step and no record object is made for it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numpy as np
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

__all__ = ["BatchProducer", "Column", "Headers", "OutRecord", "Outgoing", "partition_for"]

#: Kafka record headers, as aiokafka takes them
Headers = list[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to write: ``partition`` None = by ``key`` (Kafka's default partitioner;
    any partition when the key is None too); ``value`` None: a tombstone (a changelog
    deletion)."""

    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    headers: Headers | None = None


@dataclass(frozen=True, slots=True)
class Column:
    """Many records to one topic, in order: their ``values``; their keys, ``keys`` (one
    each) or ``key`` (the same for all); where they go, ``partitions`` (one each, taken
    modulo the topic's count) or, when None, by key as :class:`OutRecord` says."""

    topic: str
    values: Sequence[bytes]
    keys: Sequence[bytes | None] | None = None
    key: bytes | None = None
    partitions: Sequence[int] | None = None

    def __len__(self) -> int:
        return len(self.values)

    def record(self, i: int) -> OutRecord:
        """The ``i``-th record."""
        key = self.key if self.keys is None else self.keys[i]
        partition = None if self.partitions is None else self.partitions[i]
        return OutRecord(self.topic, key, self.values[i], partition)


@dataclass(frozen=True, slots=True)
class Outgoing(Sequence[OutRecord]):
    """Records to write: the records of ``columns``, then ``records``, in that order (each
    record made on demand when it is read one by one)."""

    columns: Sequence[Column] = ()
    records: Sequence[OutRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return sum(map(len, self.columns)) + len(self.records)

    def __iter__(self) -> Iterator[OutRecord]:
        for column in self.columns:
            yield from map(column.record, range(len(column)))
        yield from self.records

    @overload
    def __getitem__(self, index: int) -> OutRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[OutRecord]: ...

    def __getitem__(self, index: int | slice) -> OutRecord | list[OutRecord]:
        return list(self)[index]


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, as faust and aiokafka producers
    use) gives ``key`` among ``partitions``.

    >>> partition_for(b"default", 1), 0 <= partition_for(b"fraud", 8) < 8
    (0, True)
    """
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


class BatchProducer:
    """Records out in one produce batch per topic partition (aiokafka's batch API: no
    future, partitioner call or log record per record).

    aiokafka takes a partition's next batch only once its last one has left for the broker
    (``send_batch`` waits until then). ``pipelined``: each partition's batches are handed
    over by a task of its own (:class:`_Lane`), so :meth:`send_many` never waits for the
    broker, and the records that come while a batch waits join it: a request carries what
    came while the last was on its way (the scorer). Otherwise :meth:`send_many` hands its
    batches over itself, and has when it returns (the learner, whose flush waits for
    what it handed over)."""

    def __init__(self, producer: AIOKafkaProducer, *, pipelined: bool = False) -> None:
        self.producer = producer
        self.pipelined = pipelined
        self._partitions: dict[str, int] = {}
        self._spread = itertools.count()  # where records without key or partition go
        self._lanes: dict[tuple[str, int], _Lane] = {}

    async def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (asked once, then cached)."""
        count = self._partitions.get(topic)
        if count is None:
            found = await self.producer.partitions_for(topic)
            count = self._partitions[topic] = len(found)
        return count

    async def send_many(self, records: Sequence[OutRecord]) -> asyncio.Future[Any]:
        """Queue ``records``; the returned future is done once the broker acknowledged all
        of them (and fails if any one fails). A record's ``partition`` is taken modulo the
        topic's partition count (the count the topic really has)."""
        columns = records.columns if isinstance(records, Outgoing) else ()
        rest = records.records if isinstance(records, Outgoing) else records
        topics = {c.topic for c in columns} | {r.topic for r in rest}
        counts = {topic: await self.partitions(topic) for topic in topics}
        groups: dict[tuple[str, int], _Group] = {}
        for column in columns:
            self._group_column(column, counts[column.topic], groups)
        keyed: dict[tuple[bytes, int], int] = {}  # label requests share a few keys (models)
        for r in rest:
            count = counts[r.topic]
            if r.partition is not None:
                p = r.partition % count
            elif r.key is not None:
                p = self._keyed(r.key, count, keyed)
            else:
                p = next(self._spread) % count
            group = groups.get((r.topic, p))
            if group is None:
                group = groups[(r.topic, p)] = _Group()
            group.add(r.key, r.value, r.headers)
        futures: list[Any] = []
        for (topic, p), group in groups.items():
            if self.pipelined:
                lane = self._lanes.get((topic, p))
                if lane is None:
                    lane = self._lanes[(topic, p)] = _Lane(self.producer, topic, p)
                futures += lane.add(group)
            else:
                futures += await self._send(topic, p, group)
        return asyncio.gather(*futures)

    @staticmethod
    def _keyed(key: bytes, count: int, keyed: dict[tuple[bytes, int], int]) -> int:
        p = keyed.get((key, count), -1)
        if p < 0:
            p = keyed[(key, count)] = partition_for(key, count)
        return p

    def _group_column(
        self, column: Column, count: int, groups: dict[tuple[str, int], _Group]
    ) -> None:
        """``column``'s records into ``groups`` by (topic, partition), in order."""
        topic, values, keys, n = column.topic, column.values, column.keys, len(column)
        if not n:
            return
        if column.partitions is not None:  # by partition: one stable sort for all
            places = np.asarray(column.partitions, dtype=np.int64) % count
            order = np.argsort(places, kind="stable")
            cuts = np.flatnonzero(np.diff(places[order])) + 1
            for chosen in np.split(order, cuts):
                rows = chosen.tolist()
                group = groups.setdefault((topic, int(places[rows[0]])), _Group())
                group.extend(
                    [column.key] * len(rows) if keys is None else [keys[i] for i in rows],
                    [values[i] for i in rows],
                )
            return
        if keys is None and column.key is not None:  # one key: one partition
            group = groups.setdefault((topic, partition_for(column.key, count)), _Group())
            group.extend([column.key] * n, list(values))
            return
        keyed: dict[tuple[bytes, int], int] = {}
        for i, value in enumerate(values):  # as each record alone would go
            key = column.key if keys is None else keys[i]
            p = next(self._spread) % count if key is None else self._keyed(key, count, keyed)
            groups.setdefault((topic, p), _Group()).add(key, value, None)

    async def _send(self, topic: str, partition: int, group: _Group) -> list[Any]:
        futures: list[Any] = []
        batch = self.producer.create_batch()
        none: Headers = []
        headers = group.headers or itertools.repeat(none)
        for key, value, h in zip(group.keys, group.values, headers, strict=False):
            h = h or none
            if batch.append(key=key, value=value, timestamp=None, headers=h):
                continue
            if batch.record_count():  # full: send it, start the next
                futures.append(await self.producer.send_batch(batch, topic, partition=partition))
                batch = self.producer.create_batch()
                if batch.append(key=key, value=value, timestamp=None, headers=h):
                    continue
            # larger than a batch may be: the record alone (the producer checks its size)
            alone = self.producer.send(topic, value, key=key, partition=partition, headers=h)
            futures.append(await alone)
        if batch.record_count():
            futures.append(await self.producer.send_batch(batch, topic, partition=partition))
        return futures


@dataclass(slots=True)
class _Item:
    """What a lane hands over next: a batch still filling, or one record too large for a
    batch; ``acked`` is done once the broker acknowledged it."""

    acked: asyncio.Future[Any]
    batch: Any | None = None  # aiokafka's BatchBuilder
    alone: tuple[bytes | None, bytes | None, Headers] | None = None


class _Lane:
    """The records of one topic partition on their way to aiokafka, in order: batches
    handed over one at a time by a task of the lane's own, the last batch filling until its
    turn (see :class:`BatchProducer`)."""

    def __init__(self, producer: AIOKafkaProducer, topic: str, partition: int) -> None:
        self.producer = producer
        self.topic = topic
        self.partition = partition
        self.queue: deque[_Item] = deque()
        self.task: asyncio.Task[None] | None = None

    def add(self, group: _Group) -> list[asyncio.Future[Any]]:
        """Queue ``group``'s records; the futures of the batches that hold them."""
        touched: list[asyncio.Future[Any]] = []
        none: Headers = []
        headers = group.headers or itertools.repeat(none)
        for key, value, h in zip(group.keys, group.values, headers, strict=False):
            h = h or none
            item = self._open()
            if not item.batch.append(key=key, value=value, timestamp=None, headers=h):
                if item.batch.record_count():  # full: the next batch takes it
                    item = self._open(new=True)
                if not item.batch.append(key=key, value=value, timestamp=None, headers=h):
                    # larger than a batch may be: the record alone (the producer checks it)
                    item = _Item(asyncio.get_running_loop().create_future(), alone=(key, value, h))
                    self.queue.append(item)
            if not touched or touched[-1] is not item.acked:
                touched.append(item.acked)
        if self.queue and (self.task is None or self.task.done()):
            self.task = asyncio.create_task(self._hand())
        return touched

    def _open(self, *, new: bool = False) -> Any:
        """The batch that fills now (a new one after a full batch or a record alone)."""
        last = self.queue[-1] if self.queue else None
        if new or last is None or last.batch is None:
            last = _Item(asyncio.get_running_loop().create_future(), self.producer.create_batch())
            self.queue.append(last)
        return last

    async def _hand(self) -> None:
        """Hand the queue to aiokafka, oldest first; each item's future follows the
        broker's acknowledgement (or the error that kept it from the broker)."""
        item: _Item | None = None
        try:
            while self.queue:
                item = self.queue.popleft()  # taken: records that come now start a new batch
                if item.batch is not None and not item.batch.record_count():
                    item.acked.set_result(None)  # opened for a record that went alone
                    continue
                try:
                    sent = await self._handed(item)
                except Exception as exc:  # any error: it goes to whoever waits for the records
                    item.acked.set_exception(exc)
                    continue
                sent.add_done_callback(functools.partial(_follow, item.acked))
                item = None  # handed over: its future follows aiokafka's
        finally:  # cancelled: what was not handed over never will be
            for left in [item, *self.queue]:
                if left is not None and not left.acked.done():
                    left.acked.cancel()

    async def _handed(self, item: _Item) -> asyncio.Future[Any]:
        """``item`` handed to aiokafka (waits while its last batch of the partition waits)."""
        if item.batch is not None:
            sent: asyncio.Future[Any] = await self.producer.send_batch(
                item.batch, self.topic, partition=self.partition
            )
            return sent
        assert item.alone is not None  # noqa: S101 - a batch or a record alone
        key, value, headers = item.alone
        alone: asyncio.Future[Any] = await self.producer.send(
            self.topic, value, key=key, partition=self.partition, headers=headers
        )
        return alone


def _follow(target: asyncio.Future[Any], source: asyncio.Future[Any]) -> None:
    """``target`` ends as ``source`` did."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(None)


@dataclass(slots=True)
class _Group:
    """The records of one topic partition, in order, as columns (``headers``: None while
    no record has any, then one entry per record)."""

    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: list[Headers | None] | None = None

    def add(self, key: bytes | None, value: bytes | None, headers: Headers | None) -> None:
        if headers and self.headers is None:
            self.headers = [None] * len(self.values)
        self.keys.append(key)
        self.values.append(value)
        if self.headers is not None:
            self.headers.append(headers)

    def extend(self, keys: list[bytes | None], values: list[bytes]) -> None:
        self.keys += keys
        self.values += values
        if self.headers is not None:
            self.headers += [None] * len(values)
