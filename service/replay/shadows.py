"""Champion and shadows on one stream, offline: ``abstain replay --shadow SPEC``.

Per run (the trials and coins of :func:`service.replay.protocol.plan_trials`), the
*champion* (the replay's one algorithm at its one cost, held to its label budget if one is
given) decides every event and asks for labels by its own rule or budget. Every *shadow*
decides the same events (only counted) and learns only from the labels the champion's
questions received, weighted by the champion's query probabilities
(:func:`service.learning.learn_from_champion`, capped at the champion's weight cap). Each
model, champion included, is judged as the stream judges it: a
:class:`service.learning.Scorecard` charged with the champion's $p$ on asked events. As
every label is known offline, the true running risk is tracked beside the estimate;
:mod:`service.replay.shadow_results` holds both.

Inputs are those of :mod:`service.replay.sequential`: the run's standardised events shared
by every model, or with ``scaler_fit="labels"`` one pipeline per model that learns from the
labelled examples (for a shadow: the champion's).

A shadow is given as ``ALGO[:KEY=VALUE,...]``: ``cost`` (default: the champion's),
``weighting`` (``importance``, the default, or ``none``: one plain step per label, as the
champion learns) and any hyperparameter of the algorithm (JSON values).

>>> parse_shadow("dral")
ShadowSpec(name='dral', algorithm='dral', cost=None, weighting='importance', params={})
>>> parse_shadow('DSAL: cost=0.1, eta={"kind": "constant", "eta": 0.05}').params
{'eta': {'kind': 'constant', 'eta': 0.05}}
>>> parse_shadow("dral:speed=3")
Traceback (most recent call last):
...
service.replay.errors.ReplayConfigError: --shadow 'dral:speed=3': dral takes no 'speed' \
(it takes cost, weighting and eta, intercept_eta_min, rho, rho_eta_max, update_rule)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from service.learning import Decision, LearningError, learn_from_champion, make_learner
from service.learning.registry import ALGORITHM_NAMES
from service.learning.risk import (
    DEFAULT_LEVEL,
    DEFAULT_MAX_WEIGHT,
    WEIGHTINGS,
    Scorecard,
    decision_loss,
)
from service.learning.risk.shadow import Weighting
from service.replay.errors import ReplayConfigError
from service.replay.features import RunFeatures
from service.replay.options import ReplayOptions, accepted_params
from service.replay.protocol import Progress, plan_trials, validate_costs
from service.replay.results import Variant
from service.replay.sequential import champion_weight_cap, scaler_for, variant_learner
from service.replay.shadow_results import CURVES, ShadowResult, Track, checkpoints

__all__ = [
    "ShadowSpec",
    "champion_variant",
    "champion_weight_cap",
    "check_shadow_options",
    "parse_shadow",
    "replay_shadows",
]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ShadowSpec:
    """A shadow model: algorithm, cost (None: the champion's), weighting, hyperparameters."""

    name: str
    algorithm: str
    cost: float | None = None
    weighting: Weighting = "importance"
    params: Mapping[str, Any] = field(default_factory=dict)

    def learner(self, n_features: int, champion_cost: float, seed: int) -> Any:
        """A fresh learner for one run."""
        cost = champion_cost if self.cost is None else self.cost
        return make_learner(
            self.algorithm, n_features=n_features, cost=cost, seed=seed, **self.params
        )


def _split(text: str) -> list[str]:
    """Split on commas outside brackets and quotes (values may be JSON objects)."""
    items, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "{[":
            depth += 1
        elif not quoted and ch in "}]":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items]


def _values(text: str, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in _split(text):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ReplayConfigError(f"{where}: expected KEY=VALUE after ':', got {item!r}")
        if key in out:
            raise ReplayConfigError(f"{where}: {key!r} given twice")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw.strip()
    return out


def parse_shadow(text: str) -> ShadowSpec:
    """Read ``ALGO[:KEY=VALUE,...]`` (see the module docstring); errors name the spec."""
    where = f"--shadow {text!r}"
    head, colon, rest = text.strip().partition(":")
    algorithm = head.strip().lower().replace("_", "-")
    if algorithm not in ALGORITHM_NAMES:
        raise ReplayConfigError(
            f"{where}: unknown algorithm {head.strip()!r}; expected one of "
            f"{', '.join(ALGORITHM_NAMES)}, optionally followed by :KEY=VALUE,..."
        )
    values = _values(rest, where) if colon else {}
    cost = values.pop("cost", None)
    if cost is not None:
        try:
            cost = validate_costs([cost])[0]
        except (ReplayConfigError, TypeError, ValueError) as exc:
            raise ReplayConfigError(f"{where}: {exc}") from None
    weighting = values.pop("weighting", "importance")
    if weighting not in WEIGHTINGS:
        raise ReplayConfigError(f"{where}: weighting must be one of {', '.join(WEIGHTINGS)}")
    if algorithm.startswith("kernel-") and weighting == "importance":
        raise ReplayConfigError(f"{where}: kernel shadows learn unweighted; add weighting=none")
    accepted = accepted_params(algorithm)
    for key in values:
        if key not in accepted:
            raise ReplayConfigError(
                f"{where}: {algorithm} takes no {key!r} "
                f"(it takes cost, weighting and {', '.join(sorted(accepted))})"
            )
    spec = ShadowSpec(_name(algorithm, rest if colon else ""), algorithm, cost, weighting, values)
    try:  # bad values (a negative step, an unknown kernel) are refused here, not mid-run
        spec.learner(2, 0.25, 0)
    except (LearningError, TypeError, ValueError) as exc:
        raise ReplayConfigError(f"{where}: {exc}") from None
    return spec


def _name(algorithm: str, rest: str) -> str:
    items = [item for item in _split(rest) if item] if rest.strip() else []
    return algorithm if not items else f"{algorithm}:{','.join(items)}"


def check_shadow_options(options: ReplayOptions, shadows: Sequence[ShadowSpec]) -> None:
    """A shadow replay has one champion: one algorithm, one cost, at most one budget."""
    if not shadows:
        raise ReplayConfigError("a shadow replay needs at least one --shadow")
    if len(options.algorithms) != 1 or len(options.costs) != 1:
        raise ReplayConfigError(
            "with --shadow, --algorithms and --costs name the champion: give exactly one "
            f"algorithm and one cost (got {','.join(options.algorithms)} and "
            f"{','.join(f'{c:g}' for c in options.costs)})"
        )
    if len(options.label_budgets) > 1:
        raise ReplayConfigError("with --shadow, --label-budget takes one budget (the champion's)")
    names = [s.name for s in shadows]
    if len(set(names)) != len(names):
        raise ReplayConfigError(f"duplicate --shadow specs in {names}")


def champion_variant(options: ReplayOptions) -> Variant:
    """The champion: the one algorithm on its own rule, or held to the one label budget."""
    if options.label_budgets:
        return Variant(options.algorithms[0], options.label_budgets[0], "budget")
    return Variant(options.algorithms[0])


class _Model:
    """One model of a run: its learner, pipeline (labels-fitted inputs), scorecard and the
    sum of its true losses."""

    __slots__ = ("card", "cap", "cost", "learner", "pipe", "true_loss", "weighting")

    def __init__(self, learner: Any, pipe: Any, weighting: Weighting | None, cap: float) -> None:
        self.learner, self.pipe, self.weighting, self.cap = learner, pipe, weighting, cap
        self.cost = float(learner.cost)
        self.card = Scorecard(cost=self.cost, max_weight=cap)
        self.true_loss = 0.0

    def decide(self, raw: FloatArray, z: FloatArray, y: int, coin: float) -> Decision:
        x = z if self.pipe is None else self.pipe.seen(raw)
        decision: Decision = self.learner.decide(x, coin=coin)
        self.card.decided(decision.label)
        self.true_loss += decision_loss(decision.label, y, self.cost)
        return decision

    def learn(self, raw: FloatArray, z: FloatArray, y: int, label: int, p: float) -> None:
        self.card.labelled(label, y, p)
        x = z
        if self.pipe is not None:
            x = self.pipe.learn(raw)
        if self.weighting is None:  # the champion learns as it does on the stream
            self.learner.update(x, y)
        else:
            learn_from_champion(
                self.learner, x, y, p, max_weight=self.cap, weighting=self.weighting
            )


@dataclass
class _Recorder:
    """Checkpoint values of every model, shape ``(G, R)`` each."""

    grid: npt.NDArray[np.int64]
    runs: int
    n_models: int
    level: float
    values: dict[str, FloatArray] = field(init=False)

    NAMES = CURVES

    def __post_init__(self) -> None:
        shape = (self.n_models, self.grid.shape[0], self.runs)
        self.values = {name: np.full(shape, np.nan) for name in self.NAMES}

    def record(self, models: Sequence[_Model], g: int, r: int, t: int) -> None:
        for i, m in enumerate(models):
            ht = m.card.report(self.level)
            ratio = m.card.estimate.interval(self.level)
            row = (
                m.true_loss / t,
                ht.risk,
                ht.low,
                ht.high,
                ratio.risk,
                ratio.low,
                ratio.high,
                ht.labels,
                m.card.rejected / t,
            )
            for name, value in zip(self.NAMES, row, strict=True):
                self.values[name][i, g, r] = value

    def track(self, i: int, **labels: Any) -> Track:
        return Track(**labels, **{n: self.values[n][i] for n in self.NAMES})


def _run(
    models: list[_Model],
    raw: FloatArray,
    z: FloatArray,
    ys: list[int],
    coins: list[float],
    slots: list[int],
    rec: _Recorder,
    r: int,
) -> int:
    """Run ``r``: every model decides each event; the champion's asked labels teach all.
    Returns how many of the champion's probabilities were floored at its cap."""
    floor = 1.0 / models[0].cap
    floored = 0
    for t, (yt, coin) in enumerate(zip(ys, coins, strict=True)):
        decisions = [m.decide(raw[t], z[t], yt, coin) for m in models]
        p = decisions[0].query_probability
        floored += p < floor
        if decisions[0].query:
            for m, d in zip(models, decisions, strict=True):
                m.learn(raw[t], z[t], yt, d.label, p)
        if slots[t + 1] >= 0:
            rec.record(models, slots[t + 1], r, t + 1)
    return floored


@dataclass(frozen=True)
class _Lineup:
    """The champion and the shadows of a replay: fresh models per run, tracks at the end."""

    options: ReplayOptions
    shadows: Sequence[ShadowSpec]
    features: RunFeatures
    cap: float

    @property
    def variant(self) -> Variant:
        return champion_variant(self.options)

    @property
    def cost(self) -> float:
        return self.options.costs[0]

    @property
    def per_label(self) -> bool:
        return self.options.standardize and self.options.scaler_fit != "events"

    def models(self) -> list[_Model]:
        n, seed = self.features.n_features, self.options.seed
        champion = variant_learner(self.variant, self.cost, n, self.options)
        models = [_Model(champion, self._pipe(), None, self.cap)]
        for spec in self.shadows:
            learner = spec.learner(n, self.cost, seed)
            models.append(_Model(learner, self._pipe(), spec.weighting, self.cap))
        return models

    def _pipe(self) -> Any:
        return scaler_for(self.features, self.options) if self.per_label else None

    def tracks(self, rec: _Recorder) -> list[Track]:
        v = self.variant
        out = [
            rec.track(
                0,
                name=v.name,
                role="champion",
                algorithm=v.algorithm,
                cost=self.cost,
                weighting=None,
            )
        ]
        for i, spec in enumerate(self.shadows, start=1):
            cost = self.cost if spec.cost is None else spec.cost
            out.append(
                rec.track(
                    i,
                    name=spec.name,
                    role="shadow",
                    algorithm=spec.algorithm,
                    cost=cost,
                    weighting=spec.weighting,
                )
            )
        return out


def replay_shadows(
    X: FloatArray,
    y: npt.NDArray[np.int64],
    options: ReplayOptions,
    shadows: Sequence[ShadowSpec],
    *,
    level: float = DEFAULT_LEVEL,
    max_weight: float = DEFAULT_MAX_WEIGHT,
    min_labels: int = 0,
    points: int = 100,
    dataset: str = "",
    progress: Progress | None = None,
) -> ShadowResult:
    """Run the champion of ``options`` with ``shadows`` (see the module docstring).

    ``level``: of the intervals; ``max_weight``: the cap of the weights (raised for a
    label budget as the stream raises it, :func:`champion_weight_cap`); ``min_labels``:
    checkpoints with fewer labels do not count for coverage; ``points``: checkpoints."""
    check_shadow_options(options, shadows)
    if not 0.0 < level < 1.0 or not math.isfinite(max_weight) or max_weight < 1.0:
        raise ReplayConfigError(
            f"level must be in (0, 1) and max weight >= 1, got {level}, {max_weight}"
        )
    started = time.perf_counter()
    plan = plan_trials(X.shape[0], options.runs, options.trials, options.seed, options.sampling)
    features = RunFeatures(X, plan, standardize=options.standardize, intercept=options.intercept)
    budget = champion_variant(options).query_budget(options.budget_params, options.seed)
    lineup = _Lineup(options, shadows, features, champion_weight_cap(max_weight, budget))
    grid = checkpoints(options.trials, points)
    slots = np.full(options.trials + 1, -1, dtype=np.int64)
    slots[grid] = np.arange(grid.shape[0])
    rec = _Recorder(grid, options.runs, 1 + len(shadows), level)
    floored = np.zeros(options.runs)
    labels_all = y[plan.indices]
    for r in range(options.runs):
        raw = features.X[plan.indices[r]]
        z = raw if lineup.per_label else features.run(r)
        models = lineup.models()
        ys, coins = labels_all[r].tolist(), plan.coins[r].tolist()
        floored[r] = _run(models, raw, z, ys, coins, slots.tolist(), rec, r) / options.trials
        if progress is not None:
            progress(options.trials * len(models))
    settings = {
        **options.settings(),
        "shadows": [s.name for s in shadows],
        "max_weight": max_weight,
        "weight_cap": lineup.cap,
    }
    return ShadowResult(
        dataset,
        options.runs,
        options.trials,
        grid,
        level,
        min_labels,
        lineup.tracks(rec),
        floored,
        settings=settings,
        seconds=time.perf_counter() - started,
    )
