"""Every offset reaches the agents: notice records the Kafka consumer skipped and fetch them.

faust-streaming can skip records after a restart or a rebalance. Records fetched while the
new assignment is being recovered are queued for the agents; the queues are cleared when
recovery ends, but the fetch position has already moved past them. The records are never
processed: the group's committed offset stays behind them (lag that never drains) or, once
a later record arrives, faust takes the jump for a compacted range and commits past them.

:class:`Continuity` watches the offsets an agent sees, per partition and consumer
generation. The first record of a partition in a generation must be at the group's committed
offset and each later one must follow the one before. A record beyond that means the ones in
between were skipped: they are fetched straight from Kafka (:class:`KafkaGaps`, outside the
group, never committing) and handed to the agent first, in order. A record *before* the
expected offset is a redelivery (at-least-once) and is processed again. When no later record
comes to reveal the gap, :class:`QuietTender` (run every second) finds partitions whose
consumer has fetched past what the agent saw and that have been quiet for
:data:`QUIET_SECONDS`, and seeks them back so the records are delivered again; and it
commits what a quiet partition has processed when the group's committed offset is behind.
Records fetched here are acknowledged to faust through ``ConsumerView.acknowledge``
(:mod:`service.stream.internals`).

>>> import asyncio
>>> async def committed(topic, partition):
...     return 10
>>> async def fetch(topic, partition, start, end):
...     return [RawMessage(b"x", topic, partition, o) for o in range(start, end)]
>>> c = Continuity(committed, fetch)
>>> [m.offset for m in asyncio.run(c.missing("t", 0, 13, generation=1))]
[10, 11, 12]
>>> c.in_order("t", 0, 14, generation=1)
True
>>> c.in_order("t", 0, 16, generation=1)  # 15 is missing: ask ``missing``
False
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from service.records import RawMessage
from service.stream.kafka import reader
from service.stream.partitions import TP, ConsumerView, Progress, partition_key

__all__ = ["QUIET_SECONDS", "Continuity", "KafkaGaps", "QuietTender", "Tended"]

log = logging.getLogger(__name__)
T = TypeVar("T")

#: a partition whose agent has seen nothing for this long while the consumer has fetched
#: past it has records stranded (fetched, never delivered): it is sought back to them
QUIET_SECONDS = 5.0

#: errors of a broker that is away or slow; anything else is a bug and propagates
KAFKA_ERRORS = (KafkaError, OSError)  # TimeoutError is an OSError
RETRY_DELAYS = (1.0, 2.0)  # seconds before the second and the third attempt

Committed = Callable[[str, int], Awaitable[int | None]]
Fetch = Callable[[str, int, int, int], Awaitable[list[RawMessage]]]


async def _retried(call: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``await call(*args)``; on a Kafka error again after each of :data:`RETRY_DELAYS`."""
    for delay in RETRY_DELAYS:
        try:
            return await call(*args)
        except KAFKA_ERRORS as exc:
            log.warning("retrying in %ss: %r", delay, exc)
        await asyncio.sleep(delay)
    return await call(*args)


@dataclass(slots=True)
class _Track:
    generation: int
    next: int


class Continuity:
    """Per (topic, partition): the next offset the agent must see in the current generation.

    ``committed(topic, partition)`` gives the group's committed offset (None: nothing
    committed, so the partition starts at its beginning); ``fetch(topic, partition, start,
    end)`` returns the records with ``start <= offset < end`` that exist (a range may hold
    none: compaction, retention, transaction markers).
    """

    def __init__(self, committed: Committed, fetch: Fetch) -> None:
        self._committed = committed
        self._fetch = fetch
        self._tracks: dict[tuple[str, int], _Track] = {}
        self.sought: dict[tuple[str, int], tuple[int, int, int]] = {}  # by QuietTender
        self.recovered = 0  # records fetched because the consumer skipped them
        self.gaps = 0  # jumps seen (some hold no records)

    def in_order(self, topic: str, partition: int, offset: int, *, generation: int) -> bool:
        """The fast path: True (and ``offset`` remembered) if nothing can be missing before
        it; False if :meth:`missing` must look."""
        track = self._tracks.get((topic, partition))
        if track is not None and track.generation == generation and offset <= track.next:
            track.next = offset + 1
            return True
        return False

    async def missing(
        self, topic: str, partition: int, offset: int, *, generation: int
    ) -> list[RawMessage]:
        """Records the agent should have seen before the one at ``offset`` (oldest first),
        and remember ``offset`` as seen. Kafka errors are retried (:data:`RETRY_DELAYS`);
        after that the gap is logged as an error and left, and the agent goes on."""
        key = (topic, partition)
        track = self._tracks.get(key)
        if track is None or track.generation != generation:
            try:
                start = await _retried(self._committed, topic, partition)
            except KAFKA_ERRORS as exc:
                log.error("no committed offset for %s[%s] (%r): offsets before %s unchecked",
                          topic, partition, exc, offset)  # fmt: skip
                start = offset
            track = _Track(generation, 0 if start is None else start)
            self._tracks[key] = track
        expected = track.next
        track.next = offset + 1
        if offset <= expected:  # in order, or a redelivery (processed again: at least once)
            return []
        self.gaps += 1
        try:
            fetched = await _retried(self._fetch, topic, partition, expected, offset)
        except KAFKA_ERRORS as exc:
            log.error("consumer skipped %s[%s] offsets %s..%s and reading them failed: %r",
                      topic, partition, expected, offset - 1, exc)  # fmt: skip
            return []
        records = [r for r in fetched if expected <= r.offset < offset]
        self.recovered += len(records)
        log.warning(
            "consumer skipped %s[%s] offsets %s..%s: %s records fetched and processed",
            topic, partition, expected, offset - 1, len(records),
        )  # fmt: skip
        return records

    async def group_committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset, as Kafka has it (None: nothing committed)."""
        return await self._committed(topic, partition)

    def expected(self, topic: str, partition: int, *, generation: int) -> int | None:
        """The next offset the agent must see, if it has seen one in ``generation``."""
        track = self._tracks.get((topic, partition))
        return track.next if track is not None and track.generation == generation else None


class KafkaGaps:
    """Committed offsets and record ranges read from Kafka without joining the group.

    One admin client and one group-less consumer (``enable_auto_commit`` off, nothing ever
    committed), started on first use and stopped by :meth:`close`.
    """

    def __init__(
        self,
        bootstrap: list[str],
        group_id: str,
        *,
        client_kwargs: Mapping[str, Any],
        max_fetch_bytes: int = 1_048_576,
        timeout: float = 10.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.group_id = group_id
        self.client_kwargs = dict(client_kwargs)
        self.max_fetch_bytes = max_fetch_bytes
        self.timeout = timeout
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def committed(self, topic: str, partition: int) -> int | None:
        """The group's committed offset of one partition (None if it has none)."""
        async with self._lock:
            if self._admin is None:
                admin = AIOKafkaAdminClient(
                    bootstrap_servers=self.bootstrap,
                    client_id=f"{self.group_id}-gaps-admin",
                    **self.client_kwargs,
                )
                await admin.start()
                self._admin = admin
            tp = TopicPartition(topic, partition)
            offsets = await self._admin.list_consumer_group_offsets(self.group_id, partitions=[tp])
        found = offsets.get(tp)
        return None if found is None or found.offset < 0 else int(found.offset)

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> list[RawMessage]:
        """Records with ``start <= offset < end`` (those that exist), oldest first. Stops at
        the first record at or past ``end``, at the end of the partition, or after
        ``timeout`` seconds (what was read by then, and an error in the log)."""
        tp = TopicPartition(topic, partition)
        out: list[RawMessage] = []
        async with self._lock:
            consumer = await self._ensure_consumer()
            consumer.assign([tp])
            consumer.seek(tp, start)
            try:
                async with asyncio.timeout(self.timeout):
                    await _read_range(consumer, tp, end, out)
            except TimeoutError:
                log.error("fetching %s[%s] %s..%s timed out after %ss with %s records",
                          topic, partition, start, end - 1, self.timeout, len(out))  # fmt: skip
        return out

    async def _ensure_consumer(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = reader(
                self.bootstrap,
                f"{self.group_id}-gaps",
                max_partition_fetch_bytes=self.max_fetch_bytes,
                client_kwargs=self.client_kwargs,
                fetch_max_wait_ms=50,  # the records exist: do not wait for more
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        """Stop the clients (if started)."""
        async with self._lock:
            if self._consumer is not None:
                await self._consumer.stop()
                self._consumer = None
            if self._admin is not None:
                await self._admin.close()
                self._admin = None


async def _read_range(
    consumer: AIOKafkaConsumer, tp: TopicPartition, end: int, out: list[RawMessage]
) -> None:
    while True:
        batch = await consumer.getmany(tp, timeout_ms=500)
        records = batch.get(tp, [])
        if not records:
            position = await consumer.position(tp)
            high = consumer.highwater(tp)
            if position >= end or (high is not None and position >= high):
                return  # the range is read, or nothing more exists
        for r in records:
            if r.offset >= end:
                return
            ts = r.timestamp / 1000.0 if r.timestamp and r.timestamp > 0 else None
            out.append(RawMessage(r.value or b"", tp.topic, tp.partition, r.offset, r.key, ts))


@dataclass
class Tended:
    """What :meth:`QuietTender.tend` did, per (topic, partition)."""

    reread: dict[tuple[str, int], tuple[int, int]]  # sought back: [from, to)
    committed: dict[tuple[str, int], tuple[int | None, int]]  # (group had, committed)


class QuietTender:
    """Looks after the partitions that have been quiet for ``quiet`` seconds (counted from
    their last progress in ``progress``) among the ``watched`` topics.

    - Stranded records (:meth:`_reread`): the consumer position is past the next offset the
      agent must see (records fetched, never delivered): seek back to it.
    - Offsets processed but not committed (:meth:`_commit`): the agent has processed every
      offset up to its position and the group's committed offset (asked from Kafka) is
      behind: commit it. faust's own bookkeeping can believe a commit happened that did
      not, or move backwards when a commit and a seek race; the lag would then never drain.

    Each action is taken once for the same offsets (a range that holds no records, such as
    a transaction marker at the end, is not retried forever): what was done is remembered
    in ``continuity.sought``.
    """

    def __init__(
        self,
        view: ConsumerView,
        continuity: Continuity,
        progress: Progress,
        *,
        watched: Iterable[str],
        quiet: float = QUIET_SECONDS,
    ) -> None:
        self.view = view
        self.continuity = continuity
        self.progress = progress
        self.watched = frozenset(watched)
        self.quiet = quiet

    async def tend(self, now: float, *, since: float) -> Tended:
        """Tend the partitions quiet at ``now``; quiet time does not count from before
        ``since`` (when the agents could start). Kafka errors propagate: try next time."""
        generation = self.view.generation
        tended = Tended({}, {})
        for tp in sorted(self.view.assignment(), key=partition_key):
            key = partition_key(tp)
            last = self.progress.times.get(key, now)
            if tp.topic not in self.watched or now - max(since, last) < self.quiet:
                continue
            position = await self.view.position(tp)
            if position is None:
                continue
            expected = self.continuity.expected(tp.topic, tp.partition, generation=generation)
            start = expected if expected is not None else await self._assigned_at(tp)
            if start is None:
                continue
            if position > start:
                reread = await self._reread(tp, start, position, generation)
                if reread is not None:
                    tended.reread[key] = reread
            elif expected is not None:
                committed = await self._commit(tp, expected, generation)
                if committed is not None:
                    tended.committed[key] = committed
        return tended

    async def _assigned_at(self, tp: TP) -> int | None:
        """Where the agent starts when it has seen nothing since the assignment: the
        committed offset, else the earliest the broker has."""
        committed = self.view.committed_next(tp)
        return committed if committed is not None else await self.view.earliest(tp)

    async def _reread(
        self, tp: TP, start: int, position: int, generation: int
    ) -> tuple[int, int] | None:
        """Seek back to ``start``: offsets ``start..position - 1`` were fetched but never
        delivered. The range sought back ``[start, position)``, or None if it was already
        sought back in this generation."""
        key = partition_key(tp)
        target = (generation, start, position)
        if self.continuity.sought.get(key) == target:
            return None
        self.continuity.sought[key] = target
        log.warning("%s[%s]: offsets %s..%s fetched but never processed; reading them again",
                    tp.topic, tp.partition, start, position - 1)  # fmt: skip
        self.view.chop_gap(tp, start, position)
        await self.view.seek(tp, start)
        return (start, position)

    async def _commit(
        self, tp: TP, expected: int, generation: int
    ) -> tuple[int | None, int] | None:
        """Commit ``expected`` when every offset before it is processed and the group's
        committed offset is behind. ``(what the group had, expected)``, or None when
        nothing was committed: still at work, committed already, or asked before."""
        key = partition_key(tp)
        if self.progress.offsets.get(key) != expected - 1:
            return None  # nothing processed in this generation, or still at work
        mark = (generation, 0, expected)
        if self.continuity.sought.get(key) == mark:
            return None
        have = await self.continuity.group_committed(tp.topic, tp.partition)  # may raise
        self.continuity.sought[key] = mark
        if have is not None and have >= expected:
            return None
        log.warning("%s[%s]: processed up to %s but the group's committed offset is %s; "
                    "committing", tp.topic, tp.partition, expected - 1, have)  # fmt: skip
        await self.view.commit_processed(tp, expected)
        return (have, expected)
