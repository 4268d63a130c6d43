"""Mergeable moments and what a standardiser makes of them: merged in any split and order
they are the moments of all the rows, a record read back is checked, a record that lies is
refused or bounded, and the serving pipeline learns every event's moments and the labelled rows."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as hst

from service.learning import Pipeline, default_pipeline, serving_pipeline
from service.learning.errors import DimensionError, InputError
from service.learning.moments import Moments, bounds, implausible, merge_step
from service.learning.preprocessing import (
    MERGE_ROWS,
    Intercept,
    OnlineStandardizer,
    label_prior,
    preprocessor_from_state,
)

rows = hst.lists(
    hst.lists(hst.floats(min_value=-1e3, max_value=1e3), min_size=3, max_size=3),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(data=rows, cuts=hst.lists(hst.integers(min_value=0, max_value=40), max_size=4))
def test_moments_merged_in_any_split_are_those_of_all_the_rows(
    data: list[list[float]], cuts: list[int]
) -> None:
    X = np.array(data)
    edges = sorted({0, X.shape[0], *(c % (X.shape[0] + 1) for c in cuts)})
    parts = []
    for a, b in zip(edges, edges[1:], strict=False):
        part = Moments(3)
        part.add_many(X[a:b])
        parts.append(part)
    total = Moments(3)
    for part in reversed(parts):  # any order
        total.merge(part)
    assert total.count == X.shape[0]
    np.testing.assert_allclose(total.mean, X.mean(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(
        total.m2, ((X - X.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-7, atol=1e-6
    )


@settings(max_examples=100, deadline=None)
@given(data=rows, split=hst.integers(min_value=0, max_value=40))
def test_a_standardiser_merging_moments_equals_one_that_learned_the_rows(
    data: list[list[float]], split: int
) -> None:
    X = np.array(data)
    k = split % (X.shape[0] + 1)
    one, merged = OnlineStandardizer(3), OnlineStandardizer(3)
    for x in X:
        one.learn(x)
    for x in X[:k]:
        merged.learn(x)
    rest = Moments(3)
    rest.add_many(X[k:])
    assume(merged.refusal(rest) is None)  # refused: changes nothing (tests below)
    if k and rest.count:  # within one step of the statistics (else bounded: tests below)
        a, b = merge_step(rest.count, k)
        sd, judged = merged.std, merged.std > merged.min_std
        assume(np.all(~judged | (np.abs(one.mean - merged.mean) <= 0.999 * a * sd)))
        ratio = np.divide(one.std**2, sd**2, out=np.ones(3), where=judged)
        assume(np.all(~judged | (np.abs(np.log(np.maximum(ratio, 1e-300))) <= 0.999 * b)))
    assert merged.merge(rest) == X.shape[0] - k
    assert merged.count == one.count
    np.testing.assert_allclose(merged.mean, one.mean, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(merged.std, one.std, rtol=1e-6, atol=1e-6)


def test_rows_that_are_not_finite_or_too_large_are_left_out() -> None:
    m = Moments(2)
    m.add_many([[1.0, 2.0], [np.nan, 0.0], [1e200, 0.0], [3.0, 4.0], [np.inf, 1.0]])
    assert m.count == 2
    assert m.mean.tolist() == [2.0, 3.0]


def test_take_hands_the_moments_over_and_starts_afresh() -> None:
    m = Moments(1)
    m.add_many([[1.0], [3.0]])
    taken = m.take()
    assert (taken.count, taken.mean.tolist(), taken.m2.tolist()) == (2, [2.0], [2.0])
    assert not m
    assert (m.count, m.mean.tolist(), m.m2.tolist()) == (0, [0.0], [0.0])


def test_a_record_reads_back_to_the_same_moments() -> None:
    m = Moments(2)
    m.add_many(np.random.default_rng(0).normal(size=(9, 2)))
    back = Moments.from_record(json.loads(json.dumps(m.to_record())), 2)
    assert back.count == m.count
    assert back.mean.tolist() == m.mean.tolist()
    assert back.m2.tolist() == m.m2.tolist()


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ([1, 2], "object"),
        ({"count": 0, "mean": [0.0, 0.0], "m2": [0.0, 0.0]}, "count"),
        ({"count": True, "mean": [0.0, 0.0], "m2": [0.0, 0.0]}, "count"),
        ({"count": 2.0, "mean": [0.0, 0.0], "m2": [0.0, 0.0]}, "count"),
        ({"count": 2, "mean": [0.0], "m2": [0.0, 0.0]}, "mean"),
        ({"count": 2, "mean": [0.0, "x"], "m2": [0.0, 0.0]}, "mean"),
        ({"count": 2, "mean": [0.0, True], "m2": [0.0, 0.0]}, "mean"),
        ({"count": 2, "mean": [0.0, 0.0], "m2": [False, 0.0]}, "m2"),
        ({"count": 2, "mean": [0.0, None], "m2": [0.0, 0.0]}, "mean"),
        ({"count": 2, "mean": [0.0, 2**1100], "m2": [0.0, 0.0]}, "mean"),
        ({"count": 2, "mean": [0.0, 1e101], "m2": [0.0, 0.0]}, "mean"),
        ({"count": 2, "mean": [0.0, 0.0], "m2": [0.0, -1.0]}, "m2"),
        ({"count": 2, "mean": [0.0, 0.0], "m2": [0.0, 1e201]}, "m2"),
        ({"count": 2, "mean": [0.0, 0.0]}, "m2"),
    ],
)
def test_a_record_that_is_not_moments_is_refused(record: Any, match: str) -> None:
    with pytest.raises(InputError, match=match):
        Moments.from_record(record, 2)


def test_a_record_of_numbers_of_any_int_or_float_type_reads_alike() -> None:
    # plain ints and floats take one check in C; a subclass (numpy's float64) the slow one
    plain = {"count": 3, "mean": [0.5, 2], "m2": [1.0, 0]}
    subclassed = {"count": 3, "mean": [np.float64(0.5), 2], "m2": [1.0, np.float64(0.0)]}
    a, b = Moments.from_record(plain, 2), Moments.from_record(subclassed, 2)
    assert (a.count, a.mean.tolist(), a.m2.tolist()) == (3, [0.5, 2.0], [1.0, 0.0])
    assert (b.count, b.mean.tolist(), b.m2.tolist()) == (a.count, a.mean.tolist(), a.m2.tolist())


def test_moments_of_another_width_are_refused() -> None:
    with pytest.raises(InputError):
        Moments(2).merge(Moments(3))
    with pytest.raises(DimensionError):
        OnlineStandardizer(2).merge(Moments(3))


def _standardiser(n: int, seed: int = 1) -> OnlineStandardizer:
    z = OnlineStandardizer(2)
    seen = Moments(2)
    seen.add_many(np.random.default_rng(seed).normal(size=(n, 2)) * [20.0, 1.0] + [100.0, -5.0])
    z._count, z._mean, z._m2 = seen.count, seen.mean, seen.m2  # as if learnt row by row
    z._refresh_scale()
    return z


@pytest.mark.parametrize(
    ("record", "kind"),
    [
        ({"count": 10**12, "mean": [1e6, -5.0], "m2": [0.0, 0.0]}, "mean"),
        ({"count": 10**9, "mean": [100.0 + 5 * 20.0, -5.0], "m2": [4e11, 1e9]}, "mean"),
        ({"count": 10**12, "mean": [100.0, -5.0], "m2": [1e24, 1e24]}, "spread"),
        ({"count": 1, "mean": [100.0, -5.0 + 9.0], "m2": [0.0, 0.0]}, "mean"),
        ({"count": 50, "mean": [100.0, -5.0], "m2": [50 * 400.0, 50 * 30.0]}, "spread"),
    ],
)
def test_moments_no_scorer_could_have_gathered_are_refused_and_change_nothing(
    record: dict[str, Any], kind: str
) -> None:
    z = _standardiser(5000)
    before = z.to_state()
    lie = Moments.from_record(record, 2)
    verdict = z.refusal(lie)
    assert verdict is not None
    assert verdict.kind == kind
    assert f"feature {verdict.feature}" in verdict.detail
    assert z.merge(lie) == 0
    assert z.to_state() == before


def test_a_plausible_record_counts_for_at_most_merge_rows_whatever_it_claims() -> None:
    z = _standardiser(5000)
    claim = Moments.from_record({"count": 10**12, "mean": [101.0, -5.0], "m2": [4e14, 1e12]}, 2)
    assert z.refusal(claim) is None
    assert z.merge(claim) == MERGE_ROWS
    assert z.count == 5000 + MERGE_ROWS
    fresh = OnlineStandardizer(2)
    assert fresh.merge(claim) == MERGE_ROWS  # at the start too


def test_the_events_of_a_stationary_or_cycling_stream_are_never_refused() -> None:
    rng = np.random.default_rng(3)
    z, drifting = OnlineStandardizer(3), OnlineStandardizer(3)
    t = 0
    for _ in range(1000):
        size = int(rng.integers(1, 150))
        seen = Moments(3)
        seen.add_many(rng.standard_t(8, size=(size, 3)) * [20.0, 1.0, 1e-3] + [100.0, -5.0, 0.0])
        assert z.refusal(seen) is None
        assert z.merge(seen) == min(size, MERGE_ROWS)
        # a time of day, a feature that cycles slowly, a day of the week
        ts = np.arange(t, t + size, dtype=float)
        t += size
        rows = np.column_stack([ts % 48, np.sin(ts / 50.0), (ts // 48) % 7])
        seen = Moments(3)
        seen.add_many(rows)
        assert drifting.refusal(seen) is None, (t, drifting.refusal(seen))
        drifting.merge(seen)


records = hst.tuples(
    hst.integers(min_value=1, max_value=10**12),
    hst.floats(min_value=-50.0, max_value=50.0),
    hst.floats(min_value=0.0, max_value=1e4),
)


@settings(max_examples=200, deadline=None)
@given(n=hst.integers(min_value=1, max_value=10**5), series=hst.lists(records, max_size=30))
def test_no_record_moves_the_statistics_more_than_one_step_nor_adds_more_than_merge_rows(
    n: int, series: list[tuple[int, float, float]]
) -> None:
    z = OnlineStandardizer(1)
    z._count, z._mean, z._m2 = n, np.zeros(1), np.full(1, float(n))  # mean 0, sd 1
    z._refresh_scale()
    for count, shift, variance in series:
        sd_before, mean_before, rows = float(z.std[0]), float(z.mean[0]), z.count
        record = Moments(1)
        record.count = count
        record.mean = np.array([mean_before + shift * sd_before])
        record.m2 = np.array([variance * sd_before**2 * count])
        refused = implausible(record, rows, z.mean, z.std) is not None
        merged = z.merge(record)
        assert (merged == 0) == refused
        assert merged <= MERGE_ROWS
        assert z.count == rows + merged
        bound = bounds(count, rows)[0]
        moved = abs(float(z.mean[0]) - mean_before) / sd_before
        assert moved <= merged / (rows + merged) * bound * (1 + 1e-9)
        if merged:
            a, b = merge_step(merged, rows)
            assert moved <= a * (1 + 1e-9)
            ratio = (float(z.std[0]) / sd_before) ** 2
            assert np.exp(-b) * (1 - 1e-9) <= ratio <= np.exp(b) * (1 + 1e-9)


def test_thirty_records_just_inside_the_gate_move_statistics_of_10000_rows_little() -> None:
    z = _standardiser(10_000)
    mean0, sd0 = z.mean, z.std
    for _ in range(30):  # each as far out as the gate lets it, claiming every row it can
        reach, spread = bounds(10**12, z.count)
        lie = Moments(2)
        lie.count = 10**12
        lie.mean = z.mean + 0.99 * reach * z.std
        lie.m2 = 0.99 * spread * z.std**2 * lie.count
        assert z.merge(lie) == MERGE_ROWS
    assert np.all(np.abs(z.mean - mean0) / sd0 < 0.09)
    assert np.all(z.std / sd0 < 1.07)


def test_a_standardiser_with_a_prior_starts_as_the_identity_and_keeps_it_in_its_record() -> None:
    z = OnlineStandardizer(2, prior=30)
    assert z.transform([3.0, -1.0]).tolist() == [3.0, -1.0]
    z.learn([3.0, -1.0])
    assert z.count == 31
    assert 0.0 < float(z.mean[0]) < 3.0 / 10  # 30 pseudo-rows at 0 weigh on it
    record = json.loads(json.dumps(z.to_state()))
    assert record["params"]["prior"] == 30
    back = preprocessor_from_state(record)
    assert back.transform([1.0, 1.0]).tolist() == z.transform([1.0, 1.0]).tolist()
    # a standardiser without one writes the record every release wrote
    assert "prior" not in OnlineStandardizer(2).to_state()["params"]


def test_the_serving_pipeline_takes_every_events_moments_then_the_labelled_row() -> None:
    rng = np.random.default_rng(2)
    events = rng.normal(size=(50, 2)) * [10.0, 0.1] + [100.0, 0.0]
    seen = Moments(2)
    seen.add_many(events)
    pipe = serving_pipeline(2)
    assert pipe.takes_moments
    assert pipe.learn_label(events[-1], seen) == 50
    first, second = pipe.steps[0], pipe.steps[1]
    assert isinstance(first, OnlineStandardizer)
    assert isinstance(second, OnlineStandardizer)
    np.testing.assert_allclose(first.mean, events.mean(axis=0))
    assert first.count == 50
    assert second.count == label_prior(2) + 1  # the labelled row, as the first step made it
    assert pipe.n_features_out == 3
    # standardised by every event: the inputs have about unit scale whatever the raw one
    # (10 and 0.1); the second step has learned one labelled row over label_prior(2)
    z = pipe.transform_many(events)
    assert np.all(np.abs(z[:, :2].std(axis=0) - 1.0) < 0.25)


def test_the_serving_pipeline_learns_its_first_step_from_moments_only() -> None:
    # a request without moments (the second of a scorer's batch: its events came with the
    # first) teaches the labelled row to the later steps alone, never twice to the first
    pipe = serving_pipeline(2)
    pipe.learn_label([5.0, 1.0], None)
    first, second = pipe.steps[0], pipe.steps[1]
    assert isinstance(first, OnlineStandardizer)
    assert isinstance(second, OnlineStandardizer)
    assert (first.count, second.count) == (0, label_prior(2) + 1)


def test_a_pipeline_of_one_standardiser_learns_the_labelled_row_as_before() -> None:
    # a model made before the serving pipeline: the moments do not change what it learns
    seen = Moments(2)
    seen.add_many([[100.0, 1.0], [200.0, 2.0]])
    old, plain = default_pipeline(2), default_pipeline(2)
    assert not old.takes_moments
    assert old.learn_label([1.0, 2.0], seen) == 0
    plain.learn([1.0, 2.0])
    assert old.to_state() == plain.to_state()
    without = Pipeline([Intercept()], n_features=2)
    assert without.learn_label([1.0, 2.0], seen) == 0
