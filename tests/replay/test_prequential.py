"""One model on one stream, event by event: the same numbers as the replay's sequential
protocol, and the drift measures on streams whose answer is known."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.learning import DSAL, Budgeted, QueryBudget, default_pipeline, make_learner
from service.replay.errors import ReplayConfigError
from service.replay.features import RunFeatures
from service.replay.options import ReplayOptions
from service.replay.prequential import (
    Trace,
    ends_rejecting,
    pre_change_level,
    recovery,
    run_stream,
    window_risk,
)
from service.replay.protocol import plan_trials
from service.replay.results import Variant
from service.replay.sequential import replay_sequential, variant_learner

Dataset = tuple[np.ndarray, np.ndarray]


@pytest.mark.parametrize("fit", ["labels", "events"])
@pytest.mark.parametrize("variant", [Variant("dsal", 0.1, "budget"), Variant("dral")])
def test_run_stream_counts_what_the_replay_counts(
    guide_like: Dataset, fit: str, variant: Variant
) -> None:
    X, y = guide_like
    options = ReplayOptions(
        algorithms=(variant.algorithm,),
        costs=(0.25,),
        runs=2,
        trials=700,
        seed=5,
        scaler_fit=fit,  # type: ignore[arg-type]
        label_budgets=() if variant.label_budget is None else (variant.label_budget,),
    )
    plan = plan_trials(X.shape[0], options.runs, options.trials, options.seed)
    features = RunFeatures(X, plan, standardize=True, intercept=True)
    (series,) = replay_sequential(y, plan, features, options, [variant])
    for r in range(options.runs):
        model = variant_learner(variant, 0.25, features.n_features, options)
        rows = plan.indices[r]
        if fit == "labels":
            trace = run_stream(
                model, X[rows], y[rows], plan.coins[r], 0.25, pipeline=features.pipeline()
            )
        else:
            trace = run_stream(model, features.run(r), y[rows], plan.coins[r], 0.25)
        at = series.grid - 1
        np.testing.assert_allclose(np.cumsum(trace.loss)[at], series.counts["loss"][:, r])
        assert np.array_equal(np.cumsum(trace.asked)[at], series.counts["asked"][:, r])
        assert np.array_equal(np.cumsum(trace.decision == 0)[at], series.counts["rejected"][:, r])
        wrong = (trace.decision != 0) & (trace.decision != y[rows])
        assert np.array_equal(np.cumsum(wrong)[at], series.counts["misclassified"][:, r])


class _Recorder:
    """A learner that records what it is given (and asks for every label)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seen = inner, []
        self.changes_detected = 0

    def decide(self, x: Any, coin: float | None = None) -> Any:
        return self.inner.decide(x, coin=coin)

    def query_utility(self, f: Any) -> Any:
        return self.inner.query_utility(f)

    def update(self, x: Any, y: Any, *, query_probability: float = 1.0) -> bool:
        self.seen.append(query_probability)
        if len(self.seen) == 3:
            self.changes_detected += 1
        return bool(self.inner.update(x, y))


def test_the_learner_gets_the_probability_its_label_was_asked_with() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2))
    y = np.where(X[:, 0] > 0, 1, -1)
    recorder = _Recorder(DSAL(n_features=3, cost=0.25))
    model = Budgeted(recorder, QueryBudget(0.2))
    trace = run_stream(model, X, y, rng.random(300), 0.25, pipeline=default_pipeline(2))
    assert len(recorder.seen) == trace.labels > 0
    assert recorder.seen == trace.probability[trace.asked].tolist()
    (third,) = np.flatnonzero(trace.asked)[2:3]
    assert trace.changes == (int(third),)  # the event whose label made it count a change


def test_bad_lengths_are_refused() -> None:
    learner = make_learner("dsal", n_features=2, cost=0.25)
    with pytest.raises(ReplayConfigError):
        run_stream(learner, np.zeros((3, 2)), np.ones(2, dtype=np.int64), [0.5] * 3, 0.25)


def test_window_risk_is_the_trailing_mean() -> None:
    loss = np.random.default_rng(1).random(50)
    w = window_risk(loss, 7)
    for t in range(50):
        assert w[t] == pytest.approx(loss[max(0, t - 6) : t + 1].mean())
    with pytest.raises(ReplayConfigError):
        window_risk(loss, 0)


def test_recovery_counts_until_the_last_bad_event_leaves_the_window() -> None:
    level, bad = 0.1, 1.0
    loss = np.r_[np.full(2000, level), np.full(30, bad), np.full(3000, level)]
    # the window is back within 1.1 x the level once at most (500 x 0.01 / 0.9) bad events
    # remain in it: 5 of the 30, i.e. 25 have left it, 25 + 499 events after the change
    assert recovery(loss, 2000) == 524
    assert recovery(np.full(5000, level), 2000) == 0
    assert recovery(np.r_[np.full(2000, level), np.full(3000, bad)], 2000) is None
    assert pre_change_level(loss, 2000) == pytest.approx(level)
    with pytest.raises(ReplayConfigError):
        pre_change_level(loss, 0)


def test_ends_rejecting_looks_at_the_last_window_only() -> None:
    n = 1000
    rejecting = np.r_[np.ones(500, dtype=np.int8), np.zeros(500, dtype=np.int8)]
    trace = Trace(np.zeros(n), rejecting, np.zeros(n, bool), np.zeros(n), 0.25)
    assert ends_rejecting(trace)
    trace = Trace(np.zeros(n), rejecting[::-1].copy(), np.zeros(n, bool), np.zeros(n), 0.25)
    assert not ends_rejecting(trace)
    assert trace.risk == 0.0
    assert trace.labels == 0
