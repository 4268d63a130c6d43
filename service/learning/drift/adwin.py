r"""ADWIN, adaptive windowing (Bifet & Gavaldà, 2007, "ADWIN2"); see
:mod:`service.learning.drift` for the rule and the conventions shared with River.

>>> adwin = ADWIN(clock=1)
>>> flags = [adwin.update(0.1 if t < 300 else 0.9) for t in range(400)]
>>> flags.index(True), adwin.rising, adwin.recent, adwin.detections
(313, True, 14, 1)
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from .. import state as st
from ..base import check_int
from ..errors import HyperparameterError, StateError
from .detector import flag, float_rows, open_record, real, record, value

__all__ = ["ADWIN"]


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
        self.delta = real("delta", delta, 0.0, 1.0)
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
        v = value(x)
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

    def _look(self) -> bool:
        self._tick += 1
        if self._tick % self.clock or self._width <= self.grace_period:
            return False
        lw = self.min_window_length
        split = 0
        found = False
        again = True
        # the bound on the gap of the means of two parts (River's): m = 1/(n0 - lw + 1) +
        # 1/(n1 - lw + 1), eps = sqrt(2 m var dprime) + 2/3 dprime m. The running variance is a
        # difference of sums: once values are dropped from a window of equal values it can
        # come out a rounding error below zero; River's bound is then NaN and no comparison
        # with it holds: the same here, without taking the root of a negative number
        shift = 1.0 - float(lw)
        sqrt = math.sqrt
        while again:
            again = False
            w = float(self._width)  # the window's size and variance hold for the whole scan
            dprime, var = math.log(2.0 * math.log(w) / self.delta), self._variance / w
            if var < 0.0:  # no bound holds: no split cuts
                break
            third = 2.0 / 3.0 * dprime
            n0, n1 = 0.0, w
            u0, u1 = 0.0, self._total
            totals = self._totals
            for level in range(len(totals) - 1, -1, -1):
                size = float(1 << level)
                # the last value is no split (nothing after it)
                for total in totals[level] if level else totals[0][:-1]:
                    n0 += size
                    n1 -= size
                    u0 += total
                    u1 -= total
                    if n1 < lw or n0 < lw:
                        continue
                    gap = u0 / n0 - u1 / n1
                    m = 1.0 / (n0 + shift) + 1.0 / (n1 + shift)
                    if abs(gap) > sqrt(2.0 * m * var * dprime) + third * m:
                        if not found:  # where and which way, before any value is dropped
                            self._rising = gap < 0.0
                            split = self._best_split()
                        found = again = True
                        self._drop_oldest()
                        break
                if again:
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
        return record(
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
        params, learned = open_record(state, cls.kind)
        try:
            det = cls(**params)
        except (TypeError, ValueError) as exc:
            raise StateError(f"ADWIN state params are invalid: {exc}") from exc
        totals = float_rows(learned, "totals")
        variances = float_rows(learned, "variances")
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
        det._detected = flag(learned, "detected")
        det._rising = flag(learned, "rising")
        return det

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"ADWIN({params}, width={self._width}, detections={self._detections})"
