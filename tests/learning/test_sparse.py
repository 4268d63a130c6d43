"""Sparse rows, scored and counted in proportion to what they set: the same scores as the
rows made whole through the served pipeline (to rounding), a row's score the same in any
batch (bit for bit), the same moments as the whole rows, and a pipeline of other steps not
taken."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as hst

from service.learning import DSAL, Adaptive, serving_pipeline
from service.learning.errors import DimensionError, NonFiniteError
from service.learning.moments import Moments
from service.learning.preprocessing import Intercept, OnlineStandardizer, Pipeline
from service.learning.sparse import SparseRows
from service.learning.sparse_scoring import SparseScorer

WIDTH = 40
NUMBERS = 3  # the first inputs are numbers (centred); the rest hashed buckets (never)

_value = hst.one_of(
    hst.floats(min_value=-1e3, max_value=1e3, allow_subnormal=False),
    hst.sampled_from([1.0, 2.0, -0.0, 0.0]),
)
_entry = hst.tuples(hst.integers(0, WIDTH - 1), _value)
_row = hst.lists(_entry, max_size=12)
_rows = hst.lists(_row, min_size=1, max_size=12)


def _entries(rows: list[list[tuple[int, float]]]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [
        (np.array([i for i, _ in r], dtype=np.int64), np.array([v for _, v in r])) for r in rows
    ]


def _bits(a: Any) -> bytes:
    return np.asarray(a, dtype=np.float64).tobytes()


def _dense(rows: list[list[tuple[int, float]]]) -> np.ndarray:
    out = np.zeros((len(rows), WIDTH))
    for k, r in enumerate(rows):
        for i, v in r:
            out[k, i] += v
    return out


def _trained(seed: int) -> tuple[Pipeline, np.ndarray]:
    """A served pipeline of a declared model that has learnt (its numbers centred, its
    buckets scaled) and weights of its output's width."""
    rng = np.random.default_rng(seed)
    pipe = serving_pipeline(WIDTH, hashed_from=NUMBERS)
    seen = Moments(WIDTH)
    X = np.zeros((50, WIDTH))
    X[:, :NUMBERS] = rng.normal(3.0, 2.0, size=(50, NUMBERS))
    X[:, NUMBERS:] = rng.random((50, WIDTH - NUMBERS)) < 0.2
    seen.add_many(X)
    pipe.learn_label(X[0], seen, trusted=True)
    for x in X[1:10]:
        pipe.learn_label(x)
    return pipe, rng.normal(size=WIDTH + 1)


@settings(max_examples=150, deadline=None)
@given(rows=_rows)
@example(rows=[[(0, 1.0), (0, -25.0), (0, -999.51094536924)]])  # summed from the first
def test_rows_hold_the_entries_as_given_and_are_made_whole_with_repeats_summed(
    rows: list[list[tuple[int, float]]],
) -> None:
    sparse = SparseRows.of(_entries(rows), WIDTH)
    assert len(sparse) == len(rows)
    np.testing.assert_array_equal(sparse.toarray(), _dense(rows))
    for r, (idx, val) in enumerate(_entries(rows)):  # neither sorted nor merged
        got = sparse.row(r)
        assert got[0].tolist() == idx.tolist()
        assert _bits(got[1]) == _bits(val)
    order = list(range(len(rows)))[::-1]
    np.testing.assert_array_equal(sparse.take(order).toarray(), _dense(rows)[order])
    np.testing.assert_array_equal(sparse.toarray(order), _dense(rows)[order])


def test_a_column_outside_the_width_is_refused() -> None:
    with pytest.raises(DimensionError):
        SparseRows.of([(np.array([WIDTH]), np.array([1.0]))], WIDTH)
    with pytest.raises(DimensionError):
        SparseRows.of([(np.array([-1]), np.array([1.0]))], WIDTH)
    empty = SparseRows.of([(np.zeros(0, dtype=np.int64), np.zeros(0))] * 2, WIDTH)
    assert len(empty) == 2
    assert not empty.toarray().any()


@settings(max_examples=100, deadline=None)
@given(rows=_rows, seed=hst.integers(0, 5))
def test_scores_are_the_whole_rows_scores_and_the_same_in_any_batch(
    rows: list[list[tuple[int, float]]], seed: int
) -> None:
    pipe, w = _trained(seed)
    scorer = SparseScorer.of(pipe, w)
    assert scorer is not None
    sparse = SparseRows.of(_entries(rows), WIDTH)
    got = scorer.scores(sparse)
    want = pipe.transform_many(_dense(rows)) @ w
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
    for r in range(len(rows)):  # alone, bit for bit
        alone = scorer.scores(SparseRows.of(_entries([rows[r]]), WIDTH))
        assert alone.tolist() == [got[r]]


def test_the_numbers_are_centred_and_the_buckets_keep_their_zeros() -> None:
    pipe, w = _trained(1)
    centre, _ = pipe.steps[0].affine  # type: ignore[attr-defined]
    assert centre[:NUMBERS].all()
    assert not centre[NUMBERS:].any()
    scorer = SparseScorer.of(pipe, w)
    assert repr(scorer) == f"SparseScorer(width={WIDTH}, centred={NUMBERS})"


def test_a_pipeline_of_other_steps_or_another_width_is_not_taken() -> None:
    after = Pipeline([Intercept(), OnlineStandardizer(WIDTH + 1)], n_features=WIDTH)
    assert SparseScorer.of(after, np.zeros(WIDTH + 1)) is None
    assert SparseScorer.of(serving_pipeline(WIDTH), np.zeros(WIDTH)) is None
    scorer = SparseScorer.of(serving_pipeline(WIDTH), np.zeros(WIDTH + 1))
    assert scorer is not None
    with pytest.raises(DimensionError):
        scorer.scores(SparseRows.of([([0], [1.0])], WIDTH + 1))


def test_a_row_that_overflows_scores_not_finite_and_the_learner_refuses_it() -> None:
    pipe, w = _trained(2)
    scorer = SparseScorer.of(pipe, w)
    assert scorer is not None
    scores = scorer.scores(SparseRows.of([([NUMBERS], [1e308]), ([0], [1.0])], WIDTH))
    assert not np.isfinite(scores[0])
    assert np.isfinite(scores[1])
    with pytest.raises(NonFiniteError):
        DSAL(WIDTH + 1, 0.25).decide_scores(scores)


@settings(max_examples=150, deadline=None)
@given(rows=_rows, k=hst.integers(1, WIDTH))
def test_the_head_of_sparse_rows_is_that_of_the_whole_rows(
    rows: list[list[tuple[int, float]]], k: int
) -> None:
    head = SparseRows.of(_entries(rows), WIDTH).head(k)
    assert head.shape == (len(rows), k)
    np.testing.assert_array_equal(head, _dense(rows)[:, :k])


@pytest.mark.parametrize("wrapped", [False, True])
def test_a_learner_decides_scores_as_it_decides_the_rows(wrapped: bool) -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(30, 5))

    def make() -> Any:
        learner = DSAL(5, 0.25, seed=0)
        for x in X[:10]:
            learner.update(x, 1 if x[0] > 0 else -1)
        return Adaptive(learner) if wrapped else learner

    a, b = make(), make()
    coins = rng.random(30)
    champion = b.champion if wrapped else b
    got = b.decide_scores(X @ champion.w, coins=coins)
    want = a.decide_many(X, coins=coins)
    for g, e in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, e)


def test_a_row_made_whole_is_the_bincount_of_its_entries_bit_for_bit() -> None:
    sparse = SparseRows.of([([0, 1, 1], [-0.0, 0.1, 0.2])], 3)
    want = np.bincount([0, 1, 1], weights=[-0.0, 0.1, 0.2], minlength=3)
    assert sparse.toarray()[0].tolist() == want.tolist()
    assert not np.signbit(sparse.toarray()[0, 0])
