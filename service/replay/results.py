"""What a replay measured, and how it is written: ``summary.json`` and the curves CSV.

A :class:`Series` holds, for one (algorithm, cost) pair, the cumulative counts of every run
at the points of a time grid; every rate shown anywhere is derived from them:

* risk at ``t``: (sum of the 0-d-1 loss ``L_d`` of the decisions up to ``t``) / ``t``;
* asked / misclassified / rejected at ``t``: the count up to ``t``, divided by ``t``;
* labels at ``t``: the number of labels asked up to ``t`` (the x axis of "risk vs labels").

Means and standard deviations are over runs (population std, ``ddof=0``).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["COUNTS", "ReplayResult", "Series", "time_grid"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: names of the cumulative quantities a series carries (``loss`` is a float sum).
COUNTS = ("loss", "asked", "misclassified", "rejected")


def time_grid(trials: int, points: int = 100) -> IntArray:
    """Increasing trial numbers in ``[1, trials]`` at which curves are sampled.

    Half the points are spread geometrically (the early, fast-moving part of a curve),
    half linearly; ``trials`` itself is always the last point.

    >>> time_grid(100, points=10).tolist()
    [1, 3, 10, 26, 32, 50, 75, 100]
    >>> int(time_grid(10_000)[-1]), len(time_grid(10_000)) <= 100
    (10000, True)
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    half = max(points // 2, 1)
    geo = np.geomspace(1, trials, num=half)
    lin = np.linspace(1, trials, num=max(points - half, 1))
    grid = np.unique(np.rint(np.concatenate([geo, lin, [trials]])).astype(np.int64))
    return grid


@dataclass(frozen=True)
class Series:
    """Cumulative counts of one (algorithm, cost) pair over ``R`` runs.

    ``counts[name]`` has shape ``(len(grid), R)``: the value of the cumulative count
    ``name`` (one of :data:`COUNTS`) after ``grid[g]`` trials in run ``r``.
    ``rho`` is the final rejection width of each run, shape ``(R,)``.
    """

    algorithm: str
    cost: float
    grid: IntArray
    counts: dict[str, FloatArray]
    rho: FloatArray
    seconds: float = 0.0

    def rate(self, name: str) -> FloatArray:
        """Running average ``count / t`` on the grid, shape ``(len(grid), R)``."""
        if name == "labels":
            return self.counts["asked"]
        values = self.counts[name]
        return values / self.grid[:, None].astype(np.float64)

    def mean(self, name: str) -> FloatArray:
        """Mean over runs of :meth:`rate` (``"labels"`` gives cumulative labels asked)."""
        out: FloatArray = self.rate(name).mean(axis=1)
        return out

    def std(self, name: str) -> FloatArray:
        """Standard deviation over runs of :meth:`rate`."""
        out: FloatArray = self.rate(name).std(axis=1)
        return out

    def final(self, name: str) -> FloatArray:
        """Per-run value of :meth:`rate` after the last trial, shape ``(R,)``."""
        out: FloatArray = self.rate(name)[-1]
        return out

    def summary(self) -> dict[str, Any]:
        """The ``results`` entry of ``summary.json`` for this series."""
        return {
            "algorithm": self.algorithm,
            "cost": self.cost,
            "risk_mean": float(self.final("loss").mean()),
            "risk_std": float(self.final("loss").std()),
            "asked": float(self.final("asked").mean()),
            "misclassified": float(self.final("misclassified").mean()),
            "rejected": float(self.final("rejected").mean()),
            "rho": float(self.rho.mean()),
        }


@dataclass(frozen=True)
class ReplayResult:
    """Everything one replay measured."""

    dataset: str
    runs: int
    trials: int
    series: list[Series]
    settings: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """``{"dataset", "runs", "trials", "results": [...], "settings", "seconds"}``."""
        return {
            "dataset": self.dataset,
            "runs": self.runs,
            "trials": self.trials,
            "results": [s.summary() for s in self.series],
            "settings": self.settings,
            "seconds": round(self.seconds, 3),
        }

    def write_summary(self, path: Path) -> None:
        """Write :meth:`summary` as indented JSON."""
        path.write_text(json.dumps(self.summary(), indent=2) + "\n", encoding="utf-8")

    def write_curves(self, path: Path) -> None:
        """Write the curves in long format, one row per (algorithm, cost, t).

        Columns: ``algorithm, cost, t, labels_mean, labels_std`` then ``NAME_mean,
        NAME_std`` for risk, asked, misclassified and rejected; 6 significant digits.
        """
        names = {"labels": "labels", "risk": "loss", "asked": "asked"}
        names |= {"misclassified": "misclassified", "rejected": "rejected"}
        header = ["algorithm", "cost", "t"]
        header += [f"{col}_{stat}" for col in names for stat in ("mean", "std")]
        with path.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            for s in self.series:
                columns = []
                for key in names.values():
                    columns += [s.mean(key), s.std(key)]
                for g, t in enumerate(s.grid.tolist()):
                    row = [s.algorithm, f"{s.cost:g}", str(t)]
                    row += [f"{col[g]:.6g}" for col in columns]
                    writer.writerow(row)
