"""Kernel reject-option learners with a bounded support set (the paper's appendix).

- :mod:`.kernels`: the kernels (linear, polynomial, RBF, and the data-scaled RBF);
- :mod:`.learner`: :class:`~.learner.KernelLearner`, what every kernel learner shares (the
  support set and its budget, the capped rho, the state record);
- :mod:`.dral`, :mod:`.dsal`: :class:`~.dral.KernelDRAL`, :class:`~.dsal.KernelDSAL` and
  :class:`~.dsal.KernelDSOL`;
- :mod:`.defaults`: their default steps (the linear rule with ``K(x, x)`` for ``|x|^2``).
"""

from .defaults import default_kernel_dral_eta, default_kernel_ds_eta
from .dral import KernelDRAL
from .dsal import KernelDSAL, KernelDSOL
from .kernels import (
    Kernel,
    LinearKernel,
    PolynomialKernel,
    RBFKernel,
    ScaledRBFKernel,
    kernel_from_config,
)
from .learner import DEFAULT_BUDGET, DEFAULT_RHO_CAP, KernelLearner

__all__ = [
    "DEFAULT_BUDGET",
    "DEFAULT_RHO_CAP",
    "Kernel",
    "KernelDRAL",
    "KernelDSAL",
    "KernelDSOL",
    "KernelLearner",
    "LinearKernel",
    "PolynomialKernel",
    "RBFKernel",
    "ScaledRBFKernel",
    "default_kernel_dral_eta",
    "default_kernel_ds_eta",
    "kernel_from_config",
]
