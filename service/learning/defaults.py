r"""Default hyperparameters of the learners, and the replay evidence behind them.

A learner built without ``eta`` takes its step size from its width $n$ = ``n_features``
(every column it sees, the intercept included), because the best step scales like
$1/\|x\|^2$ and standardised features plus an intercept have $\|x\|^2 \approx n$
(``docs/replay/README.md``, "Step sizes"; sweeps in ``docs/replay/*/sweep.csv``):

========================  ===============================================================
learner                   default step $\eta_t$ ($t$ = labels absorbed)
========================  ===============================================================
DSAL, DSOL                $\dfrac{5}{\gamma^2 (n + 1)} \Big/ (1 + t/1000)$
DRAL                      $\dfrac{1.5}{n + 1} \Big/ (1 + t/1000)$
kernel DSAL, DSOL         $\dfrac{5}{\gamma^2 (\bar K + 1)}$, constant
kernel DRAL               $\dfrac{1.5}{\bar K + 1}$, constant
========================  ===============================================================

with $\bar K = K(x, x)$ at $\|x\|^2 = n$. The schedule a learner gets is stored in its
state like one given explicitly, so a learner rebuilt from its state keeps it even if these
rules change. Inputs scaled differently need an explicit ``eta``.

>>> default_ds_eta(69).eta0 == 5 / 70 and default_dral_eta(69).eta0 == 1.5 / 70
True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .base import check_int, check_param
from .kernels import Kernel, kernel_from_config
from .schedules import Constant, InverseTime

__all__ = [
    "DEFAULT_GAMMA",
    "DEFAULT_TAU",
    "default_dral_eta",
    "default_ds_eta",
    "default_kernel_dral_eta",
    "default_kernel_ds_eta",
]

DEFAULT_GAMMA: Final = 1.0
r"""Default sigmoid slope $\gamma$ (the replay sweeps: $\gamma \in \{0.5, 1, 2\}$ change
Phishing's risk by < 0.001; on Guide $\gamma = 2$ asks half the labels for a slightly
higher risk)."""

DEFAULT_TAU: Final = 1000.0
r"""Decay constant $\tau$ of the linear learners' default steps (labels until the step halves).

The replay sweeps (``docs/replay/*/sweep.csv``, $\tau \in \{100, 1000, 10000\}$) found 1000
best for DSAL/DSOL on Phishing and Guide; DRAL is less sensitive to it."""


def default_ds_eta(n_features: int, gamma: float = DEFAULT_GAMMA) -> InverseTime:
    r"""Default DSAL/DSOL step for a learner of width $n$ = ``n_features``:
    $\eta_t = \eta_0 / (1 + t/1000)$ with $\eta_0 = 5 / (\gamma^2 (n + 1))$.

    $\eta_0$ is the paper's DSAL theory step $5/(\gamma^2(R^2 + 1))$
    (:class:`~service.learning.schedules.DSALTheory`) with $R^2 = n$: $n$ counts every
    column the learner sees, the intercept included, and standardised features plus an
    intercept have $\|x\|^2 \approx n$. The replay (``docs/replay/README.md``, "Step
    sizes"; 20-run sweeps in ``docs/replay/*/sweep.csv``) found the best step scaling like
    $1/\|x\|^2$, with this value at the optimum on both datasets: DSAL's risk averaged
    over $d \in \{0.1, 0.25, 0.4\}$ is 0.0489 on Phishing ($n = 69$, $\eta_0 = 0.0714$;
    best of the sweep 0.0487) and 0.0408 on Guide ($n = 5$, $\eta_0 = 0.833$; best 0.0399),
    where the former fixed default 0.1 gave 0.0492 and 0.0546. $\tau = 1000$ was the
    best decay of $\{100, 1000, 10000\}$ for DSAL and DSOL on both.

    >>> default_ds_eta(5)                              # Guide: 4 features + intercept
    InverseTime(eta0=0.8333333333333334, tau=1000.0)
    >>> round(default_ds_eta(69).eta0, 4)              # Phishing: 68 features + intercept
    0.0714
    >>> default_ds_eta(4, gamma=2.0).eta0              # 5 / (4 * 5)
    0.25
    """
    n = check_int("n_features", n_features, 1)
    g = check_param("gamma", gamma)
    return InverseTime(eta0=5.0 / (g * g * (n + 1.0)), tau=DEFAULT_TAU)


def default_dral_eta(n_features: int) -> InverseTime:
    r"""Default DRAL step for a learner of width $n$ = ``n_features``:
    $\eta_t = \eta_0 / (1 + t/1000)$ with $\eta_0 = 1.5 / (n + 1)$.

    $n$ counts every column the learner sees, the intercept included. For standardised
    features plus an intercept $\|x\|^2 \approx n$, so one DRAL label moves $f$ on its own
    example by $\eta\, d\, \|x\|^2$ or $\eta (1-d) \|x\|^2$, about $1.5\, d$ or
    $1.5 (1-d)$: of the order of the ramps' unit width whatever the width of the data.
    The replay (``docs/replay/README.md``, "Step sizes"; 20-run sweeps in
    ``docs/replay/*/sweep.csv``) found the best DRAL step scaling like $1/n$ and smaller
    than DSAL's: the sweeps' risk, averaged over $d \in \{0.1, 0.25, 0.4\}$, is 0.0525 at
    $\eta_0 = 0.02 \approx 1.5/70$ on Phishing ($n = 69$) and 0.0470 at
    $\eta_0 = 0.3 \approx 1.5/6$ on Guide ($n = 5$), against 0.0552 and 0.0530 for the
    former fixed default 0.1. Larger steps lock some runs out (once every $|f|$ lies
    outside $[\rho - 1, \rho + 1]$ DRAL never asks again): with $\eta_0 = 5/(n+1)$,
    $\tau = 100$, 3 of 100 Guide runs at $d = 0.4$ ended far above the median (the worst
    at risk 0.65), while with this default the worst of 100 runs ends at 0.066 (Guide)
    and 0.069 (Phishing).

    >>> default_dral_eta(5)                      # Guide: 4 features + intercept
    InverseTime(eta0=0.25, tau=1000.0)
    >>> round(default_dral_eta(69).eta0, 4)      # Phishing: 68 features + intercept
    0.0214
    """
    n = check_int("n_features", n_features, 1)
    return InverseTime(eta0=1.5 / (n + 1.0), tau=DEFAULT_TAU)


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
    first (``docs/replay/README.md``, "Kernel learners"). On Guide (10 runs x 10,000
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
