"""Preprocessing: online standardisation, intercept, pipelines and their state."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from service.learning import HyperparameterError, Pipeline, StateError, default_pipeline
from service.learning.errors import DimensionError, NonFiniteError
from service.learning.preprocessing import Intercept, OnlineStandardizer, preprocessor_from_state


@settings(max_examples=40, deadline=None)
@given(hst.lists(hst.lists(hst.floats(-1e3, 1e3), min_size=3, max_size=3), min_size=1, max_size=40))
def test_running_mean_and_std_match_numpy(rows: list[list[float]]) -> None:
    data = np.array(rows)
    z = OnlineStandardizer(3)
    for row in data:
        z.learn(row)
    assert z.count == len(data)
    assert np.allclose(z.mean, data.mean(axis=0), rtol=1e-9, atol=1e-9)
    assert np.allclose(z.std, data.std(axis=0), rtol=1e-7, atol=1e-7)


def test_standardised_features_have_zero_mean_and_unit_variance() -> None:
    rng = np.random.default_rng(0)
    data = rng.normal(loc=[5.0, -3.0], scale=[10.0, 0.01], size=(500, 2))
    z = OnlineStandardizer(2)
    for row in data:
        z.learn(row)
    out = z.transform_many(data)
    assert np.allclose(out.mean(axis=0), 0.0, atol=1e-9)
    assert np.allclose(out.std(axis=0), 1.0, atol=1e-9)
    assert np.allclose(z.transform(data[7]), out[7])


def test_a_constant_feature_is_only_centred_and_never_divided_by_zero() -> None:
    z = OnlineStandardizer(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for v in (1.0, 2.0, 3.0):
            z.learn([v, 7.0])
        out = z.transform([4.0, 9.0])
    assert out[1] == 2.0  # 9 - 7, not divided by the zero spread
    assert out[0] == pytest.approx((4.0 - 2.0) / math.sqrt(2.0 / 3.0))


def test_before_any_example_the_standardiser_is_the_identity() -> None:
    assert OnlineStandardizer(2).transform([3.0, -1.0]).tolist() == [3.0, -1.0]


def test_learn_refuses_non_finite_input_and_keeps_its_statistics() -> None:
    z = OnlineStandardizer(2)
    z.learn([1.0, 2.0])
    before = z.to_state()
    with pytest.raises(NonFiniteError):
        z.learn([math.nan, 1.0])
    with pytest.raises(DimensionError):
        z.learn([1.0, 2.0, 3.0])
    assert z.to_state() == before


def test_intercept_appends_a_constant() -> None:
    assert Intercept().transform([1.0, 2.0]).tolist() == [1.0, 2.0, 1.0]
    assert Intercept(3.0).transform_many(np.zeros((2, 1))).tolist() == [[0.0, 3.0], [0.0, 3.0]]
    assert Intercept().output_size(4) == 5
    with pytest.raises(DimensionError):
        Intercept().transform(np.zeros((2, 2)))


def test_transforms_never_modify_their_input() -> None:
    pipe = default_pipeline(3)
    x = np.array([1.0, 2.0, 3.0])
    X = np.arange(6.0).reshape(2, 3)
    x0, X0 = x.copy(), X.copy()
    pipe.learn(x)
    pipe.learn(x * 2)
    pipe.transform(x)
    pipe.transform_many(X)
    assert np.array_equal(x, x0)
    assert np.array_equal(X, X0)
    empty = Pipeline([], n_features=3)
    assert empty.transform(x) is not x


def test_pipeline_chains_steps_in_order() -> None:
    pipe = default_pipeline(2)
    data = np.array([[0.0, 10.0], [2.0, 30.0]])
    for row in data:
        pipe.learn(row)
    # mean (1, 20), std (1, 10); then the intercept
    assert pipe.transform([3.0, 40.0]).tolist() == [2.0, 2.0, 1.0]
    assert pipe.transform_many(data).tolist() == [[-1.0, -1.0, 1.0], [1.0, 1.0, 1.0]]
    assert pipe.n_features_in == 2
    assert pipe.n_features_out == 3


def test_pipeline_checks_dimensions_when_built() -> None:
    with pytest.raises(HyperparameterError, match="takes 3 features"):
        Pipeline([Intercept(), OnlineStandardizer(3)], n_features=3)
    with pytest.raises(HyperparameterError, match="unknown"):
        _ = Pipeline([Intercept()]).n_features_out
    with pytest.raises(HyperparameterError, match="not a preprocessing step"):
        Pipeline([object()])  # type: ignore[list-item]


def test_pipeline_state_round_trips_through_json_bit_for_bit() -> None:
    pipe = default_pipeline(3)
    rng = np.random.default_rng(1)
    for row in rng.normal(size=(25, 3)) * [1.0, 100.0, 1e-3]:
        pipe.learn(row)
    clone = Pipeline.from_state(json.loads(json.dumps(pipe.to_state())))
    probe = rng.normal(size=(5, 3))
    assert np.array_equal(clone.transform_many(probe), pipe.transform_many(probe))
    more = rng.normal(size=3)
    clone.learn(more)
    pipe.learn(more)
    assert clone.to_state() == pipe.to_state()


def test_bad_preprocessing_state_is_refused() -> None:
    state = OnlineStandardizer(2).to_state()
    with pytest.raises(StateError, match="version"):
        preprocessor_from_state({**state, "version": 3})
    with pytest.raises(StateError, match="unknown preprocessing step"):
        preprocessor_from_state({**state, "kind": "pca"})
    broken = json.loads(json.dumps(state))
    broken["learned"]["m2"] = [-1.0, 0.0]
    with pytest.raises(StateError, match="m2"):
        OnlineStandardizer.from_state(broken)
    with pytest.raises(StateError, match="steps"):
        Pipeline.from_state({"format": "abstain.pipeline", "version": 1, "steps": {}})


def test_min_std_must_keep_the_scale_finite() -> None:
    for bad in (0.0, -1.0, 1e-320, math.nan):
        with pytest.raises(HyperparameterError, match="min_std"):
            OnlineStandardizer(2, min_std=bad)


# -- binary features left uncentred (uncentred_binary) ---------------------------------
def _one_hot_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows of a 4-level one-hot block beside a numeric column."""
    levels = rng.integers(0, 4, n)
    block = (levels[:, None] == np.arange(4)[None, :]).astype(np.float64)
    return np.hstack([block, rng.normal(5.0, 2.0, (n, 1))])


def test_binary_features_keep_their_zeros_and_numbers_are_standardised_as_before() -> None:
    rng = np.random.default_rng(3)
    rows = _one_hot_rows(rng, 400)
    binary, plain = OnlineStandardizer(5, uncentred_binary=True), OnlineStandardizer(5)
    for row in rows:
        binary.learn(row)
        plain.learn(row)
    assert binary.binary().tolist() == [True, True, True, True, False]
    out = binary.transform_many(rows)
    assert np.array_equal(out[:, :4] == 0.0, rows[:, :4] == 0.0)  # sparse stays sparse
    p = rows[:, :4].mean(axis=0)
    assert np.allclose(out[:, :4].max(axis=0), 1.0 / np.sqrt(p))  # divided by sqrt(p)
    assert np.allclose((out[:, :4] ** 2).mean(axis=0), 1.0)  # unit root mean square
    assert np.array_equal(out[:, 4], plain.transform_many(rows)[:, 4])
    assert not plain.binary().any()


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.sampled_from([0.0, 1.0, 0.5, 0.25, 0.999]), min_size=1, max_size=30))
def test_a_feature_of_values_in_0_1_is_binary_exactly_when_it_held_both_0_and_1_only(
    values: list[float],
) -> None:
    z = OnlineStandardizer(1, uncentred_binary=True)
    for v in values:
        z.learn([v])
    assert bool(z.binary()[0]) == (set(values) == {0.0, 1.0})


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.sampled_from([0.0, 1.0, 2.0, -1.0, 3.5]), min_size=1, max_size=30))
def test_a_feature_that_held_a_value_outside_0_1_is_binary_only_by_coincidence_of_moments(
    values: list[float],
) -> None:
    """Two moments cannot tell every such set from 0/1 (eight 0.5 and a 2.0 match them):
    binary then means exactly that both moments match, and the row stays finite."""
    z = OnlineStandardizer(1, uncentred_binary=True)
    for v in values:
        z.learn([v])
    p, var = float(np.mean(values)), float(np.var(values))
    matches = 0.0 < p < 1.0 and abs(var - p * (1.0 - p)) <= 1e-9
    assert bool(z.binary()[0]) == matches
    assert np.isfinite(z.transform([max(values)])).all()


def test_moments_that_match_a_binary_features_by_coincidence_make_it_binary() -> None:
    z = OnlineStandardizer(1, uncentred_binary=True)
    for v in [0.5] * 8 + [2.0]:
        z.learn([v])
    assert z.binary()[0]
    assert z.transform([0.0])[0] == 0.0
    assert z.transform([2.0])[0] == pytest.approx(2.0 / math.sqrt(2.0 / 3.0))


def test_a_feature_that_stops_being_binary_is_standardised_from_then_on() -> None:
    z = OnlineStandardizer(1, uncentred_binary=True)
    for v in (0.0, 1.0, 0.0, 0.0):
        z.learn([v])
    assert z.transform([0.0])[0] == 0.0
    z.learn([3.0])
    assert not z.binary()[0]
    mean, std = z.mean[0], z.std[0]
    assert z.transform([0.0])[0] == pytest.approx(-mean / std)


def test_merged_moments_of_binary_rows_keep_a_binary_feature_binary_even_when_clipped() -> None:
    from service.learning.moments import Moments

    z = OnlineStandardizer(1, uncentred_binary=True)
    for i in range(1000):  # p = 0.1
        z.learn([float(i % 10 == 0)])
    assert z.binary()[0]
    shifted = Moments(1)  # an abrupt change to p = 0.9: the untrusted merge clips the mean
    shifted.add_many([[float(i % 10 != 0)] for i in range(100)])
    assert z.merge(shifted) == 100
    mean = z.mean[0]
    assert 0.1 < mean < (0.9 * 100 + 0.1 * 1000) / 1100  # moved, but less than Chan's merge
    assert z.binary()[0]  # its variance followed its mean
    assert z.std[0] ** 2 == pytest.approx(mean * (1 - mean), abs=1e-12)


def test_uncentred_binary_is_in_the_record_only_when_set_and_round_trips() -> None:
    rng = np.random.default_rng(4)
    z = OnlineStandardizer(5, uncentred_binary=True)
    for row in _one_hot_rows(rng, 50):
        z.learn(row)
    record = json.loads(json.dumps(z.to_state()))
    assert record["params"]["uncentred_binary"] is True
    clone = OnlineStandardizer.from_state(record)
    probe = _one_hot_rows(rng, 5)
    assert np.array_equal(clone.transform_many(probe), z.transform_many(probe))
    # a record written before the setting existed keeps centring every feature
    params = {k: v for k, v in record["params"].items() if k != "uncentred_binary"}
    old = {**record, "params": params}
    assert "uncentred_binary" not in OnlineStandardizer(2).to_state()["params"]
    assert not OnlineStandardizer.from_state(old).binary().any()
    for bad in ("yes", 1, None):
        broken = {**record, "params": {**record["params"], "uncentred_binary": bad}}
        with pytest.raises(StateError, match="uncentred_binary"):
            OnlineStandardizer.from_state(broken)
    with pytest.raises(HyperparameterError, match="prior"):
        OnlineStandardizer(2, prior=3, uncentred_binary=True)


def test_the_serving_pipeline_leaves_binary_features_uncentred_in_its_first_step_only() -> None:
    from service.learning import serving_pipeline

    first, second = serving_pipeline(3).steps[:2]
    assert isinstance(first, OnlineStandardizer)
    assert isinstance(second, OnlineStandardizer)
    assert first.uncentred_binary
    assert not second.uncentred_binary


def test_an_untrusted_record_cannot_switch_a_binary_features_centring_back_on() -> None:
    from service.learning.moments import Moments

    z = OnlineStandardizer(1, uncentred_binary=True)
    for i in range(10_000):  # p = 0.1
        z.learn([float(i % 10 == 0)])
    # plausible (its variance 1.3 x the binary one), but no 0/1 rows have it
    record = Moments.from_record({"count": 100, "mean": [0.1], "m2": [100 * 0.09 * 1.3]}, 1)
    assert z.merge(record) == 100
    assert z.binary()[0]
    assert z.transform([0.0])[0] == 0.0
    signed = OnlineStandardizer(1, uncentred_binary=True)  # signed moments are followed
    for i in range(10_000):
        signed.learn([float(i % 10 == 0)])
    assert signed.merge(record, trusted=True) == 100
    assert not signed.binary()[0]


# -- hashed inputs never centred (uncentred_from) ----------------------------------------
def _hashed_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rows of two numbers beside 30 hashed buckets of token counts (0, 1, 2, 3)."""
    numbers = rng.normal(10.0, 3.0, (n, 2))
    counts = rng.poisson(0.15, (n, 30)).astype(np.float64)
    return np.hstack([numbers, counts])


def test_hashed_inputs_keep_their_zeros_whatever_they_hold_and_numbers_are_as_before() -> None:
    rng = np.random.default_rng(5)
    rows = _hashed_rows(rng, 500)
    assert rows[:, 2:].max() >= 2.0  # counts: not binary, uncentred_binary would centre them
    hashed, plain = OnlineStandardizer(32, uncentred_from=2), OnlineStandardizer(32)
    for row in rows:
        hashed.learn(row)
        plain.learn(row)
    out = hashed.transform_many(rows)
    assert np.array_equal(out[:, 2:] == 0.0, rows[:, 2:] == 0.0)  # sparse stays sparse
    assert np.allclose((out[:, 2:] ** 2).mean(axis=0), 1.0)  # unit root mean square
    assert np.array_equal(out[:, :2], plain.transform_many(rows)[:, :2])
    assert (plain.transform_many(rows)[:, 2:] != 0.0).all()  # centred: dense


@settings(max_examples=40, deadline=None)
@given(
    hst.lists(
        hst.lists(hst.sampled_from([0.0, 0.0, 0.0, 1.0, 2.0, -1.5, 7.25]), min_size=4, max_size=4),
        min_size=1,
        max_size=25,
    ),
    hst.integers(0, 3),
)
def test_the_serving_pipeline_keeps_every_zero_of_a_hashed_input(
    rows: list[list[float]], k: int
) -> None:
    """Through both standardisers, moments merged as a worker's learner merges them, and
    the second step's labelled rows: a hashed input is zero exactly where the event's is."""
    from service.learning import serving_pipeline
    from service.learning.moments import Moments

    pipe = serving_pipeline(4, hashed_from=k)
    for i, row in enumerate(rows):
        seen = Moments(4)
        seen.add_many(rows[max(0, i - 2) : i + 1])
        pipe.learn_label(row, seen, trusted=i % 2 == 0)
        for probe in rows:
            z = pipe.transform(probe)
            assert np.isfinite(z).all()
            assert [v == 0.0 for v in z[k:4]] == [v == 0.0 for v in probe[k:]]


def test_uncentred_from_is_in_the_record_only_when_set_round_trips_and_is_checked() -> None:
    from service.learning import serving_pipeline

    rng = np.random.default_rng(6)
    z = OnlineStandardizer(32, uncentred_from=2)
    for row in _hashed_rows(rng, 60):
        z.learn(row)
    record = json.loads(json.dumps(z.to_state()))
    assert record["params"]["uncentred_from"] == 2
    assert "uncentred_from" not in OnlineStandardizer(2).to_state()["params"]
    probe = _hashed_rows(rng, 5)
    clone = OnlineStandardizer.from_state(record)
    assert np.array_equal(clone.transform_many(probe), z.transform_many(probe))
    for bad in (32, 40, -1, "2", True, 2.0):
        with pytest.raises(HyperparameterError, match="uncentred_from"):
            OnlineStandardizer(32, uncentred_from=bad)
        broken = {**record, "params": {**record["params"], "uncentred_from": bad}}
        with pytest.raises(StateError, match="uncentred_from"):
            OnlineStandardizer.from_state(broken)
    # a pipeline of a declared model's shape: the first (every event's moments) passes the
    # buckets through, the second (the labelled rows) never centres them
    first, second = serving_pipeline(32, hashed_from=2).steps[:2]
    assert isinstance(first, OnlineStandardizer)
    assert isinstance(second, OnlineStandardizer)
    assert (first.uncentred_from, first.passes_from) == (None, 2)
    assert (second.squares_from, second.passes_from) == (2, None)
    assert first.uncentred_binary
    assert second.prior == 32
    plain = serving_pipeline(32).steps[:2]
    assert all(
        isinstance(s, OnlineStandardizer) and s.uncentred_from is None and s.passes_from is None
        for s in plain
    )


def test_passed_features_are_never_learned_by_rows_or_moments_and_a_record_is_checked() -> None:
    from service.learning.moments import Moments

    rng = np.random.default_rng(7)
    rows = _hashed_rows(rng, 80)
    z, plain = OnlineStandardizer(32, prior=32, passes_from=2), OnlineStandardizer(32, prior=32)
    for row in rows:
        z.learn(row)
        plain.learn(row)
    assert np.array_equal(z.transform_many(rows)[:, 2:], rows[:, 2:])  # passed unchanged
    assert np.array_equal(z.transform_many(rows)[:, :2], plain.transform_many(rows)[:, :2])
    assert not z.mean[2:].any()
    assert z.count == plain.count
    seen = Moments(32)
    seen.add_many(rows[:10] * 3.0)
    for trusted in (False, True):
        z.merge(seen, trusted=trusted)
        assert np.array_equal(z.transform_many(rows)[:, 2:], rows[:, 2:])
    record = json.loads(json.dumps(z.to_state()))
    assert record["params"]["passes_from"] == 2
    assert "passes_from" not in plain.to_state()["params"]
    clone = OnlineStandardizer.from_state(record)
    assert np.array_equal(clone.transform_many(rows), z.transform_many(rows))
    learned = {**record, "learned": {**record["learned"], "m2": [1.0] * 32}}
    with pytest.raises(StateError, match="passes through"):
        OnlineStandardizer.from_state(learned)
    for bad in (32, -1, "2", True):
        with pytest.raises(HyperparameterError, match="passes_from"):
            OnlineStandardizer(32, passes_from=bad)


def test_sums_of_squares_scale_by_the_rows_learnt_change_where_a_row_is_set_and_are_checked() -> (
    None
):
    from service.learning.moments import Moments

    rng = np.random.default_rng(8)
    rows = _hashed_rows(rng, 50)
    squares = OnlineStandardizer(32, prior=32, squares_from=2)
    uncentred = OnlineStandardizer(32, uncentred_from=2)  # the mean square, kept otherwise
    assert np.array_equal(squares.transform_many(rows)[:, 2:], rows[:, 2:])  # none learnt
    for row in rows:
        before = squares.to_state()["learned"]
        squares.learn(row)
        uncentred.learn(row)
        after = squares.to_state()["learned"]
        moved = [i for i in range(2, 32) if after["m2"][i] != before["m2"][i]]
        assert moved == [i for i in range(2, 32) if row[i]]  # only where the row is set
        assert not any(after["mean"][2:])
    # the buckets: the root mean square of the rows alone, the prior left out
    np.testing.assert_allclose(
        squares.transform_many(rows)[:, 2:], uncentred.transform_many(rows)[:, 2:], rtol=1e-12
    )
    # the numbers: the prior's pseudo-rows weigh in
    plain = OnlineStandardizer(32, prior=32)
    for row in rows:
        plain.learn(row)
    assert np.array_equal(squares.transform_many(rows)[:, :2], plain.transform_many(rows)[:, :2])
    record = json.loads(json.dumps(squares.to_state()))
    assert record["params"]["squares_from"] == 2
    clone = OnlineStandardizer.from_state(record)
    assert np.array_equal(clone.transform_many(rows), squares.transform_many(rows))
    meant = {**record, "learned": {**record["learned"], "mean": [0.5] * 32}}
    with pytest.raises(StateError, match="sums of squares"):
        OnlineStandardizer.from_state(meant)
    for other in ({"passes_from": 2}, {"uncentred_from": 2}):
        with pytest.raises(HyperparameterError, match="squares_from"):
            OnlineStandardizer(32, squares_from=2, **other)  # type: ignore[arg-type]
    seen = Moments(32)
    seen.add_many(rows[:5])
    for trusted in (False, True):
        with pytest.raises(HyperparameterError, match="rows, not moments"):
            squares.merge(seen, trusted=trusted)
    from service.learning import Pipeline

    assert not Pipeline([squares, OnlineStandardizer(32)], n_features=32).takes_moments


@pytest.mark.parametrize("trusted", [False, True])
def test_moments_of_the_numbers_alone_merge_as_those_of_every_input(trusted: bool) -> None:
    from service.learning import serving_pipeline
    from service.learning.moments import Moments

    rng = np.random.default_rng(9)
    rows = _hashed_rows(rng, 60)
    head, whole = serving_pipeline(32, hashed_from=2), serving_pipeline(32, hashed_from=2)
    assert head.moments_width == 2
    for i in range(0, 60, 6):
        few, every = Moments(2), Moments(32)
        few.add_many(rows[i : i + 6, :2])
        every.add_many(rows[i : i + 6])
        assert head.moments_refusal(few) is None
        head.learn_label(rows[i + 5], few, trusted=trusted)
        whole.learn_label(rows[i + 5], every, trusted=trusted)
    assert np.array_equal(head.transform_many(rows), whole.transform_many(rows))
    assert head.steps[0].count == whole.steps[0].count >= 6  # type: ignore[attr-defined]
    for width in (1, 3, 31):
        wrong = Moments(width)
        wrong.add_many(rows[:5, :width])
        refused = head.moments_refusal(wrong, judge=False)
        assert refused is not None
        assert refused.kind == "width"
        assert f"moments of {width} features" in refused.detail
    plain = serving_pipeline(4)
    assert plain.moments_width == 4
    assert plain.moments_refusal(Moments(2)) is not None
