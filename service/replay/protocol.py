"""The paper's prequential protocol, batched over runs x costs x algorithms.

Protocol (Shah & Manwani 2020, section "Experiments"): for each of ``R`` runs, draw ``T``
trials from the dataset and present them one at a time. At trial ``t`` the learner scores
``x_t`` and decides (predict +1 / -1 or reject); the decision's 0-d-1 loss
``L_d = 1{y f < -rho} + d 1{|f| <= rho}`` is charged
(:func:`service.learning.losses.zero_d_one_loss`); the learner then decides whether to ask
for ``y_t``, and only if it asks is the label revealed and the model updated. Reported
per ``t``: average risk, fractions asked / misclassified / rejected, and labels asked.

Trials are drawn by :func:`plan_trials` from a per-run generator seeded by
``SeedSequence(seed, spawn_key=(r,))``: run ``r`` sees the same trials whatever ``R`` is, and
every (algorithm, cost) pair of a run sees the same trials and the same query coins
(common random numbers: differences between algorithms are not sampling noise).

The linear learners run in lockstep through one batched engine of
:mod:`service.learning` (:class:`~service.learning.batch.BatchLearner`): one row per
(variant, cost, run), a variant being an algorithm with its own query rule or held to a
label budget (:class:`~service.replay.results.Variant`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from service.learning.losses import zero_d_one_loss
from service.learning.registry import KERNEL_ALGORITHMS, LINEAR_ALGORITHMS
from service.replay.errors import ReplayConfigError
from service.replay.results import ReplayResult, Series, Variant, time_grid

__all__ = [
    "ALGORITHMS",
    "KERNEL_ALGORITHMS",
    "PAPER_ALGORITHMS",
    "SAMPLINGS",
    "TrialPlan",
    "plan_trials",
    "replay_linear",
    "validate_costs",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Sampling = Literal["replacement", "permutation", "sequential"]
Progress = Callable[[int], None]

#: what the batched replay runs: every linear learner of the registry
ALGORITHMS = LINEAR_ALGORITHMS
#: the paper's algorithms: what a replay runs unless told otherwise (as ``--algorithms``)
PAPER_ALGORITHMS: tuple[str, ...] = ("dral", "dsal", "dsol")
SAMPLINGS: tuple[Sampling, ...] = ("replacement", "permutation", "sequential")


@dataclass(frozen=True)
class TrialPlan:
    """Which dataset row each trial shows and the uniform coin drawn for it, per run.

    ``indices`` and ``coins`` both have shape ``(R, T)``.
    """

    indices: IntArray
    coins: FloatArray

    @property
    def runs(self) -> int:
        return int(self.indices.shape[0])

    @property
    def trials(self) -> int:
        return int(self.indices.shape[1])


def plan_trials(
    n: int, runs: int, trials: int, seed: int, sampling: Sampling = "replacement"
) -> TrialPlan:
    """Draw the trials of ``runs`` runs over a dataset of ``n`` rows.

    ``"replacement"``: ``T`` rows drawn uniformly with replacement (the paper's "sample
    ``x_t`` from ``S``"; the only reading that allows its ``T = 10000`` on Guide's 3089 rows).
    ``"permutation"``: a random permutation of the rows, followed by fresh permutations
    while ``T > n``. ``"sequential"``: the file's own order, once: trial ``t`` is row ``t``
    in every run (``T <= n``), so runs and seeds differ only in their coins (a stream whose
    order is time, such as a drifting one). Coins are uniform in ``[0, 1)``; DSAL asks when
    ``coin < p``.

    >>> plan = plan_trials(5, runs=2, trials=5, seed=0, sampling="permutation")
    >>> [sorted(row) for row in plan.indices.tolist()]
    [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    >>> bool((plan_trials(5, 3, 4, 0).indices[1] == plan_trials(5, 2, 4, 0).indices[1]).all())
    True
    >>> plan_trials(5, runs=2, trials=4, seed=0, sampling="sequential").indices.tolist()
    [[0, 1, 2, 3], [0, 1, 2, 3]]
    """
    if n < 1:
        raise ReplayConfigError("the dataset has no rows")
    if runs < 1 or trials < 1:
        raise ReplayConfigError(f"runs and trials must be >= 1, got {runs} and {trials}")
    if sampling not in SAMPLINGS:
        raise ReplayConfigError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
    if sampling == "sequential" and trials > n:
        raise ReplayConfigError(
            f"sequential sampling shows each of the {n} rows once: "
            f"trials must be <= {n}, got {trials}"
        )
    indices = np.empty((runs, trials), dtype=np.int64)
    coins = np.empty((runs, trials), dtype=np.float64)
    for r in range(runs):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(r,)))
        if sampling == "sequential":
            indices[r] = np.arange(trials)
        elif sampling == "replacement":
            indices[r] = rng.integers(0, n, size=trials)
        else:
            epochs = -(-trials // n)
            indices[r] = np.concatenate([rng.permutation(n) for _ in range(epochs)])[:trials]
        coins[r] = rng.random(trials)
    return TrialPlan(indices, coins)


def validate_costs(costs: Sequence[float]) -> list[float]:
    """Costs as floats, each strictly inside ``(0, 0.5)``, no duplicates."""
    out = [float(c) for c in costs]
    if not out:
        raise ReplayConfigError("at least one cost is needed")
    for c in out:
        if not 0.0 < c < 0.5:
            raise ReplayConfigError(f"cost must be in (0, 0.5), got {c:g}")
    if len(set(out)) != len(out):
        raise ReplayConfigError(f"duplicate costs in {out}")
    return out


class _Tally:
    """Cumulative counts of ``B`` rows, snapshotted at the grid points."""

    def __init__(self, costs: FloatArray, grid: IntArray) -> None:
        b = costs.shape[0]
        self.costs = costs
        self.loss = np.zeros(b)
        self.asked = np.zeros(b)
        self.misclassified = np.zeros(b)
        self.rejected = np.zeros(b)
        self.snapshots = np.zeros((4, grid.shape[0], b))
        self.seconds = 0.0

    def add(
        self,
        y: FloatArray,
        labels: npt.NDArray[Any],
        scores: FloatArray,
        rho: FloatArray,
        queried: npt.NDArray[np.bool_],
    ) -> None:
        # L_d from the score and the width used for the decision (not from the label the
        # learner returned): risk = misclassified + d * rejected is then a real check.
        self.loss += zero_d_one_loss(y * scores, rho, self.costs)
        self.asked += queried
        self.misclassified += labels == -y
        self.rejected += labels == 0

    def snapshot(self, g: int) -> None:
        for k, values in enumerate((self.loss, self.asked, self.misclassified, self.rejected)):
            self.snapshots[k, g] = values


def _series(
    variants: Sequence[Variant],
    tally: _Tally,
    costs: Sequence[float],
    runs: int,
    grid: IntArray,
    rho: FloatArray,
) -> list[Series]:
    out = []
    n_costs = len(costs)
    for i, variant in enumerate(variants):
        for c, cost in enumerate(costs):
            start = (i * n_costs + c) * runs
            rows = slice(start, start + runs)
            counts = {
                name: tally.snapshots[k, :, rows].copy()
                for k, name in enumerate(("loss", "asked", "misclassified", "rejected"))
            }
            out.append(
                Series(
                    variant.algorithm,
                    cost,
                    grid,
                    counts,
                    rho[rows].copy(),
                    seconds=tally.seconds,
                    label_budget=variant.label_budget,
                    sampling=variant.sampling,
                )
            )
    return out


def replay_linear(
    y: npt.NDArray[np.int64],
    plan: TrialPlan,
    *,
    variants: Sequence[Variant],
    costs: Sequence[float],
    features: Callable[[int], FloatArray],
    make_engine: Callable[[Sequence[Variant], FloatArray], Any],
    dataset: str = "",
    grid_points: int = 100,
    grid_every: int | None = None,
    progress: Progress | None = None,
) -> ReplayResult:
    """Run every (variant, cost, run) learner of ``plan`` in lockstep (curves sampled on
    :func:`~service.replay.results.time_grid` ``(trials, grid_points, grid_every)``).

    ``features(t)`` returns the learner inputs of trial ``t`` for every run, shape
    ``(R, d)``, and is called once per ``t`` in increasing order.
    ``make_engine(variants, row_costs)`` builds one batched learner whose rows are the
    variants in order, ``len(row_costs) / len(variants)`` rows each, row
    ``(v * C + c) * R + r`` for variant ``v``, cost ``c``, run ``r``; it must offer
    ``step(X, y, coins) -> (labels, scores, probabilities, queried)`` and ``rho``.
    ``progress`` is called with the number of trials just completed.
    """
    costs = validate_costs(costs)
    if not variants:
        raise ReplayConfigError("at least one algorithm is needed")
    runs, trials = plan.runs, plan.trials
    grid = time_grid(trials, grid_points, every=grid_every)
    copies = len(variants) * len(costs)
    row_costs = np.tile(np.repeat(np.asarray(costs, dtype=np.float64), runs), len(variants))
    engine = make_engine(list(variants), row_costs)
    tally = _Tally(row_costs, grid)
    labels_all = np.ascontiguousarray(y[plan.indices].T, dtype=np.float64)
    coins_all = np.ascontiguousarray(plan.coins.T)
    g = 0
    started = time.perf_counter()
    done_since = 0
    for t in range(trials):
        z = np.tile(features(t), (copies, 1))
        yt = np.tile(labels_all[t], copies)
        coins = np.tile(coins_all[t], copies)
        tic = time.perf_counter()
        rho = engine.rho
        labels, scores, _, queried = engine.step(z, yt, coins)
        tally.seconds += time.perf_counter() - tic
        tally.add(yt, labels, scores, rho, queried)
        if t + 1 == grid[g]:
            tally.snapshot(g)
            g += 1
        done_since += 1
        if progress is not None and (done_since == 250 or t + 1 == trials):
            progress(done_since)
            done_since = 0
    rho_final = np.asarray(engine.rho, dtype=np.float64)
    return ReplayResult(
        dataset=dataset,
        runs=runs,
        trials=trials,
        series=_series(variants, tally, costs, runs, grid, rho_final),
        seconds=time.perf_counter() - started,
    )
