r"""Default steps of the kernel learners: the linear learners' rule
(:mod:`service.learning.schedules`, "Default steps") with $\|x\|^2$ replaced by
$K(x, x)$, held constant.

>>> default_kernel_ds_eta("rbf", 5), default_kernel_dral_eta("rbf", 5)
(Constant(eta=2.5), Constant(eta=0.75))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import check_int, check_param
from ..schedules import DEFAULT_GAMMA, Constant
from .kernels import Kernel, kernel_from_config

__all__ = ["default_kernel_dral_eta", "default_kernel_ds_eta"]


def _typical_diagonal(kernel: Kernel | Mapping[str, Any] | str, n_features: int) -> float:
    r"""$\bar K = K(x, x)$ at $\|x\|^2 = n$ (standardised features plus an intercept)."""
    n = check_int("n_features", n_features, 1)
    return max(kernel_from_config(kernel).diagonal(float(n)), 0.0)


def default_kernel_ds_eta(
    kernel: Kernel | Mapping[str, Any] | str, n_features: int, gamma: float = DEFAULT_GAMMA
) -> Constant:
    r"""Default step of kernel DSAL/DSOL: the constant $\eta = 5 / (\gamma^2 (\bar K + 1))$,
    with $\bar K = K(x, x)$ for $\|x\|^2 = n$ = ``n_features`` (standardised features plus
    an intercept): 1 for an RBF kernel, $(\gamma_k n + c_0)^p$ for a polynomial one.

    It is the paper's DSAL theory step $5/(\gamma^2(R^2 + 1))$ with $R^2 = K(x, x)$ (how
    much a unit coefficient on $x$ moves $f(x)$), as
    :func:`default_ds_eta` is with $R^2 = \|x\|^2$; constant, as
    in the theorem, because with a budget a decaying step loses the largest coefficients
    first (``docs/results/replay/index.md``, "Kernel learners"). On Guide (10 runs x 10,000
    trials, budget 1000; risk averaged over $d \in \{0.1, 0.25, 0.4\}$), polynomial kernel
    $(x \cdot s + 1)^2$ ($\bar K = 36$, $\eta = 0.135$): kernel DSAL 0.0422, DSOL 0.0556,
    against 0.0476 and 0.0582 with the constant 0.05 used before; RBF kernel with
    $\gamma_k = 1/n$ ($\eta = 2.5$): DSAL 0.0470, DSOL 0.0624, against 0.0522 and 0.0724
    with the former default $2.5/(1 + t/1000)$. The price, over 100 runs with the
    polynomial kernel: one run locks itself out at $d = 0.4$ (risk 0.347; kernel DRAL
    loses the same run); half this step avoids that but has a higher mean risk in the
    other five (kernel, $d$) cells.

    >>> default_kernel_ds_eta({"kind": "polynomial"}, 5).eta       # 5 / (36 + 1)
    0.13513513513513514
    >>> default_kernel_ds_eta("rbf", 5)                             # K(x, x) = 1
    Constant(eta=2.5)
    """
    g = check_param("gamma", gamma)
    return Constant(5.0 / (g * g * (_typical_diagonal(kernel, n_features) + 1.0)))


def default_kernel_dral_eta(kernel: Kernel | Mapping[str, Any] | str, n_features: int) -> Constant:
    r"""Default step of kernel DRAL: the constant $\eta = 1.5 / (\bar K + 1)$, with
    $\bar K$ as in :func:`default_kernel_ds_eta`.

    The linear DRAL rule (:func:`default_dral_eta`) with
    $\|x\|^2$ replaced by $K(x, x)$, held constant. On Guide (10 runs x 10,000 trials,
    budget 1000, risk averaged over the three costs) it gives 0.0419 with the polynomial
    kernel ($\eta = 0.041$; 0.0415 with the constant 0.05 used before, 0.0414 with twice
    this step) and 0.0426 with the RBF kernel $\gamma_k = 1/n$ ($\eta = 0.75$; 0.0388 with
    the former default $2.5/(1 + t/1000)$, 0.0393 with twice this step). It stays well
    below the constant 0.1 ($\approx 3.7/(\bar K + 1)$ for the polynomial kernel), with
    which runs lock themselves out as linear DRAL does with large steps (5 runs,
    $d = 0.4$: mean risk 0.109 against 0.046 with 0.05).

    >>> default_kernel_dral_eta("rbf", 68)
    Constant(eta=0.75)
    """
    return Constant(1.5 / (_typical_diagonal(kernel, n_features) + 1.0))
