r"""Kernel DSAL and DSOL: the double sigmoid rule on a bounded support set, asked with
probability $p$ or always (the paper's appendix; the kernel, the budget and the defaults:
:mod:`service.learning.kernel.learner`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ..base import check_param
from ..rules import DoubleSigmoidRule, FullLabelRule
from ..schedules import DEFAULT_GAMMA, Schedule
from .defaults import default_kernel_ds_eta
from .kernels import Kernel
from .learner import DEFAULT_BUDGET, DEFAULT_RHO_CAP, KernelLearner

__all__ = ["KernelDSAL", "KernelDSOL"]


class KernelDSAL(DoubleSigmoidRule, KernelLearner):
    r"""Kernel DSAL (appendix): Bernoulli($p$) queries, double sigmoid gradient.

    Parameters as :class:`KernelDRAL`, plus ``gamma`` (sigmoid slope $\gamma$) and ``tail``
    (the weight of a logistic term in the loss; both with defaults as
    :class:`~service.learning.linear.dsal.DSAL`); the default ``eta`` is
    :func:`~service.learning.kernel.defaults.default_kernel_ds_eta`, the constant
    $5/(\gamma^2 (K(x, x) + 1))$ at $\|x\|^2 = n$.

    >>> KernelDSAL(n_features=5, cost=0.25, kernel="polynomial").eta   # (5 + 1)^2 = 36
    Constant(eta=0.13513513513513514)

    >>> learner = KernelDSAL(n_features=2, cost=0.25, kernel={"kind": "rbf", "gamma": 0.5})
    >>> learner.decide([0.0, 0.0], coin=0.0).query   # f = 0, rho = 1: p = 4 s (1 - s) > 0
    True
    """

    algorithm: ClassVar[str] = "kernel-dsal"
    param_names: ClassVar[tuple[str, ...]] = (
        "n_features",
        "cost",
        "gamma",
        "tail",
        "kernel",
        "budget",
        "eta",
        "rho_cap",
        "seed",
    )
    __slots__ = ("gamma", "tail")

    gamma: float
    tail: float

    def __init__(
        self,
        n_features: int,
        cost: float,
        *,
        gamma: float = DEFAULT_GAMMA,
        tail: float = 0.0,
        kernel: Kernel | Mapping[str, Any] | str | None = None,
        budget: int | None = DEFAULT_BUDGET,
        eta: float | Schedule | Mapping[str, Any] | None = None,
        rho: float = 1.0,
        rho_cap: float | None = DEFAULT_RHO_CAP,
        seed: int | None = 0,
    ) -> None:
        self.gamma = check_param("gamma", gamma)  # first: the default step depends on it
        self.tail = check_param("tail", tail)
        super().__init__(
            n_features,
            cost,
            eta=eta,
            kernel=kernel,
            budget=budget,
            rho=rho,
            rho_cap=rho_cap,
            seed=seed,
        )

    def _default_eta(self) -> Schedule:
        return default_kernel_ds_eta(self.kernel, self.n_features, self.gamma)


class KernelDSOL(FullLabelRule, KernelDSAL):
    """Kernel DSOL: Kernel DSAL's update on every example (``p = 1``).

    >>> KernelDSOL(n_features=1, cost=0.1).decide([3.0]).query_probability
    1.0
    """

    algorithm: ClassVar[str] = "kernel-dsol"
    __slots__ = ()
