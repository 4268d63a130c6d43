r"""The Page-Hinkley test (Page, 1954); see :mod:`service.learning.drift` for the rule and
the conventions shared with River.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from .. import state as st
from ..base import check_int
from ..errors import HyperparameterError, StateError
from .detector import flag, open_record, real, record, value

__all__ = ["PageHinkley"]


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
        self.delta = real("delta", delta, 0.0, 1e12, open_low=False)
        self.threshold = real("threshold", threshold, 0.0, 1e12)
        self.alpha = real("alpha", alpha, 0.0, 1.0)
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
        v = value(x)
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
        return record(
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
        params, learned = open_record(state, cls.kind)
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
        det._detected = flag(learned, "detected")
        return det

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"PageHinkley({params}, detections={self._detections})"
