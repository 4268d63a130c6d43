r"""Kernel DRAL: the double ramp rule on a bounded support set (the paper's appendix; the
kernel, the budget and the defaults: :mod:`service.learning.kernel.learner`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from ..rules import DoubleRampRule
from ..schedules import Schedule
from .defaults import default_kernel_dral_eta
from .kernels import Kernel
from .learner import DEFAULT_BUDGET, DEFAULT_RHO_CAP, KernelLearner

__all__ = ["KernelDRAL"]


class KernelDRAL(DoubleRampRule, KernelLearner):
    r"""Kernel DRAL (appendix): deterministic queries on $\rho - 1 \le |f| \le \rho + 1$.

    Parameters: ``n_features``, ``cost`` ($d$), ``kernel`` (a kernel, a name or a config;
    default :class:`~service.learning.kernel.kernels.ScaledRBFKernel`, an RBF kernel whose width
    follows the variance of the examples learnt from), ``budget`` (default 1000, oldest
    removed first), ``eta`` (``None``, the default:
    :func:`~service.learning.kernel.defaults.default_kernel_dral_eta` of the kernel and
    ``n_features``, the constant $1.5/(K(x, x) + 1)$ at $\|x\|^2 = n$; stored in the
    state like a given step), ``rho`` (initial width 1), ``rho_cap`` ($c$ in
    $\rho \le 1 + c\,\bar m$, default 2; ``None``: no cap), ``seed``.

    >>> KernelDRAL(n_features=5, cost=0.25, kernel="rbf").eta
    Constant(eta=0.75)

    >>> learner = KernelDRAL(n_features=1, cost=0.25, kernel="linear", eta=1.0)
    >>> learner.update([2.0], +1), learner.n_support, learner.rho
    (True, 1, 0.75)
    >>> learner.decide([1.0]).score    # a_1 K(x_1, x) = (eta d y) (2 * 1)
    0.5
    """

    algorithm: ClassVar[str] = "kernel-dral"
    __slots__ = ()

    def __init__(
        self,
        n_features: int,
        cost: float,
        *,
        kernel: Kernel | Mapping[str, Any] | str | None = None,
        budget: int | None = DEFAULT_BUDGET,
        eta: float | Schedule | Mapping[str, Any] | None = None,
        rho: float = 1.0,
        rho_cap: float | None = DEFAULT_RHO_CAP,
        seed: int | None = 0,
    ) -> None:
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
        return default_kernel_dral_eta(self.kernel, self.n_features)
