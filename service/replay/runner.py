"""Run a replay: linear algorithms batched, kernel algorithms (or the stream service's
labelled-only standardiser) one learner at a time.

* Linear algorithms (``dral``, ``dsal``, ``dsol``) run batched: one
  :class:`service.learning.BatchLearner` row per (variant, cost, run), all in lockstep; a
  variant under a label budget is a row held to its own
  :class:`~service.learning.QueryBudget`.
* Kernel algorithms (``kernel-dral``, ...), and every algorithm when the standardiser is
  fitted on labelled examples only (``scaler_fit="labels"``), run through
  :mod:`service.replay.sequential` (slower), budgets through
  :class:`~service.learning.Budgeted`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from service.learning.batch import BatchLearner
from service.replay.features import RunFeatures
from service.replay.options import ReplayOptions, accepted_params, check_params, params_for
from service.replay.protocol import (
    ALGORITHMS,
    Progress,
    plan_trials,
    replay_linear,
)
from service.replay.results import ReplayResult, Series, Variant
from service.replay.sequential import replay_sequential

__all__ = ["per_event_microseconds", "replay", "total_work"]

FloatArray = npt.NDArray[np.float64]


def _engine_factory(
    options: ReplayOptions, n_features: int
) -> Callable[[Sequence[Variant], FloatArray], BatchLearner]:
    def make(variants: Sequence[Variant], row_costs: FloatArray) -> BatchLearner:
        algorithms = {v.algorithm for v in variants}
        per_algo = {a: params_for(a, options.params) for a in algorithms}
        rows_per_variant = row_costs.shape[0] // len(variants)
        rows = [v for v in variants for _ in range(rows_per_variant)]
        names = [v.algorithm for v in rows]
        defaults = {a: accepted_params(a) for a in algorithms}

        def column(key: str, fallback: Any) -> list[Any]:
            values = []
            for a in names:
                if key in per_algo[a]:
                    values.append(per_algo[a][key])
                elif key in defaults[a]:
                    values.append(defaults[a][key].default)
                else:
                    values.append(fallback)
            return values

        return BatchLearner(
            names,
            n_features,
            row_costs,
            gamma=column("gamma", 1.0),
            eta=column("eta", 1.0),
            rho=column("rho", 1.0),
            seed=options.seed,
            budgets=[v.query_budget(options.budget_params, options.seed) for v in rows],
        )

    return make


#: hyperparameters the batched engine does not apply (a learner with them runs alone)
_UNBATCHED_PARAMS = ("rho_eta_max", "intercept_eta_min", "update_rule", "tail")


def _batched(options: ReplayOptions) -> list[Variant]:
    """Variants that run in the batched engine (the rest run sequentially)."""
    if (
        (options.standardize and options.scaler_fit != "events")
        or options.adaptive is not None
        or options.update_rule not in (None, "sgd")
    ):
        return []
    return [
        v
        for v in options.variants()
        if v.algorithm in ALGORITHMS
        and not set(params_for(v.algorithm, options.params)) & set(_UNBATCHED_PARAMS)
    ]


def replay(
    X: FloatArray,
    y: npt.NDArray[np.int64],
    options: ReplayOptions,
    *,
    dataset: str = "",
    progress: Progress | None = None,
) -> ReplayResult:
    """Run the protocol of :mod:`service.replay.protocol` with ``options``.

    ``progress`` receives numbers of (algorithm-independent) trials for the batched part
    and of learner-trials for the sequential part; :func:`total_work` gives the sum.
    """
    check_params(options.algorithms, options.params)
    started = time.perf_counter()
    plan = plan_trials(X.shape[0], options.runs, options.trials, options.seed, options.sampling)
    features = RunFeatures(X, plan, standardize=options.standardize, intercept=options.intercept)
    variants = options.variants()
    batched = _batched(options)
    one_by_one = [v for v in variants if v not in batched]
    series: list[Series] = []
    if batched:
        result = replay_linear(
            y,
            plan,
            variants=batched,
            costs=options.costs,
            features=features,
            make_engine=_engine_factory(options, features.n_features),
            grid_points=options.grid_points,
            grid_every=options.grid_every,
            progress=progress,
        )
        series += result.series
    if one_by_one:
        series += replay_sequential(y, plan, features, options, one_by_one, progress)
    order = {v: i for i, v in enumerate(variants)}
    series.sort(key=lambda s: (order[s.variant], s.cost))
    return ReplayResult(
        dataset=dataset,
        runs=options.runs,
        trials=options.trials,
        series=series,
        settings=options.settings(),
        seconds=time.perf_counter() - started,
    )


def total_work(options: ReplayOptions) -> int:
    """Sum of what ``replay`` reports to ``progress``."""
    batched = _batched(options)
    n_seq = len(options.variants()) - len(batched)
    return (options.trials if batched else 0) + n_seq * len(options.costs) * options.runs * (
        options.trials
    )


def per_event_microseconds(series: Series, trials: int) -> float:
    """Mean time of one decide (+ update when queried) of a sequential series, in us."""
    runs = series.rho.shape[0]
    return math.nan if not series.seconds else series.seconds / (runs * trials) * 1e6
