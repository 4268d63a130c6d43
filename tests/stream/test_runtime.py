"""Liveness: lag without progress fails it, except while the stream is paused on purpose
(table recovery, rebalance), when failing it would restart every worker at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError
from faust.types import TP

from service.config import Settings
from service.stream.app import create_app
from service.stream.runtime import PartitionStatus, Progress, stalled_partitions


def _status(high: int | None, position: int | None, last: float) -> PartitionStatus:
    return PartitionStatus("abstain.features", 0, high=high, position=position, last_progress=last)


def test_lag_is_high_water_mark_minus_position() -> None:
    assert _status(10, 4, 0.0).lag == 6
    assert _status(4, 10, 0.0).lag == 0  # never negative
    assert _status(-1, 0, 0.0).lag == 0  # unknown end
    assert _status(10, None, 0.0).lag == 0  # unknown position


@pytest.mark.parametrize(
    ("high", "position", "last", "stalled"),
    [
        (10, 4, 0.0, True),  # lag and no progress for 61 s
        (10, 10, 0.0, False),  # no lag: an idle partition is healthy
        (10, 4, 2.0, False),  # progress 59 s ago: within the window
    ],
)
def test_stall_needs_lag_and_no_progress_for_stall_seconds(
    high: int, position: int, last: float, stalled: bool
) -> None:
    found = stalled_partitions(
        [_status(high, position, last)], now=61.0, stall_seconds=60.0, paused=False
    )
    assert bool(found) is stalled


def test_paused_stream_is_never_stalled() -> None:
    assert stalled_partitions([_status(10, 0, 0.0)], now=1e6, stall_seconds=1.0, paused=True) == []


def test_hold_restarts_the_stall_clock() -> None:
    progress = Progress(clock=lambda: 5.0)
    progress.mark("t", 0, 3)
    progress.hold([("t", 0), ("t", 1)], 100.0)
    assert progress.times == {("t", 0): 100.0, ("t", 1): 100.0}
    assert progress.offsets == {("t", 0): 3}


class FakeConsumer:
    """The parts of a faust consumer liveness reads."""

    def __init__(self, tps: set[TP], high: int) -> None:
        self.tps = tps
        self.high = high
        self._committed_offset: dict[TP, int] = {}

    def assignment(self) -> set[TP]:
        return self.tps

    def highwater(self, tp: TP) -> int:
        return -1  # stale cache: a paused partition is not fetched

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        return dict.fromkeys(tps, self.high)

    async def position(self, tp: TP) -> int:
        return 0


@pytest.fixture
def clock() -> list[float]:
    return [1000.0]


async def test_recovery_longer_than_stall_seconds_keeps_the_worker_live_then_a_pause_fails_it(
    tmp_path: Path, clock: list[float]
) -> None:
    settings = Settings(app_id="live", datadir=tmp_path, stall_seconds=10.0)
    app: Any = create_app(settings, clock=lambda: clock[0])
    tp = TP("abstain.features", 0)
    app.consumer = FakeConsumer({tp}, high=5)
    recovery = app.tables.recovery
    recovery.in_recovery = True  # recovery after a rebalance: the stream is paused
    await app.housekeeping()
    clock[0] += 120.0  # far beyond stall_seconds, still recovering
    await app.housekeeping()
    assert app.runtime.live
    assert app.runtime.stalled == []

    recovery.in_recovery = False
    recovery.completed.set()
    clock[0] += 5.0  # recovered 5 s ago, lag 5, nothing processed: not yet stalled
    await app.housekeeping()
    assert app.runtime.live
    clock[0] += 6.0  # consumer still paused with lag: 11 s > stall_seconds since recovery
    await app.housekeeping()
    assert not app.runtime.live
    assert app.runtime.stalled == ["abstain.features[0] lag=5"]
    assert app.runtime.metrics.registry.get_sample_value("abstain_live") == 0.0
    lag = app.runtime.metrics.registry.get_sample_value(
        "abstain_consumer_lag", {"topic": "abstain.features", "partition": "0"}
    )
    assert lag == 5.0

    app.runtime.progress.mark("abstain.features", 0, 4)  # it processed up to the end
    await app.housekeeping()
    assert app.runtime.live


async def _recovering(
    tmp_path: Path, clock: list[float], consumer: FakeConsumer
) -> tuple[Any, Any, TP]:
    """An app recovering a changelog (40 of 100 records read; stall_seconds 10), after
    one housekeeping round."""
    settings = Settings(app_id="live-rec", datadir=tmp_path, stall_seconds=10.0)
    app: Any = create_app(settings, clock=lambda: clock[0])
    changelog = TP("live-rec-pending-changelog", 0)
    app.consumer = consumer
    recovery = app.tables.recovery
    recovery.in_recovery = True
    recovery.active_highwaters[changelog] = 100
    recovery.active_offsets[changelog] = 40
    await app.housekeeping()
    return app, recovery, changelog


async def test_a_table_recovery_that_reads_nothing_fails_liveness_one_that_reads_does_not(
    tmp_path: Path, clock: list[float]
) -> None:
    app, recovery, changelog = await _recovering(
        tmp_path, clock, FakeConsumer({TP("abstain.features", 0)}, high=5)
    )
    for _ in range(3):  # slow but moving: 10 records every 6 s
        clock[0] += 6.0
        recovery.active_offsets[changelog] += 10
        await app.housekeeping()
        assert app.runtime.live
    clock[0] += 6.0
    await app.housekeeping()
    assert app.runtime.live  # 6 s without a record: not yet
    clock[0] += 6.0
    await app.housekeeping()  # 12 s > stall_seconds with 30 records left
    assert not app.runtime.live
    assert app.runtime.stalled == ["table recovery: 30 changelog records left, none read for 12 s"]
    recovery.active_offsets[changelog] += 1  # it moves again
    clock[0] += 1.0
    await app.housekeeping()
    assert app.runtime.live


async def test_a_stopped_recovery_during_a_broker_outage_is_not_the_workers_fault(
    tmp_path: Path, clock: list[float]
) -> None:
    app, _, _ = await _recovering(
        tmp_path, clock, UnreachableBroker({TP("abstain.features", 0)}, high=5)
    )
    clock[0] += 30.0
    await app.housekeeping()
    assert app.runtime.live
    assert not app.runtime.broker_reachable


async def test_committed_offset_counts_as_position_before_any_progress(
    tmp_path: Path, clock: list[float]
) -> None:
    settings = Settings(app_id="live2", datadir=tmp_path, stall_seconds=10.0)
    app: Any = create_app(settings, clock=lambda: clock[0])
    tp = TP("abstain.features", 1)
    consumer = FakeConsumer({tp}, high=7)
    consumer._committed_offset[tp] = 7  # next offset to read: all consumed before
    app.consumer = consumer
    app.tables.recovery.completed.set()
    await app.housekeeping()
    clock[0] += 60.0
    await app.housekeeping()
    assert app.runtime.live


class UnreachableBroker(FakeConsumer):
    """A consumer whose broker stops answering end-offset requests, then comes back."""

    down = True

    def highwater(self, tp: TP) -> int:
        return self.high  # the cached mark from before the broker went away

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        if self.down:
            raise KafkaConnectionError("broker down")
        return await super().highwaters(*tps)


async def test_readiness_follows_the_broker_while_liveness_does_not(
    tmp_path: Path, clock: list[float]
) -> None:
    settings = Settings(app_id="ready", datadir=tmp_path, stall_seconds=10.0)
    app: Any = create_app(settings, clock=lambda: clock[0])
    consumer = UnreachableBroker({TP("abstain.features", 0)}, high=0)
    app.consumer = consumer
    app.tables.recovery.completed.set()
    app.runtime.recovered = True
    app.runtime.book.loaded.set()
    await app.housekeeping()
    assert not app.runtime.ready  # cannot reach Kafka: take it out of the Service
    assert app.runtime.live  # a restart would not bring the broker back
    consumer.high = 5  # events were waiting when the broker went away
    clock[0] += 60.0  # far beyond stall_seconds without progress, broker still down
    await app.housekeeping()
    assert app.runtime.live
    assert not app.runtime.ready
    consumer.high = 0
    consumer.down = False
    clock[0] += 1.0
    await app.housekeeping()
    assert app.runtime.ready
    assert app.runtime.live
