r"""Change detectors over a stream of numbers (a model's losses or margins on its labels).

Both detectors read one value at a time with :meth:`update`, which returns whether a
change was detected at that value; after a detection the next :meth:`update` starts the
detector afresh (the convention of River's ``drift`` module, whose ``ADWIN`` and
``PageHinkley`` give the same detections on the same sequences, see
``tests/learning/test_drift.py``). Their state is a versioned, JSON-safe record
(``"format": "abstain.drift-detector"``) that rebuilds a detector with the same future.

* :class:`ADWIN` — adaptive windowing (Bifet & Gavaldà, 2007, "ADWIN2"): keeps the
  values since the last change in exponential histograms (at most ``max_buckets`` buckets
  of each size $2^i$) and, every ``clock`` values, cuts the window into an older part $W_0$
  and a recent part $W_1$ at every bucket boundary; a change is detected when

  .. math::

      |\hat\mu_0 - \hat\mu_1| > \sqrt{2\,m\,\hat\sigma^2\,\delta'} + \tfrac23\,\delta'\,m,
      \qquad \delta' = \ln\frac{2 \ln |W|}{\delta},\quad
      m = \frac{1}{n_0 - \ell + 1} + \frac{1}{n_1 - \ell + 1},

  with $\hat\sigma^2$ the variance of the whole window and $\ell$ = ``min_window_length``
  (both parts need at least $\ell$ values). The oldest bucket is dropped while a cut holds.
  Besides the detection it tells where the change is: :attr:`ADWIN.recent` is the number
  of latest values after the best split of the window (largest
  $n_0 n_1 (\hat\mu_0 - \hat\mu_1)^2$ over the bucket boundaries) and
  :attr:`ADWIN.rising` whether the recent values' mean is the higher one.
* :class:`PageHinkley` — the Page-Hinkley test (Page, 1954) on deviations from the running
  mean $\bar x_t$: $U_t = \alpha U_{t-1} + (x_t - \bar x_t - \delta)$ and
  $D_t = \alpha D_{t-1} + (x_t - \bar x_t + \delta)$; an increase is detected when
  $U_t - \min_s U_s > \lambda$, a decrease when $\max_s D_s - D_t > \lambda$ (``mode``
  ``"up"``, ``"down"`` or ``"both"``), once ``min_instances`` values were seen.

>>> adwin = ADWIN(clock=1)
>>> flags = [adwin.update(0.1 if t < 300 else 0.9) for t in range(400)]
>>> flags.index(True), adwin.rising, adwin.detections
(313, True, 1)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Final

import numpy as np

from . import state as st
from .base import check_int
from .errors import HyperparameterError, InputError, StateError

__all__ = ["ADWIN", "DRIFT_FORMAT", "PageHinkley", "detector_from_state"]

DRIFT_FORMAT: Final = "abstain.drift-detector"


def _real(name: str, value: Any, low: float, high: float, *, open_low: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HyperparameterError(f"{name} must be a number, got {value!r}")
    v = float(value)
    above = v > low if open_low else v >= low
    if not (math.isfinite(v) and above and v <= high):
        left = "(" if open_low else "["
        raise HyperparameterError(f"{name} must be in {left}{low:g}, {high:g}], got {value!r}")
    return v


def _value(x: Any) -> float:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise InputError(f"a detector reads numbers, got {x!r}")
    v = float(x)
    if not math.isfinite(v):
        raise InputError(f"a detector reads finite numbers, got {x!r}")
    return v


def _record(kind: str, params: Mapping[str, Any], learned: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "format": DRIFT_FORMAT,
        "version": st.VERSION,
        "kind": kind,
        "params": dict(params),
        "learned": dict(learned),
    }


def _open(state: Any, kind: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    record = st.read_record(state, DRIFT_FORMAT)
    if record.get("kind") != kind:
        raise StateError(f"state is for detector {record.get('kind')!r}, not {kind!r}")
    return st.read_mapping(record, "params"), st.read_mapping(record, "learned")


def _float_rows(learned: Mapping[str, Any], key: str) -> list[list[float]]:
    rows = learned.get(key)
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise StateError(f"detector state field {key!r} must be a list of lists of numbers")
    out = []
    for row in rows:
        values = []
        for v in row:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise StateError(f"detector state field {key!r} holds a non-number {v!r}")
            values.append(float(v))
        out.append(values)
    return out


class ADWIN:
    """Adaptive windowing change detector (see the module docstring).

    Parameters
    ----------
    delta:
        Confidence $\\delta \\in (0, 1)$ of a cut (default 0.002, River's): smaller detects
        later and more surely.
    clock:
        Look for a cut every ``clock`` values (default 32, River's; 1 looks at every value,
        at a cost of $O(\\log |W|)$ per value).
    max_buckets:
        Buckets kept per size before two are merged (default 5).
    min_window_length:
        Fewest values on either side of a cut (default 5).
    grace_period:
        No cut is looked for until the window holds more than this many values (default 10).
    """

    kind: ClassVar[str] = "adwin"
    param_names: ClassVar[tuple[str, ...]] = (
        "delta",
        "clock",
        "max_buckets",
        "min_window_length",
        "grace_period",
    )
    __slots__ = (
        "clock",
        "delta",
        "grace_period",
        "max_buckets",
        "min_window_length",
        "_detected",
        "_detections",
        "_recent",
        "_rising",
        "_tick",
        "_total",
        "_totals",
        "_variance",
        "_variances",
        "_width",
    )

    def __init__(
        self,
        delta: float = 0.002,
        clock: int = 32,
        max_buckets: int = 5,
        min_window_length: int = 5,
        grace_period: int = 10,
    ) -> None:
        self.delta = _real("delta", delta, 0.0, 1.0)
        if self.delta >= 1.0:
            raise HyperparameterError(f"delta must be in (0, 1), got {delta!r}")
        self.clock = check_int("clock", clock, 1)
        self.max_buckets = check_int("max_buckets", max_buckets, 1)
        self.min_window_length = check_int("min_window_length", min_window_length, 1)
        self.grace_period = check_int("grace_period", grace_period, 0)
        self._detections = 0
        self._detected = False
        self._recent = 0
        self._rising = False
        self._clear()

    def _clear(self) -> None:
        # level i holds buckets of 2**i values, oldest first: totals and variances (sums of
        # squared deviations from the bucket's own mean)
        self._totals: list[list[float]] = [[]]
        self._variances: list[list[float]] = [[]]
        self._total = 0.0
        self._variance = 0.0
        self._width = 0
        self._tick = 0

    # -- what it knows -----------------------------------------------------------------
    @property
    def width(self) -> int:
        """Values in the current window."""
        return self._width

    @property
    def estimation(self) -> float:
        """Mean of the current window (0 when it is empty)."""
        return self._total / self._width if self._width else 0.0

    @property
    def variance(self) -> float:
        """Population variance of the current window (0 when it is empty)."""
        return self._variance / self._width if self._width else 0.0

    @property
    def detections(self) -> int:
        """Changes detected since the detector was built (kept across the restarts)."""
        return self._detections

    @property
    def drift_detected(self) -> bool:
        """Whether the last :meth:`update` detected a change."""
        return self._detected

    @property
    def recent(self) -> int:
        """At the last detection: how many of the latest values came after the change (the
        recent part of the split of the window that separates its means best)."""
        return self._recent

    @property
    def rising(self) -> bool:
        """At the last detection: whether the recent values' mean was above the older ones'."""
        return self._rising

    # -- updating ----------------------------------------------------------------------
    def update(self, x: float) -> bool:
        """Read one value; return whether a change is detected at it."""
        v = _value(x)
        if self._detected:
            self._clear()
            self._detected = False
        self._insert(v)
        self._detected = self._look()
        return self._detected

    def _insert(self, v: float) -> None:
        self._totals[0].append(v)
        self._variances[0].append(0.0)
        width = self._width + 1
        if width > 1:
            w = float(width)
            d = v - self._total / (w - 1.0)
            self._variance += (w - 1.0) * d * d / w
        self._width = width
        self._total += v
        self._compress()

    def _compress(self) -> None:
        level = 0
        cap = self.max_buckets + 1
        while len(self._totals[level]) == cap:
            size = float(1 << level)
            t0, t1 = self._totals[level][0], self._totals[level][1]
            v0, v1 = self._variances[level][0], self._variances[level][1]
            m0, m1 = t0 / size, t1 / size
            merged = v0 + v1 + size * 0.5 * (m0 - m1) * (m0 - m1)
            if level + 1 == len(self._totals):
                self._totals.append([])
                self._variances.append([])
            self._totals[level + 1].append(t0 + t1)
            self._variances[level + 1].append(merged)
            del self._totals[level][:2], self._variances[level][:2]
            level += 1

    def _drop_oldest(self) -> None:
        last = len(self._totals) - 1
        size = float(1 << last)
        u, var = self._totals[last][0], self._variances[last][0]
        mean = u / size
        self._width -= 1 << last
        self._total -= u
        w = float(self._width)
        rest = self._total / w
        self._variance -= var + size * w * (mean - rest) * (mean - rest) / (size + w)
        del self._totals[last][0], self._variances[last][0]
        if not self._totals[last] and last > 0:
            self._totals.pop()
            self._variances.pop()

    def _cut(self, n0: float, n1: float, gap: float, dprime: float, var: float) -> bool:
        """Whether the means of the two parts differ by more than the bound."""
        lw = float(self.min_window_length)
        m = 1.0 / (n0 - lw + 1.0) + 1.0 / (n1 - lw + 1.0)
        eps = math.sqrt(2.0 * m * var * dprime) + 2.0 / 3.0 * dprime * m
        return abs(gap) > eps

    def _look(self) -> bool:
        self._tick += 1
        if self._tick % self.clock or self._width <= self.grace_period:
            return False
        lw = self.min_window_length
        split = 0
        found = False
        again = True
        while again:
            again = False
            w = float(self._width)  # the window's size and variance hold for the whole scan
            dprime, var = math.log(2.0 * math.log(w) / self.delta), self._variance / w
            n0, n1 = 0.0, w
            u0, u1 = 0.0, self._total
            for level in range(len(self._totals) - 1, -1, -1):
                size = float(1 << level)
                row = self._totals[level]
                last = len(row) - 1
                for k, total in enumerate(row):
                    n0 += size
                    n1 -= size
                    u0 += total
                    u1 -= total
                    if level == 0 and k == last:
                        break
                    if n1 < lw or n0 < lw:
                        continue
                    gap = u0 / n0 - u1 / n1
                    if self._cut(n0, n1, gap, dprime, var):
                        if not found:  # where and which way, before any value is dropped
                            self._rising = gap < 0.0
                            split = self._best_split()
                        found = again = True
                        self._drop_oldest()
                        break
                if again or (level == 0):
                    break
        if found:
            self._detections += 1
            self._recent = split
        return found

    def _best_split(self) -> int:
        r"""Length of the recent part at the bucket boundary that best separates the window
        in two (largest $n_0 n_1 / n\,(\hat\mu_0 - \hat\mu_1)^2$)."""
        n0, n1 = 0.0, float(self._width)
        u0, u1 = 0.0, self._total
        best, where = -1.0, self._width
        for level in range(len(self._totals) - 1, -1, -1):
            size = float(1 << level)
            for total in self._totals[level]:
                n0 += size
                n1 -= size
                u0 += total
                u1 -= total
                if n1 <= 0.0:
                    break
                gap = u0 / n0 - u1 / n1
                score = n0 * n1 * gap * gap
                if score > best:
                    best, where = score, int(n1)
        return where

    # -- state -------------------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """Hyperparameters as JSON-safe values (the constructor's keywords)."""
        return {name: getattr(self, name) for name in self.param_names}

    def to_state(self) -> dict[str, Any]:
        """A versioned, JSON-safe record of the parameters and the window."""
        return _record(
            self.kind,
            self.get_params(),
            {
                "totals": [list(r) for r in self._totals],
                "variances": [list(r) for r in self._variances],
                "total": self._total,
                "variance": self._variance,
                "width": self._width,
                "tick": self._tick,
                "detections": self._detections,
                "detected": self._detected,
                "recent": self._recent,
                "rising": self._rising,
            },
        )

    @classmethod
    def from_state(cls, state: Any) -> ADWIN:
        """Rebuild a detector from :meth:`to_state` output (the same future detections)."""
        params, learned = _open(state, cls.kind)
        try:
            det = cls(**params)
        except (TypeError, ValueError) as exc:
            raise StateError(f"ADWIN state params are invalid: {exc}") from exc
        totals = _float_rows(learned, "totals")
        variances = _float_rows(learned, "variances")
        width = st.read_int(learned, "width")
        pairs = zip(totals, variances, strict=False)  # lengths compared first
        shape_ok = (
            len(totals) == len(variances) >= 1
            and all(len(a) == len(b) <= det.max_buckets for a, b in pairs)
            and sum(len(r) << i for i, r in enumerate(totals)) == width
        )
        if not shape_ok:
            raise StateError("ADWIN state buckets do not fit its width and max_buckets")
        det._totals, det._variances, det._width = totals, variances, width
        det._total = st.read_float(learned, "total")
        det._variance = st.read_float(learned, "variance")
        det._tick = st.read_int(learned, "tick")
        det._detections = st.read_int(learned, "detections")
        det._recent = st.read_int(learned, "recent")
        det._detected = _flag(learned, "detected")
        det._rising = _flag(learned, "rising")
        return det

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"ADWIN({params}, width={self._width}, detections={self._detections})"


def _flag(learned: Mapping[str, Any], key: str) -> bool:
    value = learned.get(key)
    if not isinstance(value, bool):
        raise StateError(f"detector state field {key!r} must be true or false, got {value!r}")
    return value


class PageHinkley:
    r"""Page-Hinkley test (see the module docstring).

    Parameters
    ----------
    min_instances:
        Values read (since the last restart) before a change may be detected (default 30).
    delta:
        Magnitude $\delta \ge 0$ of changes to ignore (default 0.005).
    threshold:
        $\lambda > 0$ (default 50).
    alpha:
        Forgetting factor $\alpha \in (0, 1]$ of the cumulative sums (default $1 - 10^{-4}$).
    mode:
        ``"up"`` (increases only), ``"down"`` or ``"both"`` (default).

    >>> ph = PageHinkley(threshold=5.0, mode="up")
    >>> flags = [ph.update(0.1 if t < 100 else 0.9) for t in range(200)]
    >>> flags.index(True)
    106
    """

    kind: ClassVar[str] = "page-hinkley"
    MODES: ClassVar[tuple[str, ...]] = ("up", "down", "both")
    param_names: ClassVar[tuple[str, ...]] = (
        "min_instances",
        "delta",
        "threshold",
        "alpha",
        "mode",
    )
    __slots__ = (
        "alpha",
        "delta",
        "min_instances",
        "mode",
        "threshold",
        "_count",
        "_detected",
        "_detections",
        "_down",
        "_max_down",
        "_mean",
        "_min_up",
        "_up",
    )

    def __init__(
        self,
        min_instances: int = 30,
        delta: float = 0.005,
        threshold: float = 50.0,
        alpha: float = 1 - 0.0001,
        mode: str = "both",
    ) -> None:
        self.min_instances = check_int("min_instances", min_instances, 1)
        self.delta = _real("delta", delta, 0.0, 1e12, open_low=False)
        self.threshold = _real("threshold", threshold, 0.0, 1e12)
        self.alpha = _real("alpha", alpha, 0.0, 1.0)
        if mode not in self.MODES:
            raise HyperparameterError(f"mode must be one of {self.MODES}, got {mode!r}")
        self.mode = mode
        self._detections = 0
        self._detected = False
        self._clear()

    def _clear(self) -> None:
        self._count = 0
        self._mean = 0.0
        self._up = 0.0
        self._down = 0.0
        self._min_up = math.inf
        self._max_down = -1.0  # as River starts it: the first deviation replaces it

    @property
    def detections(self) -> int:
        """Changes detected since the detector was built."""
        return self._detections

    @property
    def drift_detected(self) -> bool:
        """Whether the last :meth:`update` detected a change."""
        return self._detected

    def update(self, x: float) -> bool:
        """Read one value; return whether a change is detected at it."""
        v = _value(x)
        if self._detected:
            self._clear()
            self._detected = False
        self._count += 1
        self._mean += (1.0 / self._count) * (v - self._mean)
        dev = v - self._mean
        self._up = self.alpha * self._up + dev - self.delta
        self._down = self.alpha * self._down + dev + self.delta
        self._min_up = min(self._min_up, self._up)
        self._max_down = max(self._max_down, self._down)
        if self._count < self.min_instances:
            return False
        up = self._up - self._min_up > self.threshold
        down = self._max_down - self._down > self.threshold
        hit = {"up": up, "down": down, "both": up or down}[self.mode]
        if hit:
            self._detections += 1
        self._detected = hit
        return hit

    def get_params(self) -> dict[str, Any]:
        """Hyperparameters as JSON-safe values (the constructor's keywords)."""
        return {name: getattr(self, name) for name in self.param_names}

    def to_state(self) -> dict[str, Any]:
        """A versioned, JSON-safe record (``min_up`` is ``null`` before the first value)."""
        return _record(
            self.kind,
            self.get_params(),
            {
                "count": self._count,
                "mean": self._mean,
                "up": self._up,
                "down": self._down,
                "min_up": None if math.isinf(self._min_up) else self._min_up,
                "max_down": self._max_down,
                "detections": self._detections,
                "detected": self._detected,
            },
        )

    @classmethod
    def from_state(cls, state: Any) -> PageHinkley:
        """Rebuild a detector from :meth:`to_state` output."""
        params, learned = _open(state, cls.kind)
        try:
            det = cls(**params)
        except (TypeError, ValueError) as exc:
            raise StateError(f"Page-Hinkley state params are invalid: {exc}") from exc
        det._count = st.read_int(learned, "count")
        det._mean = st.read_float(learned, "mean")
        det._up = st.read_float(learned, "up")
        det._down = st.read_float(learned, "down")
        low = st.read_optional_float(learned, "min_up")
        det._min_up = math.inf if low is None else low
        det._max_down = st.read_float(learned, "max_down")
        det._detections = st.read_int(learned, "detections")
        det._detected = _flag(learned, "detected")
        return det

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"PageHinkley({params}, detections={self._detections})"


_DETECTORS: dict[str, Any] = {"adwin": ADWIN, "page-hinkley": PageHinkley}


def detector_from_state(state: Any) -> ADWIN | PageHinkley:
    """Rebuild whichever detector a state record holds."""
    record = st.read_record(state, DRIFT_FORMAT)
    kind = record.get("kind")
    if kind not in _DETECTORS:
        raise StateError(
            f"unknown change detector {kind!r} (known: {sorted(_DETECTORS)}); upgrade abstain "
            "to a release that knows it"
        )
    det: ADWIN | PageHinkley = _DETECTORS[str(kind)].from_state(record)
    return det
