"""``abstain skip TOPIC PARTITION``: move a partition past a record batch no worker can read.

::

    abstain skip TOPIC PARTITION [--offset N] [--by WHO] [--dry-run] [--broker ...] [--config FILE]

A worker that meets a batch it cannot read in an input it commits offsets of (the features,
label-requests or labels topic) stops that partition there and says so (``/healthz``,
``/readyz``, ``abstain_unreadable_partitions``, the alert ``AbstainUnreadableBatch``); it never
skips accepted input on its own. This command reads the partition again with the workers'
own reader, from where their consumer group committed (or ``--offset``), finds the first batch
it cannot read, and then, unless ``--dry-run``:

1. writes the batch's dead letter (reason ``unreadable``, the offset range and what the client
   said), acknowledged by every in-sync replica;
2. writes the skip order (:class:`~service.records.SkipOrder`, signed with ``snapshot_key``
   when one is set) to the models topic, which every worker follows: the worker stopped at that
   batch, and any worker that meets it later, moves past it and commits the offset after it.

It prints what it found (JSON) and exits 1 when the partition reads to its end.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
import time
from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from service.config import ConfigError, Settings, common_arguments, settings_from_arguments
from service.records import SIGNATURE_HEADER
from service.records.codec import dumps
from service.records.reasons import Source
from service.records.skips import SkipOrder
from service.stream.errors import StreamError, TopicError
from service.stream.kafka.clients import consumer_options, produce_one, reader
from service.stream.kafka.unreadable import Reader, Unreadable, UnreadableBatch
from service.stream.labels.loop import learn_group
from service.stream.models.book import signer_for
from service.stream.scoring.loop import score_group

__all__ = ["Target", "find_unreadable", "main", "skip_batch", "target_of"]

#: seconds without a record before the reading gives up short of the partition's end
QUIET_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Target:
    """A partition a worker stops at: its topic, the consumer group that commits its offsets
    and the dead letters' source."""

    topic: str
    partition: int
    group: str
    source: Source


def target_of(settings: Settings, topic: str, partition: int) -> Target:
    """The :class:`Target` of ``topic[partition]``; :class:`StreamError` for a topic the
    workers do not stop at (they skip what they read from the start again themselves)."""
    t, app = settings.topics, settings.app_id
    known = {
        t.features: (score_group(app), Source.FEATURES, settings.partitions.features),
        t.label_requests: (learn_group(app), Source.LABEL_REQUESTS, settings.partitions.labels),
        t.labels: (learn_group(app), Source.LABELS, settings.partitions.labels),
    }
    if topic not in known:
        raise StreamError(
            f"{topic!r} is none of the topics a worker stops at ({sorted(known)}); "
            "a batch of the models topic or a changelog is skipped (and "
            "dead-lettered) by the worker itself"
        )
    group, source, count = known[topic]
    if not 0 <= partition < count:
        raise StreamError(f"{topic} has partitions 0..{count - 1} in the settings")
    return Target(topic, partition, group, source)


async def _committed(settings: Settings, target: Target) -> int | None:
    tp = TopicPartition(target.topic, target.partition)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers, **settings.security.aiokafka_kwargs()
    )
    await admin.start()
    try:
        found = await admin.list_consumer_group_offsets(target.group, partitions=[tp])
    finally:
        await admin.close()
    meta = found.get(tp)
    return None if meta is None or meta.offset < 0 else int(meta.offset)


async def find_unreadable(
    settings: Settings, target: Target, offset: int | None
) -> tuple[int, UnreadableBatch | None]:
    """Read ``target`` from ``offset`` (None: where its group committed, else its first
    record) to its end: where the reading started and the first batch it cannot read (None:
    it reads to the end)."""
    tp = TopicPartition(target.topic, target.partition)
    start = offset if offset is not None else await _committed(settings, target)
    consumer = reader(
        settings.bootstrap_servers,
        f"{settings.app_id}-skip",
        max_partition_fetch_bytes=settings.fetch_bytes,
        client_kwargs=consumer_options(settings),
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        if start is None:
            await consumer.seek_to_beginning(tp)
            start = await consumer.position(tp)
        else:
            consumer.seek(tp, start)
        end = (await consumer.end_offsets([tp]))[tp]
        unreadable = Unreadable()
        fetch = Reader(consumer, policy="stop", unreadable=unreadable)
        quiet_until = time.monotonic() + QUIET_SECONDS
        while not unreadable.stopped and await consumer.position(tp) < end:
            if await fetch.getmany(tp, timeout_ms=500):
                quiet_until = time.monotonic() + QUIET_SECONDS
            elif time.monotonic() > quiet_until:
                raise TopicError(
                    f"{tp.topic}[{tp.partition}]: nothing read for "
                    f"{QUIET_SECONDS:g} s before its end"
                )
        found = unreadable.of([tp])
        return start, (found[0] if found else None)
    finally:
        await consumer.stop()


async def skip_batch(settings: Settings, target: Target, batch: UnreadableBatch, by: str) -> None:
    """Dead-letter ``batch``, then order every worker past it (in that order: a batch is
    skipped only once its dead letter is written)."""
    letter = batch.dead_letter(target.source)
    await produce_one(settings, settings.topics.dead_letters, None, letter.to_json())
    order = SkipOrder(
        batch.topic,
        batch.partition,
        batch.first,
        batch.end,
        detail=batch.describe(),
        by=by,
        at=time.time(),
    )
    key, value = order.key.encode(), order.to_json()
    signer = signer_for(settings)
    headers = None if signer is None else [(SIGNATURE_HEADER, signer.sign(key, value))]
    await produce_one(settings, settings.topics.models, key, value, headers)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="abstain skip",
        description="dead-letter the record batch a partition's workers cannot read and move "
        "them past it",
    )
    parser.add_argument("topic", help="the features, label-requests or labels topic")
    parser.add_argument("partition", type=int, help="the partition (/healthz names it)")
    parser.add_argument(
        "--offset",
        type=int,
        default=None,
        help="read from here (default: where the workers' group committed)",
    )
    parser.add_argument("--by", default=None, help="who orders it (default: the user name)")
    parser.add_argument("--dry-run", action="store_true", help="find the batch, write nothing")
    common_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = settings_from_arguments(args)
        target = target_of(settings, args.topic, args.partition)
        if args.offset is not None and args.offset < 0:
            raise StreamError("--offset must be 0 or more")
        start, batch = asyncio.run(find_unreadable(settings, target, args.offset))
        if batch is None:
            print(
                dumps(
                    {
                        "topic": target.topic,
                        "partition": target.partition,
                        "read_from": start,
                        "unreadable": None,
                    }
                ).decode()
            )
            print(
                f"abstain: {target.topic}[{target.partition}] reads to its end from offset "
                f"{start}: nothing to skip",
                file=sys.stderr,
            )
            return 1
        by = args.by or getpass.getuser()
        if not args.dry_run:
            asyncio.run(skip_batch(settings, target, batch, by))
    except (ConfigError, StreamError, KafkaError) as exc:
        print(f"abstain: {exc}", file=sys.stderr)
        return 2
    print(
        dumps(
            {
                "topic": batch.topic,
                "partition": batch.partition,
                "read_from": start,
                "first": batch.first,
                "last": batch.end - 1,
                "error": batch.error,
                "skipped": not args.dry_run,
                "by": by,
            }
        ).decode()
    )
    return 0
