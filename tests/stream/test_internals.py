"""faust internals: the consumer's commit bookkeeping (a gap that covers acknowledged offsets
must not make the committed offset crawl, as faust's own merge does), and the consumer view
over faust's private state, here over stand-ins with the attributes it reads."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from aiokafka.errors import IllegalStateError
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st
from intervaltree import IntervalTree

from service.records import RawMessage
from service.stream.internals import Consumer, FaustConsumerView, Transport, merge_gap
from service.stream.partitions import RecoveryState

TPX = TP("features", 2)


def bare(cls: type[Any], acked: list[int], gap: list[tuple[int, int]], committed: int) -> Any:
    """A consumer with only the bookkeeping ``_new_offset`` reads (no Kafka)."""
    c = cls.__new__(cls)
    c._acked = defaultdict(list, {TPX: list(acked)})
    c._acked_index = defaultdict(set, {TPX: set(acked)})
    c._gap = defaultdict(IntervalTree, {TPX: IntervalTree.from_tuples(gap)})
    c._committed_offset = defaultdict(lambda: None, {TPX: committed})
    return c


def commits(c: Any, rounds: int) -> list[int | None]:
    out = []
    for _ in range(rounds):
        offset = c._new_offset(TPX)
        if offset is not None:
            c._committed_offset[TPX] = offset
        out.append(offset)
    return out


def test_the_traced_rebalance_commits_to_the_end_at_once() -> None:
    # after the rebalance: 556..760 acknowledged, and faust's gap 557..652 over them
    acked = list(range(556, 761))
    ours = commits(bare(Consumer, acked, [(557, 653)], committed=556), 3)
    assert ours[0] == 761
    theirs = commits(bare(faust_aiokafka.Consumer, acked, [(557, 653)], committed=556), 3)
    assert theirs[0] is not None
    assert theirs[0] < 560  # faust's own merge: a record or two per commit


def test_a_gap_over_offsets_nobody_acknowledged_still_counts_as_done() -> None:
    # 10, 11 acknowledged; 12..14 a gap (markers); 15 acknowledged: commit 16
    c = bare(Consumer, [10, 11, 15], [(12, 15)], committed=10)
    assert commits(c, 1) == [16]


@given(
    acked=st.sets(st.integers(0, 60), min_size=1),
    gaps=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 10)), max_size=4),
)
def test_merging_never_duplicates_and_covers_the_gap_below_the_top(
    acked: set[int], gaps: list[tuple[int, int]]
) -> None:
    tree = IntervalTree.from_tuples([(a, a + n) for a, n in gaps])
    top = max(acked)
    covered = {o for iv in tree for o in range(iv.begin, iv.end) if o < top}
    above = {o for iv in tree for o in range(iv.begin, iv.end) if o > top}
    rows, index = sorted(acked), set(acked)
    merge_gap(rows, index, tree)
    assert len(rows) == len(set(rows))
    assert set(rows) == acked | covered == index
    assert not tree.overlap(0, top + 1)
    assert {o for iv in tree for o in range(iv.begin, iv.end)} == above  # kept for later


def test_the_transport_runs_the_fixed_consumer() -> None:
    assert Transport.Consumer is Consumer


@dataclass
class FaustConsumerStandIn:
    """The parts of faust's consumer the view reads or calls."""

    _gap: dict[TP, IntervalTree] = field(default_factory=dict)
    _committed_offset: defaultdict[TP, int | None] = field(
        default_factory=lambda: defaultdict(lambda: None)
    )
    acked: list[tuple[TP, int]] = field(default_factory=list)
    commits: list[dict[TP, int]] = field(default_factory=list)

    def ack(self, message: Any) -> bool:
        self.acked.append((message.tp, message.offset))
        return True

    async def _commit_offsets(self, offsets: dict[TP, int]) -> bool:
        self.commits.append(dict(offsets))
        return True

    async def position(self, tp: TP) -> int:
        if tp.partition != 0:
            raise IllegalStateError(f"No current assignment for partition {tp}")
        return 12


def _view(consumer: FaustConsumerStandIn, **app: Any) -> FaustConsumerView:
    return FaustConsumerView(SimpleNamespace(consumer=consumer, **app))


def test_acknowledging_fetched_records_acks_each_and_cuts_fausts_gap() -> None:
    tp = TP("t", 0)
    consumer = FaustConsumerStandIn(_gap={tp: IntervalTree.from_tuples([(11, 15), (20, 22)])})
    view = _view(consumer)
    records = [RawMessage(b"", "t", 0, o) for o in (10, 11, 12, 13)]
    view.acknowledge(records, upto=14)
    assert consumer.acked == [(tp, o) for o in (10, 11, 12, 13)]
    # the range faust took for compacted (11..14) is gone; the unrelated one stays
    assert sorted((i.begin, i.end) for i in consumer._gap[tp]) == [(20, 22)]
    view.acknowledge([], upto=30)  # nothing fetched: nothing to do
    assert len(consumer.acked) == 4


def test_the_committed_offset_is_fausts_and_asking_adds_no_partition() -> None:
    consumer = FaustConsumerStandIn()
    consumer._committed_offset[TP("t", 0)] = 7
    view = _view(consumer)
    assert view.committed_next(TP("t", 0)) == 7
    assert view.committed_next(TP("t", 1)) is None
    assert TP("t", 1) not in consumer._committed_offset


def test_the_position_of_a_partition_revoked_meanwhile_is_unknown_not_a_crash() -> None:
    view = _view(FaustConsumerStandIn())
    assert asyncio.run(view.position(TP("t", 0))) == 12
    assert asyncio.run(view.position(TP("t", 1))) is None


def test_a_processed_offset_is_committed_through_fausts_own_commit() -> None:
    consumer = FaustConsumerStandIn()
    assert asyncio.run(_view(consumer).commit_processed(TP("t", 3), 41))
    assert consumer.commits == [{TP("t", 3): 41}]


def _recovery(*, in_recovery: bool, completed: bool) -> SimpleNamespace:
    """faust's table recovery: one changelog 40 records into 100."""
    done = asyncio.Event()
    if completed:
        done.set()
    changelog = TP("app-table-changelog", 0)
    offsets = Counter({changelog: 40})
    return SimpleNamespace(
        in_recovery=in_recovery,
        completed=done,
        active_offsets=offsets,
        active_remaining=lambda: Counter({changelog: 100 - offsets[changelog]}),
    )


def test_recovery_and_rebalance_are_read_from_faust() -> None:
    recovery = _recovery(in_recovery=True, completed=False)
    app: dict[str, Any] = {"tables": SimpleNamespace(recovery=recovery), "rebalancing": False}
    view = _view(FaustConsumerStandIn(), consumer_generation_id=3, **app)
    assert view.recovery() == RecoveryState(
        in_recovery=True,
        completed=False,
        offsets={("app-table-changelog", 0): 40},
        remaining=60,
    )
    assert view.paused
    assert view.generation == 3
    app["tables"].recovery = _recovery(in_recovery=False, completed=True)
    view = _view(FaustConsumerStandIn(), consumer_generation_id=None, **app)
    assert not view.paused
    assert view.generation == 0
    view = _view(FaustConsumerStandIn(), consumer_generation_id=4, **{**app, "rebalancing": True})
    assert view.paused
