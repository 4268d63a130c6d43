"""What a replay measured, and how it is written: ``summary.json`` and the curves CSV.

A :class:`Series` holds, for one (algorithm, cost) pair, the cumulative counts of every run
at the points of a time grid; every rate shown anywhere is derived from them:

* risk at ``t``: (sum of the 0-d-1 loss ``L_d`` of the decisions up to ``t``) / ``t``;
* asked / misclassified / rejected at ``t``: the count up to ``t``, divided by ``t``;
* labels at ``t``: the number of labels asked up to ``t`` (the x axis of "risk vs labels").

Means and standard deviations are over runs (population std, ``ddof=0``).

A series belongs to one :class:`Variant`: the algorithm, and, under a label budget, the
budget and whether the learner chose its queries (``"budget"``) or asked uniformly chosen
events (``"random"``); ``"own"`` is the algorithm's own rule, as in the paper.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from service.learning import QueryBudget
from service.learning.registry import FULL_LABEL_ALGORITHMS as LEARNING_FULL_LABEL
from service.replay.errors import ReplayConfigError

__all__ = [
    "BUDGET_PARAMS",
    "COUNTS",
    "FULL_LABEL_ALGORITHMS",
    "SAMPLINGS",
    "ReplayResult",
    "Series",
    "Variant",
    "time_grid",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: names of the cumulative quantities a series carries (``loss`` is a float sum).
COUNTS = ("loss", "asked", "misclassified", "rejected")


QuerySampling = Literal["own", "budget", "random"]
#: how a variant chooses the events it asks: its own rule, its rule under a label budget,
#: or uniformly at random under the same budget.
SAMPLINGS: tuple[QuerySampling, ...] = ("own", "budget", "random")
#: algorithms that ask every label (no budget variants: see the module docstring), from the
#: learners' registry
FULL_LABEL_ALGORITHMS = LEARNING_FULL_LABEL
#: QueryBudget keywords a replay may set (``--budget-param``); rate and seed are its own
BUDGET_PARAMS = ("sharpness", "horizon", "explore", "burst")


@dataclass(frozen=True)
class Variant:
    """One learner configuration of a replay: an algorithm, and how it chooses its queries.

    >>> Variant("dsal", 0.1, "random").name
    'dsal random@0.1'
    """

    algorithm: str
    label_budget: float | None = None
    sampling: QuerySampling = "own"

    @property
    def name(self) -> str:
        """``"dsal"``, ``"dsal budget@0.1"``, ``"dral random@0.05"``."""
        if self.label_budget is None:
            return self.algorithm
        return f"{self.algorithm} {self.sampling}@{self.label_budget:g}"

    def query_budget(self, params: Mapping[str, Any], seed: int) -> QueryBudget | None:
        """A fresh :class:`~service.learning.QueryBudget` for one learner (``None``: own rule)."""
        if self.label_budget is None:
            return None
        kwargs = dict(params)
        if self.sampling == "random":
            kwargs["sharpness"] = 0.0
        try:
            return QueryBudget(self.label_budget, seed=seed, **kwargs)
        except (TypeError, ValueError) as exc:
            raise ReplayConfigError(f"bad --budget-param: {exc}") from exc


def time_grid(trials: int, points: int = 100, every: int | None = None) -> IntArray:
    """Increasing trial numbers in ``[1, trials]`` at which curves are sampled.

    Half the points are spread geometrically (the early, fast-moving part of a curve),
    half linearly; ``trials`` itself is always the last point. ``every``: each multiple of
    it too (what a windowed risk needs, :func:`window_risk`).

    >>> time_grid(100, points=10).tolist()
    [1, 3, 10, 26, 32, 50, 75, 100]
    >>> int(time_grid(10_000)[-1]), len(time_grid(10_000)) <= 100
    (10000, True)
    >>> time_grid(10, points=2, every=4).tolist()
    [1, 4, 8, 10]
    """
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    half = max(points // 2, 1)
    geo = np.geomspace(1, trials, num=half)
    lin = np.linspace(1, trials, num=max(points - half, 1))
    parts: list[npt.NDArray[Any]] = [geo, lin, np.array([trials])]
    if every is not None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        parts.append(np.arange(every, trials + 1, every))
    grid = np.unique(np.rint(np.concatenate(parts)).astype(np.int64))
    return grid


def window_step(window: int) -> int:
    """The grid step of a windowed risk over ``window`` events: the largest divisor of
    ``window`` at most a tenth of it (1 for small or prime windows).

    >>> window_step(500), window_step(10), window_step(7)
    (50, 1, 1)
    """
    for k in range(10, window + 1):
        if window % k == 0:
            return window // k
    return 1


@dataclass(frozen=True)
class Series:
    """Cumulative counts of one (algorithm, cost) pair over ``R`` runs.

    ``counts[name]`` has shape ``(len(grid), R)``: the value of the cumulative count
    ``name`` (one of :data:`COUNTS`) after ``grid[g]`` trials in run ``r``.
    ``rho`` is the final rejection width of each run, shape ``(R,)``. ``label_budget`` and
    ``sampling`` say which :class:`Variant` of the algorithm it is.
    """

    algorithm: str
    cost: float
    grid: IntArray
    counts: dict[str, FloatArray]
    rho: FloatArray
    seconds: float = 0.0
    label_budget: float | None = None
    sampling: QuerySampling = "own"
    #: per run, the trials (1-based) after which the learner reported a detected change
    #: (empty: it reports none, or detected none)
    changes: tuple[tuple[int, ...], ...] = ()

    @property
    def variant(self) -> Variant:
        return Variant(self.algorithm, self.label_budget, self.sampling)

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

    def window_risk(self, window: int) -> tuple[IntArray, FloatArray]:
        """The mean over runs of the risk over the last ``window`` trials (fewer at the
        start), at the grid points ``t`` where it is known exactly: ``t <= window``, or
        ``t - window`` on the grid too (every multiple of the grid's step when it was made
        with ``every=window_step(window)``). Returns ``(t, risk)``.

        >>> grid = time_grid(8, points=2, every=2)
        >>> loss = np.array([[1.0], [1.0], [2.0], [2.0], [2.0]])  # cumulative, at 1,2,4,6,8
        >>> s = Series("dsal", 0.25, grid, {"loss": loss}, np.zeros(1))
        >>> [(int(t), float(r)) for t, r in zip(*s.window_risk(4))]
        [(1, 1.0), (2, 0.5), (4, 0.5), (6, 0.25), (8, 0.0)]
        """
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        cumulative = self.counts["loss"]
        where = {int(t): i for i, t in enumerate(self.grid)}
        times: list[int] = []
        rows: list[FloatArray] = []
        for i, t in enumerate(self.grid.tolist()):
            if t <= window:
                rows.append(cumulative[i] / t)
            elif t - window in where:
                rows.append((cumulative[i] - cumulative[where[t - window]]) / window)
            else:
                continue
            times.append(t)
        risk = np.asarray(rows).mean(axis=1) if rows else np.zeros(0)
        return np.asarray(times, dtype=np.int64), risk

    def summary(self) -> dict[str, Any]:
        """The ``results`` entry of ``summary.json`` for this series (with ``changes``,
        per run, when the learner reported any)."""
        extra = {"changes": [list(c) for c in self.changes]} if any(self.changes) else {}
        return {
            "algorithm": self.algorithm,
            "label_budget": self.label_budget,
            "sampling": self.sampling,
            "cost": self.cost,
            "risk_mean": float(self.final("loss").mean()),
            "risk_std": float(self.final("loss").std()),
            "asked": float(self.final("asked").mean()),
            "misclassified": float(self.final("misclassified").mean()),
            "rejected": float(self.final("rejected").mean()),
            "rho": float(self.rho.mean()),
            **extra,
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

        Columns: ``algorithm, label_budget, sampling, cost, t, labels_mean, labels_std``
        then ``NAME_mean, NAME_std`` for risk, asked, misclassified and rejected; 6
        significant digits (``label_budget`` is empty for the algorithms' own rules).
        """
        names = {"labels": "labels", "risk": "loss", "asked": "asked"}
        names |= {"misclassified": "misclassified", "rejected": "rejected"}
        header = ["algorithm", "label_budget", "sampling", "cost", "t"]
        header += [f"{col}_{stat}" for col in names for stat in ("mean", "std")]
        with path.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            for s in self.series:
                columns = []
                for key in names.values():
                    columns += [s.mean(key), s.std(key)]
                for g, t in enumerate(s.grid.tolist()):
                    budget = "" if s.label_budget is None else f"{s.label_budget:g}"
                    row = [s.algorithm, budget, s.sampling, f"{s.cost:g}", str(t)]
                    row += [f"{col[g]:.6g}" for col in columns]
                    writer.writerow(row)
