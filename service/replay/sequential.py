"""Replay one learner at a time: kernel learners, and the stream service's preprocessing.

Every (variant, cost, run) gets its own learner from
:func:`service.learning.serving_learner`, the function that builds version 0 of a stream
worker's model (inside :class:`service.learning.Adaptive` with ``options.adaptive``; held
to its label budget by :class:`service.learning.Budgeted` when the variant has one); its
decisions, queries and updates follow the protocol of :mod:`service.replay.protocol` with
the run's trials and coins. An adaptive learner learns each label with the probability it
was asked with and the stream's cap of its weight, as the worker's label path gives them.

Inputs:

* ``scaler_fit="events"`` (or no standardiser): the run's inputs from
  :meth:`service.replay.features.RunFeatures.run`, shared by all learners of the run;
* ``scaler_fit="moments"`` (with a standardiser): what a stream worker does. Each learner
  owns the :func:`~service.learning.serving_pipeline`; a decision uses its transform with
  the statistics learned so far, and a queried label first makes it learn the moments of
  the events scored since the last label and the labelled row
  (:class:`~service.replay.features.LabelScaler`), then updates the learner with the
  re-transformed ``x`` (:func:`service.stream.labels.protocol.apply_label`);
* ``scaler_fit="labels"``: what a worker did before, a standardiser that learns from the
  labelled examples only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from service.learning import Adaptive, Budgeted, QueryBudget, serving_learner, serving_pipeline
from service.learning.losses import zero_d_one_loss
from service.learning.risk import DEFAULT_MAX_WEIGHT
from service.replay.features import LabelScaler, RunFeatures
from service.replay.options import ReplayOptions, learner_kwargs
from service.replay.protocol import Progress, TrialPlan
from service.replay.results import COUNTS, Series, Variant, time_grid

__all__ = [
    "champion_weight_cap",
    "scaler_for",
    "detecting",
    "learn_function",
    "replay_sequential",
    "variant_learner",
]


def replay_sequential(
    y: npt.NDArray[np.int64],
    plan: TrialPlan,
    features: RunFeatures,
    options: ReplayOptions,
    variants: Sequence[Variant],
    progress: Progress | None = None,
) -> list[Series]:
    """One :class:`Series` per (variant, cost); ``Series.seconds`` is the time spent in
    preprocessing, ``decide`` and ``update``."""
    runs, trials = plan.runs, plan.trials
    grid = time_grid(trials, options.grid_points, every=options.grid_every)
    slot = np.full(trials + 1, -1, dtype=np.int64)
    slot[grid] = np.arange(grid.shape[0])
    keys = [(v, c) for v in variants for c in options.costs]
    counts = {k: {name: np.zeros((grid.shape[0], runs)) for name in COUNTS} for k in keys}
    rho = {k: np.zeros(runs) for k in keys}
    changes: dict[tuple[Variant, float], list[tuple[int, ...]]] = {k: [] for k in keys}
    seconds = dict.fromkeys(keys, 0.0)
    per_label = options.standardize and options.scaler_fit in ("labels", "moments")
    labels_all = y[plan.indices]
    slots = slot.tolist()
    for r in range(runs):
        raw = features.X[plan.indices[r]]
        z = raw if per_label else features.run(r)
        ys, coins = labels_all[r].tolist(), plan.coins[r].tolist()
        for v, c in keys:
            learner = variant_learner(v, c, features.n_features, options)
            learn = learn_function(learner)
            pipe = scaler_for(features, options) if per_label else None
            watched = detecting(learner)
            seen = 0 if watched is None else int(watched.changes_detected)
            found: list[int] = []
            loss = asked = wrong = rejected = 0.0
            out = counts[(v, c)]
            tic = time.perf_counter()
            for t in range(trials):
                yt = ys[t]
                x = pipe.seen(raw[t]) if pipe is not None else z[t]
                dec = learner.decide(x, coin=coins[t])
                loss += zero_d_one_loss(yt * dec.score, dec.rho, c)
                if dec.label == 0:
                    rejected += 1.0
                elif dec.label != yt:
                    wrong += 1.0
                if dec.query:
                    asked += 1.0
                    if pipe is not None:
                        x = pipe.learn(raw[t])
                    learn(x, yt, dec.query_probability)
                    if watched is not None and int(watched.changes_detected) > seen:
                        seen = int(watched.changes_detected)
                        found.append(t + 1)
                g = slots[t + 1]
                if g >= 0:
                    out["loss"][g, r] = loss
                    out["asked"][g, r] = asked
                    out["misclassified"][g, r] = wrong
                    out["rejected"][g, r] = rejected
            seconds[(v, c)] += time.perf_counter() - tic
            rho[(v, c)][r] = float(learner.rho)
            changes[(v, c)].append(tuple(found))
            if progress is not None:
                progress(trials)
    return [
        Series(
            v.algorithm,
            c,
            grid,
            counts[(v, c)],
            rho[(v, c)],
            seconds=seconds[(v, c)],
            label_budget=v.label_budget,
            sampling=v.sampling,
            changes=tuple(changes[(v, c)]),
        )
        for v, c in keys
    ]


def scaler_for(features: RunFeatures, options: ReplayOptions) -> LabelScaler:
    """One learner's preprocessing for ``scaler_fit="labels"`` (a standardiser of the
    labelled rows) or ``"moments"`` (what a worker serves: every event's moments, then the
    labelled rows, :func:`~service.learning.serving_pipeline`)."""
    if options.scaler_fit == "moments":
        n = features.X.shape[1]
        return LabelScaler(
            serving_pipeline(n, intercept=options.intercept, hashed_from=options.hashed_from)
        )
    return LabelScaler(features.pipeline())


def variant_learner(variant: Variant, cost: float, n_features: int, options: ReplayOptions) -> Any:
    """A fresh learner of ``variant`` at ``cost``, held to its label budget if it has one."""
    parts = options.adaptive
    if parts is not None:  # the tracking steps need to know where the intercept is
        parts = dataclasses.replace(parts, intercept=options.intercept)
    learner = serving_learner(
        variant.algorithm,
        n_features=n_features,
        cost=cost,
        seed=options.seed,
        hyperparameters=learner_kwargs(variant.algorithm, options),
        parts=parts,
    )
    budget = variant.query_budget(options.budget_params, options.seed)
    return learner if budget is None else Budgeted(learner, budget)


def champion_weight_cap(max_weight: float, budget: QueryBudget | None) -> float:
    """The cap of the weights 1/p of the champion's labels, the stream's rule
    (``ModelConfig.weight_cap``): ``max_weight``, raised for a budget to what its
    exploration floor ``p >= explore x rate`` reaches.

    >>> champion_weight_cap(100.0, None), round(champion_weight_cap(100.0, QueryBudget(0.05)))
    (100.0, 200)
    """
    if budget is None or budget.explore == 0.0:
        return max_weight
    return max(max_weight, 1.0 / (budget.explore * budget.rate))


def detecting(model: Any) -> Any:
    """The object that counts ``changes_detected``: the model, or the learner it holds."""
    for candidate in (model, getattr(model, "learner", None)):
        if candidate is not None and hasattr(candidate, "changes_detected"):
            return candidate
    return None


def learn_function(model: Any) -> Any:
    """``learn(x, y, p)`` for ``model``: an adaptive learner (alone or held to a budget)
    takes ``p`` and the weight cap the stream gives its model (``ModelConfig.weight_cap``
    at the default ``max_importance_weight``); any other learns ``(x, y)``."""
    inner = model.learner if isinstance(model, Budgeted) else model
    if not isinstance(inner, Adaptive):
        return lambda x, y, p: model.update(x, y)
    cap = champion_weight_cap(DEFAULT_MAX_WEIGHT, getattr(model, "budget", None))

    def learn(x: Any, y: int, p: float) -> bool:
        return bool(inner.update(x, y, query_probability=p, max_weight=cap))

    return learn
