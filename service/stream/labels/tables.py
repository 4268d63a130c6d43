"""The learner's tables: in memory for the partitions it owns, every write a record on the
table's compacted changelog, read back from the start of a partition when it is assigned.

A :class:`ChangelogTable` is a :class:`~service.stream.labels.state.Table` (get, set, delete, scan).
Its changelog is ``<app_id>-<name>-changelog`` (the catalogue:
:mod:`service.stream.kafka.topics`): key → value, a record without a value (a tombstone) deletes
the key, so compaction keeps exactly the live entries. A write goes to the changelog partition
of the record being handled (:class:`Writes`: the label topics and the changelogs are
co-partitioned, so that is the partition of the model the write is about); the records wait in
:attr:`Writes.records` until the learner sends them, in order, with the batch produce API, and
awaits their acknowledgement before it commits the offsets that caused them (:mod:`.loop`).

:func:`recover` reads the changelog partitions of newly assigned partitions up to their end
into the tables before a single label record of them is handled. A changelog is input like
any other: a key that is not bytes-like is impossible here (the records are raw), a value
that does not parse is the stores' concern (:mod:`service.stream.labels.state` skips it on scans
and refuses it on reads).

>>> writes = Writes()
>>> table = ChangelogTable("abstain-pending-changelog", writes)
>>> with writes.partition(3):
...     table[b"k"] = b"v"
...     del table[b"k"]
>>> [(r.key, r.value, r.partition) for r in writes.take()]
[(b'k', b'v', 3), (b'k', None, 3)]
>>> b"k" in table
False
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from service.stream.errors import StreamError
from service.stream.kafka.produce import OutRecord
from service.stream.kafka.unreadable import FetchFailed, Reader, Unreadable, UnreadableBatch

__all__ = [
    "ChangelogTable",
    "Recovery",
    "TableWriteError",
    "Writes",
    "recover",
]

log = logging.getLogger(__name__)

#: seconds between attempts when the broker fails a recovery read
RETRY_SECONDS = 1.0


class TableWriteError(StreamError):
    """A table was written outside the handling of a record (no partition to write to)."""


class Writes:
    """The partition table writes go to now, and the changelog records not yet sent."""

    def __init__(self) -> None:
        self._partition: int | None = None
        self.records: list[OutRecord] = []

    @contextlib.contextmanager
    def partition(self, partition: int) -> Iterator[None]:
        """Writes in this block go to changelog partition ``partition``."""
        before, self._partition = self._partition, partition
        try:
            yield
        finally:
            self._partition = before

    def current(self) -> int:
        if self._partition is None:
            raise TableWriteError("a table write outside the handling of a record")
        return self._partition

    def take(self) -> list[OutRecord]:
        """The records written since the last call, oldest first (to be sent)."""
        out, self.records = self.records, []
        return out


class ChangelogTable:
    """A table of bytes kept in memory, its writes recorded in :attr:`writes`."""

    def __init__(self, topic: str, writes: Writes) -> None:
        self.topic = topic
        self.writes = writes
        self._data: dict[bytes, bytes] = {}
        self._where: dict[bytes, int] = {}  # key -> changelog partition

    def get(self, key: bytes, /) -> bytes | None:
        return self._data.get(key)

    def __contains__(self, key: object, /) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        return self._data.items()

    def __setitem__(self, key: bytes, value: bytes, /) -> None:
        partition = self.writes.current()
        self._data[key] = value
        self._where[key] = partition
        self.writes.records.append(OutRecord(self.topic, key, value, partition=partition))

    def __delitem__(self, key: bytes, /) -> None:
        partition = self.writes.current()
        del self._data[key]
        self._where.pop(key, None)
        self.writes.records.append(OutRecord(self.topic, key, None, partition=partition))

    def load(self, partition: int, records: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        """Apply changelog records of ``partition`` (recovery): a value sets, None deletes;
        a record without a key is skipped."""
        data, where = self._data, self._where
        for key, value in records:
            if key is None:
                continue
            if value is None:
                data.pop(key, None)
                where.pop(key, None)
            else:
                data[key] = value
                where[key] = partition

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget the entries of ``partitions`` (revoked: another worker owns them now)."""
        gone = set(partitions)
        for key in [k for k, p in self._where.items() if p in gone]:
            del self._data[key]
            del self._where[key]


@dataclass
class Recovery:
    """Changelog reading in progress: offset read so far and records left, per changelog
    partition (what liveness watches to tell a slow recovery from a stopped one)."""

    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    remaining: dict[tuple[str, int], int] = field(default_factory=dict)


async def recover(
    reader: Callable[[], AIOKafkaConsumer],
    tables: Sequence[ChangelogTable],
    partitions: Iterable[int],
    progress: Recovery,
    *,
    on_skip: Callable[[UnreadableBatch], Awaitable[None]] | None = None,
    unreadable: Unreadable | None = None,
) -> int:
    """Read every changelog partition of ``partitions`` of ``tables`` from its start to the
    end it had when asked, into the tables; the records read. Retries (a second apart)
    while the broker fails; cancel to give up. A batch that cannot be read is skipped and
    handed to ``on_skip`` (:class:`~service.stream.kafka.unreadable.Reader`)."""
    by_topic = {t.topic: t for t in tables}
    tps = [TopicPartition(t.topic, p) for t in tables for p in sorted(set(partitions))]
    if not tps:
        return 0
    while True:
        consumer = reader()
        try:
            await consumer.start()
            fetch = Reader(consumer, policy="skip", unreadable=unreadable, on_skip=on_skip)
            return await _read_all(fetch, tps, by_topic, progress)
        except (KafkaError, FetchFailed) as exc:
            log.warning("reading the learner's changelogs failed (%r); again", exc)
            await asyncio.sleep(RETRY_SECONDS)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()


async def _read_all(
    fetch: Reader,
    tps: list[TopicPartition],
    tables: dict[str, ChangelogTable],
    progress: Recovery,
) -> int:
    consumer = fetch.consumer
    consumer.assign(tps)
    await consumer.seek_to_beginning(*tps)
    ends = await consumer.end_offsets(tps)
    for tp in tps:  # a partition read again starts empty (what was loaded may be stale)
        tables[tp.topic].drop([tp.partition])
    left = {tp for tp in tps if ends.get(tp, 0) > 0}
    for tp in tps:
        progress.offsets[(tp.topic, tp.partition)] = 0
        progress.remaining[(tp.topic, tp.partition)] = ends.get(tp, 0)
    count, started = 0, time.monotonic()
    while left:
        for tp in list(left):
            if await consumer.position(tp) >= ends[tp]:
                left.discard(tp)
                progress.remaining[(tp.topic, tp.partition)] = 0
        if not left:
            break
        fetched = await fetch.getmany(*left, timeout_ms=200, max_records=10_000)
        for tp, records in fetched.items():
            mine = [r for r in records if r.offset < ends[tp]]
            tables[tp.topic].load(tp.partition, ((r.key, r.value) for r in mine))
            count += len(mine)
            if mine:
                key = (tp.topic, tp.partition)
                progress.offsets[key] = mine[-1].offset + 1
                progress.remaining[key] = max(0, ends[tp] - mine[-1].offset - 1)
    log.info("recovered %d changelog records of %d partitions in %.1f s", count, len(tps),
             time.monotonic() - started)  # fmt: skip
    return count
