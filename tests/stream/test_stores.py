"""Typed stores over a byte table: the pending index, expiry order, unreadable values."""

from __future__ import annotations

from service.records import Label
from service.stream.model import initial_envelope
from service.stream.stores import ModelStore, ParkedStore, PendingStore

from .memory import CFG, MemoryKafka, pending


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
    answer = Label("done", "m", 1, "", None)
    writer.put(pending([1.0], "done", requested_at=1.0).answered(answer, offset=0, version=1,
                                                                 now=6.0))  # fmt: skip
    await kafka.flush()
    reader = PendingStore(kafka.table("pending"))  # recovered by a worker after a rebalance
    assert reader.open_requests(["m"], now=10.0) == {"m": (0, 0.0)}  # not indexed yet
    reader.refresh(frozenset({0}))
    assert reader.open_requests(["m"], now=10.0) == {"m": (1, 5.0)}  # answered not counted
    assert [k for k, _ in reader.due(0, now=2e9, grace=0.0)] == ["done", "old"]


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
