r"""Kernels $K(s, x)$ for the kernel learners, as small frozen JSON-safe configs.

* :class:`LinearKernel` — $K(s, x) = s \cdot x$ (the kernel learners then match the
  linear ones, up to rounding).
* :class:`PolynomialKernel` — $K(s, x) = (\gamma_k\, s \cdot x + c_0)^p$.
* :class:`RBFKernel` — $K(s, x) = \exp(-\gamma_k \|s - x\|^2)$, with
  $\|s - x\|^2 = \|s\|^2 - 2 s \cdot x + \|x\|^2$ (clipped at 0 against rounding).

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

from .base import check_int, check_param
from .errors import HyperparameterError
from .losses import FloatArray

__all__ = ["Kernel", "LinearKernel", "PolynomialKernel", "RBFKernel", "kernel_from_config"]


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
        d2: FloatArray = S @ x
        d2 *= -2.0
        d2 += s_sq if x.ndim == 1 else s_sq[:, None]
        d2 += x_sq
        np.maximum(d2, 0.0, out=d2)
        d2 *= -self.gamma
        return np.exp(d2, out=d2)

    def to_config(self) -> dict[str, Any]:
        return {"kind": self.kind, "gamma": self.gamma}


Kernel: TypeAlias = LinearKernel | PolynomialKernel | RBFKernel
_KINDS: dict[str, type[Kernel]] = {
    "linear": LinearKernel,
    "polynomial": PolynomialKernel,
    "rbf": RBFKernel,
}


def kernel_from_config(config: Kernel | Mapping[str, Any] | str) -> Kernel:
    """A kernel from an instance, a name (default parameters) or a ``to_config()`` dict."""
    if isinstance(config, (LinearKernel, PolynomialKernel, RBFKernel)):
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
