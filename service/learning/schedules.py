r"""Step-size schedules $\eta_t$, as small JSON-safe objects.

``t`` is the learner's ``steps``: the number of labels it has absorbed so far (not the
number of events seen, so scoring never changes the step size). A schedule is called with
an ``int`` or with an integer array (the batched engine evaluates all rows at once).

* :class:`Constant` — $\eta_t = \eta$ (Algorithm 1 and 2 as printed).
* :class:`InverseTime` — $\eta_t = \eta_0 / (1 + t/\tau)$: "start with a small step and
  let it decrease after every trial" (the paper's experiments), without ever reaching 0.
* :class:`DSALTheory` — the constant $\eta = 5 / (\gamma^2 (R^2 + 1))$ of the paper's local
  regret theorem for DSAL ($R$ bounds $\|x\|$; keep its $\gamma$ equal to the learner's).

**Default steps**, and the replay evidence behind them. A learner built without ``eta``
takes its step size from its width $n$ = ``n_features`` (every column it sees, the
intercept included), because the best step scales like $1/\|x\|^2$ and standardised
features plus an intercept have $\|x\|^2 \approx n$ (``docs/results/replay/index.md``, "Step
sizes"; sweeps in ``loadtest/results/replay/*/sweep.csv``): :func:`default_ds_eta`,
:func:`default_dral_eta` and, for the kernel learners,
:mod:`service.learning.kernel.defaults`:

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
>>> InverseTime(eta0=1.0, tau=100.0)(100)
0.5
>>> schedule_from_config(InverseTime(1.0, 100.0).to_config()) == InverseTime(1.0, 100.0)
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeAlias, overload, runtime_checkable

import numpy as np
import numpy.typing as npt

from .base import check_int, check_param
from .errors import HyperparameterError

__all__ = [
    "DEFAULT_GAMMA",
    "DEFAULT_TAU",
    "Constant",
    "DSALTheory",
    "InverseTime",
    "Schedule",
    "as_schedule",
    "default_dral_eta",
    "default_ds_eta",
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


DEFAULT_GAMMA: Final = 1.0
r"""Default sigmoid slope $\gamma$ (the replay sweeps: $\gamma \in \{0.5, 1, 2\}$ change
Phishing's risk by < 0.001; on Guide $\gamma = 2$ asks half the labels for a slightly
higher risk)."""

DEFAULT_TAU: Final = 1000.0
r"""Decay constant $\tau$ of the linear learners' default steps (labels until the step halves).

The replay sweeps (``loadtest/results/replay/*/sweep.csv``,
$\tau \in \{100, 1000, 10000\}$) found 1000 best for DSAL/DSOL on Phishing and Guide; DRAL
is less sensitive to it."""


def default_ds_eta(n_features: int, gamma: float = DEFAULT_GAMMA) -> InverseTime:
    r"""Default DSAL/DSOL step for a learner of width $n$ = ``n_features``:
    $\eta_t = \eta_0 / (1 + t/1000)$ with $\eta_0 = 5 / (\gamma^2 (n + 1))$.

    $\eta_0$ is the paper's DSAL theory step $5/(\gamma^2(R^2 + 1))$
    (:class:`~service.learning.schedules.DSALTheory`) with $R^2 = n$: $n$ counts every
    column the learner sees, the intercept included, and standardised features plus an
    intercept have $\|x\|^2 \approx n$. The replay (``docs/results/replay/index.md``, "Step
    sizes"; 20-run sweeps in ``loadtest/results/replay/*/sweep.csv``) found the best step
    scaling like $1/\|x\|^2$, with this value at the optimum on both datasets: DSAL's risk averaged
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
    The replay (``docs/results/replay/index.md``, "Step sizes"; 20-run sweeps in
    ``loadtest/results/replay/*/sweep.csv``) found the best DRAL step scaling like $1/n$ and smaller
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
