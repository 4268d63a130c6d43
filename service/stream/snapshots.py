"""Model snapshots: the learner publishes each new version to the compacted models topic;
every worker follows that topic and scores with the newest version it has seen.

The follower is a plain aiokafka consumer that *assigns* every partition of the models
topic and reads from the beginning (no consumer group, so each worker sees every model);
it is not a faust ``GlobalTable``, whose recovery has known loops. Until a snapshot of a
model arrives, scorers use the configured initial model (version 0, the same everywhere).
``ModelBook.loaded`` is set once the topic has been read up to the end offsets taken at
start-up: part of readiness, and scorers wait for it so a restarted worker never serves an
old version it already knows to be superseded.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from service.config import Settings
from service.stream.handlers import ServedModel
from service.stream.records import BadMessage, decode_state

__all__ = ["ModelBook", "follow_models", "reader", "topic_partitions"]

log = logging.getLogger(__name__)


class ModelBook:
    """The models this worker scores with, newest version per model.

    ``on_swap(model)`` is called after a model is replaced (metrics hook)."""

    def __init__(
        self, settings: Settings, *, on_swap: Callable[[ServedModel], None] | None = None
    ) -> None:
        self.settings = settings
        self.models: dict[str, ServedModel] = {
            name: ServedModel.initial(name, cfg) for name, cfg in settings.models.items()
        }
        self.loaded = asyncio.Event()
        self._on_swap = on_swap
        for served in self.models.values():
            self._notify(served)

    def _notify(self, served: ServedModel) -> None:
        if self._on_swap is not None:
            self._on_swap(served)

    def offer(self, name: str, state: Any) -> bool:
        """Swap in ``state`` if it is a newer version of a configured model."""
        config = self.settings.models.get(name)
        current = self.models.get(name)
        if config is None or current is None:
            return False
        if not isinstance(state, dict) or int(state.get("version", -1)) <= current.version:
            return False
        served = ServedModel.from_state(name, config, state)
        self.models = {**self.models, name: served}  # swap, never mutate in place
        self._notify(served)
        return True

    def snapshot(self) -> Mapping[str, ServedModel]:
        """The current mapping (replaced, never mutated, on each swap)."""
        return self.models


def reader(
    bootstrap: list[str],
    client_id: str,
    *,
    max_partition_fetch_bytes: int,
    client_kwargs: Mapping[str, Any],
    **options: Any,
) -> AIOKafkaConsumer:
    """A consumer outside any group (partitions are assigned, nothing is ever committed)
    that starts from the earliest offset; not started yet."""
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id=client_id,
        max_partition_fetch_bytes=max_partition_fetch_bytes,
        **options,
        **client_kwargs,
    )


async def follow_models(
    settings: Settings, book: ModelBook, *, poll_ms: int = 500, consumer_kwargs: Mapping[str, Any]
) -> None:
    """Follow the models topic forever (until cancelled), feeding ``book``."""
    topic = settings.topics.models
    consumer = reader(
        settings.bootstrap_servers,
        f"{settings.app_id}-model-follower",
        max_partition_fetch_bytes=max(1_048_576, settings.max_message_bytes * 2),
        client_kwargs=consumer_kwargs,
        fetch_max_bytes=max(52_428_800, settings.max_message_bytes * 4),
    )
    await consumer.start()
    try:
        tps = await topic_partitions(
            settings.bootstrap_servers, topic, client_kwargs=consumer_kwargs
        )
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        while True:
            if not book.loaded.is_set():
                positions = {tp: await consumer.position(tp) for tp in tps}
                if all(positions[tp] >= end[tp] for tp in tps):
                    book.loaded.set()
                    log.info("models loaded: %s", {n: m.version for n, m in book.models.items()})
            batch = await consumer.getmany(timeout_ms=poll_ms)
            for records in batch.values():
                for record in records:
                    _apply(book, record.key, record.value)
    finally:
        await consumer.stop()


async def topic_partitions(
    bootstrap: list[str], topic: str, *, client_kwargs: Mapping[str, Any], attempts: int = 120
) -> list[TopicPartition]:
    """All partitions of ``topic``, waiting (up to ``attempts`` half-seconds) for it to exist."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_kwargs)
    await admin.start()
    try:
        for _ in range(attempts):
            try:
                (meta,) = await admin.describe_topics([topic])
            except KafkaError as exc:  # pragma: no cover - broker hiccup; retry
                log.warning("describe %s failed: %r", topic, exc)
            else:
                if meta.get("error_code") == 0 and meta.get("partitions"):
                    parts = sorted(p["partition"] for p in meta["partitions"])
                    return [TopicPartition(topic, p) for p in parts]
            await asyncio.sleep(0.5)
    finally:
        await admin.close()
    raise RuntimeError(f"topic {topic!r} does not exist")


def _apply(book: ModelBook, key: bytes | None, value: bytes | None) -> None:
    if key is None or value is None:
        return
    name = key.decode("utf-8", errors="replace")
    try:
        book.offer(name, decode_state(value))
    except (BadMessage, ValueError) as exc:
        log.error("ignoring unreadable snapshot of model %r: %s", name, exc)
