"""What every learner shares: the :class:`Decision` record, declared hyperparameter bounds
and the cheap input checks of the hot path.

Bounds are declared once in :data:`BOUNDS` and checked by :func:`check_param`, so a bad
value always gets the same message, naming the parameter and its allowed range.

>>> check_param("cost", 0.25)
0.25
>>> check_param("cost", 0.5)
Traceback (most recent call last):
...
service.learning.errors.HyperparameterError: cost must be in (0, 0.5), got 0.5
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from .errors import DimensionError, HyperparameterError, InputError, LabelError, NonFiniteError

__all__ = [
    "BOUNDS",
    "Decision",
    "Interval",
    "check_coin",
    "check_int",
    "check_label",
    "check_param",
    "check_seed",
    "draw_queries",
    "draw_query",
    "features",
    "features_matrix",
    "quiet",
    "raise_non_finite",
]

F64: Final = np.dtype(np.float64)

quiet: Final = np.errstate(all="ignore")
"""Decorator: run a function with numpy's floating-point warnings off (thread-safe: the
setting is a context variable set per call). Used on the learners' public methods, which
check every result that matters for finiteness themselves and raise
:class:`~service.learning.errors.NonFiniteError` instead of warning."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What a learner says about one example.

    ``label`` is ``+1``, ``-1`` or ``0`` (reject); ``score`` is ``f(x)``; ``rho`` the
    rejection width used; ``query`` whether to ask for the true label and
    ``query_probability`` the probability ``p`` it was drawn with (DRAL: 1.0 or 0.0).
    """

    label: int
    score: float
    rho: float
    query: bool
    query_probability: float


@dataclass(frozen=True, slots=True)
class Interval:
    """A real interval; ``low_open``/``high_open`` exclude the end points."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low_open and not value > self.low:
            return False
        if not self.low_open and not value >= self.low:
            return False
        if self.high_open:
            return value < self.high
        return value <= self.high

    def __str__(self) -> str:
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        return f"{left}{self.low:g}, {self.high:g}{right}"


BOUNDS: Final[dict[str, Interval]] = {
    "cost": Interval(0.0, 0.5, low_open=True, high_open=True),
    "gamma": Interval(0.0, 1e6, low_open=True),
    "rho": Interval(0.0, 1e12),
    "kernel_gamma": Interval(0.0, 1e6, low_open=True),
    "coef0": Interval(-1e6, 1e6),
    "rho_cap": Interval(0.0, 1e6),
    "rho_eta_max": Interval(0.0, math.inf, low_open=True, high_open=True),
    "intercept_eta_min": Interval(0.0, math.inf, low_open=True, high_open=True),
    "tail": Interval(0.0, 1e6),
}
"""Declared bounds of the real-valued hyperparameters (name -> allowed interval)."""


def check_param(name: str, value: Any) -> float:
    """Return ``value`` as a float if it is a finite number inside ``BOUNDS[name]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise HyperparameterError(f"{name} must be a number, got {value!r}")
    v = float(value)
    interval = BOUNDS[name]
    if not math.isfinite(v) or v not in interval:
        raise HyperparameterError(f"{name} must be in {interval}, got {value!r}")
    return v


def check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as an int if it is an integer ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise HyperparameterError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise HyperparameterError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def check_seed(seed: Any) -> int | None:
    """A seed is ``None`` (fresh entropy) or an integer ``>= 0``."""
    return None if seed is None else check_int("seed", seed, 0)


def features(x: Any, n_features: int) -> npt.NDArray[np.float64]:
    """``x`` as a 1-D float64 array of length ``n_features`` (no copy when it already is).

    Finiteness is not checked here: the learners check the score ``w . x`` instead, which
    is NaN or infinite whenever ``x`` holds a NaN or an infinity.
    """
    if type(x) is not np.ndarray or x.dtype is not F64:
        try:
            x = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError(f"x must be a sequence of numbers: {exc}") from exc
    if x.shape != (n_features,):
        raise DimensionError(f"x must be a 1-D array of {n_features} features, got shape {x.shape}")
    return x  # type: ignore[no-any-return]


def features_matrix(X: Any, n_features: int) -> npt.NDArray[np.float64]:
    """``X`` as a 2-D float64 array with ``n_features`` columns."""
    if type(X) is not np.ndarray or X.dtype is not F64:
        try:
            X = np.asarray(X, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError(f"X must be a 2-D array of numbers: {exc}") from exc
    if X.ndim != 2 or X.shape[1] != n_features:
        raise DimensionError(
            f"X must be a 2-D array with {n_features} columns, got shape {X.shape}"
        )
    return X  # type: ignore[no-any-return]


def raise_non_finite(x: npt.NDArray[np.float64], what: str = "x") -> None:
    """Raise :class:`NonFiniteError` for a score that came out NaN or infinite."""
    if not np.isfinite(x).all():
        bad = np.flatnonzero(~np.isfinite(x.reshape(-1)))[:5].tolist()
        raise NonFiniteError(f"{what} holds NaN or infinite values (flat positions {bad})")
    raise NonFiniteError(f"the score w . {what} overflowed; rescale the features")


def check_label(y: Any) -> float:
    """``y`` as ``1.0`` or ``-1.0``; anything else raises :class:`LabelError`."""
    if isinstance(y, (int, float, np.integer, np.floating)) and not isinstance(y, bool):
        if y == 1:
            return 1.0
        if y == -1:
            return -1.0
    raise LabelError(f"y must be +1 or -1, got {y!r}")


def draw_query(p: float, coin: float | None, rng: np.random.Generator) -> bool:
    """Query with probability ``p``: ``coin < p`` for a caller's coin, else a draw from
    ``rng`` (made only when ``0 < p < 1``, so deterministic rules never consume one)."""
    if coin is None:
        return p >= 1.0 or (p > 0.0 and rng.random() < p)
    return check_coin(coin) < p


def draw_queries(probs: Any, coins: Any, rng: np.random.Generator) -> Any:
    """:func:`draw_query` for a batch, making the same draws as row-by-row calls."""
    if coins is None:
        queries = probs >= 1.0
        undecided = (probs > 0.0) & ~queries
        k = int(np.count_nonzero(undecided))
        if k == probs.shape[0]:
            queries = rng.random(k) < probs
        elif k:
            where = np.flatnonzero(undecided)
            queries[where] = rng.random(k) < probs[where]
        return queries
    u = np.asarray(coins, dtype=np.float64)
    if u.shape != probs.shape:
        raise DimensionError(f"coins must have shape {probs.shape}, got {u.shape}")
    if not ((u >= 0.0).all() and (u < 1.0).all()):
        raise InputError("coins must all be in [0, 1)")
    return u < probs


def check_coin(coin: Any) -> float:
    """A caller-supplied query coin: a uniform draw in ``[0, 1)``."""
    try:
        u = float(coin)
    except (TypeError, ValueError) as exc:
        raise InputError(f"coin must be a number in [0, 1), got {coin!r}") from exc
    if not 0.0 <= u < 1.0:
        raise InputError(f"coin must be in [0, 1), got {coin!r}")
    return u
