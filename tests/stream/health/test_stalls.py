"""Partition bookkeeping: lag, and when lag without progress is a stall."""

from __future__ import annotations

import pytest

from service.stream.health.stalls import PartitionStatus, RecoveryWatch, stalled_partitions


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


def test_a_recovery_with_nothing_left_is_never_stalled() -> None:
    watch = RecoveryWatch()
    assert watch.check({"c": 5}, remaining=0, now=0.0, stall_seconds=1.0) is None
    assert watch.check({"c": 5}, remaining=0, now=100.0, stall_seconds=1.0) is None


def test_reset_forgets_the_recovery_watched_before() -> None:
    watch = RecoveryWatch()
    watch.check({"c": 5}, remaining=3, now=0.0, stall_seconds=10.0)
    watch.reset()
    # a new recovery at the same offsets starts its own clock
    assert watch.check({"c": 5}, remaining=3, now=50.0, stall_seconds=10.0) is None
    assert watch.check({"c": 5}, remaining=3, now=61.0, stall_seconds=10.0) is not None
