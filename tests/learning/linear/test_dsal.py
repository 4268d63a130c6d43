"""DSAL and DSOL: the update is the true gradient step of L_ds; queries are Bernoulli(p)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from service.learning import DSAL, DSOL
from service.learning.errors import NonFiniteError
from service.learning.schedules import DSALTheory

from ..strategies import costs, gammas, labels, vectors


def slope(a: float, gamma: float) -> float:
    """sigma(a) (1 - sigma(a)) straight from sigma(a) = 1/(1 + e^(gamma a))."""
    s = 1.0 / (1.0 + math.exp(gamma * a))
    return s * (1.0 - s)


@settings(max_examples=60, deadline=None)
@given(
    vectors(3),
    vectors(3, scale=1.5),
    labels,
    hst.floats(0.0, 3.0),
    costs,
    gammas,
    hst.floats(0.01, 2.0),
)
def test_update_is_one_gradient_step_on_l_ds(
    w: np.ndarray, x: np.ndarray, y: float, rho: float, d: float, gamma: float, eta: float
) -> None:
    learner = DSAL(n_features=3, cost=d, gamma=gamma, eta=eta, w=w, rho=rho)
    z = y * float(w @ x)
    q_minus, q_plus = slope(z - rho, gamma), slope(z + rho, gamma)
    # dL/dw = -2 gamma (d q- + (1-d) q+) y x ;  dL/drho = 2 gamma (d q- - (1-d) q+)
    expected_w = w + eta * 2 * gamma * (d * q_minus + (1 - d) * q_plus) * y * x
    expected_rho = max(0.0, rho - eta * 2 * gamma * (d * q_minus - (1 - d) * q_plus))
    learner.update(x, y)
    assert np.allclose(learner.w, expected_w, rtol=1e-12, atol=1e-14)
    assert learner.rho == pytest.approx(expected_rho, rel=1e-12, abs=1e-14)
    assert learner.rho >= 0.0


@settings(max_examples=60, deadline=None)
@given(vectors(2), vectors(2), labels, hst.floats(0.0, 2.0), costs, hst.floats(0.01, 50.0))
def test_rho_stays_non_negative_after_any_update(
    w: np.ndarray, x: np.ndarray, y: float, rho: float, d: float, eta: float
) -> None:
    for cls in (DSAL, DSOL):
        learner = cls(n_features=2, cost=d, eta=eta, w=w, rho=rho)
        learner.update(x, y)
        assert learner.rho >= 0.0


def test_confidently_right_example_shrinks_rho_and_wrong_one_grows_it() -> None:
    x = np.array([1.0, 0.0])
    right = DSAL(n_features=2, cost=0.25, eta=0.1, w=[4.0, 0.0], rho=1.0)
    right.update(x, +1)
    assert right.rho < 1.0
    assert right.w[0] > 4.0  # moved toward y x
    wrong = DSAL(n_features=2, cost=0.25, eta=0.1, w=[4.0, 0.0], rho=1.0)
    wrong.update(x, -1)
    assert wrong.rho > 1.0
    assert wrong.w[0] < 4.0  # moved toward y x = -x


def test_query_probability_is_one_on_the_transitions_and_small_far_away() -> None:
    learner = DSAL(n_features=1, cost=0.25, gamma=2.0, w=[1.0], rho=1.5)
    assert learner.decide([1.5]).query_probability == 1.0
    assert learner.decide([-1.5]).query_probability == 1.0
    assert learner.decide([20.0]).query_probability < 1e-12
    assert learner.decide([0.0]).query_probability < 1.0


def test_queries_follow_the_supplied_coin() -> None:
    learner = DSAL(n_features=1, cost=0.25, w=[1.0], rho=1.0)
    p = learner.decide([0.2], coin=0.5).query_probability
    assert 0.0 < p < 1.0
    assert learner.decide([0.2], coin=p * 0.999).query is True
    assert learner.decide([0.2], coin=min(p * 1.001, 0.999)).query is False


def test_internal_coins_ask_at_rate_p() -> None:
    learner = DSAL(n_features=1, cost=0.25, w=[1.0], rho=1.0, seed=4)
    p = learner.decide([0.2]).query_probability
    n = 4000
    rate = sum(learner.decide([0.2]).query for _ in range(n)) / n
    # binomial standard deviation sqrt(p (1 - p) / n) < 0.008: allow 5 sigma
    assert abs(rate - p) < 0.04


def test_dsol_always_queries_and_updates_like_dsal() -> None:
    dsol = DSOL(n_features=2, cost=0.1, eta=0.3, w=[50.0, 0.0])
    dsal = DSAL(n_features=2, cost=0.1, eta=0.3, w=[50.0, 0.0])
    x = np.array([1.0, 1.0])
    assert dsol.decide(x).query is True
    assert dsol.decide(x).query_probability == 1.0
    assert dsal.decide(x, coin=0.5).query is False  # p is tiny at |f| = 50
    dsol.update(x, -1)
    dsal.update(x, -1)
    assert dsol.w.tolist() == dsal.w.tolist()
    assert dsol.rho == dsal.rho


def test_theory_step_size_is_5_over_gamma2_r2_plus_1() -> None:
    learner = DSAL(n_features=1, cost=0.25, gamma=2.0, eta=DSALTheory(gamma=2.0, radius=3.0))
    assert learner.eta(0) == pytest.approx(5.0 / (4.0 * 10.0))
    assert learner.to_state()["params"]["eta"] == {
        "kind": "dsal-theory",
        "gamma": 2.0,
        "radius": 3.0,
    }


def test_non_finite_update_is_refused_and_the_model_unchanged() -> None:
    learner = DSAL(n_features=2, cost=0.25, eta=1e308)
    before = learner.to_state()
    with pytest.raises(NonFiniteError):
        learner.update([1e200, 1.0], -1)
    assert learner.to_state() == before


def test_gamma_bounds_are_enforced() -> None:
    from service.learning import HyperparameterError

    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(HyperparameterError, match="gamma"):
            DSAL(n_features=1, cost=0.25, gamma=bad)


def test_without_step_bounds_the_record_is_the_one_before_they_existed() -> None:
    learner = DSAL(n_features=3, cost=0.25)
    assert set(learner.to_state()["params"]) == {"n_features", "cost", "gamma", "eta", "seed"}
    bounded = DSAL(n_features=3, cost=0.25, rho_eta_max=0.2, intercept_eta_min=1.0)
    record = bounded.to_state()
    assert (record["params"]["rho_eta_max"], record["params"]["intercept_eta_min"]) == (0.2, 1.0)
    again = DSAL.from_state(record)
    assert (again.rho_eta_max, again.intercept_eta_min) == (0.2, 1.0)
    for x, y in ([1.0, -2.0, 1.0], 1), ([0.5, 0.1, 1.0], -1), ([3.0, 3.0, 1.0], -1):
        bounded.update(x, y)
        again.update(x, y)
    assert again.to_state() == bounded.to_state()


@pytest.mark.parametrize("name", ["rho_eta_max", "intercept_eta_min"])
def test_step_bounds_must_be_positive_numbers(name: str) -> None:
    from service.learning import HyperparameterError

    for bad in (0.0, -1.0, math.inf, math.nan, True, "1"):
        with pytest.raises(HyperparameterError, match=name):
            DSAL(n_features=2, cost=0.25, **{name: bad})


def test_the_bounds_cap_rho_and_floor_the_last_weight_only() -> None:
    kw = {"n_features": 3, "cost": 0.25, "eta": 2.0, "rho": 1.0}
    free = DSAL(**kw)
    held = DSAL(**kw, rho_eta_max=0.5, intercept_eta_min=3.0)
    x = np.array([1.0, -0.5, 1.0])
    for learner in (free, held):
        learner.update(x, -1)  # w = 0: z = 0, inside the band: w moves, rho grows
    dz, drho = free._gradient(0.0, 1.0)
    np.testing.assert_allclose(free.w, 2.0 * dz * x)
    np.testing.assert_allclose(held.w, dz * np.array([2.0, 2.0, 3.0]) * x)
    assert free.rho == pytest.approx(1.0 - 2.0 * drho)
    assert held.rho == pytest.approx(1.0 - 0.5 * drho)
    # a floor below the step and a cap above it change nothing, bit for bit
    loose = DSAL(**kw, rho_eta_max=5.0, intercept_eta_min=0.1)
    loose.update(x, -1)
    assert loose.w.tolist() == free.w.tolist()
    assert loose.rho == free.rho


def test_a_tail_of_zero_leaves_the_record_as_it_was_and_a_tail_round_trips() -> None:
    plain = DSAL(n_features=3, cost=0.25, update_rule="normalized")
    assert plain.tail == 0.0
    assert "tail" not in plain.to_state()["params"]
    tailed = DSOL(n_features=3, cost=0.25, tail=2.0)
    record = tailed.to_state()
    assert record["params"]["tail"] == 2.0
    again = DSOL.from_state(record)
    for x, y in ([1.0, -2.0, 1.0], 1), ([0.5, 0.1, 1.0], -1), ([3.0, 3.0, 1.0], -1):
        tailed.update(x, y)
        again.update(x, y)
    assert again.to_state() == tailed.to_state()


def test_a_tail_must_be_a_non_negative_number() -> None:
    from service.learning import HyperparameterError

    for bad in (-0.5, math.inf, math.nan, True, "2", 1e7):
        with pytest.raises(HyperparameterError, match="tail"):
            DSAL(n_features=2, cost=0.25, tail=bad)


@pytest.mark.parametrize("update_rule", ["sgd", "normalized"])
def test_with_a_tail_a_model_follows_a_boundary_that_turned(update_rule: str) -> None:
    """From the same model, sure of a boundary that then turned a quarter circle, the paper's
    loss barely moves (the labels it gets wrong are confidently wrong: its slope is gone)
    while the tail learns the new boundary within a few hundred labels."""
    rng = np.random.default_rng(5)
    X = np.c_[rng.normal(size=(1800, 2)), np.ones(1800)]
    y = np.where(np.arange(1800) < 1500, np.sign(X[:, 0]), np.sign(X[:, 1])).astype(int)
    paper = DSOL(n_features=3, cost=0.25, update_rule=update_rule)
    for x, label in zip(X[:1500], y[:1500], strict=True):
        paper.update(x, int(label))
    record = paper.to_state()
    tailed = DSOL.from_state({**record, "params": {**record["params"], "tail": 2.0}})
    risks = {}
    for name, model in (("paper", paper), ("tail", tailed)):
        losses = []
        for x, label in zip(X[1500:], y[1500:], strict=True):
            d = model.decide(x, coin=0.5)
            losses.append(float(d.label * label < 0) + 0.25 * float(d.label == 0))
            model.update(x, int(label))
        risks[name] = float(np.mean(losses[100:]))
    assert risks["tail"] < 0.1 < 0.3 < risks["paper"]


@pytest.mark.parametrize("bad", [-1.0, "2", None, True, math.nan, 1e300])
def test_a_record_with_a_bad_tail_is_refused(bad: object) -> None:
    """A record read from the models topic is input: a tail out of range or not a number
    is a StateError, never a learner."""
    from service.learning import StateError
    from service.learning.registry import learner_from_state

    record = DSOL(n_features=2, cost=0.25, tail=1.0).to_state()
    with pytest.raises(StateError, match="tail"):
        learner_from_state({**record, "params": {**record["params"], "tail": bad}})
