r"""Step-size schedules $\eta_t$, as small JSON-safe objects.

``t`` is the learner's ``steps``: the number of labels it has absorbed so far (not the
number of events seen, so scoring never changes the step size). A schedule is called with
an ``int`` or with an integer array (the batched engine evaluates all rows at once).

* :class:`Constant` — $\eta_t = \eta$ (Algorithm 1 and 2 as printed).
* :class:`InverseTime` — $\eta_t = \eta_0 / (1 + t/\tau)$: "start with a small step and
  let it decrease after every trial" (the paper's experiments), without ever reaching 0.
* :class:`DSALTheory` — the constant $\eta = 5 / (\gamma^2 (R^2 + 1))$ of the paper's local
  regret theorem for DSAL ($R$ bounds $\|x\|$; keep its $\gamma$ equal to the learner's).

The learners' default steps are built from these in :mod:`service.learning.defaults`.

>>> InverseTime(eta0=1.0, tau=100.0)(100)
0.5
>>> schedule_from_config(InverseTime(1.0, 100.0).to_config()) == InverseTime(1.0, 100.0)
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias, overload, runtime_checkable

import numpy as np
import numpy.typing as npt

from .errors import HyperparameterError

__all__ = [
    "Constant",
    "DSALTheory",
    "InverseTime",
    "Schedule",
    "as_schedule",
    "schedule_from_config",
]

IntArray: TypeAlias = npt.NDArray[np.int64]


def _positive_finite(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise HyperparameterError(f"{name} must be a number, got {value!r}") from exc
    if not (math.isfinite(v) and v > 0.0):
        raise HyperparameterError(f"{name} must be finite and > 0, got {value!r}")
    return v


@runtime_checkable
class Schedule(Protocol):
    """What a learner needs from a step size: ``eta(t)`` and a JSON-safe config."""

    def __call__(self, t: int) -> float: ...

    def to_config(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Constant:
    r"""Constant step $\eta_t = \eta$.

    >>> Constant(0.5)(10), Constant(0.5).to_config()
    (0.5, {'kind': 'constant', 'eta': 0.5})
    """

    eta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "eta", _positive_finite("eta", self.eta))

    @overload
    def __call__(self, t: int) -> float: ...
    @overload
    def __call__(self, t: IntArray) -> float: ...
    def __call__(self, t: int | IntArray) -> float:
        return self.eta

    def to_config(self) -> dict[str, Any]:
        return {"kind": "constant", "eta": self.eta}


@dataclass(frozen=True, slots=True)
class InverseTime:
    r"""Inverse-time decay $\eta_t = \eta_0 / (1 + t / \tau)$: $\eta_0$ at first, half of it
    after $\tau$ labels, $\eta_0 \tau / t$ in the long run.

    >>> s = InverseTime(eta0=2.0, tau=10.0)
    >>> s(0), s(10), s(30)
    (2.0, 1.0, 0.5)
    >>> s(np.array([0, 10]))
    array([2., 1.])
    """

    eta0: float
    tau: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "eta0", _positive_finite("eta0", self.eta0))
        object.__setattr__(self, "tau", _positive_finite("tau", self.tau))

    @overload
    def __call__(self, t: int) -> float: ...
    @overload
    def __call__(self, t: IntArray) -> npt.NDArray[np.float64]: ...
    def __call__(self, t: int | IntArray) -> float | npt.NDArray[np.float64]:
        return self.eta0 / (1.0 + t / self.tau)

    def to_config(self) -> dict[str, Any]:
        return {"kind": "inverse-time", "eta0": self.eta0, "tau": self.tau}


@dataclass(frozen=True, slots=True)
class DSALTheory:
    r"""The paper's DSAL step $\eta = 5 / (\gamma^2 (R^2 + 1))$ ($= 1/\beta$ for the
    smoothness constant $\beta = \gamma^2 (R^2 + 1) / 5$ of $L_{ds}$), constant in $t$.

    >>> DSALTheory(gamma=1.0, radius=1.0)(0)
    2.5
    """

    gamma: float
    radius: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "gamma", _positive_finite("gamma", self.gamma))
        object.__setattr__(self, "radius", _positive_finite("radius", self.radius))

    @property
    def eta(self) -> float:
        return 5.0 / (self.gamma * self.gamma * (self.radius * self.radius + 1.0))

    @overload
    def __call__(self, t: int) -> float: ...
    @overload
    def __call__(self, t: IntArray) -> float: ...
    def __call__(self, t: int | IntArray) -> float:
        return self.eta

    def to_config(self) -> dict[str, Any]:
        return {"kind": "dsal-theory", "gamma": self.gamma, "radius": self.radius}


_KINDS: dict[str, tuple[type[Any], tuple[str, ...]]] = {
    "constant": (Constant, ("eta",)),
    "inverse-time": (InverseTime, ("eta0", "tau")),
    "dsal-theory": (DSALTheory, ("gamma", "radius")),
}


def schedule_from_config(config: Mapping[str, Any]) -> Schedule:
    """Rebuild a schedule from :meth:`to_config` output.

    >>> schedule_from_config({"kind": "constant", "eta": 0.1})
    Constant(eta=0.1)
    >>> schedule_from_config({"kind": "cosine"})
    Traceback (most recent call last):
    ...
    service.learning.errors.HyperparameterError: unknown step-size schedule kind 'cosine'; \
expected one of ['constant', 'dsal-theory', 'inverse-time']
    """
    if not isinstance(config, Mapping):
        raise HyperparameterError(f"a schedule config must be a mapping, got {config!r}")
    kind = config.get("kind")
    if kind not in _KINDS:
        raise HyperparameterError(
            f"unknown step-size schedule kind {kind!r}; expected one of {sorted(_KINDS)}"
        )
    cls, fields = _KINDS[str(kind)]
    extra = set(config) - {"kind", *fields}
    missing = [f for f in fields if f not in config]
    if extra or missing:
        raise HyperparameterError(
            f"schedule {kind!r} takes exactly {list(fields)}; "
            f"missing {missing}, unexpected {sorted(extra)}"
        )
    schedule: Schedule = cls(**{f: config[f] for f in fields})
    return schedule


def as_schedule(eta: float | Schedule | Mapping[str, Any]) -> Schedule:
    """Accept a number (constant step), one of this module's schedules or a schedule config.

    Only the schedules defined here are accepted, so every learner's state can name its
    schedule and be rebuilt from JSON.

    >>> as_schedule(0.25)
    Constant(eta=0.25)
    """
    if isinstance(eta, Mapping):
        return schedule_from_config(eta)
    if isinstance(eta, (Constant, InverseTime, DSALTheory)):
        return eta
    if isinstance(eta, bool):
        raise HyperparameterError(f"eta must be a number or a schedule, got {eta!r}")
    if isinstance(eta, (int, float, np.floating, np.integer)):
        return Constant(float(eta))
    raise HyperparameterError(f"eta must be a number or a schedule, got {eta!r}")
