"""Rows learnt as the entries they set: a wide learner and the served pipeline learn a row
and its whole vector to the same numbers, bit for bit (so every path a label takes agrees);
they agree with the whole-vector arithmetic of a narrow model to rounding; what a label
writes in place never reaches a view, a state or a snapshot taken before it; and the
served stack read back from its state mid-stream learns on as if never stopped."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from service.learning import DSAL, DSOL, serving_pipeline
from service.learning.adaptive import Adaptive
from service.learning.adaptive.parts import Parts, learner_for, serving_learner
from service.learning.errors import DimensionError, NonFiniteError, StateError
from service.learning.linear import DRAL
from service.learning.linear.normalized import Normalizer, normalized_step
from service.learning.moments import Moments
from service.learning.preprocessing import OnlineStandardizer, Pipeline
from service.learning.sparse import SPARSE_FROM, SparseRow, SparseRows, as_input

WIDE = SPARSE_FROM + 76  # inputs of a learner that takes rows
NUMBERS = 4  # a declared model's numbers come first; hashed buckets after them

_value = hst.one_of(
    hst.floats(min_value=-1e3, max_value=1e3, allow_subnormal=False),
    hst.sampled_from([1.0, 2.0, -0.0, 0.0]),
)
_entries = hst.lists(hst.tuples(hst.integers(0, WIDE - 1), _value), max_size=20)


def _row(rng: np.random.Generator, width: int, set_: int = 30) -> np.ndarray:
    """A whole vector: numbers first, then ``set_`` hashed buckets (some repeated)."""
    x = np.zeros(width)
    x[:NUMBERS] = rng.normal(size=NUMBERS)
    x[NUMBERS] = 0.0  # a number that is zero
    np.add.at(x, rng.integers(NUMBERS, width, size=set_), 1.0)
    return x


def _bits(a: Any) -> bytes:
    return np.asarray(a, dtype=np.float64).tobytes()


@settings(max_examples=200, deadline=None)
@given(_entries)
def test_a_row_of_entries_is_the_row_of_its_whole_vector(entries: list[tuple[int, float]]) -> None:
    idx = [i for i, _ in entries]
    val = [v for _, v in entries]
    whole = np.bincount(np.array(idx, dtype=np.int64), weights=val, minlength=WIDE)
    row = SparseRow.of(idx, val, WIDE)
    assert row == SparseRow.dense(whole.astype(np.float64))
    in_batch = SparseRows.of([([], []), (idx, val)], WIDE)  # a row of a batch, made whole
    assert _bits(in_batch.toarray()[1]) == _bits(whole)
    assert not (row.values == 0.0).any()  # no zero of either sign is an entry
    assert np.array_equal(row.toarray(), whole + 0.0)


def test_a_row_outside_its_width_or_of_another_width_is_refused() -> None:
    with pytest.raises(DimensionError):
        SparseRow.of([WIDE], [1.0], WIDE)
    with pytest.raises(DimensionError):
        as_input(SparseRow.of([1], [1.0], WIDE + 1), WIDE)
    assert type(as_input(np.zeros(WIDE), WIDE)) is SparseRow
    assert type(as_input(np.zeros(8), 8)) is np.ndarray  # a narrow learner: whole vectors


@pytest.mark.parametrize("make", [DSAL, DSOL, DRAL])
@pytest.mark.parametrize("rule", ["normalized", "sgd"])
def test_a_wide_learner_learns_a_row_as_its_whole_vector_bit_for_bit(make: Any, rule: str) -> None:
    rng = np.random.default_rng(3)
    by_row = make(n_features=WIDE, cost=0.25, update_rule=rule, intercept_eta_min=0.3)
    by_whole = make(n_features=WIDE, cost=0.25, update_rule=rule, intercept_eta_min=0.3)
    assert by_row.takes_rows
    moved = 0
    for t in range(150):
        x = _row(rng, WIDE)
        x[-1] = 1.0  # the intercept
        y = 1 if x[0] + x[1] > 0 else -1
        weight = 3.5 if t % 7 == 0 else 1.0  # heavy labels take sub-steps
        a = by_row.update(SparseRow.dense(x), y, weight=weight)
        b = by_whole.update(x, y, weight=weight)
        assert a == b
        moved += a
        assert by_row.decide(x).score == by_whole.decide(SparseRow.dense(x)).score
    assert moved > 20
    assert _bits(by_row.w) == _bits(by_whole.w)
    assert by_row.rho == by_whole.rho
    assert by_row.to_state() == by_whole.to_state()


def test_a_row_step_agrees_with_the_whole_vector_step_to_rounding() -> None:
    rng = np.random.default_rng(5)
    learner = DSAL(n_features=WIDE, cost=0.25, update_rule="normalized")
    w, rho, sums = np.zeros(WIDE), 1.0, Normalizer.empty(WIDE)
    for _ in range(100):
        x = _row(rng, WIDE)
        x[-1] = 1.0
        y = 1 if x[0] > 0 else -1
        eta = float(learner.eta(learner.steps))
        learner.update(SparseRow.dense(x), y)
        w, rho, _ = normalized_step(w, rho, x, y, 1.0, sums, learner._gradient, eta=eta)
        np.testing.assert_allclose(learner.w, w, rtol=1e-9, atol=1e-12)
        assert learner.rho == pytest.approx(rho, rel=1e-9, abs=1e-12)


def test_what_a_label_writes_in_place_never_reaches_a_view_or_a_state_taken_before() -> None:
    rng = np.random.default_rng(8)
    learner = DSAL(n_features=WIDE, cost=0.25, update_rule="normalized")
    for _ in range(5):
        learner.update(SparseRow.dense(_row(rng, WIDE)), 1)
    view = learner.w
    kept = view.copy()
    state = learner.to_state()
    again = type(learner).from_state(state)
    x = _row(rng, WIDE)
    assert learner.update(SparseRow.dense(x), -1 if learner.decide(x, coin=0.0).score > 0 else 1)
    assert _bits(view) == _bits(kept)  # the view still reads the weights it lent
    assert type(learner).from_state(state).to_state() == again.to_state()
    later = learner.to_state()  # a state made from the last one's lists sees the change
    assert _bits(type(learner).from_state(later).w) == _bits(learner.w)
    assert _bits(learner.w) != _bits(kept)


@pytest.mark.parametrize("taken", ["w", "sums", "both"])
def test_a_label_never_writes_into_the_weights_or_sums_lent_before_it(taken: str) -> None:
    """A view of the weights, of the normaliser's sums, or of both, reads what it read
    when it was taken, whichever was lent (each is copied before a label writes it)."""
    rng = np.random.default_rng(9)
    learner = DSAL(n_features=WIDE, cost=0.25, update_rule="normalized")
    for _ in range(5):
        learner.update(SparseRow.dense(_row(rng, WIDE)), 1)
    views = {name: getattr(learner, name) for name in ("w", "sums") if taken in (name, "both")}
    kept = {name: _bits(view.copy()) for name, view in views.items()}
    for y in (-1, 1, -1):
        learner.update(SparseRow.dense(_row(rng, WIDE)), y)
    now = {"w": _bits(learner.w), "sums": _bits(learner.sums)}
    for name, view in views.items():
        assert _bits(view) == kept[name]  # the view still reads what it was lent
        assert now[name] != kept[name]  # while the learner moved on


@pytest.mark.parametrize("rule", ["normalized", "sgd"])
def test_an_empty_row_moves_rho_alone(rule: str) -> None:
    learner = DSAL(n_features=WIDE, cost=0.25, update_rule=rule)
    for y in (1, -1, 1):
        learner.update(SparseRow.dense(np.zeros(WIDE)), y)
    assert learner.steps == 3
    assert not learner.w.any()
    assert learner.rho != 1.0


def test_a_refused_row_changes_nothing() -> None:
    learner = DSAL(n_features=WIDE, cost=0.25, update_rule="normalized")
    rng = np.random.default_rng(2)
    for _ in range(5):
        learner.update(SparseRow.dense(_row(rng, WIDE)), 1)
    before = learner.to_state()
    bad = _row(rng, WIDE)
    bad[7] = np.inf
    with pytest.raises(NonFiniteError):
        learner.update(SparseRow.dense(bad), 1)
    huge = _row(rng, WIDE)
    huge[9] = 1e300
    with pytest.raises(NonFiniteError):
        learner.update(SparseRow.dense(huge), 1 if learner.decide(huge, coin=0.0).score < 0 else -1)
    assert learner.to_state() == before


def _stream(rng: np.random.Generator, n: int, width: int) -> list[tuple[np.ndarray, int]]:
    out = []
    for t in range(n):
        x = _row(rng, width, set_=20)
        y = (1 if x[0] > 0 else -1) * (1 if t < n // 2 else -1)
        out.append((x, y))
    return out


def test_the_served_pipeline_transforms_and_learns_a_row_as_its_whole_vector() -> None:
    rng = np.random.default_rng(11)
    width = WIDE - 1
    by_row = serving_pipeline(width, hashed_from=NUMBERS)
    by_whole = serving_pipeline(width, hashed_from=NUMBERS)
    assert by_row.rows_from == NUMBERS
    for t, (x, _) in enumerate(_stream(rng, 120, width)):
        moments = None
        if t % 9 == 0:
            moments = Moments(NUMBERS)
            moments.add_many(rng.normal(size=(6, NUMBERS)))
        by_row.learn_label(SparseRow.dense(x), moments, trusted=True)
        by_whole.learn_label(x, moments, trusted=True)
        assert by_row.transform(SparseRow.dense(x)) == SparseRow.dense(by_whole.transform(x))
    assert by_row.to_state() == by_whole.to_state()
    state = by_row.to_state()
    x = _stream(rng, 1, width)[0][0]
    by_row.learn_label(SparseRow.dense(x))  # in place, after a state took its lists
    by_whole.learn_label(x)
    assert type(by_row).from_state(state).to_state() == state
    assert by_row.to_state() == by_whole.to_state() != state
    centre, scale = by_whole.steps[1].affine
    kept = scale.copy()
    x = _stream(rng, 1, width)[0][0]
    by_whole.learn_label(SparseRow.dense(x))  # in place, after its affine was lent
    assert _bits(scale) == _bits(kept)


def test_a_standardiser_learning_rows_in_place_keeps_the_centre_it_lent() -> None:
    rng = np.random.default_rng(12)
    width = WIDE - 1
    pipeline = Pipeline([OnlineStandardizer(width, passes_from=NUMBERS)], n_features=width)
    stream = _stream(rng, 30, width)
    for x, _ in stream[:10]:
        pipeline.learn(SparseRow.dense(x))
    centre, _ = pipeline.steps[0].affine  # the mean itself: nothing centres it otherwise
    kept = centre.copy()
    for x, _ in stream[10:]:
        pipeline.learn(SparseRow.dense(x))
    assert _bits(centre) == _bits(kept)
    assert _bits(pipeline.steps[0].affine[0]) != _bits(kept)


def _served(width: int) -> tuple[Any, Adaptive]:
    pipeline = serving_pipeline(width, hashed_from=NUMBERS)
    learner = serving_learner(
        "dsal",
        n_features=width + 1,
        cost=0.25,
        seed=0,
        hyperparameters={"update_rule": "normalized"},
        parts=Parts(),
    )
    return pipeline, learner


def _learn(pipeline: Any, learner: Adaptive, x: Any, y: int) -> None:
    with np.errstate(all="ignore"):
        pipeline.learn_label(x)
        learner.update(pipeline.transform(x), y, query_probability=0.5)


def test_the_served_stack_learns_rows_as_whole_vectors_and_as_if_read_back_at_every_label() -> None:
    width = WIDE - 1
    stream = _stream(np.random.default_rng(4), 600, width)
    rows, whole, reread = _served(width), _served(width), _served(width)
    for x, y in stream:
        _learn(*rows, SparseRow.dense(x), y)
        _learn(*whole, x, y)
        _learn(*reread, SparseRow.dense(x), y)
        pipeline, learner = reread  # as a learner that lost its objects reads its state
        reread = (
            type(pipeline).from_state(pipeline.to_state()),
            learner_for(learner.to_state(), Parts()),
        )
    assert rows[1].changes_detected >= 1  # the flip started challengers from memory
    assert rows[1].takeovers >= 1
    assert rows[1].to_state() == whole[1].to_state() == reread[1].to_state()
    assert rows[0].to_state() == whole[0].to_state() == reread[0].to_state()


def test_a_snapshot_keeps_the_weights_of_its_label() -> None:
    width = WIDE - 1
    pipeline, learner = _served(width)
    stream = _stream(np.random.default_rng(9), 40, width)
    for x, y in stream[:17]:
        _learn(pipeline, learner, SparseRow.dense(x), y)
    at, w, _, _ = learner._recall.since(16, learner.champion.peek()[0])
    assert at == 16
    kept = np.array(w)
    for x, y in stream[17:]:
        _learn(pipeline, learner, SparseRow.dense(x), y)
    again = learner._recall.since(16, learner.champion.peek()[0])[1]  # the weights now
    assert _bits(np.array(again)) == _bits(kept)  # with what changed since put back


def test_a_wide_models_weights_and_statistics_are_written_as_their_entries() -> None:
    width = WIDE - 1
    pipeline, learner = _served(width)
    for x, y in _stream(np.random.default_rng(6), 30, width):
        _learn(pipeline, learner, SparseRow.dense(x), y)
    champion = learner.to_state()["champion"]["learned"]
    second = pipeline.to_state()["steps"][1]["learned"]
    assert "w" not in champion
    assert len(champion["w_at"]) == int(np.count_nonzero(learner.w)) < width // 2
    assert "m2_at" in second
    assert "mean_at" in second
    again = learner_for(learner.to_state(), Parts())
    assert again.to_state() == learner.to_state()
    assert _bits(again.w) == _bits(learner.w)
    assert type(pipeline).from_state(pipeline.to_state()).to_state() == pipeline.to_state()


def _hostile(field: str, how: str, entries: dict[str, Any], n: int) -> None:
    """``entries`` (a section written as its entries) with ``<field>_at``/``_to`` made wrong
    in the way ``how`` names."""
    at, to = f"{field}_at", f"{field}_to"
    some = list(entries[at])
    if how == "not a list":
        entries[at] = "0,1"
    elif how == "a bool index":
        entries[at] = [True, *some[1:]]
    elif how == "a float index":
        entries[at] = [float(some[0]), *some[1:]]
    elif how == "decreasing":
        entries[at] = some[::-1]
    elif how == "repeated":
        entries[at] = [some[0], *some]
        entries[to] = [entries[to][0], *entries[to]]
    elif how == "past the end":
        entries[at] = [*some[:-1], n]
    elif how == "negative":
        entries[at] = [-1, *some[1:]]
    elif how == "a value short":
        entries[to] = list(entries[to])[:-1]
    elif how == "not finite":
        entries[to] = [float("nan"), *list(entries[to])[1:]]
    elif how == "whole as well":
        entries[field] = [0.0] * n
    else:  # pragma: no cover - the parameters below name every way
        raise AssertionError(how)


_WAYS = [
    "not a list",
    "a bool index",
    "a float index",
    "decreasing",
    "repeated",
    "past the end",
    "negative",
    "a value short",
    "not finite",
    "whole as well",
]


@pytest.mark.parametrize("how", _WAYS)
@pytest.mark.parametrize("field", ["w", "mean", "m2"])
def test_a_state_whose_entries_are_wrong_is_refused_and_the_model_is_not_made(
    field: str, how: str
) -> None:
    width = WIDE - 1
    pipeline, learner = _served(width)
    for x, y in _stream(np.random.default_rng(6), 30, width):
        _learn(pipeline, learner, SparseRow.dense(x), y)
    if field == "w":
        state = learner.to_state()
        section, n = state["champion"]["learned"], width + 1
        _hostile(field, how, section, n)
        with pytest.raises(StateError):
            learner_for(state, Parts())
    else:
        state = pipeline.to_state()
        section, n = state["steps"][1]["learned"], width
        _hostile(field, how, section, n)
        with pytest.raises(StateError):
            type(pipeline).from_state(state)


def test_a_standardisers_sums_of_squares_below_zero_are_refused() -> None:
    width = WIDE - 1
    pipeline, learner = _served(width)
    for x, y in _stream(np.random.default_rng(6), 30, width):
        _learn(pipeline, learner, SparseRow.dense(x), y)
    state = pipeline.to_state()
    section = state["steps"][1]["learned"]
    section["m2_to"] = [-abs(v) - 1.0 for v in section["m2_to"]]
    with pytest.raises(StateError, match="negative"):
        type(pipeline).from_state(state)
