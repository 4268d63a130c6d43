"""The adaptive wrapper: it keeps the learner contract, notices a change, recovers by
itself (a mirror after a flip, a fresh model after a collapse), explores where the old
model would not ask, and round-trips its whole state, challengers included."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from service.learning import (
    DSAL,
    Budgeted,
    HyperparameterError,
    InputError,
    LearningError,
    Parts,
    QueryBudget,
    StateError,
    learner_for,
    make_learner,
    serving_state,
)
from service.learning.adaptive import ADAPTIVE_FORMAT, Adaptive
from service.learning.adaptive.challengers import challenger_for
from service.learning.drift import ADWIN, PageHinkley
from service.learning.state import FrozenRecord

N = 3  # two features and an intercept


def flipped_stream(n: int = 1200, flip: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Standardised rows with an intercept; ``y = sign(x1 + 0.5 x2)``, negated from ``flip``."""
    rng = np.random.default_rng(seed)
    X = np.c_[rng.normal(size=(n, 2)), np.ones(n)]
    y = np.where(X[:, 0] + 0.5 * X[:, 1] > 0, 1, -1)
    noise = rng.random(n) < 0.05
    y = np.where(noise, -y, y) * np.where(np.arange(n) < flip, 1, -1)
    return X, y


def feed(model: Any, X: np.ndarray, y: np.ndarray) -> None:
    for x, label in zip(X, y, strict=True):
        model.update(x, int(label))


def until_challenged(model: Adaptive, X: np.ndarray, y: np.ndarray) -> int:
    """Feed labels until challengers run; return how many were fed."""
    for i, (x, label) in enumerate(zip(X, y, strict=True)):
        model.update(x, int(label))
        if model.running:
            return i + 1
    raise AssertionError("no challenger started")


def accuracy(model: Any, X: np.ndarray, y: np.ndarray) -> float:
    labels = np.array([model.decide(x, coin=0.5).label for x in X])
    return float((labels == y).mean())


def test_a_label_flip_is_detected_once_and_the_mirror_takes_over() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    feed(model, X[:600], y[:600])
    assert (model.changes_detected, model.takeovers) == (0, 0)
    before = accuracy(model, X[:600], y[:600])
    feed(model, X[600:], y[600:])
    assert (model.changes_detected, model.takeovers) == (1, 1)
    assert model.champion_origin == "mirror"
    assert model.last_change is not None
    assert 600 < model.last_change < 650
    after = accuracy(model, X[600:], y[600:])
    assert before > 0.8
    assert after > 0.8
    plain = DSAL(n_features=N, cost=0.25)
    feed(plain, X, y)
    assert accuracy(plain, X[600:], y[600:]) < 0.3


def budgeted_labels(model: Adaptive, n: int, wrong: float, seed: int = 3) -> None:
    """Labels as a budget asks them: 97 % near the champion's boundary (p = 0.5, a quarter
    of them against it), 3 % spent uniformly (p = 0.01, on events it is sure of, labelled
    against it with probability ``wrong``)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        if rng.random() < 0.97:
            y = -1 if rng.random() < 0.25 else 1
            model.update(np.array([0.5, 0.0, 1.0]), y, query_probability=0.5)
        else:
            y = -1 if rng.random() < wrong else 1
            model.update(np.array([4.0, 0.0, 1.0]), y, query_probability=0.01)


def test_a_champion_right_where_it_asks_and_wrong_elsewhere_is_a_change() -> None:
    detectors = {}
    for weighted in (True, False):
        model = Adaptive(DSAL(n_features=N, cost=0.25), weighted=weighted, challengers=())
        budgeted_labels(model, 2000, wrong=0.0, seed=13)
        assert model.decide([4.0, 0.0, 1.0]).label == 1
        settled = model.changes_detected
        budgeted_labels(model, 500, wrong=0.0, seed=15)
        assert model.changes_detected == settled  # the same stream: no change
        budgeted_labels(model, 2000, wrong=0.8, seed=14)  # sure and now wrong
        detectors[weighted] = model.changes_detected - settled
    # the plain detector reads mostly the labels near the boundary, which stay right
    assert detectors[False] == 0
    assert detectors[True] >= 1


def test_with_every_label_the_weighted_detector_reads_what_the_plain_one_does() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25), challengers=())
    for x, label in zip(X[:640], y[:640], strict=True):
        model.update(x, int(label))
        assert model.weighted_detector is not None
        assert model.detector is not None
        assert model.weighted_detector.to_state() == model.detector.to_state()
    plain = Adaptive(DSAL(n_features=N, cost=0.25), challengers=(), weighted=False)
    feed(plain, X[:640], y[:640])
    assert plain.weighted_detector is None
    assert (plain.changes_detected, plain.last_change) == (
        model.changes_detected,
        model.last_change,
    )


def test_risk_since_the_change_counts_the_labels_after_it() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    feed(model, X[:300], y[:300])
    assert model.risk_since_change.labels == 300
    feed(model, X[300:], y[300:])
    est = model.risk_since_change  # restarted at the change, then at the takeover
    assert 0 < est.labels < 600
    assert est.risk < 0.2


def test_a_collapsed_champion_is_replaced_by_a_fresh_model() -> None:
    rng = np.random.default_rng(1)
    X = np.c_[rng.normal(size=(2000, 2)), np.ones(2000)]
    y = np.where(X[:, 0] > 0, 1, -1)
    stuck = DSAL(n_features=N, cost=0.25, rho=30.0)  # rejects every event, rho grows
    model = Adaptive(stuck, detector=None)
    feed(model, X, y)
    assert model.changes_detected >= 1
    assert model.champion_origin == "fresh"
    assert model.rho < 5.0
    assert accuracy(model, X[-500:], y[-500:]) > 0.9


def test_a_stationary_stream_keeps_its_champion() -> None:
    X, y = flipped_stream(n=4000, flip=4000, seed=2)
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    plain = DSAL(n_features=N, cost=0.25)
    feed(model, X, y)
    feed(plain, X, y)
    assert model.takeovers == 0
    assert model.champion_origin == "initial"
    assert np.array_equal(model.w, plain.w)  # the champion learned exactly what DSAL learns


def test_exploration_floors_the_utility_at_the_start_and_after_a_change() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25), explore_start=3, explore_after=4)
    sure = 50.0  # a score the champion is sure of: DSAL's own utility is ~0
    for _ in range(3):
        assert model.exploring
        assert model.query_utility(sure) == 0.5
        assert model.decide(X[0] * 0.0 + [25.0, 0.0, 1.0], coin=0.4).query_probability >= 0.5
        model.update(X[0], int(y[0]))
    assert not model.exploring
    assert model.query_utility(sure) < 1e-6
    feed(model, X[1:600], y[1:600])
    changes = model.changes_detected
    for x, label in zip(X[600:], y[600:], strict=True):
        model.update(x, int(label))
        if model.changes_detected > changes:
            break
    assert model.exploring
    probs = model.query_utility(np.array([sure, -sure, 0.0]))
    assert (probs >= 0.5).all()


def test_a_budget_over_the_wrapper_asks_with_the_true_probability() -> None:
    X, y = flipped_stream(n=8000, flip=4000)
    coins = np.random.default_rng(5).random(X.shape[0])
    model = Budgeted(Adaptive(DSAL(n_features=N, cost=0.25)), QueryBudget(0.1))
    twin = QueryBudget(0.1)
    asked = 0
    for x, label, c in zip(X, y, coins, strict=True):
        d = model.decide(x, coin=float(c))
        p, q = twin.ask(model.learner.query_utility(d.score), coin=float(c))
        assert (d.query_probability, d.query) == (p, q)
        if d.query:
            asked += 1
            model.learner.update(x, int(label), query_probability=d.query_probability)
    assert 0.05 * X.shape[0] < asked < 0.15 * X.shape[0]
    assert model.learner.changes_detected >= 1


def test_decide_many_decides_as_decide_does_and_counts_only_the_floored_decisions() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25), explore_start=5)
    feed(model, X[:2], y[:2])  # still exploring: the floor lasts ceil(5 / 0.5) = 10 decisions
    twin = Adaptive.from_state(model.to_state())
    coins = np.random.default_rng(3).random(50)
    before = model.to_state()
    labels, scores, probs, queries = model.decide_many(X[:50], coins=coins)
    one = [twin.decide(x, coin=float(c)) for x, c in zip(X[:50], coins, strict=True)]
    assert twin.to_state() == model.to_state()
    after = model.to_state()
    assert after["learned"].pop("explored") == 10
    before["learned"].pop("explored")
    assert after == before  # deciding moves the count of floored decisions, nothing else
    assert labels.tolist() == [d.label for d in one]
    np.testing.assert_allclose(scores, [d.score for d in one], rtol=1e-12)
    np.testing.assert_allclose(probs, [d.query_probability for d in one], rtol=1e-12)
    assert queries.tolist() == [d.query for d in one]
    assert (probs[:10] >= 0.5).all()
    assert model.exploring  # the labels have not come back: a budget's utilities stay floored
    assert model.query_utility(50.0) == 0.5


def _changed(model: Adaptive, X: np.ndarray, y: np.ndarray) -> int:
    """Feed labels until a change is detected; return how many were fed."""
    for i, (x, label) in enumerate(zip(X, y, strict=True)):
        model.update(x, int(label))
        if model.changes_detected:
            return i + 1
    raise AssertionError("no change detected")


def test_without_a_budget_the_floor_after_a_change_asks_a_window_of_decisions() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    _changed(model, X, y)
    sure = np.array([25.0, 0.0, 1.0])  # the champion is sure of it: its own p is ~0
    assert model.champion.decide(sure, coin=0.5).query_probability < 1e-3
    assert model.explore_decisions == 20  # 20 labels at a floor of 1
    # no label comes back: only the first 20 decisions are asked at the floor
    probs = [model.decide(sure, coin=0.999).query_probability for _ in range(100)]
    assert probs[:20] == [1.0] * 20
    assert max(probs[20:]) < 1e-3
    assert model.explored == 20
    assert model.exploring  # ... while a budget keeps the floor until 20 labels are back
    assert model.query_utility(50.0) == 1.0
    # decide_many ends the window at the same decision
    again = Adaptive.from_state(model.to_state())
    again._explored = 15
    _, _, many, _ = again.decide_many(np.tile(sure, (8, 1)), coins=np.full(8, 0.999))
    assert many.tolist()[:5] == [1.0] * 5
    assert max(many[5:]) < 1e-3
    # a new change opens a new window
    fresh = Adaptive(DSAL(n_features=N, cost=0.25), explore_events=3)
    _changed(fresh, X, y)
    assert [fresh.decide(sure, coin=0.5).query_probability for _ in range(4)][2:] == [
        1.0,
        pytest.approx(fresh.champion.decide(sure, coin=0.5).query_probability),
    ]


def test_the_decision_window_leaves_a_budgeted_model_as_it_was() -> None:
    X, y = flipped_stream(n=4000, flip=2000)
    coins = np.random.default_rng(8).random(X.shape[0])
    runs = []
    for events in (None, 0, 5000):
        model = Budgeted(
            Adaptive(DSAL(n_features=N, cost=0.25), explore_events=events), QueryBudget(0.1)
        )
        asked = []
        for x, label, c in zip(X, y, coins, strict=True):
            d = model.decide(x, coin=float(c))
            asked.append((d.query, d.query_probability))
            if d.query:
                model.learner.update(x, int(label), query_probability=d.query_probability)
        assert model.learner.changes_detected >= 1
        runs.append(asked)
    assert runs[0] == runs[1] == runs[2]


def test_a_scorer_keeps_counting_across_versions_of_the_same_floor() -> None:
    X, y = flipped_stream()
    labels = Adaptive(DSAL(n_features=N, cost=0.25))  # the label path's copy
    fed = _changed(labels, X, y)
    scoring = Adaptive.from_state(labels.to_state())  # the version a scorer serves
    sure = np.array([25.0, 0.0, 1.0])
    for _ in range(12):
        scoring.decide(sure, coin=0.5)
    labels.update(X[fed], int(y[fed]))  # a label: the next version, its count still 0
    newer = Adaptive.from_state(labels.to_state())
    assert newer.explored == 0
    newer.continue_from(scoring)
    assert newer.explored == 12
    assert [newer.decide(sure, coin=0.5).query_probability for _ in range(9)].count(1.0) == 8
    later = Adaptive(DSAL(n_features=N, cost=0.25))  # another floor: nothing to continue
    later.continue_from(scoring)
    assert later.explored == 0


def test_a_record_without_the_count_of_floored_decisions_loads() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    _changed(model, X, y)
    old = model.to_state()
    del old["learned"]["explored"]
    del old["params"]["explore_events"]
    restored = Adaptive.from_state(old)
    assert (restored.explored, restored.explore_events, restored.explore_decisions) == (0, None, 20)


def test_a_record_from_before_the_weighted_detector_loads_with_a_fresh_one() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    feed(model, X[:300], y[:300])
    old = model.to_state()
    del old["weighted_detector"], old["learned"]["least_p"], old["params"]["weighted"]
    restored = Adaptive.from_state(old)
    assert restored.weighted
    assert restored.weighted_detector is not None
    assert restored.weighted_detector.to_state() == ADWIN(**model.detector.get_params()).to_state()
    restored.update(X[300], int(y[300]), query_probability=0.2)
    assert restored.to_state()["learned"]["least_p"] == 0.2


def test_without_coins_the_wrapper_draws_its_own_from_its_seed() -> None:
    X, _ = flipped_stream()
    a, b = (Adaptive(DSAL(n_features=N, cost=0.25), seed=9) for _ in range(2))
    assert [a.decide(x).query for x in X[:200]] == [b.decide(x).query for x in X[:200]]


@pytest.mark.parametrize("cut", [0, 300, 640, 700, 1100])
def test_a_json_round_trip_keeps_decisions_and_the_future(cut: int) -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    feed(model, X[:cut], y[:cut])
    state = json.loads(json.dumps(model.to_state(), allow_nan=False))
    assert state["format"] == ADAPTIVE_FORMAT
    copy = Adaptive.from_state(state)
    assert copy.to_state() == model.to_state()
    assert copy.running == model.running
    for x, label in zip(X[cut:], y[cut:], strict=True):
        assert copy.decide(x, coin=0.3) == model.decide(x, coin=0.3)
        assert copy.update(x, int(label)) == model.update(x, int(label))
    assert copy.to_state() == model.to_state()


def test_a_remembered_label_s_record_is_made_once_and_never_changes() -> None:
    """A learner writes a state per label: the labels it remembers are not made into
    records again for each (the states share them), and no later label changes a state
    already made."""
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    feed(model, X[:100], y[:100])
    first = model.to_state()
    frozen = json.dumps(first)
    feed(model, X[100:103], y[100:103])
    second = model.to_state()
    old, new = first["recall"]["labels"], second["recall"]["labels"]
    assert len(old) == len(new)
    assert all(a is b for a, b in zip(old[3:], new, strict=False))  # shared, not rebuilt
    snaps = first["recall"]["snapshots"], second["recall"]["snapshots"]
    assert any(a is b for a in snaps[0] for b in snaps[1])  # the snapshots' records too
    for record in [*new, *snaps[1]]:  # frozen: what a writer checked of one holds
        assert isinstance(record, FrozenRecord)
        assert record.unchanged()
    assert json.dumps(first) == frozen  # what was written stays as it was
    copy = Adaptive.from_state(json.loads(json.dumps(second)))
    assert copy.to_state() == second


def test_challengers_are_part_of_the_state_while_they_run() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25), min_labels=50)
    until_challenged(model, X, y)
    state = model.to_state()
    assert [c["kind"] for c in state["contest"]["challengers"]] == ["mirror", "fresh", "tail"]
    assert Adaptive.from_state(state).running == ("mirror", "fresh", "tail")


@pytest.mark.parametrize(
    "bad",
    [
        {"x": [np.nan, 0.0, 1.0]},
        {"x": [0.0, 1.0]},
        {"y": 0},
        {"y": "1"},
        {"query_probability": 0.0},
        {"query_probability": 1.5},
        {"query_probability": float("nan")},
    ],
)
def test_bad_input_is_refused_and_changes_nothing(bad: dict[str, Any]) -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    fed = until_challenged(model, X, y)
    before = json.dumps(model.to_state())
    args = {"x": X[fed], "y": 1, "query_probability": 0.5} | bad
    with pytest.raises(InputError):
        model.update(args["x"], args["y"], query_probability=args["query_probability"])
    assert json.dumps(model.to_state()) == before


def test_each_part_can_be_turned_off() -> None:
    X, y = flipped_stream()
    blind = Adaptive(DSAL(n_features=N, cost=0.25), detector=None, collapse_window=0)
    feed(blind, X, y)
    assert (blind.changes_detected, blind.takeovers) == (0, 0)
    watch_only = Adaptive(DSAL(n_features=N, cost=0.25), challengers=())
    feed(watch_only, X, y)
    assert watch_only.changes_detected >= 1
    assert watch_only.takeovers == 0
    quiet = Adaptive(DSAL(n_features=N, cost=0.25), explore_floor=0.0)
    assert not quiet.exploring
    assert quiet.query_utility(50.0) == quiet.champion.query_utility(50.0)


def test_page_hinkley_can_watch_instead_of_adwin() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25), detector=PageHinkley(threshold=5.0, mode="up"))
    feed(model, X, y)
    assert model.takeovers >= 1
    restored = Adaptive.from_state(json.loads(json.dumps(model.to_state())))
    assert isinstance(restored.detector, PageHinkley)


@pytest.mark.parametrize("name", ["dral", "dsal", "dsol", "kernel-dsal", "kernel-dral"])
def test_the_mirror_of_any_learner_decides_the_other_way(name: str) -> None:
    X, y = flipped_stream(n=300, flip=300)
    learner = make_learner(name, n_features=N, cost=0.25)
    feed(learner, X, y)
    mirror = challenger_for(learner, "mirror", rho=0.7)
    assert mirror.rho == 0.7
    for x in X[:20]:
        assert mirror.decide(x, coin=0.5).score == pytest.approx(-learner.decide(x, coin=0.5).score)
    fresh = challenger_for(learner, "fresh", rho=0.7)
    assert fresh.steps == 0
    assert fresh.weight_norm() == 0.0


@pytest.mark.parametrize("name", ["dral", "dsol", "kernel-dsal"])
def test_other_learners_recover_from_the_flip_too(name: str) -> None:
    X, y = flipped_stream()
    model = Adaptive(make_learner(name, n_features=N, cost=0.25))
    feed(model, X, y)
    assert model.takeovers >= 1
    assert accuracy(model, X[900:], y[900:]) > 0.75
    assert Adaptive.from_state(json.loads(json.dumps(model.to_state()))).to_state() == (
        model.to_state()
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"challengers": ("fresh", "copy")},
        {"challengers": ("fresh", "fresh")},
        {"z": -1.0},
        {"z": True},
        {"min_labels": 0},
        {"patience": 0},
        {"explore_floor": 1.5},
        {"explore_start": -1},
        {"explore_events": -1},
        {"collapse_window": -1},
        {"detector": "adwin"},
        {"seed": -1},
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(HyperparameterError):
        Adaptive(DSAL(n_features=N, cost=0.25), **kwargs)


def test_only_a_learner_can_be_wrapped() -> None:
    with pytest.raises(HyperparameterError):
        Adaptive(ADWIN())


def test_state_records_are_checked() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    until_challenged(model, X, y)
    good = model.to_state()
    bad: list[dict[str, Any]] = [
        {**good, "format": "abstain.learner"},
        {**good, "version": 2},
        {**good, "params": {**good["params"], "colour": "red"}},
        {**good, "params": {**good["params"], "z": -3}},
        {**good, "champion_origin": "elsewhere"},
        {**good, "contest": {**good["contest"], "challengers": [{"kind": "copy"}]}},
        {**good, "contest": {**good["contest"], "challengers": "fresh"}},
        {**good, "collapse_watch": None},
        {**good, "recall": {**good["recall"], "labels": good["recall"]["labels"] * 9}},
        {**good, "contest": {**good["contest"], "duels": []}},
        {**good, "learned": {**good["learned"], "labels": -1}},
        {**good, "learned": {**good["learned"], "least_p": 1.5}},
        {**good, "learned": {**good["learned"], "least_p": 0.0}},
        {**good, "weighted_detector": {"kind": "adwin"}},
        {**good, "params": {**good["params"], "weighted": "yes"}},
        {**good, "params": {**good["params"], "weighted": False}},  # its detector is there
    ]
    for record in bad:
        with pytest.raises(StateError):
            Adaptive.from_state(record)


def test_the_wrapper_and_the_detectors_import_numpy_and_the_standard_library_only() -> None:
    probe = (
        "import sys, service.learning.adaptive, service.learning.drift; print(*sorted(sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    top = {m.split(".")[0] for m in loaded if not m.startswith("_")}
    assert top - set(sys.stdlib_module_names) - {"numpy", "service"} == set()
    assert {m for m in loaded if m.startswith("service")} <= {"service", "service.errors"} | {
        m for m in loaded if m.startswith("service.learning")
    }


def _takeover_label(model: Adaptive, X: np.ndarray, y: np.ndarray) -> tuple[int, int]:
    """(labels fed at the detected change, labels fed at the takeover)."""
    change = 0
    for i, (x, label) in enumerate(zip(X, y, strict=True)):
        model.update(x, int(label))
        if not change and model.changes_detected:
            change = i + 1
        if model.takeovers:
            return change, i + 1
    raise AssertionError("no takeover")


def test_remembered_labels_start_the_challengers_at_the_change() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    fed = until_challenged(model, X, y)
    state = model.to_state()
    replayed = state["contest"]["challengers"][0]["n"]
    assert 0 < replayed <= 32 + 8  # tested on the labels since the change, before any new one
    first_snapshot = state["recall"]["snapshots"][0]["n"]
    assert first_snapshot % 8 == 0
    change, took = fed, _takeover_label(model, X[fed:], y[fed:])[1] + fed
    assert took - change == 10  # then min_labels new labels, and the mirror takes over
    assert model.champion_origin == "mirror"
    blank = Adaptive(DSAL(n_features=N, cost=0.25), memory=0)
    until_challenged(blank, X, y)
    assert blank.to_state()["contest"]["challengers"][0]["n"] == 0


def test_a_fresh_challenger_must_also_beat_the_mirror() -> None:
    X, y = flipped_stream()
    both = Adaptive(DSAL(n_features=N, cost=0.25))
    feed(both, X, y)
    assert both.champion_origin == "mirror"
    # alone, the fresh model beats the wrong champion too; beside the mirror it does not
    fresh_only = Adaptive(DSAL(n_features=N, cost=0.25), challengers=("fresh",))
    feed(fresh_only, X, y)
    assert fresh_only.champion_origin == "fresh"
    assert accuracy(both, X[700:], y[700:]) > accuracy(fresh_only, X[700:], y[700:])


def turning_stream(n: int, period: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``y = sign(cos(a) x1 + sin(a) x2)`` with the angle ``a`` turning a full circle every
    ``period`` labels: a boundary that never stops moving."""
    rng = np.random.default_rng(seed)
    X = np.c_[rng.normal(size=(n, 2)), np.ones(n)]
    a = 2 * np.pi * np.arange(n) / period
    y = np.where(np.cos(a) * X[:, 0] + np.sin(a) * X[:, 1] > 0, 1, -1)
    return X, y


def _risk_after(model: Adaptive, X: np.ndarray, y: np.ndarray, start: int) -> float:
    losses = []
    for x, label in zip(X, y, strict=True):
        d = model.decide(x, coin=0.5)
        losses.append(float(d.label * label < 0) + 0.25 * float(d.label == 0))
        model.update(x, int(label))
    return float(np.mean(losses[start:]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_on_a_boundary_that_keeps_turning_the_tail_challenger_takes_over(seed: int) -> None:
    """The paper's loss is flat where the model is confidently wrong, which a turning
    boundary makes all the time; the challenger with the logistic tail keeps learning there,
    wins the paired test and serves from then on, with a lower risk than the wrapper whose
    challengers are the mirror and a fresh model only."""
    X, y = turning_stream(6000, 4000, seed)
    model = Adaptive(make_learner("dsol", n_features=N, cost=0.25, update_rule="normalized"))
    without = Adaptive(
        make_learner("dsol", n_features=N, cost=0.25, update_rule="normalized"),
        challengers=("mirror", "fresh"),
    )
    risk, risk_without = _risk_after(model, X, y, 2000), _risk_after(without, X, y, 2000)
    assert model.champion_origin == "tail"
    assert model.champion.tail > 0.0
    assert risk < 0.8 * risk_without


def test_a_double_ramp_champion_runs_no_tail_challenger() -> None:
    X, y = flipped_stream()
    model = Adaptive(make_learner("dral", n_features=N, cost=0.25), min_labels=50)
    until_challenged(model, X, y)
    assert model.running == ("mirror", "fresh")
    assert Adaptive.from_state(model.to_state()).running == ("mirror", "fresh")


def test_a_model_read_to_serve_decides_as_the_whole_and_never_learns_or_writes() -> None:
    """What a scorer reads of each version: the champion and the exploration, not the
    challengers of a running contest nor the labels it remembers. It decides as the whole
    model read from the same record does, counts its floored decisions alike, and refuses
    to learn or to write a state it holds only part of."""
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25), min_labels=50)
    until_challenged(model, X, y)
    state = json.loads(json.dumps(model.to_state()))
    whole, served = Adaptive.from_state(state), Adaptive.from_state(state, serving=True)
    assert whole.running == ("mirror", "fresh", "tail")
    assert served.running == whole.running  # their kinds read, not their learners
    short = Adaptive.from_state(serving_state(state), serving=True)  # the models topic's
    assert short.running == whole.running
    with pytest.raises(StateError, match="read to serve .* cannot be learned on"):
        Adaptive.from_state(serving_state(state))
    coins = np.random.default_rng(3).random(len(X))
    for a, b in zip(
        whole.decide_many(X, coins=coins), served.decide_many(X, coins=coins), strict=True
    ):
        np.testing.assert_array_equal(a, b)
    assert served.explored == whole.explored
    assert (served.rho, served.labels, served.changes_detected) == (
        whole.rho,
        whole.labels,
        whole.changes_detected,
    )
    with pytest.raises(LearningError, match="read to serve cannot learn"):
        served.update(X[0], 1)
    with pytest.raises(LearningError, match="read to serve cannot write its state"):
        served.to_state()
    assert served.decide(X[0], coin=0.5) == whole.decide(X[0], coin=0.5)  # unchanged by either


def test_a_model_read_to_serve_checks_only_that_its_learners_parts_are_objects() -> None:
    X, y = flipped_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25), min_labels=50)
    until_challenged(model, X, y)
    state = json.loads(json.dumps(model.to_state()))
    damaged = {**state, "recall": {"labels": [{"x": "not numbers"}], "snapshots": []}}
    with pytest.raises(StateError):
        Adaptive.from_state(damaged)  # the learner reads it, and refuses it
    Adaptive.from_state(damaged, serving=True)  # a scorer does not read it
    for part in ("recall", "contest"):
        with pytest.raises(StateError, match="must be objects"):
            Adaptive.from_state({**state, part: [1, 2]}, serving=True)


def burst_stream(n: int = 1000, start: int = 600, end: int = 620) -> tuple[np.ndarray, np.ndarray]:
    """:func:`flipped_stream`'s concept with the labels of ``start``-``end`` against it (a
    burst: a detector fires, and the labels it replays favour the mirror)."""
    X, y = flipped_stream(n, flip=n)
    burst = (np.arange(n) >= start) & (np.arange(n) < end)
    return X, np.where(burst, -y, y)


def _served(model: Adaptive, X: np.ndarray, y: np.ndarray) -> tuple[list[tuple[int, str]], float]:
    """Each takeover (label, new champion's origin), and the share of labels 640-850 the
    champion got wrong before learning them."""
    takeovers, wrong = [], 0
    for i, (x, label) in enumerate(zip(X, y, strict=True)):
        if 640 <= i < 850:
            wrong += model.decide(x, coin=0.5).label == -label
        before = model.takeovers
        model.update(x, int(label))
        if model.takeovers != before:
            takeovers.append((i, model.champion_origin))
    return takeovers, wrong / 210


def test_a_takeover_the_labels_after_prove_wrong_is_taken_back() -> None:
    X, y = burst_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    takeovers, wrong = _served(model, X, y)
    # the mirror won on the burst it replayed; the champion it replaced, kept in a contest
    # of its own, won it back once the labels went on as before the burst
    (first, mirror), (back, previous) = takeovers
    assert (mirror, previous) == ("mirror", "previous")
    assert 600 < first < 640
    assert back - first <= 30
    assert model.changes_detected == 1
    assert wrong < 0.1
    # without: the mirror is wrong from its first label, so its detector sees a steady error
    # and no change, and it serves (relearning the concept) until a fresh challenger wins a
    # later contest
    kept = Adaptive(DSAL(n_features=N, cost=0.25), take_back=False)
    takeovers, kept_wrong = _served(kept, X, y)
    assert takeovers[0][1] == "mirror"
    assert takeovers[1][0] > 800
    assert kept_wrong > max(0.15, 3 * wrong)


def test_a_model_configured_without_take_back_serves_without_it_and_its_contest_ends() -> None:
    """``adaptive.take_back`` of a model's configuration: a model read under it serves the
    part on or off; turned off while a take-back contest runs, that contest ends (the next
    change starts the usual challengers); turned on again, it runs at the next takeover."""
    X, y = burst_stream()
    model = learner_for(DSAL(n_features=N, cost=0.25).to_state(), Parts())
    assert model.take_back
    off = learner_for(model.to_state(), Parts(take_back=False))
    assert off.take_back is False
    for x, label in zip(X, y, strict=True):
        model.update(x, int(label))
        if model.takeovers:
            break
    assert model.running == ("previous",)
    ended = learner_for(json.loads(json.dumps(model.to_state())), Parts(take_back=False))
    assert (ended.take_back, ended.running) == (False, ())
    assert ended.champion_origin == "mirror"  # the takeover stands
    kept = learner_for(json.loads(json.dumps(model.to_state())), Parts())
    assert kept.running == ("previous",)
    assert learner_for(ended.to_state(), Parts()).take_back is True


def test_the_take_back_contest_is_state_and_a_change_replaces_it() -> None:
    X, y = burst_stream()
    model = Adaptive(DSAL(n_features=N, cost=0.25))
    for x, label in zip(X, y, strict=True):
        model.update(x, int(label))
        if model.takeovers:
            break
    assert model.running == ("previous",)
    again = Adaptive.from_state(json.loads(json.dumps(model.to_state())))
    assert again.running == ("previous",)
    assert again.champion_origin == "mirror"
    assert again.to_state() == model.to_state()
    # a change while it runs: the challengers of a change instead
    model._start_change(0)
    assert model.running == ("mirror", "fresh", "tail")
    feed(model, X[640:], y[640:])
    record = model.to_state()
    record["champion_origin"] = "previous"  # a champion taken back reads back as such
    assert Adaptive.from_state(record).champion_origin == "previous"
