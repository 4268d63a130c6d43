"""The learner's changelog-backed tables without a broker: every write is a changelog record
of the partition being handled, recovery replays them, a revoke forgets its partitions."""

from __future__ import annotations

import tracemalloc

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.records import SIGNATURE_HEADER, Signer
from service.stream.kafka.produce import OutRecord
from service.stream.kafka.topics import changelog_topic
from service.stream.labels.tables import MARKER, ChangelogTable, TableWriteError, Writes

TOPIC = changelog_topic("app", "pending")


def test_a_write_outside_the_handling_of_a_record_is_refused_and_changes_nothing() -> None:
    table = ChangelogTable(TOPIC, Writes())
    with pytest.raises(TableWriteError):
        table[b"k"] = b"v"
    assert b"k" not in table
    assert table.writes.take() == []


def test_writes_go_to_the_partition_being_handled_in_order() -> None:
    writes = Writes()
    pending, models = ChangelogTable(TOPIC, writes), ChangelogTable("app-models-changelog", writes)
    with writes.partition(2):
        pending[b"r1"] = b"a"
        models[b"m"] = b"w1"
        with writes.partition(5):  # nested: restored after
            pending[b"r2"] = b"b"
        del pending[b"r1"]
    assert writes.take() == [
        OutRecord(TOPIC, b"r1", b"a", 2),
        OutRecord("app-models-changelog", b"m", b"w1", 2),
        OutRecord(TOPIC, b"r2", b"b", 5),
        OutRecord(TOPIC, b"r1", None, 2),  # a tombstone: compaction drops the key
    ]
    assert writes.take() == []
    assert dict(pending.items()) == {b"r2": b"b"}


def test_deleting_a_missing_key_raises_like_a_dict_and_writes_nothing() -> None:
    writes = Writes()
    table = ChangelogTable(TOPIC, writes)
    with writes.partition(0), pytest.raises(KeyError):
        del table[b"nope"]
    assert writes.take() == []


def test_a_revoke_forgets_only_the_revoked_partitions() -> None:
    writes = Writes()
    table = ChangelogTable(TOPIC, writes)
    for p in range(3):
        with writes.partition(p):
            table[f"k{p}".encode()] = b"v"
    table.drop([1])
    assert sorted(k for k, _ in table.items()) == [b"k0", b"k2"]


ops = st.lists(
    st.tuples(
        st.sampled_from([b"a", b"b", b"c", b"d"]), st.one_of(st.none(), st.binary(max_size=4))
    ),
    max_size=40,
)


@given(ops)
def test_replaying_the_changelog_rebuilds_exactly_the_table(
    script: list[tuple[bytes, bytes | None]],
) -> None:
    """What recovery does: the records a table wrote, loaded into an empty table, give the
    same entries (a key's last write wins, a tombstone removes it). A key lives in one
    partition, as a model's entries do (the label topics are keyed by model)."""
    writes = Writes()
    table = ChangelogTable(TOPIC, writes)
    for key, value in script:
        with writes.partition(key[0] % 3):
            if value is not None:
                table[key] = value
            elif key in table:
                del table[key]
    records = writes.take()
    fresh = ChangelogTable(TOPIC, Writes())
    for p in range(3):
        fresh.load(p, [(i, r.key, r.value, ()) for i, r in enumerate(records) if r.partition == p])
    assert dict(fresh.items()) == dict(table.items())


def test_loading_skips_keyless_records_and_applies_tombstones() -> None:
    table = ChangelogTable(TOPIC, Writes())
    table.load(
        0, [(0, b"a", b"1", ()), (1, None, b"x", ()), (2, b"b", b"2", ()), (3, b"a", None, ())]
    )
    assert dict(table.items()) == {b"b": b"2"}


# -- signed changelogs --------------------------------------------------------------------

KEY, OLD = b"k" * 32, b"o" * 32


def _signed(legacy: bool = True, previous: tuple[bytes, ...] = ()) -> ChangelogTable:
    return ChangelogTable(TOPIC, Writes(), signer=Signer(KEY, previous), legacy=legacy)


def _read_back(records: list[OutRecord], table: ChangelogTable) -> None:
    """What recovery does: the records, in order, into ``table`` (partition 0)."""
    table.load(0, [(i, r.key, r.value, r.headers or ()) for i, r in enumerate(records)])


def test_a_signed_table_signs_what_it_writes_and_takes_it_back() -> None:
    table = _signed()
    with table.writes.partition(0):
        table[b"a"] = b"1"
        table[b"b"] = b"2"
        del table[b"b"]
    records = table.writes.take()
    assert all(dict(r.headers or ())[SIGNATURE_HEADER].startswith(b"v1:") for r in records)
    fresh = _signed()
    _read_back(records, fresh)
    assert dict(fresh.items()) == {b"a": b"1"}
    assert fresh.repair() == []
    assert [r.key for r in fresh.writes.take()] == [MARKER]  # the partition is marked


def test_a_forged_record_is_refused_the_valid_value_stays_and_is_written_again() -> None:
    table = _signed()
    table.load(0, ())  # recovered (empty), as the learner does before it writes
    table.repair()  # the partition's mark
    with table.writes.partition(0):
        table[b"a"] = b"genuine"
    records = table.writes.take()
    records.append(OutRecord(TOPIC, MARKER, b"{}", 0))  # a marker nobody signed: ignored
    records.append(OutRecord(TOPIC, b"a", b"forged", 0))  # unsigned
    other = Signer(b"x" * 32).sign(f"{TOPIC}/".encode() + b"a", b"forged")
    records.append(OutRecord(TOPIC, b"a", b"forged", 0, [(SIGNATURE_HEADER, other)]))
    records.append(OutRecord(TOPIC, b"a", None, 0))  # an unsigned tombstone
    records.append(OutRecord(TOPIC, b"new", b"forged", 0))
    fresh = _signed()
    _read_back(records, fresh)
    assert dict(fresh.items()) == {b"a": b"genuine"}
    refused = fresh.repair()
    assert [(r.key, r.reason, r.offset) for r in refused] == [
        (b"a", "unsigned", 3),
        (b"a", "bad_signature", 4),
        (b"a", "unsigned", 5),
        (b"new", "unsigned", 6),
    ]
    # superseded: the genuine value again, a signed tombstone for the key that had none
    written = {(r.key, r.value) for r in fresh.writes.take()}
    assert {(b"a", b"genuine"), (b"new", None)} <= written


def test_records_from_before_the_learner_signed_are_taken_where_a_table_allows() -> None:
    legacy = [OutRecord(TOPIC, b"a", b"old", 0)]
    pending = _signed(legacy=True)
    _read_back(legacy, pending)
    assert dict(pending.items()) == {b"a": b"old"}
    assert pending.repair() == []
    rewritten = pending.writes.take()
    assert [r.key for r in rewritten] == [b"a", MARKER]  # signed now, and the mark
    # after the mark, an unsigned record is a forgery
    after = _signed(legacy=True)
    _read_back([*rewritten, OutRecord(TOPIC, b"b", b"late", 0)], after)
    assert dict(after.items()) == {b"a": b"old"}
    assert [(r.key, r.legacy) for r in after.refused] == [(b"b", False)]
    # the history takes nothing unsigned: refused, as written before the mark
    history = _signed(legacy=False)
    _read_back(legacy, history)
    assert dict(history.items()) == {}
    assert [(r.key, r.legacy) for r in history.repair()] == [(b"a", True)]


def test_a_record_signed_with_the_previous_key_is_taken_and_signed_again() -> None:
    old = ChangelogTable(TOPIC, Writes(), signer=Signer(OLD))
    with old.writes.partition(0):
        old[b"a"] = b"1"
    rotated = _signed(previous=(OLD,))
    _read_back(old.writes.take(), rotated)
    assert dict(rotated.items()) == {b"a": b"1"}
    assert rotated.repair() == []
    again = [r for r in rotated.writes.take() if r.key == b"a"]
    assert len(again) == 1
    assert Signer(KEY).is_current(dict(again[0].headers or ())[SIGNATURE_HEADER])


def test_a_value_kept_holds_memory_of_its_own_size_whatever_wrote_it() -> None:
    """orjson returns its output in a buffer rounded up to a power of two (16 KiB for
    1.5 KiB): a table keeps a copy of a value's own size, so an entry kept for hours (an
    answered request's mark) costs about its length."""
    record = {"features": [0.123456789 * i for i in range(68)], "id": "e1"}
    size = len(orjson.dumps(record))
    writes = Writes()
    table = ChangelogTable(TOPIC, writes)
    n = 300
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with writes.partition(0):
            for i in range(n):
                table[b"r%d" % i] = orjson.dumps(record)
        writes.take()  # sent: only the table holds them now
        held = (tracemalloc.get_traced_memory()[0] - before) / n
    finally:
        tracemalloc.stop()
    assert 500 < size < 2_000
    assert held < size + 400, held
    assert all(v == orjson.dumps(record) for _, v in table.items())
