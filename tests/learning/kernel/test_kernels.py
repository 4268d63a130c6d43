"""Kernel functions and their configs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from service.learning import HyperparameterError
from service.learning.kernel import LinearKernel, PolynomialKernel, RBFKernel, kernel_from_config


def evaluate(kernel: object, S: np.ndarray, x: np.ndarray) -> np.ndarray:
    sq = np.array([float(s @ s) for s in S])
    return kernel.values(S, x, sq, float(x @ x))  # type: ignore[attr-defined]


S = np.array([[1.0, 2.0], [-1.0, 0.5], [0.0, 0.0]])
x = np.array([0.5, -1.0])


def test_linear_kernel_is_the_dot_product() -> None:
    assert evaluate(LinearKernel(), S, x).tolist() == [s @ x for s in S]


def test_polynomial_kernel_by_hand() -> None:
    k = PolynomialKernel(degree=3, gamma=0.5, coef0=2.0)
    expected = [(0.5 * float(s @ x) + 2.0) ** 3 for s in S]
    assert evaluate(k, S, x) == pytest.approx(expected, rel=1e-14)


def test_rbf_kernel_by_hand() -> None:
    k = RBFKernel(gamma=0.7)
    expected = [math.exp(-0.7 * float((s - x) @ (s - x))) for s in S]
    assert evaluate(k, S, x) == pytest.approx(expected, rel=1e-12)
    # K(x, x) = 1 even though the squared distance is computed from norms
    assert evaluate(k, x[None, :], x)[0] == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("kernel", [LinearKernel(), PolynomialKernel(2, 0.5, 1.0), RBFKernel(0.3)])
def test_matrix_form_matches_one_column_at_a_time(kernel: object) -> None:
    X = np.random.default_rng(0).normal(size=(4, 2))
    sq = np.array([float(s @ s) for s in S])
    matrix = kernel.values(S, X.T, sq, np.einsum("ij,ij->i", X, X))  # type: ignore[attr-defined]
    columns = np.stack([evaluate(kernel, S, row) for row in X], axis=1)
    assert np.allclose(matrix, columns, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    "kernel", [LinearKernel(), PolynomialKernel(4, 0.25, -1.0), RBFKernel(2.0)]
)
def test_configs_round_trip_through_json(kernel: object) -> None:
    config = json.loads(json.dumps(kernel.to_config()))  # type: ignore[attr-defined]
    assert kernel_from_config(config) == kernel


def test_names_give_default_kernels() -> None:
    assert kernel_from_config("rbf") == RBFKernel()
    assert kernel_from_config("linear") == LinearKernel()


@pytest.mark.parametrize(
    "config",
    [
        {"kind": "sigmoid"},
        {"kind": "rbf", "gamma": 0.0},
        {"kind": "rbf", "gamma": -1.0},
        {"kind": "polynomial", "degree": 0},
        {"kind": "polynomial", "degree": 2.5},
        {"kind": "polynomial", "degree": 50},
        {"kind": "rbf", "width": 1.0},
        42,
    ],
)
def test_bad_kernel_configs_are_refused(config: object) -> None:
    with pytest.raises(HyperparameterError):
        kernel_from_config(config)  # type: ignore[arg-type]
