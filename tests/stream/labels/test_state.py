"""Typed stores over a byte table: the pending index, expiry order, the label queue and its
pages, unreadable values."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from service.records import Label, PendingEntry
from service.records.wire import FeatureMoments
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore, PendingSummary, Table
from service.stream.models.served import initial_envelope

from ..memory import CFG, MemoryKafka
from ..memory import pending as _pending


def pending(features: list[float], rid: str, **kw: Any) -> PendingEntry:
    """A pending entry whose request id is ``rid`` itself (readable assertions)."""
    return _pending(features, rid, request_id=rid, **kw)


def answer(entry: PendingEntry) -> PendingEntry:
    label = Label(entry.request_id, entry.model, 1, "", None)
    return entry.answered(label, offset=0, version=1, now=6.0)


def test_due_pops_expired_entries_of_one_partition_in_expiry_order_once() -> None:
    store = PendingStore(MemoryKafka().table("pending"))
    for rid, expires, part in [("c", 30.0, 0), ("a", 10.0, 0), ("b", 20.0, 0), ("x", 1.0, 1)]:
        store.put(pending([1.0], rid, partition=part, expires_at=expires))
    assert [k for k, _ in store.due(0, now=25.0, grace=0.0)] == ["a", "b"]
    assert store.due(0, now=25.0, grace=0.0) == []  # taken off the heap
    assert [k for k, _ in store.due(0, now=40.0, grace=5.0)] == ["c"]
    assert [k for k, s in store.due(1, now=40.0, grace=0.0)] == ["x"]


async def test_refresh_rebuilds_the_index_from_the_table_when_the_assignment_changes() -> None:
    kafka = MemoryKafka()
    writer = PendingStore(kafka.table("pending"))
    writer.put(pending([1.0], "old", requested_at=5.0))
    writer.put(answer(pending([1.0], "done", requested_at=1.0)))
    await kafka.flush()
    reader = PendingStore(kafka.table("pending"))  # recovered by a worker after a rebalance
    assert reader.open_requests(["m"], now=10.0) == {"m": (0, 0.0)}  # not indexed yet
    assert reader.page(after=None, limit=10, now=10.0) == ([], None)
    assert reader.refresh(frozenset({0}))
    assert not reader.refresh(frozenset({0}))  # same assignment: nothing to do
    assert reader.open_requests(["m"], now=10.0) == {"m": (1, 5.0)}  # answered not counted
    assert [k for k, _ in reader.due(0, now=2e9, grace=0.0)] == ["done", "old"]
    assert [e.request_id for e in reader.page(after=None, limit=10, now=10.0)[0]] == ["old"]


def test_scans_skip_values_that_do_not_parse() -> None:
    kafka = MemoryKafka()
    table = kafka.table("pending")
    store = PendingStore(table)
    store.put(pending([1.0], "ok"))
    table[b"bad"] = b'{"request_id": "bad"}'
    table[b"\xff"] = b"{}"
    assert [e.request_id for e in store.entries()] == ["ok"]
    parked = ParkedStore(table)
    assert ("bad", None) in parked.entries()


def test_model_store_serves_the_initial_envelope_until_one_is_stored() -> None:
    initial = {"m": initial_envelope("m", CFG)}
    store = ModelStore(MemoryKafka().table("models"), initial)
    assert store.get("m") == initial["m"]
    newer = initial["m"].replace(version=4)
    store.put(newer, newer.to_json())
    assert store.get("m") == newer


# --------------------------------------------------------------------------- the queue


def ids(store: PendingStore, *, limit: int = 100, now: float = 10.0) -> list[str]:
    return [e.request_id for e in store.page(after=None, limit=limit, now=now)[0]]


def all_pages(store: PendingStore, limit: int, now: float = 10.0) -> list[list[str]]:
    pages, after = [], None
    while True:
        entries, after = store.page(after=after, limit=limit, now=now)
        pages.append([e.request_id for e in entries])
        if after is None:
            return pages


def test_the_queue_is_open_requests_by_priority_then_age_answered_and_expired_left_out() -> None:
    store = PendingStore(MemoryKafka().table("pending"))
    store.put(pending([1.0], "low", priority=0.1))
    store.put(pending([1.0], "young", priority=0.9, requested_at=2.0))
    store.put(pending([1.0], "old", priority=0.9, requested_at=1.0))
    store.put(pending([1.0], "expired", priority=1.0, expires_at=5.0))
    store.put(pending([1.0], "done", priority=1.0))
    assert ids(store) == ["done", "old", "young", "low"]
    store.put(answer(store.get("done") or pending([], "?")))  # answered: leaves the queue
    assert ids(store) == ["old", "young", "low"]
    assert ids(store, now=1.0) == ["expired", "old", "young", "low"]
    store.delete("old")
    assert ids(store) == ["young", "low"]
    assert store.open_requests(["m"], now=10.0)["m"][0] == 3  # the gauges are unchanged


def test_pages_cover_the_queue_once_in_order_whatever_their_size() -> None:
    store = PendingStore(MemoryKafka().table("pending"))
    rng = random.Random(3)
    for i in range(40):
        store.put(
            pending(
                [float(i)],
                f"r{i:02}",
                priority=rng.choice([0.1, 0.5, 0.9]),
                requested_at=float(rng.randrange(5)),
            )
        )
    whole = ids(store)
    assert len(whole) == 40
    for limit in (1, 7, 40, 100):
        pages = all_pages(store, limit)
        assert [rid for page in pages for rid in page] == whole
        assert all(len(page) == limit for page in pages[:-1])


def test_a_cursor_stays_valid_while_the_queue_changes() -> None:
    store = PendingStore(MemoryKafka().table("pending"))
    for i, p in enumerate([0.9, 0.8, 0.7, 0.6]):
        store.put(pending([1.0], f"r{i}", priority=p))
    first, after = store.page(after=None, limit=2, now=10.0)
    assert [e.request_id for e in first] == ["r0", "r1"]
    store.delete("r1")  # the page's last request is answered and swept...
    store.put(pending([1.0], "top", priority=1.0))  # ...and a more urgent one arrives
    store.put(pending([1.0], "mid", priority=0.65))
    rest, end = store.page(after=after, limit=10, now=10.0)
    assert [e.request_id for e in rest] == ["r2", "mid", "r3"]
    assert end is None


def test_a_page_decodes_only_its_own_entries() -> None:
    reads: list[bytes] = []

    class Counting:
        def __init__(self, table: Table) -> None:
            self.table = table

        def get(self, key: bytes, /) -> bytes | None:
            reads.append(key)
            return self.table.get(key)

        def __setitem__(self, key: bytes, value: bytes, /) -> None:
            self.table[key] = value

        def __delitem__(self, key: bytes, /) -> None:
            del self.table[key]

        def __contains__(self, key: object, /) -> bool:
            return key in self.table

        def items(self) -> Any:
            raise AssertionError("a page must not scan the table")

    store = PendingStore(Counting(MemoryKafka().table("pending")))
    for i in range(2000):
        store.put(pending([1.0, 2.0], f"r{i:04}", priority=i / 2000))
    entries, after = store.page(after=None, limit=5, now=10.0)
    assert [e.request_id for e in entries] == [f"r{i:04}" for i in range(1999, 1994, -1)]
    assert len(reads) == 5
    assert after is not None


def test_a_page_looks_at_a_bounded_stretch_of_expired_requests() -> None:
    store = PendingStore(MemoryKafka().table("pending"))
    for i in range(30):
        store.put(pending([1.0], f"gone{i:02}", priority=0.9, expires_at=1.0))
    store.put(pending([1.0], "open", priority=0.1))
    entries, after = store.page(after=None, limit=10, now=10.0, max_scan=20)
    assert entries == []
    assert after is not None  # a short page, and where to go on
    entries, after = store.page(after=after, limit=10, now=10.0, max_scan=20)
    assert [e.request_id for e in entries] == ["open"]
    assert after is None


def test_a_page_skips_a_value_that_no_longer_parses() -> None:
    table = MemoryKafka().table("pending")
    store = PendingStore(table)
    store.put(pending([1.0], "a", priority=0.9))
    store.put(pending([1.0], "b", priority=0.1))
    table[b"a"] = b'{"request_id": "a"}'
    assert ids(store) == ["b"]


def test_the_summary_carries_the_priority_and_orders_non_finite_values_as_zero() -> None:
    entry = pending([1.0], "r", priority=0.75, requested_at=3.0)
    summary = PendingSummary.of(entry)
    assert summary.priority == 0.75
    assert summary.queue_key("r") == (-0.75, 3.0, "r")
    odd = PendingSummary("m", 0, float("nan"), 9.0, False, float("inf"))
    assert odd.queue_key("r") == (-0.0, 0.0, "r")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.floats(allow_nan=False), st.integers(-5, 5)), max_size=5),
    st.integers(0, 7),
    st.booleans(),
    st.sampled_from([{}, {"s": 1}, {"s": 0, "t": -1}]),
    st.sampled_from([None, "s"]),
    st.text(min_size=1, max_size=5),
    st.booleans(),
    st.sampled_from([None, 0, 41]),
)
def test_a_stored_entry_is_the_bytes_of_its_own_encoding(
    features: list[float],
    partition: int,
    answered: bool,
    shadows: dict[str, int],
    served_by: str | None,
    rid: str,
    with_moments: bool,
    request_offset: int | None,
) -> None:
    n = len(features)
    moments = FeatureMoments(4, (0.5,) * n, (2.0,) * n) if with_moments and n else None
    entry = pending(
        features,
        rid,
        partition=partition,
        shadow_labels=shadows,
        served_by=served_by,
        moments=moments,
    )
    entry = replace(entry, request_offset=request_offset)
    if answered:
        entry = answer(entry)
    table = MemoryKafka().table("pending")
    PendingStore(table).put(entry)
    assert table.data[rid.encode()] == entry.to_json()


def test_an_entry_keeps_where_its_request_was_read_and_older_entries_read_without_it() -> None:
    table = MemoryKafka().table("pending")
    store = PendingStore(table)
    store.put(replace(pending([1.0, 2.0], "a"), request_offset=41))
    store.put(pending([1.0, 2.0], "b"))
    a, b = store.get("a"), store.get("b")
    assert a is not None
    assert b is not None
    assert (a.request_offset, b.request_offset) == (41, None)
    assert b"request_offset" not in table.data[b"b"]  # what every release wrote


def test_the_queue_keeps_its_order_across_bursts_reads_and_answers() -> None:
    store = PendingStore(MemoryKafka().table("pending"))
    rng = random.Random(4)
    kept: dict[str, PendingEntry] = {}
    for burst in range(12):  # bursts sorted in together, then one at a time
        for i in range(50 if burst < 6 else 1):
            entry = pending(
                [1.0], f"r{burst}-{i}", priority=rng.random(), requested_at=float(rng.randrange(9))
            )
            store.put(entry)
            kept[entry.request_id] = entry
        for rid in rng.sample(sorted(kept), 10 if burst < 6 else 1):  # answered or expired
            if rng.random() < 0.5:
                store.put(answer(kept.pop(rid)))
            else:
                store.delete(rid)
                del kept[rid]
        page, _ = store.page(after=None, limit=1000, now=0.0)
        expected = sorted(
            kept.values(), key=lambda e: (-e.request.priority, e.request.requested_at, e.request_id)
        )
        assert [e.request_id for e in page] == [e.request_id for e in expected]
        assert store.least_urgent("m") == expected[-1].request_id
        assert store.open_count("m") == len(kept)


def _scanned(store: PendingStore, models: list[str], now: float) -> dict[str, tuple[int, float]]:
    """What the gauges read: every unanswered entry of the index, looked at."""
    count = dict.fromkeys(models, 0)
    oldest = dict.fromkeys(models, now)
    for entry in store.entries():
        if not entry.applied and entry.model in count:
            count[entry.model] += 1
            oldest[entry.model] = min(oldest[entry.model], entry.request.requested_at)
    return {m: (count[m], now - oldest[m]) for m in models}


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "put", "answer", "delete", "refresh"]),
            st.integers(0, 30),
            st.sampled_from(["m", "n"]),
            st.floats(0.0, 100.0),
        ),
        max_size=60,
    )
)
def test_the_open_requests_and_the_oldest_age_are_what_a_scan_of_the_entries_finds(
    steps: list[tuple[str, int, str, float]],
) -> None:
    store = PendingStore(MemoryKafka().table("pending"))
    for action, n, model, at in steps:
        rid = f"{model}{n}"
        held = store.get(rid)
        if action == "put":
            store.put(pending([1.0], rid, model=model, requested_at=at))
        elif action == "answer" and held is not None and not held.applied:
            store.put(answer(held))
        elif action == "delete" and held is not None:
            store.delete(rid)
        elif action == "refresh":
            store.refresh(frozenset({len(steps), n}))  # a new assignment: read again
        assert store.open_requests(["m", "n", "x"], 50.0) == _scanned(store, ["m", "n", "x"], 50.0)
