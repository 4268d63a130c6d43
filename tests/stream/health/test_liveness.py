"""Liveness: lag without progress fails it, except while the stream is paused on purpose
(table recovery, rebalance), when failing it would restart every worker at once, and while
the broker does not answer, when a restart would not help. The consumer is an in-memory
fake (tests/stream/fakes.py); no broker, no faust app."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from service.metrics import Metrics
from service.stream.health.liveness import LivenessMonitor, LivenessReport
from service.stream.kafka.loop import Progress, RecoveryState, StableMarks
from service.stream.kafka.unreadable import Unreadable, UnreadableBatch

from ..fakes import FakeConsumerView

FEATURES = "abstain.features"
TP0 = TopicPartition(FEATURES, 0)
CHANGELOG = ("live-rec-pending-changelog", 0)
DONE = RecoveryState(in_recovery=False, completed=True)


class Worker:
    """A liveness monitor over a fake consumer, with its clock, progress and metrics
    (``stall_seconds`` 10, ``pinned_seconds`` 30, the features topic watched)."""

    def __init__(self, view: FakeConsumerView, *, answer_timeout: float = 5.0) -> None:
        self.now = 1000.0
        self.view = view
        self.progress = Progress(clock=lambda: self.now)
        self.metrics = Metrics(CollectorRegistry())
        self.monitor = LivenessMonitor(
            view,
            self.progress,
            self.metrics,
            watched=[FEATURES],
            stall_seconds=10.0,
            answer_timeout=answer_timeout,
            pinned_seconds=30.0,
        )

    def check(self, after: float = 0.0) -> LivenessReport:
        """Let ``after`` seconds pass, then run the check (as the one-second timer does)."""
        self.now += after
        return asyncio.run(self.monitor.check(self.now))

    def sample(self, name: str, tp: TopicPartition = TP0) -> float | None:
        labels = {"topic": tp.topic, "partition": str(tp.partition)}
        return self.metrics.registry.get_sample_value(name, labels)


def test_lag_without_progress_for_stall_seconds_fails_liveness_and_progress_heals_it() -> None:
    w = Worker(FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 5}))
    assert w.check().live  # assigned just now: that counts as progress
    report = w.check(after=11.0)
    assert not report.live
    assert report.stalled == ("abstain.features[0] lag=5",)
    assert report.broker_reachable
    assert [(p.high, p.position, p.lag) for p in report.partitions] == [(5, 0, 5)]
    assert w.metrics.registry.get_sample_value("abstain_live") == 0.0
    assert w.sample("abstain_consumer_lag") == 5.0
    w.progress.mark(FEATURES, 0, 4)  # it processed up to the end
    marked_at = w.now
    assert w.check(after=1.0).live
    assert w.metrics.registry.get_sample_value("abstain_live") == 1.0
    assert w.sample("abstain_consumer_lag") == 0.0
    assert w.sample("abstain_last_progress_timestamp_seconds") == marked_at


def test_recovery_longer_than_stall_seconds_keeps_the_worker_live_then_a_pause_fails_it() -> None:
    recovering = RecoveryState(in_recovery=True, completed=False)  # after a rebalance
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 5}, recovery_state=recovering)
    w = Worker(view)
    w.check()
    report = w.check(after=120.0)  # far beyond stall_seconds, still recovering
    assert report.live
    assert report.stalled == ()
    view.recovery_state = DONE
    assert w.check(after=5.0).live  # recovered 5 s ago, lag 5, nothing processed: not yet
    report = w.check(after=6.0)  # still no progress with lag: 11 s > stall_seconds
    assert not report.live
    assert report.stalled == ("abstain.features[0] lag=5",)
    assert w.metrics.registry.get_sample_value("abstain_live") == 0.0
    assert w.sample("abstain_consumer_lag") == 5.0
    w.progress.mark(FEATURES, 0, 4)
    assert w.check().live


def test_a_rebalance_pauses_the_stall_clock_and_asks_the_broker_nothing() -> None:
    view = FakeConsumerView(
        assigned={TP0}, highs={(FEATURES, 0): 5}, rebalancing=True, broker="down"
    )
    w = Worker(view)
    w.check()
    report = w.check(after=120.0)
    assert report.live
    assert report.broker_reachable  # not asked while paused
    assert [p.high for p in report.partitions] == [-1]  # the cached (stale) mark
    view.rebalancing = False
    view.broker = "up"
    assert w.check(after=5.0).live  # the clock restarted when the rebalance ended
    assert not w.check(after=6.0).live


def _recovering(view: FakeConsumerView, offset: int) -> RecoveryState:
    """Changelog recovery at ``offset`` of 100 records."""
    state = RecoveryState(
        in_recovery=True, completed=False, offsets={CHANGELOG: offset}, remaining=100 - offset
    )
    view.recovery_state = state
    return state


def test_a_table_recovery_that_reads_nothing_fails_liveness_one_that_reads_does_not() -> None:
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 5})
    w = Worker(view)
    offset = 40
    _recovering(view, offset)
    w.check()
    for _ in range(3):  # slow but moving: 10 records every 6 s
        offset += 10
        _recovering(view, offset)
        assert w.check(after=6.0).live
    assert w.check(after=6.0).live  # 6 s without a record: not yet
    report = w.check(after=6.0)  # 12 s > stall_seconds with 30 records left
    assert not report.live
    assert report.stalled == ("table recovery: 30 changelog records left, none read for 12 s",)
    _recovering(view, offset + 1)  # it moves again
    assert w.check(after=1.0).live


@pytest.mark.parametrize("broker", ["down", "silent"])
def test_a_stopped_recovery_during_a_broker_outage_is_not_the_workers_fault(broker: str) -> None:
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 5}, broker=broker)
    w = Worker(view, answer_timeout=0.01)
    _recovering(view, 40)
    w.check()
    report = w.check(after=30.0)
    assert report.live
    assert not report.broker_reachable
    view.broker = "up"  # the broker is back, the recovery still stopped
    report = w.check(after=1.0)
    assert report.broker_reachable
    assert not report.live


def test_committed_offset_counts_as_position_before_any_progress() -> None:
    tp = TopicPartition(FEATURES, 1)
    view = FakeConsumerView(assigned={tp}, highs={(FEATURES, 1): 7}, committed={(FEATURES, 1): 7})
    w = Worker(view)  # the next offset to read is 7: all consumed before
    w.check()
    report = w.check(after=60.0)
    assert report.live
    assert [p.position for p in report.partitions] == [7]


def test_without_progress_or_commit_the_position_is_the_consumers() -> None:
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 9}, positions={(FEATURES, 0): 6})
    assert [p.lag for p in Worker(view).check().partitions] == [3]


@pytest.mark.parametrize("broker", ["down", "silent"])
def test_readiness_follows_the_broker_while_liveness_does_not(broker: str) -> None:
    view = FakeConsumerView(assigned={TP0}, broker=broker)
    w = Worker(view, answer_timeout=0.01)
    report = w.check()
    assert not report.broker_reachable  # cannot reach Kafka: take it out of the Service
    assert report.live  # a restart would not bring the broker back
    view.cached[(FEATURES, 0)] = 5  # events were waiting when the broker went away
    report = w.check(after=60.0)  # far beyond stall_seconds without progress, broker away
    assert report.live
    assert not report.broker_reachable
    assert [p.high for p in report.partitions] == [5]  # the cached mark, for the lag gauge
    view.broker = "up"  # back, and the events turn out to be consumed
    report = w.check(after=1.0)
    assert report.broker_reachable
    assert report.live


def test_after_an_outage_the_stall_clock_starts_again() -> None:
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 5}, broker="down")
    w = Worker(view)
    w.check()
    w.check(after=60.0)
    view.broker = "up"
    assert w.check(after=5.0).live  # 5 s since the broker answered again
    assert not w.check(after=6.0).live


def test_a_revoked_partition_loses_its_series_and_its_progress() -> None:
    tp1 = TopicPartition(FEATURES, 1)
    view = FakeConsumerView(assigned={TP0, tp1}, highs={(FEATURES, 0): 5, (FEATURES, 1): 3})
    w = Worker(view)
    w.progress.mark(FEATURES, 1, 2)
    w.check()
    assert w.sample("abstain_consumer_lag", tp1) == 0.0
    view.assigned = {TP0}  # the rebalance gave partition 1 to another worker
    report = w.check(after=1.0)
    assert [p.partition for p in report.partitions] == [0]
    assert w.sample("abstain_consumer_lag", tp1) is None
    assert w.sample("abstain_last_progress_timestamp_seconds", tp1) is None
    assert (FEATURES, 1) not in w.progress.offsets
    assert (FEATURES, 1) not in w.progress.times
    assert w.sample("abstain_consumer_lag") == 5.0


def test_an_assignment_counts_as_progress() -> None:
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 5, (FEATURES, 1): 8})
    w = Worker(view)
    w.check()
    w.progress.mark(FEATURES, 0, 4)
    tp1 = TopicPartition(FEATURES, 1)
    view.assigned = {TP0, tp1}  # with a lag of 8, nothing processed yet
    assert w.check(after=60.0).live  # assigned just now
    assert w.progress.times[(FEATURES, 1)] == w.now
    assert w.check(after=10.0).live
    assert w.check(after=1.0).stalled == ("abstain.features[1] lag=8",)


def test_partitions_of_topics_not_watched_are_not_reported() -> None:
    other = TopicPartition("abstain.decisions", 0)
    view = FakeConsumerView(
        assigned={TP0, other}, highs={(FEATURES, 0): 0, ("abstain.decisions", 0): 9}
    )
    w = Worker(view)
    w.check()
    report = w.check(after=60.0)
    assert report.live
    assert [(p.topic, p.partition) for p in report.partitions] == [(FEATURES, 0)]
    assert w.sample("abstain_consumer_lag", other) is None


def test_a_partition_stopped_at_a_batch_it_cannot_read_is_stalled_at_once_named_once() -> None:
    unreadable = Unreadable()
    w = Worker(FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 9}))
    w.monitor.unreadable = unreadable
    assert w.check().live
    unreadable.stop(UnreadableBatch(FEATURES, 0, 4, 6, "UnsupportedCodecError: lz4"))
    report = w.check(after=1.0)  # far less than stall_seconds
    assert not report.live
    line = (
        "abstain.features[0] offsets 4-5 cannot be read (UnsupportedCodecError: lz4): "
        "`abstain skip abstain.features 0` dead-letters it and goes on"
    )
    assert report.unreadable == (line,)
    assert report.stalled == (line,)  # and not again as "lag without progress"
    assert w.check(after=30.0).stalled == (line,)
    unreadable.release([TP0])
    w.progress.mark(FEATURES, 0, 8)
    assert w.check(after=1.0).live


def test_offsets_the_consumer_passed_without_handing_out_a_record_are_not_lag() -> None:
    # a transaction's control record (offset 5) after the last event (offset 4): the
    # consumer stands at 6 although the loop handled 4 last
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 6}, positions={(FEATURES, 0): 6})
    w = Worker(view)
    w.progress.mark(FEATURES, 0, 4)
    report = w.check(after=30.0)
    assert report.live
    assert [(p.high, p.position, p.lag) for p in report.partitions] == [(6, 6, 0)]
    view.positions[(FEATURES, 0)] = 3  # behind what was handled: what was handled counts
    assert [p.position for p in w.check(after=1.0).partitions] == [5]


def _fetched(view: FakeConsumerView, w: Worker, *, high: int, stable: int) -> None:
    """The consumer's last fetch of partition 0, answered now."""
    view.marks[(FEATURES, 0)] = StableMarks(high=high, stable=stable, fetched_at=w.now)


def test_a_last_stable_offset_held_behind_the_high_watermark_is_pinned_not_stalled() -> None:
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 4}, default_position=4)
    w = Worker(view)
    _fetched(view, w, high=9, stable=4)  # a transaction opened at 4; 5 records after it
    assert w.check().pinned == ()
    for _ in range(30):  # lag 0 all along: the end offsets are the last stable offset
        w.now += 1.0
        _fetched(view, w, high=9, stable=4)
        report = w.check()
    assert report.pinned == ()  # 30 s: not more than pinned_seconds yet
    assert w.sample("abstain_pinned_transaction_seconds") == 30.0
    w.now += 1.0
    _fetched(view, w, high=12, stable=4)
    report = w.check()
    (line,) = report.pinned
    assert line.startswith(
        "abstain.features[0] last stable offset 4 behind high watermark 12 for 31 s "
        "(a transaction neither committed nor aborted holds back 8 records)"
    )
    assert line.endswith("abort --topic abstain.features --partition 0 --start-offset 4` ends it")
    assert report.live  # the worker reads its other partitions; a restart ends nothing
    assert report.stalled == ()
    assert w.sample("abstain_consumer_lag") == 0.0
    assert w.sample("abstain_pinned_transaction_seconds") == 31.0
    assert w.sample("abstain_records_past_stable_offset") == 8.0
    w.now += 1.0
    _fetched(view, w, high=12, stable=12)  # committed (or aborted)
    report = w.check()
    assert report.pinned == ()
    assert w.sample("abstain_pinned_transaction_seconds") == 0.0
    assert w.sample("abstain_records_past_stable_offset") == 0.0


def test_a_last_stable_offset_that_moves_is_never_pinned() -> None:
    """A busy transactional producer: always a transaction open, each one short."""
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 0}, default_position=0)
    w = Worker(view)
    for second in range(120):
        _fetched(view, w, high=10 * second + 10, stable=10 * second + 3)
        assert w.check(after=1.0).pinned == ()
        assert w.sample("abstain_pinned_transaction_seconds") == 0.0
    assert w.sample("abstain_records_past_stable_offset") == 7.0


def test_the_pinned_time_counts_between_fetches_not_past_the_last_one() -> None:
    """A partition not fetched (paused) keeps the time of its last fetch response."""
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 4}, default_position=4)
    w = Worker(view)
    _fetched(view, w, high=9, stable=4)
    w.check()
    w.now += 20.0
    _fetched(view, w, high=9, stable=4)
    w.check()
    assert w.check(after=60.0).pinned == ()  # not fetched since: 20 s known, no more
    assert w.sample("abstain_pinned_transaction_seconds") == 20.0


def test_read_uncommitted_is_never_pinned() -> None:
    """Under read_uncommitted a fetch response's last stable offset reads -1."""
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 9}, default_position=9)
    w = Worker(view)
    for _ in range(40):
        _fetched(view, w, high=9, stable=-1)
        assert w.check(after=1.0).pinned == ()
    assert w.sample("abstain_pinned_transaction_seconds") == 0.0
    assert w.sample("abstain_records_past_stable_offset") == 0.0


def test_a_revoked_pinned_partition_loses_its_series_and_its_clock() -> None:
    view = FakeConsumerView(assigned={TP0}, highs={(FEATURES, 0): 4}, default_position=4)
    w = Worker(view)
    _fetched(view, w, high=9, stable=4)
    w.check()
    w.now += 40.0
    _fetched(view, w, high=9, stable=4)
    assert w.check().pinned
    view.assigned = set()
    assert w.check(after=1.0).pinned == ()
    assert w.sample("abstain_pinned_transaction_seconds") is None
    assert w.sample("abstain_records_past_stable_offset") is None
    view.assigned = {TP0}  # back again, still held: the clock starts from its next fetch
    _fetched(view, w, high=9, stable=4)
    assert w.check(after=1.0).pinned == ()
    assert w.sample("abstain_pinned_transaction_seconds") == 0.0
