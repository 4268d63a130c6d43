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

from service.config import Settings
from service.records import BadMessage, parse_model_envelope
from service.stream.kafka import reader, topic_partitions
from service.stream.model import ServedModel

__all__ = ["ModelBook", "follow_models"]

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

    def offer(self, name: str, raw: bytes) -> bool:
        """Swap in the snapshot ``raw`` if it is a newer version of a configured model;
        :class:`BadMessage` if it cannot be served."""
        config = self.settings.models.get(name)
        current = self.models.get(name)
        if config is None or current is None:
            return False
        envelope = parse_model_envelope(raw, model=name, max_bytes=self.settings.fetch_bytes)
        if envelope.version <= current.version:
            return False
        served = ServedModel.from_envelope(config, envelope)
        self.models = {**self.models, name: served}  # swap, never mutate in place
        self._notify(served)
        return True

    def snapshot(self) -> Mapping[str, ServedModel]:
        """The current mapping (replaced, never mutated, on each swap)."""
        return self.models


async def follow_models(
    settings: Settings, book: ModelBook, *, poll_ms: int = 500, consumer_kwargs: Mapping[str, Any]
) -> None:
    """Follow the models topic forever (until cancelled), feeding ``book``."""
    topic = settings.topics.models
    consumer = reader(
        settings.bootstrap_servers,
        f"{settings.app_id}-model-follower",
        max_partition_fetch_bytes=settings.fetch_bytes,
        client_kwargs=consumer_kwargs,
        fetch_max_bytes=max(52_428_800, settings.fetch_bytes * 2),
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


def _apply(book: ModelBook, key: bytes | None, value: bytes | None) -> None:
    if key is None or value is None:
        return
    name = key.decode("utf-8", errors="replace")
    try:
        book.offer(name, value)
    except BadMessage as exc:
        log.error("ignoring unreadable snapshot of model %r: %s", name, exc)
