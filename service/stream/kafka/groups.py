"""What the worker's two consumer loops (:mod:`~service.stream.scoring.loop`,
:mod:`~service.stream.labels.loop`) do alike with their consumer groups: the rebalance
listener, where a partition starts (:class:`Starts`), committing, seeking back to a commit,
and a fetched record as a :class:`~service.records.RawMessage`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from service.records import SIGNATURE_HEADER, RawMessage

__all__ = [
    "Rebalance",
    "Starts",
    "commit",
    "fetched_ends",
    "raw_message",
    "record_seconds",
    "seek_committed",
]

log = logging.getLogger(__name__)

Partitions = AbstractSet[TopicPartition]


class _Rebalanced(Protocol):
    def revoked(self, revoked: Partitions) -> Awaitable[None]: ...

    def assigned(self, assigned: Partitions) -> Awaitable[None]: ...


class Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """The listener a loop's consumer subscribes with: its ``revoked`` and ``assigned``."""

    def __init__(self, loop: _Rebalanced) -> None:
        self.loop = loop

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.loop.revoked(frozenset(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.loop.assigned(frozenset(assigned))


def raw_message(record: Any) -> RawMessage:
    """A fetched aiokafka ``ConsumerRecord`` as a :class:`RawMessage` (no value: empty; no
    timestamp: None; its signature header, if any)."""
    value = record.value if record.value is not None else b""
    ts = record_seconds(record)
    signature = next((v for k, v in record.headers or () if k == SIGNATURE_HEADER), None)
    return RawMessage(
        value, record.topic, record.partition, record.offset, record.key, ts, signature
    )


def record_seconds(record: Any) -> float | None:
    """A fetched record's Kafka timestamp in seconds (None: it has none)."""
    return record.timestamp / 1000.0 if record.timestamp > 0 else None


async def fetched_ends(
    consumer: AIOKafkaConsumer, fetched: Mapping[TopicPartition, Sequence[Any]]
) -> dict[TopicPartition, int]:
    """Where each partition of ``fetched`` goes on from once its records are handled: after
    its last record, or the consumer's position when that is further (the control record that
    ends a transaction, aborted records skipped under ``read_committed``: offsets no record is
    returned for, which a commit and the lag must pass too). Call right after the fetch."""
    ends = {}
    for tp, records in fetched.items():
        end = records[-1].offset + 1
        with contextlib.suppress(IllegalStateError):  # revoked since: the commit skips it
            end = max(end, await consumer.position(tp))
        ends[tp] = end
    return ends


async def commit(
    consumer: AIOKafkaConsumer,
    offsets: dict[TopicPartition, int],
    committed: dict[TopicPartition, int],
    what: str,
) -> bool | None:
    """Commit ``offsets`` of partitions still assigned, never below ``committed`` (which it
    updates). True: committed (or nothing to commit); False: refused, the group moved on and
    the new owner redoes them; None: the broker failed, try again."""
    mine = consumer.assignment()
    offsets = {tp: o for tp, o in offsets.items() if tp in mine and o > committed.get(tp, -1)}
    if not offsets:
        return True
    try:
        await consumer.commit(offsets)
    except (CommitFailedError, IllegalStateError) as exc:
        log.warning("commit of %s offsets refused (%r): the new owner redoes them", what, exc)
        return False
    except KafkaError as exc:
        log.warning("commit of %s offsets failed (%r); the next one covers them", what, exc)
        return None
    committed.update(offsets)
    return True


def seek_committed(
    consumer: AIOKafkaConsumer,
    tps: Iterable[TopicPartition],
    committed: dict[TopicPartition, int],
    starts: Starts,
) -> None:
    """Seek each of ``tps`` back to where its work starts: ``committed`` (the group's commit
    or the offset it started at); a partition without one is paused until ``starts``
    learns it again (never "from the first record" because an answer was missing)."""
    unknown = []
    for tp in sorted(tps):
        offset = committed.get(tp)
        if offset is None:
            unknown.append(tp)
        else:
            consumer.seek(tp, offset)
    starts.hold(consumer, frozenset(unknown))


#: seconds one attempt to learn where partitions start may take (a group coordinator that is
#: still loading answers with a retriable error for a few seconds; aiokafka retries those)
START_TIMEOUT_SECONDS = 10.0
#: seconds between attempts once one failed
RETRY_SECONDS = 1.0
#: seconds between log lines while a start cannot be learned
WARN_EVERY_SECONDS = 30.0


class Starts:
    """Where each newly assigned partition starts, learned before one record of it is
    read: the loop's own group's commit, else where ``old_group`` (the worker's faust
    group, which consumed these topics in earlier versions) committed, else the topic's
    first record, and that last only when Kafka *said* neither group committed.

    :meth:`hold` pauses the partitions the rebalance listener was given (it does not wait
    for the broker: a slow coordinator must not stretch the rebalance). The loop calls
    :meth:`learn` before each fetch; it asks Kafka (bounded by
    :data:`START_TIMEOUT_SECONDS`), seeks every partition it got an answer for and returns
    them to be resumed. A partition Kafka does not answer for stays paused and in
    :attr:`unknown` (the worker is not ready; a warning names it), and is asked for again
    a second later: a start that cannot be learned never becomes "from the beginning"."""

    def __init__(
        self,
        old_group: str | None = None,
        admin_factory: Callable[[], AIOKafkaAdminClient] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.old_group = old_group
        self.admin_factory = admin_factory
        self.clock = clock
        self.unknown: set[TopicPartition] = set()
        self.failing_since: float | None = None
        self._tried = self._warned = -WARN_EVERY_SECONDS

    def hold(self, consumer: AIOKafkaConsumer, assigned: Partitions) -> None:
        """Pause ``assigned`` until their starts are learned."""
        if assigned:
            consumer.pause(*assigned)
            self.unknown |= set(assigned)

    def forget(self, revoked: Partitions) -> None:
        self.unknown -= set(revoked)

    async def learn(
        self, consumer: AIOKafkaConsumer, committed: dict[TopicPartition, int]
    ) -> set[TopicPartition]:
        """Ask where the unknown partitions start; seek those Kafka answered for (their
        offsets go into ``committed``: a loop that seeks back before its group commits
        returns there, not to a later first record) and return them, still paused."""
        self.unknown &= consumer.assignment()
        tps = sorted(self.unknown)
        if not tps:
            self.failing_since = None
            return set()
        if self.failing_since is not None and self.clock() - self._tried < RETRY_SECONDS:
            return set()  # Kafka did not answer a moment ago: the loop goes on meanwhile
        self._tried = self.clock()
        try:
            starts = await asyncio.wait_for(self._find(consumer, tps), START_TIMEOUT_SECONDS)
        except (KafkaError, TimeoutError, OSError) as exc:
            self._failed(tps, exc)
            return set()
        started: set[TopicPartition] = set()
        for tp, offset in starts.items():
            if tp not in self.unknown or tp not in consumer.assignment():
                continue  # revoked while Kafka was asked
            consumer.seek(tp, offset)
            committed[tp] = offset
            self.unknown.discard(tp)
            started.add(tp)
        if not self.unknown:
            if self.failing_since is not None:
                log.warning(
                    "start offsets learned after %.0f s: consuming %s",
                    self.clock() - self.failing_since,
                    _names(started),
                )
            self.failing_since = None
        return started

    def _failed(self, tps: list[TopicPartition], exc: BaseException) -> None:
        now = self.clock()
        if self.failing_since is None:
            self.failing_since = now
        if now - self._warned >= WARN_EVERY_SECONDS:
            self._warned = now
            log.warning(
                "cannot learn where %s start (%r): not consuming them and not ready "
                "until Kafka answers (asked again every round, for %.0f s now)",
                _names(tps),
                exc,
                now - self.failing_since,
            )

    async def _find(
        self, consumer: AIOKafkaConsumer, tps: list[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """Each of ``tps``: its start offset (raises when Kafka does not say)."""
        out: dict[TopicPartition, int] = {}
        for tp in tps:
            offset = await consumer.committed(tp)  # aiokafka retries a loading coordinator
            if offset is not None:
                out[tp] = offset
        fresh = [tp for tp in tps if tp not in out]
        if fresh and self.admin_factory is not None and self.old_group is not None:
            earlier = await self._listed(self.old_group, fresh)
            for tp in fresh:
                meta = earlier.get(tp)
                if meta is not None and meta.offset >= 0:
                    log.info(
                        "%s[%s]: starting at %s, where %s left off",
                        tp.topic,
                        tp.partition,
                        meta.offset,
                        self.old_group,
                    )
                    out[tp] = meta.offset
        fresh = [tp for tp in tps if tp not in out]
        if fresh:  # neither group ever committed: the first record still kept
            firsts = await consumer.beginning_offsets(fresh)
            out.update({tp: int(firsts[tp]) for tp in fresh})
        return out

    async def _listed(self, group: str, tps: list[TopicPartition]) -> dict[TopicPartition, Any]:
        assert self.admin_factory is not None  # noqa: S101 - checked by the caller
        admin = self.admin_factory()
        try:
            await admin.start()
            while True:  # bounded by learn()'s timeout
                try:
                    found: dict[TopicPartition, Any] = await admin.list_consumer_group_offsets(
                        group, partitions=tps
                    )
                    return found
                except KafkaError as exc:
                    if not exc.retriable:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            with contextlib.suppress(Exception):
                await admin.close()


def _names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(tps))
