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

**Signed changelogs.** With ``snapshot_key`` (a table made with a ``signer``), every record the
learner writes carries the ``abstain-signature`` header: the HMAC of snapshots over the
changelog's name and the record's key, and its value (a tombstone: an empty value). What is
read back is checked before it enters memory (:meth:`ChangelogTable.load`): a record that is
unsigned or mis-signed is refused (:attr:`ChangelogTable.refused`: the entry keeps its last
valid value, the owner dead-letters the record, ``source: changelogs``) and
:meth:`ChangelogTable.repair` writes the valid value (or a signed tombstone) again, so the
refused record is superseded on the compacted topic. Records written before the learner
signed its changelogs: the first time a learner signs a changelog partition it writes a
signed marker there (key :data:`MARKER`); an unsigned record before the marker is the
learner's own from before (taken as it was, and written again signed) in a table made with
``legacy=True``, and refused without a dead letter (logged) in one made without (the
history, which a correction must be able to trust). A record signed with the previous key
(``snapshot_key_previous``) is taken and written again signed with the current one.

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

from service.records import SIGNATURE_HEADER, Signer
from service.records.codec import dumps, own_size
from service.stream.errors import StreamError
from service.stream.kafka.produce import Headers, OutRecord
from service.stream.kafka.unreadable import FetchFailed, Reader, Unreadable, UnreadableBatch

__all__ = [
    "MARKER",
    "ChangelogTable",
    "Loaded",
    "Recovery",
    "Refused",
    "TableWriteError",
    "Writes",
    "recover",
]

log = logging.getLogger(__name__)

#: seconds between attempts when the broker fails a recovery read
RETRY_SECONDS = 1.0
#: the key of the record from which on every record of a changelog partition is signed
MARKER = b"__signed__"
#: a value shorter than this is kept as a copy of its own size (what wrote it, such as
#: orjson, may hold it in a buffer many times longer; a longer value is a packed state,
#: written to its size)
OWN_SIZE_BELOW = 64 * 1024

#: a changelog record read back: (offset, key, value, headers)
Loaded = tuple[int, bytes | None, bytes | None, Iterable[tuple[str, bytes]]]


@dataclass(frozen=True, slots=True)
class Refused:
    """A changelog record refused when read back (its entry kept its last valid value):
    ``reason`` ``unsigned`` or ``bad_signature``; ``legacy``: an unsigned record from
    before the learner signed the partition (its own, not a forgery)."""

    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes | None
    reason: str
    legacy: bool


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
    """A table of bytes kept in memory, its writes recorded in :attr:`writes`; signed and
    checked with ``signer`` (module docstring)."""

    def __init__(
        self, topic: str, writes: Writes, *, signer: Signer | None = None, legacy: bool = True
    ) -> None:
        self.topic = topic
        self.writes = writes
        self.signer = signer
        self.legacy = legacy
        self._data: dict[bytes, bytes] = {}
        self._where: dict[bytes, int] = {}  # key -> changelog partition
        self._read: dict[bytes, tuple[int, int]] = {}  # key -> (partition, offset) read back
        self._marked: set[int] = set()  # partitions whose marker was read or written
        self._loaded: set[int] = set()  # partitions read back since the last repair
        self._stale: dict[bytes, int] = {}  # keys to write again signed -> partition
        #: records refused by the last loads (:meth:`repair` takes them)
        self.refused: list[Refused] = []

    def get(self, key: bytes, /) -> bytes | None:
        return self._data.get(key)

    def __contains__(self, key: object, /) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        return self._data.items()

    def origin(self, key: bytes) -> tuple[int, int] | None:
        """Where the entry of ``key`` was read back from, ``(partition, offset)`` (None: it
        was written here, or is not there)."""
        return self._read.get(key)

    def __setitem__(self, key: bytes, value: bytes, /) -> None:
        partition = self.writes.current()
        if len(value) < OWN_SIZE_BELOW:  # kept, maybe for hours: its own size, not its buffer's
            value = own_size(value)
        self._data[key] = value
        self._where[key] = partition
        self._read.pop(key, None)
        self._append(key, value, partition)

    def __delitem__(self, key: bytes, /) -> None:
        partition = self.writes.current()
        del self._data[key]
        self._where.pop(key, None)
        self._read.pop(key, None)
        self._append(key, None, partition)

    def _append(self, key: bytes, value: bytes | None, partition: int) -> None:
        headers: Headers | None = None
        if self.signer is not None:
            headers = [(SIGNATURE_HEADER, self.signer.sign(self._signed_key(key), value or b""))]
        self.writes.records.append(OutRecord(self.topic, key, value, partition, headers))

    def _signed_key(self, key: bytes) -> bytes:
        return self.topic.encode() + b"/" + key

    def load(self, partition: int, records: Iterable[Loaded]) -> None:
        """Apply changelog records of ``partition`` (recovery): a value sets, None deletes;
        a record without a key is skipped; with a signer, a record that fails its check is
        refused (module docstring)."""
        self._loaded.add(partition)
        for offset, key, value, headers in records:
            if key is None:
                continue
            if self.signer is not None and not self._admit(partition, offset, key, value, headers):
                continue
            if value is None:
                self._data.pop(key, None)
                self._where.pop(key, None)
                self._read.pop(key, None)
            else:
                self._data[key] = value
                self._where[key] = partition
                self._read[key] = (partition, offset)

    def _admit(
        self,
        partition: int,
        offset: int,
        key: bytes,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes]],
    ) -> bool:
        """True if a record read back may be applied (a signer is set)."""
        assert self.signer is not None  # noqa: S101 - load checks it
        header = next((v for k, v in headers if k == SIGNATURE_HEADER), None)
        reason = self.signer.verify(self._signed_key(key), value or b"", header)
        if key == MARKER:
            if reason is None:
                self._marked.add(partition)
            return False
        legacy = partition not in self._marked
        if reason is None or (reason == "unsigned" and legacy and self.legacy):
            if reason is not None or not self.signer.is_current(header):
                self._stale[key] = partition  # written again, signed with the current key
            return True
        self.refused.append(Refused(self.topic, partition, offset, key, value, reason, legacy))
        return False

    def repair(self) -> list[Refused]:
        """After a recovery: supersede the refused records (the entry's valid value written
        again, or a signed tombstone), write again what was unsigned or signed with a
        previous key, and mark every partition read that has no marker yet. Returns the
        records refused (the owner dead-letters them); the writes go out with the next
        flush."""
        refused, self.refused = self.refused, []
        if self.signer is None:
            self._loaded.clear()
            return refused
        for r in refused:
            self._stale.setdefault(r.key, r.partition)
        for key, partition in self._stale.items():
            if self._where.get(key, partition) == partition:
                self._append(key, self._data.get(key), partition)
        self._stale.clear()
        for partition in sorted(self._loaded - self._marked):
            self._append(MARKER, dumps({"format": "abstain.changelog-signed"}), partition)
            self._marked.add(partition)
        self._loaded.clear()
        return refused

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget the entries of ``partitions`` (revoked: another worker owns them now)."""
        gone = set(partitions)
        for key in [k for k, p in self._where.items() if p in gone]:
            del self._data[key]
            del self._where[key]
            self._read.pop(key, None)
        self._marked -= gone
        self._loaded -= gone
        self._stale = {k: p for k, p in self._stale.items() if p not in gone}
        self.refused = [r for r in self.refused if r.partition not in gone]


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
        tables[tp.topic].load(tp.partition, ())  # read, even if empty (its marker is due)
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
            tables[tp.topic].load(
                tp.partition, ((r.offset, r.key, r.value, r.headers or ()) for r in mine)
            )
            count += len(mine)
            if mine:
                key = (tp.topic, tp.partition)
                progress.offsets[key] = mine[-1].offset + 1
                progress.remaining[key] = max(0, ends[tp] - mine[-1].offset - 1)
    log.info(
        "recovered %d changelog records of %d partitions in %.1f s",
        count,
        len(tps),
        time.monotonic() - started,
    )
    return count
