"""The consumer's commit bookkeeping: a gap that covers acknowledged offsets must not make
the committed offset crawl (faust's own merge does)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st
from intervaltree import IntervalTree

from service.stream.consumer import Consumer, merge_gap

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
