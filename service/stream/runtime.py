"""What a running worker shares between agents, timers and web pages, and how it
authenticates to Kafka."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import faust

from service.config import KafkaSecurity, Settings
from service.metrics import Metrics
from service.stream.snapshots import ModelBook

__all__ = [
    "PartitionStatus",
    "Progress",
    "RecoveryWatch",
    "Runtime",
    "broker_credentials",
    "stalled_partitions",
]


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

    def hold(self, keys: Iterable[tuple[str, int]], now: float) -> None:
        """Count ``now`` as progress for ``keys``: the stream is paused on purpose (table
        recovery, rebalance), so the stall clock starts again when it resumes."""
        for key in keys:
            self.times[key] = now


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One consumed partition as liveness sees it.

    ``high``: the high-water mark (next offset to be written; None if unknown);
    ``position``: the next offset this worker still has to process (None if unknown)."""

    topic: str
    partition: int
    high: int | None
    position: int | None
    last_progress: float

    @property
    def lag(self) -> int:
        """Messages written but not yet processed (0 when either end is unknown).

        >>> PartitionStatus("t", 0, high=10, position=7, last_progress=0.0).lag
        3
        >>> PartitionStatus("t", 0, high=None, position=7, last_progress=0.0).lag
        0
        """
        if self.high is None or self.high < 0 or self.position is None:
            return 0
        return max(0, self.high - self.position)


def stalled_partitions(
    statuses: Iterable[PartitionStatus], *, now: float, stall_seconds: float, paused: bool
) -> list[str]:
    """Partitions with lag and no progress for more than ``stall_seconds`` (faust consumers
    that silently stop). None while ``paused``: table recovery and rebalances pause the
    stream on purpose, and failing liveness then would restart every worker at once.

    >>> s = PartitionStatus("t", 1, high=5, position=2, last_progress=0.0)
    >>> stalled_partitions([s], now=61.0, stall_seconds=60.0, paused=False)
    ['t[1] lag=3']
    >>> stalled_partitions([s], now=61.0, stall_seconds=60.0, paused=True)
    []
    """
    if paused:
        return []
    return [
        f"{st.topic}[{st.partition}] lag={st.lag}"
        for st in statuses
        if st.lag > 0 and now - st.last_progress > stall_seconds
    ]


@dataclass
class RecoveryWatch:
    """Table recovery that stops reading its changelogs while records remain (faust can
    hang there, e.g. faust-streaming#74). Recovery that moves, however slowly, is fine.

    >>> w = RecoveryWatch()
    >>> w.check({"c0": 3}, remaining=7, now=0.0, stall_seconds=60.0) is None
    True
    >>> w.check({"c0": 3}, remaining=7, now=61.0, stall_seconds=60.0)
    'table recovery: 7 changelog records left, none read for 61 s'
    >>> w.check({"c0": 4}, remaining=6, now=62.0, stall_seconds=60.0) is None
    True
    """

    last: tuple[tuple[str, int], ...] | None = None
    since: float = 0.0

    def check(
        self, offsets: Mapping[Any, Any], *, remaining: int, now: float, stall_seconds: float
    ) -> str | None:
        """A reason to fail liveness, or None. ``offsets``: changelog offsets read so far
        (faust's ``recovery.active_offsets``); ``remaining``: records still to read."""
        snapshot = tuple(sorted((str(k), int(v or 0)) for k, v in offsets.items()))
        if remaining <= 0 or snapshot != self.last:
            self.last, self.since = snapshot, now
            return None
        if now - self.since > stall_seconds:
            return (f"table recovery: {remaining} changelog records left, "
                    f"none read for {now - self.since:.0f} s")  # fmt: skip
        return None

    def reset(self) -> None:
        self.last = None


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
    recovery_watch: RecoveryWatch = field(default_factory=RecoveryWatch)
    recent_queries: dict[str, deque[bool]] = field(default_factory=dict)
    labels_seen: int = 0

    @property
    def ready(self) -> bool:
        return self.book.loaded.is_set() and self.recovered and self.broker_reachable

    recovered: bool = False
    broker_reachable: bool = True  # the last end-offset request was answered in time
