"""The learner's changelog-backed tables without a broker: every write is a changelog record
of the partition being handled, recovery replays them, a revoke forgets its partitions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.stream.kafka.produce import OutRecord
from service.stream.kafka.topics import changelog_topic
from service.stream.labels.tables import ChangelogTable, TableWriteError, Writes

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
        fresh.load(p, [(r.key, r.value) for r in records if r.partition == p])
    assert dict(fresh.items()) == dict(table.items())


def test_loading_skips_keyless_records_and_applies_tombstones() -> None:
    table = ChangelogTable(TOPIC, Writes())
    table.load(0, [(b"a", b"1"), (None, b"x"), (b"b", b"2"), (b"a", None)])
    assert dict(table.items()) == {b"b": b"2"}
