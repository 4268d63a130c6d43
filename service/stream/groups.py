"""What the worker's two consumer loops (:mod:`~service.stream.scoreloop`,
:mod:`~service.stream.learnloop`) do alike with their consumer groups: the rebalance
listener, where a partition starts, committing, seeking back to a commit, and a fetched
record as a :class:`~service.records.RawMessage`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from collections.abc import Set as AbstractSet
from functools import partial
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from service.records import RawMessage

__all__ = ["Rebalance", "adopt_offsets", "commit", "raw_message", "seek_committed"]

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
    timestamp: None)."""
    value = record.value if record.value is not None else b""
    ts = record.timestamp / 1000.0 if record.timestamp > 0 else None
    return RawMessage(value, record.topic, record.partition, record.offset, record.key, ts)


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


async def seek_committed(
    consumer: AIOKafkaConsumer, tps: Iterable[TopicPartition], committed: dict[TopicPartition, int]
) -> None:
    """Seek each of ``tps`` back to where its work starts: ``committed`` (the group's commit
    or the offset it was adopted at), else the group's commit asked from Kafka, else the
    earliest offset."""
    for tp in sorted(tps):
        offset = committed.get(tp)
        if offset is None:
            with contextlib.suppress(KafkaError):
                offset = await consumer.committed(tp)
        if offset is None:
            await consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, offset)


_FAILED = object()
#: attempts, a second apart, to read a group's offsets (a group coordinator that is still
#: loading answers with a retriable error for a few seconds)
ATTEMPTS = 10


async def _retrying(call: Callable[[], Awaitable[Any]], what: str) -> Any:
    """``await call()``, again after a Kafka error (up to :data:`ATTEMPTS`); ``_FAILED``
    (logged) if it never answers."""
    for attempt in range(ATTEMPTS):
        try:
            return await call()
        except KafkaError as exc:
            if attempt == ATTEMPTS - 1:
                log.warning("could not read %s (%r): starting from the committed offsets or "
                            "the start", what, exc)  # fmt: skip
                return _FAILED
            await asyncio.sleep(1.0)
    return _FAILED


async def adopt_offsets(
    consumer: AIOKafkaConsumer,
    admin_factory: Callable[[], AIOKafkaAdminClient] | None,
    group: str,
    assigned: Partitions,
    committed: dict[TopicPartition, int],
) -> None:
    """Of the ``assigned`` partitions, those the consumer's group committed go into
    ``committed``; those it never committed start where ``group`` (the worker's faust
    group, which consumed them in earlier versions) committed, if it did, and that offset
    goes into ``committed`` too: a loop that seeks back to its commits before its group
    ever committed (a failed produce) returns there, not to the topic's first record."""
    if admin_factory is None or not assigned:
        return
    fresh = []
    for tp in sorted(assigned):
        found = await _retrying(partial(consumer.committed, tp), f"the commit of {tp}")
        if found is _FAILED:
            return
        if found is None:
            fresh.append(tp)
        else:
            committed[tp] = found
    if not fresh:
        return

    async def listed() -> Any:
        admin = admin_factory()
        try:
            await admin.start()
            return await admin.list_consumer_group_offsets(group, partitions=fresh)
        finally:
            with contextlib.suppress(Exception):
                await admin.close()

    earlier = await _retrying(listed, f"the offsets of group {group}")
    if earlier is _FAILED:
        return
    for tp in fresh:
        meta = earlier.get(tp)
        if meta is not None and meta.offset >= 0:
            log.info("%s[%s]: starting at %s, where %s left off", tp.topic, tp.partition,
                     meta.offset, group)  # fmt: skip
            consumer.seek(tp, meta.offset)
            committed[tp] = meta.offset
