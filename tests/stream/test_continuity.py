"""Continuity: which records an agent missed, and when a quiet partition is sought back or
committed. Kafka and the consumer are faked here (tests/stream/fakes.py);
tests/integration/test_faults_skip.py and test_service_continuity.py cover the same on a real
broker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError
from hypothesis import given
from hypothesis import strategies as st
from intervaltree import IntervalTree

from service.records import RawMessage
from service.stream import continuity
from service.stream.continuity import QUIET_SECONDS, Continuity, QuietTender, Tended
from service.stream.partitions import Progress

from .fakes import FakeConsumerView


class Log:
    """A partition's records (offsets that exist) and the group's committed offset."""

    def __init__(self, offsets: list[int], committed: int | None = None) -> None:
        self.offsets = offsets
        self.committed_offset = committed
        self.fetches: list[tuple[int, int]] = []

    async def committed(self, topic: str, partition: int) -> int | None:
        return self.committed_offset

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> list[RawMessage]:
        self.fetches.append((start, end))
        return [RawMessage(b"%d" % o, topic, partition, o) for o in self.offsets if o >= start]


def see(c: Continuity, offset: int, generation: int = 1, partition: int = 0) -> list[int]:
    """What the agent does per record: the fast path, else ask what is missing."""
    if c.in_order("t", partition, offset, generation=generation):
        return []
    return [r.offset for r in asyncio.run(c.missing("t", partition, offset, generation=generation))]


def test_records_in_order_from_the_committed_offset_miss_nothing() -> None:
    log = Log(list(range(100)), committed=10)
    c = Continuity(log.committed, log.fetch)
    assert [see(c, o) for o in range(10, 20)] == [[]] * 10
    assert log.fetches == []
    assert c.gaps == 0
    assert c.recovered == 0


def test_a_first_record_past_the_committed_offset_brings_the_ones_before_it() -> None:
    log = Log(list(range(100)), committed=10)
    c = Continuity(log.committed, log.fetch)
    assert see(c, 14) == [10, 11, 12, 13]
    assert see(c, 15) == []
    assert log.fetches == [(10, 14)]
    assert (c.gaps, c.recovered) == (1, 4)


def test_a_jump_mid_stream_brings_what_was_jumped_over_and_nothing_past_it() -> None:
    log = Log(list(range(100)), committed=0)
    c = Continuity(log.committed, log.fetch)
    for o in range(5):
        see(c, o)
    assert see(c, 9) == [5, 6, 7, 8]  # the fake returns more: only 5..8 are the gap
    assert see(c, 10) == []


def test_nothing_committed_means_from_the_beginning() -> None:
    log = Log(list(range(3, 50)), committed=None)  # retention removed 0..2
    c = Continuity(log.committed, log.fetch)
    assert see(c, 6) == [3, 4, 5]


def test_redelivered_records_are_processed_again_and_followed() -> None:
    log = Log(list(range(100)), committed=0)
    c = Continuity(log.committed, log.fetch)
    for o in range(10):
        see(c, o)
    # faust sought back to 4 (at least once): 4.. again, then onwards, no gap reported
    assert [see(c, o) for o in range(4, 12)] == [[]] * 8
    assert c.gaps == 0


def test_a_jump_over_offsets_that_hold_no_records_brings_nothing() -> None:
    log = Log([0, 1, 2, 4, 5], committed=0)  # 3: a transaction marker
    c = Continuity(log.committed, log.fetch)
    for o in (0, 1, 2):
        see(c, o)
    assert see(c, 4) == []
    assert (c.gaps, c.recovered) == (1, 0)


def test_a_new_generation_starts_again_from_the_committed_offset() -> None:
    log = Log(list(range(100)), committed=0)
    c = Continuity(log.committed, log.fetch)
    for o in range(20):
        see(c, o, generation=1)
    log.committed_offset = 15  # the rebalance: this worker (or another) committed 15
    assert see(c, 18, generation=2) == [15, 16, 17]
    assert c.expected("t", 0, generation=2) == 19
    assert c.expected("t", 0, generation=1) is None


def test_partitions_are_followed_separately() -> None:
    log = Log(list(range(100)), committed=0)
    c = Continuity(log.committed, log.fetch)
    see(c, 0, partition=0)
    see(c, 0, partition=1)
    assert see(c, 1, partition=1) == []
    assert see(c, 3, partition=0) == [1, 2]


@given(
    committed=st.integers(0, 30),
    seen=st.lists(st.integers(0, 60), min_size=1, max_size=40),
)
def test_every_offset_from_the_committed_one_is_handed_over_at_least_once(
    committed: int, seen: list[int]
) -> None:
    """Whatever faust delivers (gaps, redeliveries, in any order), the agent gets every
    existing offset between the committed one and the highest delivered, in order before
    the record that revealed it."""
    log = Log(list(range(61)), committed=committed)
    c = Continuity(log.committed, log.fetch)
    handed: list[int] = []
    for o in seen:
        missed = see(c, o)
        assert missed == sorted(missed)
        assert all(m < o for m in missed)
        handed += [*missed, o]
    top = max(seen)
    assert set(range(committed, top + 1)) <= set(handed)


TP0 = TopicPartition("t", 0)


def _tender(view: FakeConsumerView, c: Continuity, progress: Progress) -> QuietTender:
    return QuietTender(view, c, progress, watched=["t"])


def _progress(last: float = 100.0, processed: int | None = None) -> Progress:
    """Progress on ``t[0]``: last at ``last``, up to ``processed`` (if any)."""
    progress = Progress(clock=lambda: last)
    progress.times[("t", 0)] = last
    if processed is not None:
        progress.offsets[("t", 0)] = processed
    return progress


def _stranded(view: FakeConsumerView, c: Continuity, quiet_for: float) -> dict[Any, Any]:
    tender = _tender(view, c, _progress())
    return asyncio.run(tender.tend(100.0 + quiet_for, since=0.0)).reread


def test_a_quiet_partition_fetched_past_what_the_agent_saw_is_sought_back_once() -> None:
    log = Log(list(range(100)), committed=0)
    c = Continuity(log.committed, log.fetch)
    for o in range(10):
        see(c, o)
    view = FakeConsumerView(assigned={TP0}, positions={("t", 0): 25},
                            gaps={("t", 0): IntervalTree.from_tuples([(11, 25)])})  # fmt: skip
    assert _stranded(view, c, QUIET_SECONDS - 1) == {}  # not quiet long enough
    assert _stranded(view, c, QUIET_SECONDS) == {("t", 0): (10, 25)}
    assert view.sought == [(("t", 0), 10)]
    assert not view.gaps[("t", 0)]  # faust's idea that 11..24 were compacted is gone
    assert _stranded(view, c, QUIET_SECONDS + 5) == {}  # the same range: not again
    assert view.sought == [(("t", 0), 10)]


def test_a_new_generation_seeks_the_same_range_back_again() -> None:
    c = Continuity(Log([]).committed, Log([]).fetch)
    view = FakeConsumerView(assigned={TP0}, positions={("t", 0): 12}, committed={("t", 0): 4})
    assert _stranded(view, c, 60) == {("t", 0): (4, 12)}
    view.generation = 2  # a rebalance in between: what was sought then no longer holds
    assert _stranded(view, c, 60) == {("t", 0): (4, 12)}
    assert view.sought == [(("t", 0), 4), (("t", 0), 4)]


def test_a_partition_the_agent_has_seen_up_to_its_position_is_left_alone() -> None:
    log = Log(list(range(100)), committed=0)
    c = Continuity(log.committed, log.fetch)
    for o in range(10):
        see(c, o)
    other = TopicPartition("other", 0)
    view = FakeConsumerView(assigned={TP0, other}, positions={("t", 0): 10, ("other", 0): 9})
    assert _stranded(view, c, 60) == {}
    assert view.sought == []


def test_a_partition_without_a_position_is_left_alone() -> None:
    c = Continuity(Log([]).committed, Log([]).fetch)
    view = FakeConsumerView(assigned={TP0}, committed={("t", 0): 4}, default_position=None)
    assert _stranded(view, c, 60) == {}


@pytest.mark.parametrize(("committed", "expected"), [(7, 7), (None, 3)])
def test_with_nothing_seen_since_the_assignment_the_start_is_the_committed_offset(
    committed: int | None, expected: int
) -> None:
    c = Continuity(Log([]).committed, Log([]).fetch)
    view = FakeConsumerView(assigned={TP0}, positions={("t", 0): 12}, earliest_offset=3)
    if committed is not None:
        view.committed[("t", 0)] = committed
    assert _stranded(view, c, 60) == {("t", 0): (expected, 12)}
    assert view.sought == [(("t", 0), expected)]


def test_quiet_time_counts_from_when_the_agents_could_start() -> None:
    c = Continuity(Log([]).committed, Log([]).fetch)
    view = FakeConsumerView(assigned={TP0}, positions={("t", 0): 12}, committed={("t", 0): 4})
    tender = _tender(view, c, _progress(last=0.0))
    # last progress long ago, but the models loaded only just now: not quiet yet
    assert asyncio.run(tender.tend(100.0, since=98.0)).reread == {}
    assert asyncio.run(tender.tend(104.0, since=98.0)).reread == {("t", 0): (4, 12)}


def _tend(view: FakeConsumerView, c: Continuity, processed: int, now: float) -> Any:
    return asyncio.run(_tender(view, c, _progress(processed=processed)).tend(now, since=0.0))


def test_a_quiet_partition_whose_processed_offsets_are_not_committed_is_committed_once() -> None:
    log = Log(list(range(100)), committed=0)
    c = Continuity(log.committed, log.fetch)
    for o in range(20):
        see(c, o)
    view = FakeConsumerView(assigned={TP0}, positions={("t", 0): 20})
    assert _tend(view, c, 19, 101.0).committed == {}  # not quiet yet
    log.committed_offset = 12  # what Kafka has: faust's bookkeeping lost the rest
    assert _tend(view, c, 19, 100.0 + QUIET_SECONDS).committed == {("t", 0): (12, 20)}
    assert view.commits == [(("t", 0), 20)]
    assert _tend(view, c, 19, 200.0).committed == {}  # once for the same offsets
    assert view.commits == [(("t", 0), 20)]


@pytest.mark.parametrize(
    ("group_has", "processed"),
    [(20, 19), (25, 19), (12, 17)],  # committed already; ... further; still processing
)
def test_nothing_is_committed_when_kafka_has_it_or_the_agent_is_not_done(
    group_has: int, processed: int
) -> None:
    log = Log(list(range(100)), committed=0)
    c = Continuity(log.committed, log.fetch)
    for o in range(20):
        see(c, o)
    log.committed_offset = group_has
    view = FakeConsumerView(assigned={TP0}, positions={("t", 0): 20})
    assert _tend(view, c, processed, 100.0 + QUIET_SECONDS).committed == {}
    assert view.commits == []


def test_nothing_is_committed_for_a_partition_the_agent_has_seen_nothing_of() -> None:
    log = Log(list(range(100)), committed=12)
    c = Continuity(log.committed, log.fetch)
    view = FakeConsumerView(assigned={TP0}, positions={("t", 0): 20}, committed={("t", 0): 20})
    assert _tend(view, c, 19, 100.0 + QUIET_SECONDS) == Tended({}, {})
    assert view.commits == []


class Flaky(Log):
    """A log whose Kafka calls fail ``failures`` times first."""

    def __init__(self, offsets: list[int], committed: int | None, failures: int) -> None:
        super().__init__(offsets, committed)
        self.failures = failures
        self.calls = 0

    def _maybe_fail(self) -> None:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise KafkaConnectionError("broker away")

    async def committed(self, topic: str, partition: int) -> int | None:
        self._maybe_fail()
        return await super().committed(topic, partition)

    async def fetch(self, topic: str, partition: int, start: int, end: int) -> list[RawMessage]:
        self._maybe_fail()
        return await super().fetch(topic, partition, start, end)


@pytest.fixture
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(continuity, "RETRY_DELAYS", (0.0, 0.0))


@pytest.mark.usefixtures("no_waiting")
def test_kafka_errors_are_retried_then_the_gap_is_fetched() -> None:
    log = Flaky(list(range(100)), committed=10, failures=2)
    c = Continuity(log.committed, log.fetch)
    assert see(c, 12) == [10, 11]  # committed: 2 failures, then fine; fetch fine
    assert log.calls == 4


@pytest.mark.usefixtures("no_waiting")
def test_a_gap_kafka_will_not_give_is_left_and_the_agent_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = Flaky(list(range(100)), committed=10, failures=0)
    c = Continuity(log.committed, log.fetch)
    assert see(c, 10) == []
    log.failures = 3  # every attempt at fetching 11..14 fails
    assert see(c, 15) == []
    assert "reading them failed" in caplog.text
    assert see(c, 16) == []  # and the stream goes on from there
    assert c.recovered == 0


@pytest.mark.usefixtures("no_waiting")
def test_without_a_committed_offset_from_kafka_the_first_record_is_taken_as_the_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = Flaky(list(range(100)), committed=10, failures=3)
    c = Continuity(log.committed, log.fetch)
    assert see(c, 15) == []
    assert "unchecked" in caplog.text
    assert c.expected("t", 0, generation=1) == 16


@pytest.mark.usefixtures("no_waiting")
def test_a_broker_error_while_asking_the_committed_offset_is_asked_again_next_time() -> None:
    log = Flaky(list(range(100)), committed=0, failures=0)
    c = Continuity(log.committed, log.fetch)
    for o in range(20):
        see(c, o)
    log.committed_offset, log.failures = 12, 1
    view = FakeConsumerView(assigned={TP0}, positions={("t", 0): 20})
    with pytest.raises(KafkaConnectionError):
        _tend(view, c, 19, 100.0 + QUIET_SECONDS)
    assert _tend(view, c, 19, 100.0 + QUIET_SECONDS).committed == {("t", 0): (12, 20)}
