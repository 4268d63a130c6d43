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
