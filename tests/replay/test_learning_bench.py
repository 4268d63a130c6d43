"""The tuning of ``loadtest/learning_bench.py``'s peers: each budgeted peer's knob is searched
until it asks the budget, and every step, rate and knob is chosen on the tuning run of a
stream alone, never on the runs the tables report."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

from .scripts import load_script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_script("learning_bench.py", "learning_bench_tuning")


def _stream(bench: ModuleType, n: int = 400, seed: int = 3) -> Any:
    """A small noisy linear stream of 3 features (labels +1/-1)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3)) * np.array([1.0, 5.0, 0.2]) + np.array([0.0, 10.0, -1.0])
    score = X[:, 0] - 0.3 * (X[:, 1] - 10.0) + rng.logistic(scale=0.5, size=n)
    y = np.where(score > 0, 1, -1)
    return bench.Run("synthetic", seed, X, y, rng.random(n))


@pytest.mark.parametrize("rising", [True, False])
def test_the_search_lands_within_its_tolerance_of_the_target(
    bench: ModuleType, rising: bool
) -> None:
    calls: list[float] = []

    def asked(knob: float) -> float:  # the fraction asked: monotone in the knob
        calls.append(knob)
        f = knob / (1.0 + knob)
        return f if rising else 1.0 - f

    knob, fraction = bench.search_knob(
        asked, 0.1, 1e-4, 1e4, rising=rising, tol=0.02, iterations=12
    )
    assert fraction == pytest.approx(0.1, rel=0.02)
    assert asked(knob) == fraction
    assert len(calls) <= 12
    assert all(1e-4 < c < 1e4 for c in calls)


def test_a_search_that_cannot_land_takes_the_least_that_asks_the_budget(
    bench: ModuleType,
) -> None:
    # asking jumps from 2 % to 40 % at knob 1: the cap holds a knob above it to the budget
    knob, fraction = bench.search_knob(
        lambda k: 0.4 if k > 1 else 0.02, 0.1, 1e-3, 1e3, rising=True
    )
    assert fraction == 0.4
    assert knob > 1
    knob, fraction = bench.search_knob(lambda k: 0.05, 0.1, 1e-3, 1e3, rising=True)
    assert fraction == 0.05
    assert 1e-3 < knob < 1e3


@pytest.mark.parametrize("budget", [0.1, 0.2])
def test_the_entropy_samplers_discount_is_searched_until_it_asks_the_budget(
    bench: ModuleType, budget: float
) -> None:
    pytest.importorskip("river")
    run = _stream(bench)
    base = {"step": 0.1, "intercept_step": 0.1}
    knobs = bench.tune_budgeted("river-es", run, budget, base)
    assert knobs["step"] == 0.1
    assert knobs["asked"] == pytest.approx(budget, rel=0.15)
    # the fraction reported is what the peer asks, free of the cap, with that knob
    free = bench.peer_trace("river-es", run, budget, knobs, cap=False)
    assert free.labels / run.y.shape[0] == knobs["asked"]
    held = bench.peer_trace("river-es", run, budget, knobs)
    assert held.labels <= budget * run.y.shape[0]


def test_vowpal_wabbits_mellowness_is_searched_until_it_asks_the_budget(
    bench: ModuleType,
) -> None:
    pytest.importorskip("vowpalwabbit")
    run = _stream(bench)
    knobs = bench.tune_budgeted("vw-active", run, 0.2, {"learning_rate": 0.5, "scaled": True})
    assert knobs["asked"] == pytest.approx(0.2, rel=0.15)
    held = bench.peer_trace("vw-active", run, 0.2, knobs)
    assert 0 < held.labels <= 0.2 * run.y.shape[0]
    full = bench.peer_trace("vw", run, None, knobs)
    assert full.labels == run.y.shape[0]


def test_the_step_grid_picks_the_lowest_risk_on_the_run_it_is_given(bench: ModuleType) -> None:
    pytest.importorskip("river")
    run = _stream(bench)
    steps = (0.01, 0.1, 1.0)
    knobs = bench.tune_steps(run, steps)
    risks = {
        (s, i): bench.river_run(run, None, step=s, intercept_step=i).risk
        for s in steps
        for i in steps
    }
    assert knobs["risk"] == risks[knobs["step"], knobs["intercept_step"]]
    # the step is the best with the intercept at the same step, the intercept's the best then
    assert knobs["step"] == min(steps, key=lambda s: (risks[s, s], s))
    assert knobs["risk"] == min(risks[knobs["step"], i] for i in steps)


def test_every_peer_is_tuned_on_the_tuning_run_alone(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("river")
    pytest.importorskip("sklearn")
    seen: list[int] = []
    river_run, vw_run = bench.river_run, bench.vw_run

    def spy_river(run: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(run.run)
        return river_run(run, *args, **kwargs)

    def spy_vw(run: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(run.run)
        return vw_run(run, *args, **kwargs)

    monkeypatch.setattr(bench, "river_run", spy_river)
    monkeypatch.setattr(bench, "vw_run", spy_vw)
    monkeypatch.setattr(bench, "STEPS", (0.1, 1.0))
    monkeypatch.setattr(bench.tune_steps, "__defaults__", ((0.1, 1.0),))
    tuned = bench.tune("iris", "river", [("river-lr", None), ("river-es", 0.2)])
    assert set(tuned) == {"river-lr", "river-es @0.2"}
    assert seen
    assert set(seen) == {bench.TUNE}
    # the tuning order is none of the evaluated ones
    tuning = bench.tuning_run("iris")
    for run in bench.runs_of("iris", 10):
        assert not np.array_equal(run.X, tuning.X)
        assert sorted(map(tuple, run.X)) == sorted(map(tuple, tuning.X))  # the same events


def test_a_peers_tuning_is_written_beside_its_row(bench: ModuleType) -> None:
    results = {
        "River LR (tuned), all labels": {
            "s": [{"risk": 0.1, "labels": 5, "tuning": {"step": 0.2, "intercept_step": 0.05}}]
        },
        "abstain served, all labels": {"s": [{"risk": 0.09, "labels": 5}]},
    }
    text = bench.table(results)
    assert "0.1000 [0.1000-0.1000] (step 0.2/0.05)" in text
    assert "| abstain served, all labels | 0.0900 [0.0900-0.0900] |" in text


def test_the_fields_streams_are_encoded_as_a_worker_encodes_their_events(
    bench: ModuleType,
) -> None:
    import orjson

    from service.config import ModelConfig
    from service.records import parse_feature_event
    from service.stream.models.served import ServedModel

    events, y = bench.declared_events("text-fields", 300)
    assert {type(v) for e in events for v in e.values()} >= {str, bool, list, float}
    assert any(e["country"] is None for e in events)
    assert set(y.tolist()) == {-1, 1}
    config = ModelConfig.model_validate(
        {"algorithm": "dsal", "fields": bench.DECLARED["text-fields"]}
    )
    model = ServedModel.initial("m", config)
    X, y_all = bench._declared("text-fields")
    assert X.shape == (10_000, config.n_inputs)
    assert np.array_equal(y_all[:300], y)
    for i in (0, 1, 150, 299):  # each event as a producer sends it, read by the worker
        raw = orjson.dumps({"id": f"e{i}", "features": events[i]})
        event = parse_feature_event(raw, default_model="m")
        assert np.array_equal(X[i], model.raw_vector(event))
