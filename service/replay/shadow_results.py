"""What a shadow replay measured, and how it is written: ``shadow.json`` and ``shadow.csv``.

A :class:`Track` holds, for one model (the champion or a shadow), its values at evenly
spaced checkpoints ``t = T/G, 2T/G, ..., T`` of every run, shape ``(G, R)``:

* ``true``: its true running risk, the mean 0-d-1 loss of all its decisions up to ``t``
  (offline every label is known);
* ``estimate``, ``low``, ``high``: its importance-weighted estimate from the labels the
  champion asked for, Horvitz-Thompson over the ``t`` events, and its interval
  (:meth:`service.learning.RiskEstimate.interval`); ``ratio``, ``ratio_low``,
  ``ratio_high``: the ratio estimate (the stream envelope's ``risk``) and its interval;
* ``labels``: labels it was charged (the champion's, for every model);
* ``rejected``: its fraction of rejections up to ``t``.

Coverage is the fraction of (checkpoint, run) pairs whose interval holds the true risk,
among the checkpoints where the model had at least ``min_labels`` labels (and one).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from service.learning.risk.shadow import Estimator

#: what a :class:`Track` holds per checkpoint and run, in the order of the curves' columns
CURVES = (
    "true",
    "estimate",
    "low",
    "high",
    "ratio",
    "ratio_low",
    "ratio_high",
    "labels",
    "rejected",
)

__all__ = ["CURVES", "Role", "ShadowResult", "Track", "checkpoints"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Role = Literal["champion", "shadow"]


def checkpoints(trials: int, points: int) -> IntArray:
    """``points`` evenly spaced trial numbers ending at ``trials`` (fewer if ``trials`` is
    smaller).

    >>> checkpoints(1000, 4).tolist()
    [250, 500, 750, 1000]
    >>> checkpoints(3, 10).tolist()
    [1, 2, 3]
    """
    if trials < 1 or points < 1:
        raise ValueError(f"trials and points must be >= 1, got {trials} and {points}")
    grid = np.unique(np.rint(np.linspace(trials / points, trials, num=points)).astype(np.int64))
    return grid[grid >= 1]


@dataclass(frozen=True)
class Track:
    """One model's checkpoints over ``R`` runs (see the module docstring)."""

    name: str
    role: Role
    algorithm: str
    cost: float
    weighting: str | None  # how a shadow learned; None for the champion
    true: FloatArray
    estimate: FloatArray
    low: FloatArray
    high: FloatArray
    ratio: FloatArray
    ratio_low: FloatArray
    ratio_high: FloatArray
    labels: FloatArray
    rejected: FloatArray

    def covered(self, estimator: Estimator = "horvitz-thompson") -> npt.NDArray[np.bool_]:
        """``low <= true <= high`` per (checkpoint, run); False before the first label."""
        low, high = (
            (self.ratio_low, self.ratio_high) if estimator == "ratio" else (self.low, self.high)
        )
        out: npt.NDArray[np.bool_] = (low <= self.true) & (self.true <= high)
        return out

    def eligible(self, min_labels: int) -> npt.NDArray[np.bool_]:
        """Checkpoints that count for coverage: at least ``min_labels`` labels (and one)."""
        out: npt.NDArray[np.bool_] = self.labels >= max(min_labels, 1)
        return out

    def coverage(self, min_labels: int = 0, estimator: Estimator = "horvitz-thompson") -> float:
        """Fraction of eligible (checkpoint, run) pairs whose interval holds the true risk."""
        ok = self.eligible(min_labels)
        return float(self.covered(estimator)[ok].mean()) if ok.any() else float("nan")

    def coverage_se(self, min_labels: int = 0, estimator: Estimator = "horvitz-thompson") -> float:
        """Standard error of :meth:`coverage` from the spread of the runs' own coverages (the
        checkpoints of one run are strongly correlated; the runs are independent)."""
        ok = self.eligible(min_labels)
        counts = ok.sum(axis=0)
        keep = counts > 0
        if keep.sum() < 2:
            return float("nan")
        per_run = (self.covered(estimator) & ok).sum(axis=0)[keep] / counts[keep]
        return float(per_run.std(ddof=1) / np.sqrt(keep.sum()))

    def coverage_by_checkpoint(
        self, min_labels: int = 0, estimator: Estimator = "horvitz-thompson"
    ) -> FloatArray:
        """Per checkpoint, the fraction of eligible runs covered (NaN: none eligible)."""
        ok = self.eligible(min_labels)
        hits = (self.covered(estimator) & ok).sum(axis=1).astype(np.float64)
        counts = ok.sum(axis=1)
        out: FloatArray = np.divide(hits, counts, out=np.full(hits.shape, np.nan), where=counts > 0)
        return out

    def summary(self, min_labels: int) -> dict[str, Any]:
        """The ``models`` entry of ``shadow.json``: final values averaged over runs."""
        return {
            "name": self.name,
            "role": self.role,
            "algorithm": self.algorithm,
            "cost": self.cost,
            "weighting": self.weighting,
            "true_risk_mean": float(self.true[-1].mean()),
            "true_risk_std": float(self.true[-1].std()),
            "estimate_mean": _mean(self.estimate[-1]),
            "interval_width_mean": _mean(self.high[-1] - self.low[-1]),
            "labels_mean": float(self.labels[-1].mean()),
            "reject_rate_mean": float(self.rejected[-1].mean()),
            "coverage": self.coverage(min_labels),
            "coverage_se": self.coverage_se(min_labels),
            "coverage_all_checkpoints": self.coverage(0),
            "runs_covered_at_end": float(self.covered()[-1].mean()),
            "ratio_estimate_mean": _mean(self.ratio[-1]),
            "ratio_interval_width_mean": _mean(self.ratio_high[-1] - self.ratio_low[-1]),
            "ratio_coverage": self.coverage(min_labels, "ratio"),
            "ratio_coverage_se": self.coverage_se(min_labels, "ratio"),
        }


@dataclass(frozen=True)
class ShadowResult:
    """Everything one shadow replay measured."""

    dataset: str
    runs: int
    trials: int
    grid: IntArray
    level: float
    min_labels: int
    tracks: list[Track]
    floored: FloatArray  # per run: fraction of the champion's p floored at 1 / max_weight
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """``{"dataset", "runs", "trials", "level", "min_labels", "checkpoints",
        "champion_floored", "models": [...], "settings", "seconds"}``."""
        return {
            "dataset": self.dataset,
            "runs": self.runs,
            "trials": self.trials,
            "level": self.level,
            "min_labels": self.min_labels,
            "checkpoints": int(self.grid.shape[0]),
            "champion_floored": float(self.floored.mean()),
            "models": [t.summary(self.min_labels) for t in self.tracks],
            "settings": self.settings,
            "seconds": round(self.seconds, 3),
        }

    def write_summary(self, path: Path) -> None:
        """Write :meth:`summary` as indented JSON (NaN as ``null``)."""
        text = json.dumps(_finite(self.summary()), indent=2)
        path.write_text(text + "\n", encoding="utf-8")

    def write_curves(self, path: Path) -> None:
        """One row per (model, checkpoint): ``model, role, t``, then the means over runs of
        ``true``, ``estimate``, ``low``, ``high``, ``ratio``, ``ratio_low``, ``ratio_high``,
        ``labels``, ``rejected``, the fractions of (eligible) runs covered (``coverage``,
        ``ratio_coverage``), and the estimates and intervals of run 0 (``*_run0``); 6
        significant digits, empty for NaN."""
        names = CURVES
        header = ["model", "role", "t", *(f"{n}_mean" for n in names), "coverage"]
        header += ["ratio_coverage", *(f"{n}_run0" for n in names[:7])]
        with path.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            for track in self.tracks:
                arrays = [getattr(track, n) for n in names]
                means = [_nanmean(a) for a in arrays]
                cover = track.coverage_by_checkpoint(self.min_labels)
                ratio_cover = track.coverage_by_checkpoint(self.min_labels, "ratio")
                for g, t in enumerate(self.grid.tolist()):
                    row = [track.name, track.role, str(t)]
                    row += [_fmt(m[g]) for m in means] + [_fmt(cover[g]), _fmt(ratio_cover[g])]
                    row += [_fmt(a[g, 0]) for a in arrays[:7]]
                    writer.writerow(row)


def _nanmean(a: FloatArray) -> FloatArray:
    counts = np.isfinite(a).sum(axis=1)
    total = np.where(np.isfinite(a), a, 0.0).sum(axis=1)
    out: FloatArray = np.divide(total, counts, out=np.full(total.shape, np.nan), where=counts > 0)
    return out


def _mean(values: FloatArray) -> float:
    """Mean of the finite values (NaN if there is none)."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def _fmt(value: float) -> str:
    return "" if not np.isfinite(value) else f"{value:.6g}"


def _finite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value
