"""The math: decisions, losses, gradients and query probabilities."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as hst

from service.learning.losses import (
    double_ramp_gradient,
    double_ramp_loss,
    double_ramp_query,
    double_ramp_query_utility,
    double_sigmoid_gradient,
    double_sigmoid_loss,
    double_sigmoid_query_probability,
    reject_decision,
    sigmoid,
    sigmoid_slope,
    zero_d_one_loss,
)

from .strategies import costs, gammas, huge, labels, margins, rhos, vectors

FAST = settings(max_examples=60, deadline=None)


def naive_sigmoid(a: float, gamma: float) -> float:
    """The paper's definition, literally (safe for the moderate arguments used with it)."""
    return 1.0 / (1.0 + math.exp(gamma * a))


def test_reject_decision_follows_the_definition() -> None:
    rho = 0.5
    assert [reject_decision(f, rho) for f in (0.51, 0.5, 0.0, -0.5, -0.51)] == [1, 0, 0, 0, -1]
    f = np.array([0.51, 0.5, 0.0, -0.5, -0.51])
    assert reject_decision(f, rho).tolist() == [1, 0, 0, 0, -1]


def test_zero_d_one_loss_charges_one_d_or_zero() -> None:
    d, rho = 0.3, 1.0
    # margin z = y f: right beyond rho, rejected inside, wrong beyond -rho
    assert zero_d_one_loss(1.5, rho, d) == 0.0
    assert zero_d_one_loss(0.2, rho, d) == d
    assert zero_d_one_loss(-1.0, rho, d) == d  # |f| = rho is a rejection
    assert zero_d_one_loss(-1.5, rho, d) == 1.0
    z = np.array([1.5, 0.2, -1.0, -1.5])
    assert zero_d_one_loss(z, rho, d).tolist() == [0.0, d, d, 1.0]


@FAST
@given(margins, rhos, costs)
def test_double_ramp_loss_matches_its_piecewise_form(z: float, rho: float, d: float) -> None:
    # each bracket [1 - a]_+ - [-1 - a]_+ is the ramp min(2, max(0, 1 - a))
    def ramp(a: float) -> float:
        return min(2.0, max(0.0, 1.0 - a))

    expected = d * ramp(z - rho) + (1.0 - d) * ramp(z + rho)
    assert double_ramp_loss(z, rho, d) == pytest.approx(expected, abs=1e-12)
    assert float(double_ramp_loss(np.array([z]), rho, d)[0]) == pytest.approx(expected, abs=1e-12)


@FAST
@given(margins, rhos, costs)
def test_double_ramp_gradient_is_the_slope_where_one_ramp_is_active(
    z: float, rho: float, d: float
) -> None:
    dz, drho = double_ramp_gradient(z, rho, d)
    first = rho - 1.0 <= z <= rho + 1.0
    second = -rho - 1.0 <= z <= 1.0 - rho
    if first:
        assert (dz, drho) == (-d, d)
    elif second:
        assert (dz, drho) == (pytest.approx(d - 1.0), pytest.approx(d - 1.0))
    else:
        assert (dz, drho) == (0.0, 0.0)
    # away from kinks and overlaps the branch is the true derivative of L_dr
    h = 1e-6
    kinks = [rho - 1, rho + 1, -rho - 1, 1 - rho]
    if rho > 1.0 + 1e-3 and min(abs(z - k) for k in kinks) > 1e-3:
        num_z = (double_ramp_loss(z + h, rho, d) - double_ramp_loss(z - h, rho, d)) / (2 * h)
        num_r = (double_ramp_loss(z, rho + h, d) - double_ramp_loss(z, rho - h, d)) / (2 * h)
        assert dz == pytest.approx(num_z, abs=1e-6)
        assert drho == pytest.approx(num_r, abs=1e-6)


@FAST
@given(hst.floats(-10, 10), rhos)
def test_dral_queries_exactly_where_a_label_could_move_it(f: float, rho: float) -> None:
    asked = double_ramp_query(f, rho)
    could_move = any(double_ramp_gradient(y * f, rho, 0.25) != (0.0, 0.0) for y in (1.0, -1.0))
    assert asked == could_move


@FAST
@given(margins, rhos, costs, gammas)
def test_double_sigmoid_loss_matches_the_paper_definition(
    z: float, rho: float, d: float, gamma: float
) -> None:
    expected = 2 * d * naive_sigmoid(z - rho, gamma) + 2 * (1 - d) * naive_sigmoid(z + rho, gamma)
    assert double_sigmoid_loss(z, rho, d, gamma) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@settings(max_examples=80, deadline=None)
@given(vectors(3), labels, hst.floats(0.05, 3.0), costs, gammas, vectors(3, scale=1.0))
def test_double_sigmoid_gradient_matches_finite_differences(
    w: np.ndarray, y: float, rho: float, d: float, gamma: float, x: np.ndarray
) -> None:
    """d/dw and d/drho of L_ds(y w.x, rho), central differences with step 1e-6."""

    def loss(w_: np.ndarray, rho_: float) -> float:
        return double_sigmoid_loss(y * float(w_ @ x), rho_, d, gamma)

    dz, drho = double_sigmoid_gradient(y * float(w @ x), rho, d, gamma)
    grad_w = dz * y * x
    h = 1e-6
    for j in range(3):
        e = np.zeros(3)
        e[j] = h
        numeric = (loss(w + e, rho) - loss(w - e, rho)) / (2 * h)
        assert grad_w[j] == pytest.approx(numeric, rel=1e-4, abs=1e-7)
    numeric_rho = (loss(w, rho + h) - loss(w, rho - h)) / (2 * h)
    assert drho == pytest.approx(numeric_rho, rel=1e-4, abs=1e-7)


def test_double_sigmoid_step_follows_the_papers_explanation() -> None:
    d, gamma, rho = 0.2, 1.0, 1.0
    # confidently right: w moves toward y x (dz < 0) and rho shrinks (drho > 0)
    dz, drho = double_sigmoid_gradient(4.0, rho, d, gamma)
    assert dz < 0.0
    assert drho > 0.0
    # confidently wrong: rho grows (drho < 0), w still moves toward y x
    dz, drho = double_sigmoid_gradient(-4.0, rho, d, gamma)
    assert dz < 0.0
    assert drho < 0.0


@FAST
@given(hst.floats(-50, 50), rhos, gammas)
@example(0.0, 1e-9, 3.6875)  # 4 s (1 - s) rounds to 1 + 2^-52 here unless clamped
def test_query_probability_is_a_probability_peaking_on_the_transitions(
    f: float, rho: float, gamma: float
) -> None:
    p = double_sigmoid_query_probability(f, rho, gamma)
    assert 0.0 <= p <= 1.0
    assert 0.0 <= double_sigmoid_query_probability(np.array([f]), rho, gamma)[0] <= 1.0
    assert double_sigmoid_query_probability(rho, rho, gamma) == 1.0
    assert double_sigmoid_query_probability(-rho, rho, gamma) == 1.0
    s = naive_sigmoid(abs(f) - rho, gamma) if abs(gamma * (abs(f) - rho)) < 700 else None
    if s is not None:
        assert p == pytest.approx(4 * s * (1 - s), abs=1e-12)


@FAST
@given(huge, huge, gammas, costs)
def test_losses_stay_finite_and_silent_for_huge_arguments(
    a: float, rho_raw: float, gamma: float, d: float
) -> None:
    rho = abs(rho_raw)
    arr = np.array([a, -a, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="raise", divide="raise", invalid="raise", under="ignore"):
            values = [
                sigmoid(a, gamma),
                sigmoid_slope(a, gamma),
                double_sigmoid_loss(a, rho, d, gamma),
                *double_sigmoid_gradient(a, rho, d, gamma),
                double_sigmoid_query_probability(a, rho, gamma),
                double_ramp_loss(a, rho, d),
            ]
            arrays = [
                sigmoid(arr, gamma),
                sigmoid_slope(arr, gamma),
                double_sigmoid_loss(arr, rho, d, gamma),
                *double_sigmoid_gradient(arr, rho, d, gamma),
                double_sigmoid_query_probability(arr, rho, gamma),
            ]
    assert all(math.isfinite(v) for v in values)
    assert all(np.isfinite(v).all() for v in arrays)
    assert 0.0 <= sigmoid(a, gamma) <= 1.0
    assert 0.0 <= double_sigmoid_loss(a, rho, d, gamma) <= 2.0


@pytest.mark.parametrize("a", [1e6, -1e6, 745.0, -745.0, 0.0])
def test_sigmoid_limits(a: float) -> None:
    s = sigmoid(a, 1.0)
    assert s == pytest.approx(0.0 if a > 700 else 1.0 if a < -700 else 0.5, abs=1e-300)
    assert sigmoid_slope(a, 1.0) == pytest.approx(0.25 if a == 0.0 else 0.0, abs=1e-300)


@FAST
@given(vectors(6, scale=20.0), rhos, costs, gammas)
def test_array_and_scalar_paths_agree(z: np.ndarray, rho: float, d: float, gamma: float) -> None:
    for fn in (
        lambda v: sigmoid(v, gamma),
        lambda v: sigmoid_slope(v, gamma),
        lambda v: double_sigmoid_loss(v, rho, d, gamma),
        lambda v: double_sigmoid_gradient(v, rho, d, gamma)[0],
        lambda v: double_sigmoid_gradient(v, rho, d, gamma)[1],
        lambda v: double_sigmoid_query_probability(v, rho, gamma),
        lambda v: double_ramp_loss(v, rho, d),
        lambda v: double_ramp_gradient(v, rho, d)[0],
        lambda v: double_ramp_gradient(v, rho, d)[1],
        lambda v: zero_d_one_loss(v, rho, d),
        lambda v: reject_decision(v, rho),
        lambda v: double_ramp_query(v, rho),
    ):
        vector = np.asarray(fn(z), dtype=np.float64)
        scalars = np.array([float(fn(float(v))) for v in z])
        assert np.allclose(vector, scalars, rtol=1e-13, atol=1e-15)


@FAST
@given(f=margins, rho=rhos)
def test_dral_query_utility_is_a_smooth_bump_over_the_query_band(f: float, rho: float) -> None:
    u = double_ramp_query_utility(f, rho)
    assert 0.0 <= u <= 1.0
    assert double_ramp_query_utility(rho, rho) == 1.0  # the peak, at the centre |f| = rho
    if double_ramp_query(f, rho):  # inside the band: at least 4 s (1 - s) at distance 1
        assert u >= 0.4199
    if abs(abs(f) - rho) >= 2.0:
        assert u <= 0.0707
    assert double_ramp_query_utility(-f, rho) == u


@settings(max_examples=60, deadline=None)
@given(vectors(3), labels, hst.floats(0.05, 3.0), costs, gammas, hst.floats(0.01, 10.0))
def test_the_tailed_gradient_matches_finite_differences_of_the_tailed_loss(
    w: np.ndarray, y: float, rho: float, d: float, gamma: float, tail: float
) -> None:
    x = np.array([0.3, -0.7, 1.0])

    def loss(w_: np.ndarray, rho_: float) -> float:
        return double_sigmoid_loss(y * float(w_ @ x), rho_, d, gamma, tail)

    dz, drho = double_sigmoid_gradient(y * float(w @ x), rho, d, gamma, tail)
    h = 1e-6
    for j in range(3):
        e = np.zeros(3)
        e[j] = h
        numeric = (loss(w + e, rho) - loss(w - e, rho)) / (2 * h)
        assert dz * y * x[j] == pytest.approx(numeric, rel=1e-4, abs=1e-6)
    # the tail is free of rho: rho's gradient is the paper's
    assert drho == double_sigmoid_gradient(y * float(w @ x), rho, d, gamma)[1]


@FAST
@given(margins, rhos, costs, gammas)
def test_a_tail_of_zero_is_the_papers_loss_exactly(
    z: float, rho: float, d: float, g: float
) -> None:
    assert double_sigmoid_loss(z, rho, d, g, 0.0) == double_sigmoid_loss(z, rho, d, g)
    assert double_sigmoid_gradient(z, rho, d, g, 0.0) == double_sigmoid_gradient(z, rho, d, g)


def test_where_the_papers_loss_is_flat_the_tail_keeps_a_slope() -> None:
    wrong = -30.0  # confidently wrong: the paper's gradient has vanished
    assert abs(double_sigmoid_gradient(wrong, 1.0, 0.25)[0]) < 1e-10
    assert double_sigmoid_gradient(wrong, 1.0, 0.25, 1.0, 2.0)[0] == pytest.approx(-2.0)
    right = 30.0  # confidently right: neither moves
    assert abs(double_sigmoid_gradient(right, 1.0, 0.25, 1.0, 2.0)[0]) < 1e-10
    z = np.array([-1e6, -30.0, 0.0, 30.0, 1e6])  # huge arguments: finite and silent
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = double_sigmoid_loss(z, 1.0, 0.25, 1.0, 2.0)
        slopes = double_sigmoid_gradient(z, 1.0, 0.25, 1.0, 2.0)[0]
    assert np.isfinite(values).all()
    assert np.isfinite(slopes).all()
    scalars = [double_sigmoid_loss(float(v), 1.0, 0.25, 1.0, 2.0) for v in z]
    assert np.allclose(values, scalars, rtol=1e-13)
