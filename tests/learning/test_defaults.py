"""Default step sizes: the documented rules, and learners built without ``eta`` use them."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as hst

from service.learning import (
    DRAL,
    DSAL,
    DSOL,
    HyperparameterError,
    KernelDRAL,
    KernelDSAL,
    KernelDSOL,
    make_learner,
)
from service.learning.kernel import default_kernel_dral_eta, default_kernel_ds_eta
from service.learning.schedules import (
    Constant,
    DSALTheory,
    InverseTime,
    default_dral_eta,
    default_ds_eta,
)

from .strategies import gammas

widths = hst.integers(min_value=1, max_value=5000)


@pytest.mark.parametrize(
    ("n", "ds_eta0", "dral_eta0"),
    [
        (69, 0.0714, 0.0214),  # Phishing: 68 features + intercept (the published figures)
        (5, 0.833, 0.25),  # Guide: 4 features + intercept
    ],
)
def test_defaults_equal_the_steps_of_the_published_replays(
    n: int, ds_eta0: float, dral_eta0: float
) -> None:
    assert default_ds_eta(n).eta0 == pytest.approx(ds_eta0, abs=5e-4)
    assert default_dral_eta(n).eta0 == pytest.approx(dral_eta0, abs=5e-4)
    assert default_ds_eta(n).tau == default_dral_eta(n).tau == 1000.0


@given(n=widths, gamma=gammas)
def test_ds_default_is_the_dsal_theory_step_at_r_squared_n_decaying_with_tau_1000(
    n: int, gamma: float
) -> None:
    eta = default_ds_eta(n, gamma)
    assert isinstance(eta, InverseTime)
    assert eta.eta0 == pytest.approx(5.0 / (gamma**2 * (n + 1)), rel=1e-12)
    assert eta.eta0 == pytest.approx(DSALTheory(gamma=gamma, radius=math.sqrt(n)).eta, rel=1e-12)
    assert eta(1000) == pytest.approx(eta.eta0 / 2, rel=1e-12)


@given(n=widths)
def test_dral_default_is_three_tenths_of_the_ds_default(n: int) -> None:
    eta = default_dral_eta(n)
    assert eta.eta0 == pytest.approx(1.5 / (n + 1), rel=1e-12)
    assert eta.eta0 == pytest.approx(0.3 * default_ds_eta(n).eta0, rel=1e-12)


@given(n=widths, gamma=gammas)
def test_learners_without_eta_take_the_default_of_their_width_and_gamma(
    n: int, gamma: float
) -> None:
    assert DRAL(n_features=n, cost=0.25).eta == default_dral_eta(n)
    assert DSAL(n_features=n, cost=0.25, gamma=gamma).eta == default_ds_eta(n, gamma)
    assert DSOL(n_features=n, cost=0.1, gamma=gamma).eta == default_ds_eta(n, gamma)
    assert make_learner("dsal", n_features=n, cost=0.4, gamma=gamma).eta == default_ds_eta(n, gamma)


def test_a_wider_learner_or_a_steeper_sigmoid_gets_a_smaller_step() -> None:
    assert DSAL(n_features=69, cost=0.25).eta(0) < DSAL(n_features=5, cost=0.25).eta(0)
    assert DSAL(n_features=5, cost=0.25, gamma=2.0).eta(0) == pytest.approx(
        DSAL(n_features=5, cost=0.25).eta(0) / 4
    )


@pytest.mark.parametrize(
    "eta",
    [0.3, Constant(0.3), InverseTime(0.5, 10.0), {"kind": "constant", "eta": 0.3}],
)
def test_an_explicit_eta_is_kept_as_given(eta: Any) -> None:
    expected = InverseTime(0.5, 10.0) if isinstance(eta, InverseTime) else Constant(0.3)
    for cls in (DRAL, DSAL, DSOL):
        assert cls(n_features=69, cost=0.25, eta=eta).eta == expected
    assert KernelDSAL(n_features=5, cost=0.25, eta=eta).eta == expected


@pytest.mark.parametrize(
    ("kernel", "n", "k_bar"),
    [
        ({"kind": "polynomial"}, 5, 36.0),  # (x . s + 1)^2 at ||x||^2 = 5 (Guide)
        ({"kind": "polynomial", "degree": 3, "gamma": 0.5, "coef0": 2.0}, 4, 64.0),
        ({"kind": "rbf", "gamma": 0.2}, 5, 1.0),
        ("rbf", 68, 1.0),
        ("linear", 69, 69.0),
    ],
)
def test_kernel_defaults_are_constant_and_scale_with_k_of_x_x(
    kernel: Any, n: int, k_bar: float
) -> None:
    ds = default_kernel_ds_eta(kernel, n)
    dral = default_kernel_dral_eta(kernel, n)
    assert isinstance(ds, Constant)
    assert isinstance(dral, Constant)
    assert ds.eta == pytest.approx(5.0 / (k_bar + 1.0), rel=1e-12)
    assert dral.eta == pytest.approx(1.5 / (k_bar + 1.0), rel=1e-12)
    assert default_kernel_ds_eta(kernel, n, gamma=2.0).eta == pytest.approx(ds.eta / 4)
    assert KernelDSAL(n_features=n, cost=0.25, kernel=kernel).eta == ds
    assert KernelDSOL(n_features=n, cost=0.25, kernel=kernel, gamma=0.5).eta == (
        default_kernel_ds_eta(kernel, n, gamma=0.5)
    )
    assert KernelDRAL(n_features=n, cost=0.25, kernel=kernel).eta == dral


def test_kernel_default_with_the_default_rbf_kernel() -> None:
    # no kernel given: RBF with gamma_k = 1 / n_features, for which K(x, x) = 1
    assert KernelDSAL(n_features=68, cost=0.25).eta == Constant(2.5)
    assert KernelDRAL(n_features=68, cost=0.25).eta == Constant(0.75)


def test_kernel_default_stays_positive_when_the_kernel_diagonal_is_negative() -> None:
    # (x . s - 10)^1 at ||x||^2 = 5 is -5: not a valid kernel there; the step uses K = 0
    kernel = {"kind": "polynomial", "degree": 1, "gamma": 1.0, "coef0": -10.0}
    assert default_kernel_ds_eta(kernel, 5) == Constant(5.0)
    assert default_kernel_dral_eta(kernel, 5) == Constant(1.5)


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (lambda: default_ds_eta(0), "n_features"),
        (lambda: default_ds_eta(5, gamma=0.0), "gamma"),
        (lambda: default_dral_eta(2.5), "n_features"),  # type: ignore[arg-type]
        (lambda: default_kernel_ds_eta("rbf", -1), "n_features"),
        (lambda: default_kernel_dral_eta("sigmoid", 5), "kernel"),
        (lambda: DSAL(n_features=5, cost=0.25, gamma=-1.0), "gamma"),
    ],
)
def test_bad_arguments_of_the_default_rules_are_named(call: Any, param: str) -> None:
    with pytest.raises(HyperparameterError, match=param):
        call()
