"""What a running worker shares between agents, timers and web pages, and how it
authenticates to Kafka."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import faust

from service.config import KafkaSecurity, Settings
from service.metrics import Metrics
from service.stream.snapshots import ModelBook

__all__ = ["Progress", "Runtime", "broker_credentials"]


def broker_credentials(security: KafkaSecurity) -> Any:
    """faust ``broker_credentials`` for the configured security protocol (None = plaintext)."""
    if security.uses_sasl:
        assert security.username is not None  # noqa: S101
        assert security.password is not None  # noqa: S101
        return faust.SASLCredentials(
            username=security.username.get_secret_value(),
            password=security.password.get_secret_value(),
            mechanism=security.sasl_mechanism,
            ssl_context=security.ssl_context(),
        )
    if security.uses_ssl:
        return faust.SSLCredentials(security.ssl_context())
    return None


@dataclass
class Progress:
    """Last processed offset and when, per (topic, partition): liveness and lag."""

    clock: Callable[[], float]
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    times: dict[tuple[str, int], float] = field(default_factory=dict)

    def mark(self, topic: str, partition: int, offset: int) -> None:
        key = (topic, partition)
        self.offsets[key] = offset
        self.times[key] = self.clock()


@dataclass
class Runtime:
    """Per-app objects shared by agents, timers and web pages."""

    settings: Settings
    metrics: Metrics
    book: ModelBook
    clock: Callable[[], float]
    progress: Progress
    live: bool = True
    stalled: list[str] = field(default_factory=list)
    recent_queries: dict[str, deque[bool]] = field(default_factory=dict)
    labels_seen: int = 0

    @property
    def ready(self) -> bool:
        return self.book.loaded.is_set() and self.recovered

    recovered: bool = False
