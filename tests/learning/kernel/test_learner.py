"""Kernel learners: the appendix algorithms with a bounded, oldest-first support set, a
data-scaled RBF width and a capped rejection width by default."""

from __future__ import annotations

import numpy as np
import pytest

from service.learning import (
    DRAL,
    DSAL,
    DSOL,
    HyperparameterError,
    KernelDRAL,
    KernelDSAL,
    KernelDSOL,
    learner_from_state,
)
from service.learning.kernel import DEFAULT_RHO_CAP

from ..strategies import noisy_stream

PAIRS = [(DRAL, KernelDRAL), (DSAL, KernelDSAL), (DSOL, KernelDSOL)]


@pytest.mark.parametrize(("linear_cls", "kernel_cls"), PAIRS)
def test_linear_kernel_without_budget_reproduces_the_linear_learner(
    linear_cls: type, kernel_cls: type
) -> None:
    X, y = noisy_stream(300, 3, seed=7)
    lin = linear_cls(n_features=3, cost=0.25, eta=0.3)
    # rho_cap=None: the appendix algorithm, which the linear learners are
    ker = kernel_cls(n_features=3, cost=0.25, eta=0.3, kernel="linear", budget=None, rho_cap=None)
    coins = np.random.default_rng(0).random(300)
    for x, label, u in zip(X, y, coins, strict=True):
        a, b = lin.decide(x, coin=u), ker.decide(x, coin=u)
        assert a.label == b.label
        assert a.query == b.query
        assert b.score == pytest.approx(a.score, rel=1e-9, abs=1e-9)
        if a.query:
            assert lin.update(x, label) == ker.update(x, label)
    assert ker.rho == pytest.approx(lin.rho, rel=1e-9, abs=1e-12)
    # w = sum_s a_s x_s
    support, coef = ker.support
    assert np.allclose(coef @ support, lin.w, rtol=1e-9, atol=1e-9)
    assert ker.weight_norm() == pytest.approx(float(np.linalg.norm(lin.w)), rel=1e-9)


def test_first_update_adds_a_support_example_with_coefficient_eta_d_y() -> None:
    learner = KernelDRAL(n_features=2, cost=0.2, eta=0.5, kernel="linear")
    assert learner.update([1.0, 2.0], -1) is True  # f = 0: first ramp
    support, coef = learner.support
    assert support.tolist() == [[1.0, 2.0]]
    assert coef.tolist() == [pytest.approx(0.5 * 0.2 * -1)]
    assert learner.rho == pytest.approx(1.0 - 0.5 * 0.2)


def test_a_label_that_moves_nothing_adds_no_support_example() -> None:
    learner = KernelDRAL(n_features=1, cost=0.2, eta=1.0, kernel="linear", rho=3.0, rho_cap=None)
    assert learner.update([1.0], 1) is False  # f = 0 is in neither ramp when rho = 3
    assert learner.n_support == 0
    assert learner.steps == 1


def test_budget_keeps_the_newest_examples_and_drops_the_oldest() -> None:
    learner = KernelDSOL(n_features=1, cost=0.25, eta=0.1, kernel="rbf", budget=3)
    for i in range(7):
        learner.update([float(i)], 1 if i % 2 else -1)
        assert learner.n_support == min(i + 1, 3)
    support, coef = learner.support
    assert support[:, 0].tolist() == [4.0, 5.0, 6.0]  # oldest first
    assert np.all(np.sign(coef) == [-1.0, 1.0, -1.0])  # a_s has the sign of y_s


def test_per_event_cost_is_bounded_by_the_budget() -> None:
    learner = KernelDSOL(n_features=2, cost=0.25, budget=5)
    X, y = noisy_stream(100, 2, seed=1)
    for x, label in zip(X, y, strict=True):
        learner.update(x, label)
    assert learner.n_support == 5
    assert len(learner.to_state()["learned"]["support"]) == 5


def test_unbounded_support_grows_past_the_initial_capacity() -> None:
    learner = KernelDSOL(n_features=2, cost=0.25, budget=None)
    X, y = noisy_stream(150, 2, seed=2)
    for x, label in zip(X, y, strict=True):
        learner.update(x, label)
    assert learner.n_support == 150
    clone = KernelDSOL.from_state(learner.to_state())
    assert clone.decide(X[0], coin=0.5) == learner.decide(X[0], coin=0.5)


def test_default_kernel_is_an_rbf_whose_width_follows_the_labelled_examples() -> None:
    learner = KernelDSAL(n_features=4, cost=0.25)
    assert learner.kernel.to_config() == {"kind": "rbf-scale", "factor": 1.0}
    assert learner.kernel_width == pytest.approx(1 / 4)  # before any data: 1 / n_features
    X = np.random.default_rng(0).normal(size=(200, 4)) * [1.0, 2.0, 3.0, 0.0]
    for x in X:
        learner.update(x, 1)
    assert learner.kernel_width == pytest.approx(1.0 / X.var(axis=0).sum(), rel=1e-9)
    assert KernelDSAL(n_features=4, cost=0.25, kernel="rbf").kernel_width is None


def test_default_kernel_learners_do_not_depend_on_the_scale_of_the_features() -> None:
    X, y = noisy_stream(400, 2, seed=3)
    coins = np.random.default_rng(1).random(400)
    for cls in (KernelDRAL, KernelDSAL, KernelDSOL):
        a, b = cls(n_features=2, cost=0.25), cls(n_features=2, cost=0.25)
        for x, label, u in zip(X, y, coins, strict=True):
            da, db = a.decide(x, coin=u), b.decide(x * 1000.0, coin=u)
            assert (da.label, da.query) == (db.label, db.query)
            assert db.score == pytest.approx(da.score, rel=1e-6, abs=1e-9)
            if da.query:
                a.update(x, label)
                b.update(x * 1000.0, label)
        assert b.rho == pytest.approx(a.rho, rel=1e-6)


def test_rho_never_exceeds_one_plus_the_cap_times_the_mean_score() -> None:
    # while f is ~0 (a fresh RBF model on spread-out data) the gradient keeps growing rho;
    # the cap keeps it at 1 + c * mean|f|
    X, y = noisy_stream(300, 3, seed=4, scale=10.0)
    capped = KernelDSOL(n_features=3, cost=0.1, kernel={"kind": "rbf", "gamma": 5.0})
    free = KernelDSOL(n_features=3, cost=0.1, kernel={"kind": "rbf", "gamma": 5.0}, rho_cap=None)
    mean_abs = 0.0
    for t, (x, label) in enumerate(zip(X, y, strict=True)):
        mean_abs += (abs(capped.decide(x).score) - mean_abs) / min(t + 1, 100)
        capped.update(x, label)
        free.update(x, label)
        assert capped.rho <= 1.0 + DEFAULT_RHO_CAP * mean_abs + 1e-12
    assert free.rho > 3.0 > capped.rho


def test_a_state_written_before_the_cap_existed_keeps_learning_without_it() -> None:
    learner = KernelDSAL(n_features=2, cost=0.25, kernel={"kind": "rbf", "gamma": 0.5})
    X, y = noisy_stream(50, 2, seed=5)
    for x, label in zip(X, y, strict=True):
        learner.update(x, label)
    state = learner.to_state()
    del state["params"]["rho_cap"]
    del state["learned"]["abs_score"], state["learned"]["width"]
    old = learner_from_state(state)
    assert old.rho_cap is None
    assert old.decide(X[0], coin=0.5) == learner.decide(X[0], coin=0.5)


def test_bad_rho_cap_is_refused() -> None:
    for bad in (-1.0, float("nan"), "2"):
        with pytest.raises(HyperparameterError, match="rho_cap"):
            KernelDSAL(n_features=2, cost=0.25, rho_cap=bad)  # type: ignore[arg-type]


def test_bad_budget_is_refused() -> None:
    for bad in (0, -1, 2.5, "10"):
        with pytest.raises(HyperparameterError, match="budget"):
            KernelDSAL(n_features=2, cost=0.25, budget=bad)  # type: ignore[arg-type]


def test_kernel_learner_separates_what_a_line_cannot() -> None:
    # y = +1 inside the unit circle, -1 outside: no linear rule beats the majority here
    rng = np.random.default_rng(5)
    X = rng.uniform(-2, 2, size=(3000, 2))
    y = np.where((X**2).sum(axis=1) < 2.0, 1.0, -1.0)
    learner = KernelDSOL(n_features=2, cost=0.25, kernel={"kind": "rbf", "gamma": 1.0}, budget=300)
    loss = 0.0
    for i, (x, label) in enumerate(zip(X, y, strict=True)):
        d = learner.decide(x)
        if i >= 2000:
            loss += 1.0 if d.label == -label else 0.25 if d.label == 0 else 0.0
        learner.update(x, label)
    majority = min(np.mean(y[2000:] > 0), np.mean(y[2000:] < 0))
    assert loss / 1000 < min(0.25, majority) - 0.05
