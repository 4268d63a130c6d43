r"""Kernels $K(s, x)$ for the kernel learners, as small frozen JSON-safe configs.

* :class:`LinearKernel` — $K(s, x) = s \cdot x$ (the kernel learners then match the
  linear ones, up to rounding).
* :class:`PolynomialKernel` — $K(s, x) = (\gamma_k\, s \cdot x + c_0)^p$.
* :class:`RBFKernel` — $K(s, x) = \exp(-\gamma_k \|s - x\|^2)$, with
  $\|s - x\|^2 = \|s\|^2 - 2 s \cdot x + \|x\|^2$ (clipped at 0 against rounding).
* :class:`ScaledRBFKernel` — an RBF kernel whose width follows the data:
  $\gamma_k = c / \sum_j \widehat{\operatorname{Var}}(x_j)$ over the examples the learner has
  learnt from (scikit-learn's ``gamma="scale"``; $1/n$ for $n$ standardised features).
  The kernel learners' default.

``diagonal(x_sq)`` is $K(x, x)$ for an ``x`` with $\|x\|^2$ = ``x_sq`` (every kernel here
depends on $x$ only through $\|x\|^2$ there); the kernel learners' default step uses it.

``values(S, x, s_sq, x_sq)`` evaluates $K(s_i, x)$ for every row $s_i$ of ``S``;
``s_sq``/``x_sq`` are the squared norms (only the RBF kernel reads them). ``x`` may also
be a matrix ``X.T`` of shape ``(d, m)`` (with ``x_sq`` of shape ``(m,)``): the result is
then the ``(len(S), m)`` matrix of kernel values.

>>> import numpy as np
>>> S = np.array([[1.0, 0.0], [0.0, 2.0]]); x = np.array([1.0, 1.0])
>>> RBFKernel(gamma=0.5).values(S, x, (S * S).sum(1), 2.0).round(4).tolist()
[0.6065, 0.3679]
>>> kernel_from_config({"kind": "polynomial", "degree": 2, "gamma": 1.0, "coef0": 1.0})
PolynomialKernel(degree=2, gamma=1.0, coef0=1.0)
>>> PolynomialKernel().diagonal(5.0), RBFKernel(0.2).diagonal(5.0), LinearKernel().diagonal(5.0)
(36.0, 1.0, 5.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

import numpy as np

from ..base import check_int, check_param
from ..errors import HyperparameterError
from ..losses import FloatArray

__all__ = [
    "Kernel",
    "LinearKernel",
    "PolynomialKernel",
    "RBFKernel",
    "ScaledRBFKernel",
    "kernel_from_config",
    "rbf_values",
]


@dataclass(frozen=True, slots=True)
class LinearKernel:
    r"""$K(s, x) = s \cdot x$."""

    kind: ClassVar[str] = "linear"

    def diagonal(self, x_sq: float) -> float:
        r"""$K(x, x) = \|x\|^2$."""
        return float(x_sq)

    def values(
        self, S: FloatArray, x: FloatArray, s_sq: FloatArray, x_sq: float | FloatArray
    ) -> FloatArray:
        out: FloatArray = S @ x
        return out

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind}


@dataclass(frozen=True, slots=True)
class PolynomialKernel:
    r"""$K(s, x) = (\gamma_k\, s \cdot x + c_0)^p$ with integer degree $p \ge 1$."""

    kind: ClassVar[str] = "polynomial"
    degree: int = 2
    gamma: float = 1.0
    coef0: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "degree", check_int("degree", self.degree, 1))
        if self.degree > 10:
            raise HyperparameterError(f"degree must be <= 10, got {self.degree}")
        object.__setattr__(self, "gamma", check_param("kernel_gamma", self.gamma))
        object.__setattr__(self, "coef0", check_param("coef0", self.coef0))

    def diagonal(self, x_sq: float) -> float:
        r"""$K(x, x) = (\gamma_k \|x\|^2 + c_0)^p$."""
        return float((self.gamma * x_sq + self.coef0) ** self.degree)

    def values(
        self, S: FloatArray, x: FloatArray, s_sq: FloatArray, x_sq: float | FloatArray
    ) -> FloatArray:
        out: FloatArray = S @ x
        out *= self.gamma
        out += self.coef0
        return out**self.degree

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "degree": self.degree, "gamma": self.gamma, "coef0": self.coef0}


@dataclass(frozen=True, slots=True)
class RBFKernel:
    r"""$K(s, x) = \exp(-\gamma_k \|s - x\|^2)$, bounded by 1."""

    kind: ClassVar[str] = "rbf"
    gamma: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "gamma", check_param("kernel_gamma", self.gamma))

    def diagonal(self, x_sq: float) -> float:
        r"""$K(x, x) = 1$ for every $x$."""
        return 1.0

    def values(
        self, S: FloatArray, x: FloatArray, s_sq: FloatArray, x_sq: float | FloatArray
    ) -> FloatArray:
        return rbf_values(S, x, s_sq, x_sq, self.gamma)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "gamma": self.gamma}


def rbf_values(
    S: FloatArray, x: FloatArray, s_sq: FloatArray, x_sq: float | FloatArray, gamma: float
) -> FloatArray:
    r"""$\exp(-\gamma_k \|s_i - x\|^2)$ for the rows $s_i$ of ``S`` (see the module doc)."""
    d2: FloatArray = S @ x
    d2 *= -2.0
    d2 += s_sq if x.ndim == 1 else s_sq[:, None]
    d2 += x_sq
    np.maximum(d2, 0.0, out=d2)
    d2 *= -gamma
    return np.exp(d2, out=d2)


@dataclass(frozen=True, slots=True)
class ScaledRBFKernel:
    r"""RBF kernel with a data-driven width $\gamma_k = c / V$, $V = \sum_j
    \widehat{\operatorname{Var}}(x_j)$ (``factor`` $= c$, default 1).

    $\mathbb{E}\|x - x'\|^2 = 2V$, so a typical pair of examples has
    $K \approx e^{-2c}$ whatever the scale of the features: no width to tune, and
    standardised features get the former default $1/n$. The learner keeps $V$ (a running
    variance over the examples it learnt from) and evaluates :meth:`values_at`; ``values``
    is the kernel at $V = 1$. While $V = 0$ (one example, or all equal) the learner uses
    the squared norm of their mean instead (it scales like $V$), and ``n_features`` before
    any example or for the zero vector.

    >>> ScaledRBFKernel().gamma_at(4.0)
    0.25
    """

    kind: ClassVar[str] = "rbf-scale"
    factor: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "factor", check_param("kernel_gamma", self.factor))

    def gamma_at(self, total_variance: float) -> float:
        r"""$\gamma_k = c / V$ for data of total variance $V > 0$ (at most $10^{300}$)."""
        return min(self.factor / total_variance, 1e300)

    def values_at(
        self,
        total_variance: float,
        S: FloatArray,
        x: FloatArray,
        s_sq: FloatArray,
        x_sq: float | FloatArray,
    ) -> FloatArray:
        """``values`` of the RBF kernel with the width for total variance $V$."""
        return rbf_values(S, x, s_sq, x_sq, self.gamma_at(total_variance))

    def diagonal(self, x_sq: float) -> float:
        r"""$K(x, x) = 1$ for every $x$."""
        return 1.0

    def values(
        self, S: FloatArray, x: FloatArray, s_sq: FloatArray, x_sq: float | FloatArray
    ) -> FloatArray:
        return self.values_at(1.0, S, x, s_sq, x_sq)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "factor": self.factor}


Kernel: TypeAlias = LinearKernel | PolynomialKernel | RBFKernel | ScaledRBFKernel
_KINDS: dict[str, type[Kernel]] = {
    "linear": LinearKernel,
    "polynomial": PolynomialKernel,
    "rbf": RBFKernel,
    "rbf-scale": ScaledRBFKernel,
}


def kernel_from_config(config: Kernel | Mapping[str, Any] | str) -> Kernel:
    """A kernel from an instance, a name (default parameters) or a ``to_config()`` dict."""
    if isinstance(config, (LinearKernel, PolynomialKernel, RBFKernel, ScaledRBFKernel)):
        return config
    if isinstance(config, str):
        config = {"kind": config}
    if not isinstance(config, Mapping):
        raise HyperparameterError(f"kernel must be a kernel, a name or a config, got {config!r}")
    kind = config.get("kind")
    if kind not in _KINDS:
        raise HyperparameterError(f"unknown kernel {kind!r}; expected one of {sorted(_KINDS)}")
    params = {k: v for k, v in config.items() if k != "kind"}
    try:
        return _KINDS[str(kind)](**params)
    except TypeError as exc:
        raise HyperparameterError(f"bad parameters for kernel {kind!r}: {exc}") from exc
