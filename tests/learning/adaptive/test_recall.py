"""What the adaptive wrapper remembers: snapshots written as the weights that changed since
(against the next snapshot, the newest against the champion now), read back bit for bit."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from service.learning import DSAL, StateError
from service.learning.adaptive import Adaptive
from service.learning.adaptive.recall import SNAPSHOT_EVERY, Recall
from service.learning.sparse import SparseRow
from service.learning.state import FrozenRecord
from service.records.packed import pack, unpack


class Weights:
    """A stand-in champion: weights that the test moves by hand, and a rho."""

    def __init__(self, w: np.ndarray) -> None:
        self.w, self.rho = w, 0.5


def _walk(
    steps: list[list[tuple[int, float]]], width: int, size: int = 16
) -> tuple[Recall, Weights, list[list[float] | None]]:
    """A recall fed ``steps`` (each a list of (input, new weight) set by one label)."""
    recall, champion = Recall(size), Weights(np.zeros(width))
    for t, changes in enumerate(steps):
        recall.snapshot(t, champion)
        w = champion.w.copy()
        for j, v in changes:
            w[j % width] = v
        champion.w = w
        recall.remember(t, np.zeros(width), 1.0, 0.5, 0.0)
    return recall, champion, [s[1] for s in recall._snapshots]


_VALUE = hst.sampled_from([0.0, -0.0, 1.5, -2.25, 1e-300, 7e200])


@settings(max_examples=60, deadline=None)
@given(
    hst.lists(hst.lists(hst.tuples(hst.integers(0, 63), _VALUE), max_size=4), max_size=60),
    hst.booleans(),
)
def test_snapshots_read_back_bit_for_bit_through_json_and_the_packed_form(
    steps: list[list[tuple[int, float]]], packed: bool
) -> None:
    recall, champion, kept = _walk(steps, 64)
    record = recall.to_state(champion.w)
    assert len(record["snapshots"]) == len(kept)
    text = unpack(pack(record)) if packed else json.loads(json.dumps(record))
    again = Recall.from_state(16, text, 64, champion.w)
    got = [s[1] for s in again._snapshots]
    assert [np.asarray(w).view(np.uint64).tolist() for w in got] == [
        np.asarray(w).view(np.uint64).tolist() for w in kept
    ]  # -0.0 stays -0.0
    assert again.to_state(champion.w) == record


def test_a_snapshot_writes_only_the_weights_its_labels_changed() -> None:
    width = 4096
    steps = [[(7 * t + k, 0.1 * t + k) for k in range(3)] for t in range(40)]
    recall, champion, _ = _walk(steps, width)
    record = recall.to_state(champion.w)
    snaps = record["snapshots"]
    assert len(snaps) == 16 // SNAPSHOT_EVERY + 2  # as far back as 16 labels reach
    for item in snaps:  # 8 labels of 3 inputs each between two: at most 24, never the width
        assert "w" not in item
        assert 0 < len(item["w_at"]) <= 3 * SNAPSHOT_EVERY
        assert len(item["w_to"]) == len(item["w_at"])
    assert len(pack(record)) < 8 * width  # less than one whole copy of the weights
    alone = Recall.from_state(16, record, width, champion.w).to_state(None)["snapshots"]
    assert len(alone[-1]["w"]) == width  # the newest without the champion's weights: whole
    assert alone[:-1] == snaps[:-1]


def test_the_records_of_older_snapshots_are_made_once_and_shared() -> None:
    steps = [[(t, float(t))] for t in range(30)]
    recall, champion, _ = _walk(steps, 64)
    first = recall.to_state(champion.w)["snapshots"]
    champion.w = champion.w.copy()
    champion.w[5] = 99.0  # the champion learns on; no snapshot is taken
    second = recall.to_state(champion.w)["snapshots"]
    assert all(a is b for a, b in zip(first[:-1], second[:-1], strict=True))
    assert first[-1] is not second[-1]
    assert 5 in second[-1]["w_at"]
    assert 5 not in first[-1]["w_at"]
    for item in second:
        assert isinstance(item, FrozenRecord)
        assert item.unchanged()  # its indices a tuple of ints, its values a FloatList


def test_a_record_written_whole_before_is_read_as_ever() -> None:
    recall, champion, kept = _walk([[(t, float(t))] for t in range(20)], 8)
    whole = {
        "labels": recall.to_state()["labels"],
        "snapshots": [{"n": s[0], "w": list(s[1] or []), "rho": s[2]} for s in recall._snapshots],
    }
    again = Recall.from_state(16, json.loads(json.dumps(whole)), 8, champion.w)
    assert [s[1] for s in again._snapshots] == kept


def _hostile(record: dict[str, Any], **change: Any) -> dict[str, Any]:
    snaps = [dict(s) for s in record["snapshots"]]
    snaps[0].update(change)
    return {**record, "snapshots": snaps}


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"w_at": [3, 1], "w_to": [1.0, 2.0]}, "increasing"),
        ({"w_at": [1, 1], "w_to": [1.0, 2.0]}, "increasing"),
        ({"w_at": [-1], "w_to": [1.0]}, "increasing"),
        ({"w_at": [8], "w_to": [1.0]}, "below 8"),
        ({"w_at": [True], "w_to": [1.0]}, "indices"),
        ({"w_at": [1.0], "w_to": [1.0]}, "indices"),
        ({"w_at": "0", "w_to": [1.0]}, "indices"),
        ({"w_at": [1, 2], "w_to": [1.0]}, "w_to"),
        ({"w_at": [1], "w_to": [float("nan")]}, "w_to"),
        ({"w_at": [1], "w_to": None}, "w_to"),
    ],
)
def test_a_hostile_snapshot_record_is_refused(change: dict[str, Any], match: str) -> None:
    recall, champion, _ = _walk([[(t, float(t))] for t in range(20)], 8)
    record = recall.to_state(champion.w)
    with pytest.raises(StateError, match=match):
        Recall.from_state(16, _hostile(record, **change), 8, champion.w)
    with pytest.raises(StateError, match="not there"):  # no weights to read it against
        Recall.from_state(16, record, 8, None)


def test_the_served_wrapper_reads_its_own_snapshots_back_and_learns_on_alike() -> None:
    rng = np.random.default_rng(2)
    width = 200
    model = Adaptive(DSAL(n_features=width, cost=0.25))
    for _t in range(300):  # sparse rows: a few inputs each, and the intercept
        x = np.zeros(width)
        x[rng.integers(0, width - 1, 4)] = rng.normal(size=4)
        x[-1] = 1.0
        model.update(x, 1 if x[:50].sum() > 0 else -1)
    state = model.to_state()
    snaps = state["recall"]["snapshots"]
    assert snaps
    assert all(len(s["w_at"]) < width // 2 for s in snaps)
    copy = Adaptive.from_state(json.loads(json.dumps(state)))
    assert copy.to_state() == state
    x = np.zeros(width)
    x[[3, 70, -1]] = 1.0
    assert copy.update(x, 1) == model.update(x, 1)
    assert copy.to_state() == model.to_state()


def test_where_most_weights_changed_a_snapshot_is_written_whole() -> None:
    """A dense model's labels move every weight: indices would only add to the record."""
    steps = [[(j, float(t + j + 1)) for j in range(8)] for t in range(20)]
    recall, champion, kept = _walk(steps, 8)
    record = recall.to_state(champion.w)
    assert all("w" in item and "w_at" not in item for item in record["snapshots"])
    again = Recall.from_state(16, json.loads(json.dumps(record)), 8, champion.w)
    assert [s[1] for s in again._snapshots] == kept


@settings(max_examples=60, deadline=None)
@given(
    hst.dictionaries(hst.integers(0, 299), _VALUE, max_size=120),
    hst.integers(8, 300),
    hst.booleans(),
)
def test_a_remembered_input_reads_back_bit_for_bit_in_either_form(
    held: dict[int, float], width: int, packed: bool
) -> None:
    """A wide input most of whose numbers are +0.0 is written as where it is not (a wide
    model's 40 rows cost their entries, not 40 times its width), any other whole; either
    reads back bit for bit, -0.0 included."""
    x = np.zeros(width)
    for i, v in held.items():
        x[i % width] = v
    recall = Recall(16)
    recall.remember(3, x, -1.0, 0.25, 0.5)
    record = recall.to_state()
    (item,) = record["labels"]
    set_ = int(np.count_nonzero(x.view(np.uint64)))
    assert ("x_at" in item) == (width >= 256 and 2 * set_ <= width)
    if "x_at" in item:
        assert "x" not in item
        assert len(item["x_at"]) == set_
    text = unpack(pack(record)) if packed else json.loads(json.dumps(record))
    (back,) = Recall.from_state(16, text, width)._labels
    assert back[1].view(np.uint64).tolist() == x.view(np.uint64).tolist()
    assert back[0] == 3
    assert back[2:] == (-1.0, 0.25, 0.5)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"x_at": [3, 1], "x_to": [1.0, 2.0]}, "increasing"),
        ({"x_at": [300], "x_to": [1.0]}, "below 300"),
        ({"x_at": [1], "x_to": [float("inf")]}, "x_to"),
        ({"x_at": [1], "x_to": [1.0], "x": [0.0] * 300}, "whole or as where"),
    ],
)
def test_a_hostile_remembered_input_is_refused(change: dict[str, Any], match: str) -> None:
    x = np.zeros(300)
    x[[4, 9]] = 1.0
    recall = Recall(16)
    recall.remember(0, x, 1.0, 1.0, 0.0)
    (item,) = recall.to_state()["labels"]
    hostile = {k: v for k, v in item.items() if k not in ("x_at", "x_to")} | change
    with pytest.raises(StateError, match=match):
        Recall.from_state(16, {"labels": [hostile], "snapshots": []}, 300)


class RowChampion:
    """A stand-in champion that learns rows: it writes the weights of a row's entries in
    place, and lets them be read as they are (``peek``)."""

    takes_rows = True

    def __init__(self, w: np.ndarray) -> None:
        self._w, self.rho = w, 0.5

    @property
    def w(self) -> np.ndarray:
        return self._w.copy()

    def peek(self) -> tuple[np.ndarray, None]:
        return self._w, None


def _bits(record: Any) -> str:
    """A state as text that tells -0.0 from 0.0."""
    return json.dumps(record, default=str, allow_nan=True) + repr(
        [
            np.asarray(s.get("w_to", s.get("w", [])), dtype=float).tobytes()
            for s in record["snapshots"]
        ]
    )


@settings(max_examples=80, deadline=None)
@given(
    hst.lists(hst.lists(hst.tuples(hst.integers(0, 63), _VALUE), max_size=5), max_size=70),
    hst.sampled_from([0, 8, 16]),
    hst.integers(0, 69),
)
def test_snapshots_of_a_champion_of_rows_kept_as_changes_write_and_recall_what_copies_do(
    steps: list[list[tuple[int, float]]], size: int, cut: int
) -> None:
    """A champion that learns rows is kept as what its labels changed since each snapshot,
    not a copy of its weights at each: every state it writes, every snapshot it recalls
    and every state read back are those of a recall that keeps copies, bit for bit (a
    label's row may name more weights than it changes)."""
    width = 64
    copies, whole = Recall(size), Weights(np.zeros(width))
    changes, rows = Recall(size), RowChampion(np.zeros(width))
    for t, step in enumerate(steps):
        if t == cut:  # read back in the middle: the changes go on from the record
            changes = Recall.from_state(size, changes.to_state(rows._w), width, rows._w, rows=True)
        copies.snapshot(t, whole)
        changes.snapshot(t, rows)
        touched = sorted({j for j, _ in step} | {t % width})  # one weight named, unchanged
        x = SparseRow(np.array(touched, dtype=np.int64), np.ones(len(touched)), width)
        changes.before(rows, x)
        w = whole.w.copy()
        for j, v in step:
            w[j] = v
            rows._w[j] = v
        whole.w = w
        copies.remember(t, x, 1.0, 0.5, 0.0)
        changes.remember(t, x, 1.0, 0.5, 0.0)
        assert _bits(changes.to_state(rows._w)) == _bits(copies.to_state(whole.w))
        for label in (t, t - 5, t - 13):
            got, want = changes.since(label, rows._w), copies.since(label)
            assert got[0] == want[0]
            assert got[2] == want[2]
            assert len(got[3]) == len(want[3])
            assert (
                np.asarray([] if got[1] is None else got[1], dtype=float).tobytes()
                == np.asarray([] if want[1] is None else want[1], dtype=float).tobytes()
            )
    if size and steps:
        assert changes._delta  # kept as changes, not copies
        assert all(s[1] is None for s in changes._snapshots)


def test_a_recall_of_changes_given_a_whole_input_keeps_copies_and_writes_the_same() -> None:
    """A recall kept as changes that is given a whole input (no row: what it may write is
    unknown) makes its snapshots whole again; its states stay those of copies."""
    width = 64
    copies, whole = Recall(16), Weights(np.zeros(width))
    changes, rows = Recall(16), RowChampion(np.zeros(width))
    rng = np.random.default_rng(4)
    for t in range(30):
        copies.snapshot(t, whole)
        changes.snapshot(t, rows)
        at = np.sort(rng.choice(width, size=3, replace=False)).astype(np.int64)
        x: Any = SparseRow(at, np.ones(3), width) if t != 17 else np.ones(width)
        changes.before(rows, x)
        if t == 17:
            assert not changes._delta  # whole again
        w = whole.w.copy()
        w[at] = rng.normal(size=3)
        rows._w[at] = w[at]
        whole.w = w
        copies.remember(t, SparseRow(at, np.ones(3), width), 1.0, 0.5, 0.0)
        changes.remember(t, SparseRow(at, np.ones(3), width), 1.0, 0.5, 0.0)
        assert _bits(changes.to_state(rows._w)) == _bits(copies.to_state(whole.w))
    assert changes._delta  # the next snapshot of a champion of rows: changes again
