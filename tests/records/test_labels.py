"""The records of the labels topic that are not labels, and the learner's history steps:
what tells a copy from a new record (a correction's id, an order's base version), and
that records written before those existed are still read."""

from __future__ import annotations

import orjson
import pytest

from service.records import (
    BadMessage,
    Correction,
    LabelRequest,
    ModelEnvelope,
    parse_model_envelope,
)
from service.records.history import MAX_NOTES, MAX_PAST, Note, Step, parse_step
from service.records.labels import Rollback, Seed, parse_labels_record


def test_a_correction_gets_a_fresh_id_that_its_record_carries() -> None:
    a = Correction("r", "m", 1, "bob", "reviewer", 1.0)
    b = Correction("r", "m", 1, "bob", "reviewer", 1.0)
    assert a.id != b.id  # two corrections, however alike
    assert parse_labels_record(a.to_json()) == a
    assert orjson.loads(a.to_json())["id"] == a.id


def test_a_correction_written_before_ids_is_known_by_its_bytes() -> None:
    raw = (
        b'{"kind": "correction", "request_id": "r", "model": "m", "label": -1, '
        b'"labelled_by": "bob", "role": "reviewer", "ts": 5.0}'
    )
    first, copy = parse_labels_record(raw), parse_labels_record(raw)
    other = parse_labels_record(raw.replace(b"5.0", b"6.0"))
    assert isinstance(first, Correction)
    assert isinstance(copy, Correction)
    assert isinstance(other, Correction)
    assert first.id == copy.id != other.id
    assert first.id.startswith("sha256:")


@pytest.mark.parametrize("bad", [b'""', b"12", b'"a b"', b'"' + b"x" * 81 + b'"'])
def test_a_correction_id_must_be_a_short_name(bad: bytes) -> None:
    raw = (
        b'{"kind": "correction", "request_id": "r", "model": "m", "label": 1, '
        b'"labelled_by": "bob", "role": "reviewer", "id": ' + bad + b"}"
    )
    with pytest.raises(BadMessage, match="schema"):
        parse_labels_record(raw)


@pytest.mark.parametrize(
    "order",
    [
        Rollback("m", "m", 3, "ops", 1.0, base_version=12),
        Seed("m", "m", b'{"model": "m"}', None, "ops", 1.0, rows=4, base_version=0),
        Rollback("m", "m", 3, "ops", 1.0),  # written before orders named their base
        Seed("m", "m", b'{"model": "m"}', None, "ops", 1.0),
    ],
)
def test_orders_carry_the_version_they_were_written_against(order: Rollback | Seed) -> None:
    raw = order.to_json()
    assert parse_labels_record(raw) == order
    assert ("base_version" in orjson.loads(raw)) == (order.base_version is not None)


def test_an_order_base_version_out_of_range_is_refused() -> None:
    raw = Rollback("m", "m", 3, "ops", 1.0, base_version=2**53).to_json()
    with pytest.raises(BadMessage, match="base_version out of range"):
        parse_labels_record(raw)


def _step() -> Step:
    req = LabelRequest("r1", "e1", "m", [1.0, 2.0], 0.5, 1.0, 1, 0.25, 3, 10.0, 70.0, 0.4)
    return Step("m", 4, 0, 17, req, -1, -1, "alice", 12.0, 12.5)


def test_a_step_knows_the_ids_of_its_corrections_even_once_their_notes_are_forgotten() -> None:
    step = _step()
    for i in range(MAX_NOTES + 5):
        step = step.corrected(Note(100 + i, "bob", "reviewer", 1 if i % 2 else -1, 1.0, id=f"c{i}"))
    assert len(step.notes) == MAX_NOTES
    assert step.past == tuple(f"c{i}" for i in range(5))
    assert all(step.knows(f"c{i}") for i in range(MAX_NOTES + 5))
    assert not step.knows("c-new")
    assert parse_step(step.to_json()) == step


def test_the_ids_a_step_keeps_are_bounded() -> None:
    step = _step()
    for i in range(MAX_NOTES + MAX_PAST + 3):
        step = step.corrected(Note(i, "bob", "reviewer", 1, 1.0, id=f"c{i}"))
    assert len(step.past) == MAX_PAST
    assert not step.knows("c0")  # the oldest go first
    assert step.knows(f"c{MAX_NOTES + MAX_PAST + 2}")


def test_the_label_a_step_had_at_an_offset() -> None:
    step = (
        _step()
        .corrected(Note(20, "bob", "reviewer", 1, 1.0))
        .corrected(Note(30, "carol", "reviewer", None, 2.0))
    )
    assert [step.label_at(t) for t in (19, 20, 29, 30, 99)] == [-1, 1, 1, None, None]


def test_a_step_and_notes_written_before_ids_are_read() -> None:
    record = orjson.loads(_step().corrected(Note(20, "bob", "reviewer", 1, 1.0)).to_json())
    del record["past"]
    del record["notes"][0]["id"]
    step = parse_step(orjson.dumps(record))
    assert step.notes[0].id is None
    assert step.past == ()


def test_an_envelope_says_which_corrections_it_holds_and_where_its_line_began() -> None:
    env = ModelEnvelope("m", 7, {"steps": []}, {"kind": "dsal"}, corrected_to=40, line_from=5)
    assert parse_model_envelope(env.to_json(), model="m") == env
    old = orjson.loads(env.to_json())
    del old["corrected_to"]
    del old["line_from"]
    legacy = parse_model_envelope(orjson.dumps(old), model="m")
    assert (legacy.corrected_to, legacy.line_from) == (-1, 0)
    with pytest.raises(BadMessage, match="counter out of range"):
        parse_model_envelope(env.replace(line_from=-1).to_json(), model="m")
