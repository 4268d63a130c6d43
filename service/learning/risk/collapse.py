r"""Collapse detection: a model that rejects (nearly) everything while $\rho$ keeps growing.

How a reject-option learner collapses: while its decision function $f$ is still near 0,
every example lies inside the reject band $|f| \le \rho$, where the gradient of $L_{ds}$
(or of $L_{dr}$'s second ramp) grows $\rho$. Once $\rho$ outruns $|f|$ the model rejects
everything (risk $= d$), its gradients and DSAL's query probability shrink like
$e^{-\rho}$, and it stops learning. The kernel learners' defaults prevent this (see
:mod:`service.learning.kernel.learner`); :class:`CollapseWatch` tells when it happens
anyway, from the decisions alone, so a service can alert or rebuild the model.

Rule: decisions are counted in tumbling windows of ``window`` events. A window is
*collapsed* when it rejected at least ``reject_fraction`` of its events (default 95 %)
**and** $\rho$ grew over it by more than ``min_growth`` (default 0): a model that rejects
everything but holds $\rho$ still (e.g. a linear model on data it cannot separate, with its
$\rho$ at equilibrium) rejects for a reason and is reported as ``rejecting`` only.
:meth:`CollapseWatch.status` describes the last complete window (pure); the watch is a
few numbers, JSON-safe through ``to_state`` / ``from_state``.

>>> watch = CollapseWatch(window=4)
>>> watch.observe_many([0, 0, 0, 0], [1.0, 1.2, 1.4, 1.6])
>>> s = watch.status()
>>> s.collapsed, s.reject_fraction, round(s.rho_growth, 2), s.streak
(True, 1.0, 0.6, 1)
>>> watch.observe_many([1, 0, -1, 0], 1.6)       # predictions again: the next window is fine
>>> watch.status().collapsed, watch.status().streak
(False, 0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .. import state as st
from ..base import check_int
from ..errors import DimensionError, HyperparameterError, InputError, StateError

__all__ = ["CollapseStatus", "CollapseWatch"]


@dataclass(frozen=True, slots=True)
class CollapseStatus:
    """The verdict on the last complete window (``windows == 0``: none complete yet)."""

    collapsed: bool  # rejected >= reject_fraction and rho grew by more than min_growth
    rejecting: bool  # rejected >= reject_fraction (whatever rho did)
    reject_fraction: float  # of the last complete window (NaN before one)
    rho_growth: float  # rho at its last event minus rho at its first (NaN before one)
    streak: int  # consecutive collapsed windows, up to the last complete one
    windows: int  # complete windows seen


class CollapseWatch:
    """Watch a model's decisions for collapse (rule in the module docstring).

    Parameters: ``window`` (events per window, default 500), ``reject_fraction`` (in
    $(0, 1]$, default 0.95), ``min_growth`` ($\\ge 0$, default 0: any growth of $\\rho$).
    """

    kind: ClassVar[str] = "collapse-watch"
    __slots__ = (
        "min_growth",
        "reject_fraction",
        "window",
        "_count",
        "_last",
        "_rejected",
        "_rho_first",
        "_rho_last",
        "_streak",
        "_windows",
    )

    def __init__(
        self, *, window: int = 500, reject_fraction: float = 0.95, min_growth: float = 0.0
    ) -> None:
        self.window = check_int("window", window, 1)
        self.reject_fraction = _fraction(reject_fraction)
        if isinstance(min_growth, bool) or not isinstance(min_growth, (int, float)):
            raise HyperparameterError(f"min_growth must be a number, got {min_growth!r}")
        if not (math.isfinite(min_growth) and min_growth >= 0.0):
            raise HyperparameterError(f"min_growth must be finite and >= 0, got {min_growth!r}")
        self.min_growth = float(min_growth)
        self._count = 0
        self._rejected = 0
        self._rho_first = 0.0
        self._rho_last = 0.0
        self._windows = 0
        self._streak = 0
        self._last: tuple[float, float] | None = None  # (reject fraction, rho growth)

    def observe(self, label: int, rho: float) -> None:
        """One decision: its label (``0`` = reject) and the $\\rho$ it was made with."""
        self.observe_many([label], rho)

    def observe_many(self, labels: Any, rho: Any) -> None:
        """Decisions in order; ``rho`` is one width for all (a batch) or one per decision."""
        lab = np.asarray(labels)
        if lab.ndim != 1:
            raise DimensionError(f"labels must be a 1-D array, got shape {lab.shape}")
        rhos = np.broadcast_to(np.asarray(rho, dtype=np.float64), lab.shape)
        if rhos.shape != lab.shape:  # pragma: no cover - broadcast_to raises first
            raise DimensionError("rho must be one number or one per label")
        if not np.isfinite(rhos).all():
            raise InputError("rho must be finite")
        for is_reject, r in zip((lab == 0).tolist(), rhos.tolist(), strict=True):
            if self._count == 0:
                self._rho_first = r
            self._count += 1
            self._rejected += int(is_reject)
            self._rho_last = r
            if self._count == self.window:
                self._close()

    def _close(self) -> None:
        fraction = self._rejected / self._count
        growth = self._rho_last - self._rho_first
        self._last = (fraction, growth)
        collapsed = fraction >= self.reject_fraction and growth > self.min_growth
        self._streak = self._streak + 1 if collapsed else 0
        self._windows += 1
        self._count = 0
        self._rejected = 0

    def status(self) -> CollapseStatus:
        """The verdict on the last complete window (the watch is not changed)."""
        if self._last is None:
            return CollapseStatus(False, False, math.nan, math.nan, 0, 0)
        fraction, growth = self._last
        rejecting = fraction >= self.reject_fraction
        collapsed = rejecting and growth > self.min_growth
        return CollapseStatus(collapsed, rejecting, fraction, growth, self._streak, self._windows)

    def to_state(self) -> dict[str, Any]:
        """A versioned, JSON-safe record (``"format": "abstain.collapse-watch"``)."""
        return {
            "format": st.COLLAPSE_FORMAT,
            "version": st.VERSION,
            "params": {
                "window": self.window,
                "reject_fraction": self.reject_fraction,
                "min_growth": self.min_growth,
            },
            "learned": {
                "count": self._count,
                "rejected": self._rejected,
                "rho_first": self._rho_first,
                "rho_last": self._rho_last,
                "windows": self._windows,
                "streak": self._streak,
                "last": None if self._last is None else list(self._last),
            },
        }

    @classmethod
    def from_state(cls, state: Any) -> CollapseWatch:
        """Rebuild a watch from :meth:`to_state` output."""
        record = st.read_record(state, st.COLLAPSE_FORMAT)
        params, learned = st.read_mapping(record, "params"), st.read_mapping(record, "learned")
        try:
            watch = cls(**params)
        except (TypeError, ValueError) as exc:
            raise StateError(f"collapse-watch state params are invalid: {exc}") from exc
        watch._count = st.read_int(learned, "count")
        watch._rejected = st.read_int(learned, "rejected")
        if watch._count >= watch.window or watch._rejected > watch._count:
            raise StateError("collapse-watch state counts do not fit its window")
        watch._rho_first = st.read_float(learned, "rho_first")
        watch._rho_last = st.read_float(learned, "rho_last")
        watch._windows = st.read_int(learned, "windows")
        watch._streak = st.read_int(learned, "streak")
        last = learned.get("last")
        if last is not None:
            pair = st.read_floats(learned, "last", (2,))
            watch._last = (float(pair[0]), float(pair[1]))
        return watch

    def __repr__(self) -> str:
        return (
            f"CollapseWatch(window={self.window}, reject_fraction={self.reject_fraction}, "
            f"min_growth={self.min_growth}, windows={self._windows}, streak={self._streak})"
        )


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HyperparameterError(f"reject_fraction must be a number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and 0.0 < v <= 1.0):
        raise HyperparameterError(f"reject_fraction must be in (0, 1], got {value!r}")
    return v
