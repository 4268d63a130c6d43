"""The contract every learner keeps (run over every algorithm of the registry, found there),
alone and held to a query budget (:class:`~service.learning.Budgeted`), and as a model
serves it: bare, budgeted, inside the adaptive wrapper and both, the linear learners with
each update rule and the double sigmoid learners with a logistic tail too (the last
section).

Stream and replay code rely on it: decisions never change the model or the input, a seed
fixes every choice, a JSON round trip of the state changes nothing now or later, and bad
input is refused with a ValueError while the model stays as it was. A budgeted learner's
decisions move its budget (that is the point) but never its learner, and its
``query_probability`` is the probability the query was really drawn with.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from service.learning import (
    Adaptive,
    Budgeted,
    HyperparameterError,
    InputError,
    LearningError,
    Parts,
    QueryBudget,
    learner_for,
    learner_from_state,
    make_learner,
)
from service.learning.errors import DimensionError, LabelError, NonFiniteError
from service.learning.registry import LINEAR_ALGORITHMS

from .strategies import LEARNER_NAMES, learner_factory, noisy_stream

N = 4
NAMES = sorted(LEARNER_NAMES)


def build(name: str, **kw: Any) -> Any:
    return learner_factory(name)(N, **kw)


def train(learner: Any, X: np.ndarray, y: np.ndarray) -> list[Any]:
    """Prequential loop: decide each example, update when the learner asks."""
    decisions = []
    for x, label in zip(X, y, strict=True):
        d = learner.decide(x)
        decisions.append(d)
        if d.query:
            learner.update(x, label)
    return decisions


def snapshot(learner: Any) -> str:
    return json.dumps(learner.to_state(), sort_keys=True)


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def stream() -> tuple[np.ndarray, np.ndarray]:
    return noisy_stream(60, N, seed=11)


def test_decide_and_update_leave_the_input_untouched(name: str, stream: Any) -> None:
    X, y = stream
    learner = build(name)
    X_before = X.copy()
    for x, label in zip(X, y, strict=True):
        learner.decide(x)
        learner.update(x, label)
    learner.decide_many(X)
    assert np.array_equal(X, X_before)


def test_decide_does_not_change_the_model(name: str, stream: Any) -> None:
    X, y = stream
    learner = build(name)
    train(learner, X[:30], y[:30])
    before = learner.to_state()
    for x in X[30:]:
        learner.decide(x, coin=0.5)
    learner.decide_many(X[30:], coins=np.full(30, 0.5))
    assert learner.to_state() == before


def test_same_seed_gives_the_same_decisions(name: str, stream: Any) -> None:
    X, y = stream
    a, b = build(name, seed=3), build(name, seed=3)
    assert train(a, X, y) == train(b, X, y)
    assert snapshot(a) == snapshot(b)


def test_json_state_round_trip_gives_same_decisions_and_updates(name: str, stream: Any) -> None:
    X, y = stream
    learner = build(name, seed=5)
    train(learner, X[:40], y[:40])
    text = json.dumps(learner.to_state())
    clone = learner_from_state(json.loads(text))
    assert type(clone) is type(learner)
    assert json.dumps(clone.to_state()) == text
    # the same future, decision by decision and bit for bit, including the query coins
    assert train(clone, X[40:], y[40:]) == train(learner, X[40:], y[40:])
    assert snapshot(clone) == snapshot(learner)


def test_default_step_schedule_is_stored_and_kept_by_the_state(name: str, stream: Any) -> None:
    X, y = stream
    learner = make_learner(name, n_features=N, cost=0.25, seed=4)
    train(learner, X[:30], y[:30])
    state = json.loads(json.dumps(learner.to_state()))
    assert state["params"]["eta"] == learner.eta.to_config()
    clone = learner_from_state(state)
    assert clone.eta == learner.eta
    assert train(clone, X[30:], y[30:]) == train(learner, X[30:], y[30:])
    assert snapshot(clone) == snapshot(learner)


def test_a_restored_learner_keeps_its_stored_schedule_not_todays_default(name: str) -> None:
    # e.g. a model saved under an older default (0.1 / (1 + t/1000)): rebuilding it from
    # its state must not switch it to the current default for its width
    state = make_learner(name, n_features=N, cost=0.25).to_state()
    old = {"kind": "inverse-time", "eta0": 0.1, "tau": 1000.0}
    assert state["params"]["eta"] != old
    state["params"]["eta"] = old
    restored = learner_from_state(state)
    assert restored.eta.to_config() == old
    assert restored.to_state()["params"]["eta"] == old


def test_class_from_state_matches_module_level_rebuild(name: str, stream: Any) -> None:
    X, y = stream
    learner = build(name)
    train(learner, X[:20], y[:20])
    state = learner.to_state()
    assert snapshot(type(learner).from_state(state)) == snapshot(learner_from_state(state))


def test_decide_many_matches_decide_row_by_row(name: str, stream: Any) -> None:
    X, y = stream
    learner = build(name, seed=9)
    train(learner, X[:25], y[:25])
    twin = learner_from_state(learner.to_state())
    labels, scores, probs, queries = learner.decide_many(X[25:])
    singles = [twin.decide(x) for x in X[25:]]
    assert labels.tolist() == [d.label for d in singles]
    assert np.allclose(scores, [d.score for d in singles], rtol=1e-12, atol=1e-12)
    assert np.allclose(probs, [d.query_probability for d in singles], rtol=1e-12, atol=1e-12)
    assert queries.tolist() == [d.query for d in singles]


def test_decide_many_accepts_an_empty_batch(name: str) -> None:
    labels, scores, probs, queries = build(name).decide_many(np.zeros((0, N)))
    assert labels.shape == scores.shape == probs.shape == queries.shape == (0,)


def test_supplied_coins_decide_the_query(name: str, stream: Any) -> None:
    X, y = stream
    learner = build(name)
    train(learner, X[:20], y[:20])
    for x in X[20:]:
        p = learner.decide(x, coin=0.0).query_probability
        assert 0.0 <= p <= 1.0
        assert learner.decide(x, coin=0.0).query is (p > 0.0)
        assert learner.decide(x, coin=0.999999).query is (p > 0.999999)
        _, _, probs, queries = learner.decide_many(x[None, :], coins=[0.0])
        assert queries[0] == (probs[0] > 0.0)


def test_steps_count_absorbed_labels(name: str, stream: Any) -> None:
    X, y = stream
    learner = build(name)
    for i, (x, label) in enumerate(zip(X[:10], y[:10], strict=True), start=1):
        moved = learner.update(x, label)
        assert isinstance(moved, bool)
        assert learner.steps == i


def test_rho_never_negative(name: str) -> None:
    # confidently right examples shrink rho; a long run of them must stop at 0
    learner = build(name, rho=0.05)
    x = np.array([1.0, 0.5, -0.5, 0.25])
    for _ in range(200):
        learner.update(x, 1)
        assert learner.rho >= 0.0


BAD_X = [
    pytest.param(np.zeros(N + 1), DimensionError, id="too-long"),
    pytest.param(np.zeros((1, N)), DimensionError, id="2-d"),
    pytest.param([1.0, math.nan, 0.0, 0.0], NonFiniteError, id="nan"),
    pytest.param([1.0, 0.0, -math.inf, 0.0], NonFiniteError, id="inf"),
    pytest.param(["a", "b", "c", "d"], InputError, id="strings"),
]


@pytest.mark.parametrize(("x", "error"), BAD_X)
def test_bad_x_is_refused_and_the_model_unchanged(
    name: str, stream: Any, x: Any, error: type[Exception]
) -> None:
    X, y = stream
    learner = build(name)
    train(learner, X[:20], y[:20])
    before = snapshot(learner)
    with pytest.raises(error) as info:
        learner.update(x, 1)
    assert isinstance(info.value, LearningError)
    assert isinstance(info.value, ValueError)
    with pytest.raises(error):
        learner.decide(x)
    assert snapshot(learner) == before


@pytest.mark.parametrize("y", [0, 2, -2, 0.5, math.nan, True, "1", None, [1]])
def test_bad_label_is_refused_and_the_model_unchanged(name: str, stream: Any, y: Any) -> None:
    X, _ = stream
    learner = build(name)
    before = snapshot(learner)
    with pytest.raises(LabelError, match="y must be"):
        learner.update(X[0], y)
    assert snapshot(learner) == before


@pytest.mark.parametrize("coin", [-0.1, 1.0, 1.5, math.nan, "x"])
def test_bad_coin_is_refused(name: str, stream: Any, coin: Any) -> None:
    X, _ = stream
    learner = build(name)
    with pytest.raises(InputError, match="coin"):
        learner.decide(X[0], coin=coin)
    with pytest.raises(InputError, match="coins"):
        learner.decide_many(X[:2], coins=[0.5, coin] if coin != "x" else [0.5, 2.0])


def test_wrong_number_of_coins_is_refused(name: str, stream: Any) -> None:
    X, _ = stream
    with pytest.raises(DimensionError, match="coins"):
        build(name).decide_many(X[:3], coins=[0.5, 0.5])


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"cost": 0.0}, "cost"),
        ({"cost": 0.5}, "cost"),
        ({"cost": -0.1}, "cost"),
        ({"cost": math.nan}, "cost"),
        ({"cost": "0.2"}, "cost"),
        ({"n_features": 0}, "n_features"),
        ({"n_features": 2.5}, "n_features"),
        ({"rho": -1.0}, "rho"),
        ({"rho": math.inf}, "rho"),
        ({"eta": 0.0}, "eta"),
        ({"eta": -0.1}, "eta"),
        ({"eta": {"kind": "nope"}}, "schedule"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_hyperparameters_are_named(name: str, kwargs: dict[str, Any], param: str) -> None:
    args: dict[str, Any] = {"n_features": N, "cost": 0.25, **kwargs}
    with pytest.raises(HyperparameterError, match=param):
        make_learner(name, **args)


def test_make_learner_builds_each_algorithm(name: str) -> None:
    learner = make_learner(name, n_features=3, cost=0.1)
    assert learner.algorithm == name
    assert learner.n_features == 3
    assert learner.cost == 0.1
    assert learner.steps == 0
    assert learner.rho == 1.0


def test_make_learner_rejects_unknown_names_and_keywords() -> None:
    with pytest.raises(HyperparameterError, match="unknown algorithm"):
        make_learner("perceptron", n_features=3, cost=0.1)
    with pytest.raises(HyperparameterError, match="bad hyperparameters"):
        make_learner("dral", n_features=3, cost=0.1, gamma=2.0)


# -- the same contract, held to a budget --------------------------------------------------


def build_budgeted(name: str, seed: int = 0) -> Budgeted:
    return Budgeted(build(name, seed=seed), QueryBudget(0.2, horizon=20, seed=seed))


def test_budgeted_decisions_leave_the_input_and_the_learner_untouched(
    name: str, stream: Any
) -> None:
    X, y = stream
    model = build_budgeted(name)
    train(model, X[:30], y[:30])
    learner_before = json.dumps(model.learner.to_state(), sort_keys=True)
    X_before = X.copy()
    for x in X[30:]:
        model.decide(x)
    model.decide_many(X[30:])
    assert np.array_equal(X, X_before)
    assert json.dumps(model.learner.to_state(), sort_keys=True) == learner_before
    assert model.budget.report().events == 30 + 30 + 30


def test_budgeted_same_seed_gives_the_same_decisions(name: str, stream: Any) -> None:
    X, y = stream
    a, b = build_budgeted(name, seed=3), build_budgeted(name, seed=3)
    assert train(a, X, y) == train(b, X, y)
    assert snapshot(a) == snapshot(b)


def test_budgeted_json_state_round_trip_gives_the_same_future(name: str, stream: Any) -> None:
    X, y = stream
    model = build_budgeted(name, seed=5)
    train(model, X[:40], y[:40])
    text = json.dumps(model.to_state())
    clone = Budgeted.from_state(json.loads(text))
    assert json.dumps(clone.to_state()) == text
    assert train(clone, X[40:], y[40:]) == train(model, X[40:], y[40:])
    assert snapshot(clone) == snapshot(model)


@pytest.mark.parametrize("with_coins", [True, False])
def test_budgeted_decide_many_matches_decide_row_by_row(
    name: str, stream: Any, with_coins: bool
) -> None:
    X, y = stream
    model = build_budgeted(name, seed=9)
    train(model, X[:25], y[:25])
    twin = Budgeted.from_state(model.to_state())
    coins = np.random.default_rng(1).random(35) if with_coins else None
    labels, scores, probs, queries = model.decide_many(X[25:], coins=coins)
    singles = [
        twin.decide(x, coin=None if coins is None else float(c))
        for x, c in zip(X[25:], coins if coins is not None else [None] * 35, strict=True)
    ]
    # scores of a batch are summed in another order than one dot product: equal to rounding
    assert labels.tolist() == [d.label for d in singles]
    assert np.allclose(scores, [d.score for d in singles], rtol=1e-12, atol=1e-12)
    assert np.allclose(probs, [d.query_probability for d in singles], rtol=1e-9, atol=1e-15)
    assert queries.tolist() == [d.query for d in singles]
    assert model.budget.report().asked == twin.budget.report().asked


def test_budgeted_query_probability_is_the_one_the_coin_was_drawn_against(
    name: str, stream: Any
) -> None:
    X, y = stream
    model = build_budgeted(name)
    coins = np.random.default_rng(4).random(60)
    for x, label, coin in zip(X, y, coins.tolist(), strict=True):
        d = model.decide(x, coin=coin)
        assert 0.0 < d.query_probability <= 1.0
        assert d.query is (coin < d.query_probability)
        if d.query:
            model.update(x, label)
    assert model.steps == model.budget.report().asked


@pytest.mark.parametrize(("x", "error"), BAD_X)
def test_budgeted_bad_x_is_refused_and_nothing_changes(
    name: str, stream: Any, x: Any, error: type[Exception]
) -> None:
    X, y = stream
    model = build_budgeted(name)
    train(model, X[:20], y[:20])
    before = snapshot(model)
    with pytest.raises(error):
        model.decide(x)
    with pytest.raises(InputError):
        model.decide(X[0], coin=1.5)
    assert snapshot(model) == before


# -- the same contract, as a model serves it ----------------------------------------------
# Every learner (the linear ones with each update rule, the double sigmoid ones also with a
# logistic tail) bare, held to a budget, inside the adaptive wrapper a worker serves it in
# (its parts and tracking steps: learner_for), and both. Decisions never change what the
# learner has learned (the wrapper counts the decisions its exploration floor raised; the
# budget counts events and questions), a seed
# fixes every choice, a JSON round trip of the state keeps the future, a batch decides as
# row by row, bad input changes nothing and rho stays >= 0.

WRAPPINGS = ("bare", "budgeted", "adaptive", "budgeted-adaptive")
#: ``name[/update rule][+tail]``: the double sigmoid learners also with a logistic tail
STACK_NAMES = [
    *NAMES,
    *(f"{n}/normalized" for n in LINEAR_ALGORITHMS),
    *("dsal/normalized+tail", "dsol+tail", "kernel-dsal+tail", "kernel-dsol+tail"),
]


def build_stack(spec: str, wrapping: str, seed: int = 0) -> Any:
    spec, _, tail = spec.partition("+")
    name, _, rule = spec.partition("/")
    kw: dict[str, Any] = {"seed": seed} if not rule else {"seed": seed, "update_rule": rule}
    if tail:
        kw["tail"] = 2.0
    model: Any = build(name, **kw)
    if "adaptive" in wrapping:
        model = learner_for(model.to_state(), Parts())
    if "budgeted" in wrapping:
        model = Budgeted(model, QueryBudget(0.2, horizon=20, seed=seed))
    return model


def rebuild(model: Any) -> Any:
    """``model`` from its JSON state record(s), as a worker reads it back."""
    if isinstance(model, Budgeted):
        inner = rebuild(model.learner)
        return Budgeted(
            inner, QueryBudget.from_state(json.loads(json.dumps(model.budget.to_state())))
        )
    record = json.loads(json.dumps(model.to_state()))
    if isinstance(model, Adaptive):
        return Adaptive.from_state(record)
    return learner_from_state(record)


def learned(model: Any) -> str:
    """What the learner inside ``model`` has learned (not the budget, not the decisions the
    exploration floor counted)."""
    inner = model.learner if isinstance(model, Budgeted) else model
    record = inner.to_state()
    if isinstance(inner, Adaptive):
        record = {**record, "learned": {**record["learned"], "explored": None}}
    return json.dumps(record, sort_keys=True)


@pytest.fixture(params=STACK_NAMES)
def spec(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=WRAPPINGS)
def wrapping(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_a_stack_decides_without_changing_what_it_learned(
    spec: str, wrapping: str, stream: Any
) -> None:
    X, y = stream
    model = build_stack(spec, wrapping)
    train(model, X[:30], y[:30])
    before, X_before = learned(model), X.copy()
    for x in X[30:]:
        model.decide(x, coin=0.5)
    model.decide_many(X[30:], coins=np.full(30, 0.5))
    assert learned(model) == before
    assert np.array_equal(X, X_before)


def test_a_stack_with_the_same_seed_makes_the_same_decisions(
    spec: str, wrapping: str, stream: Any
) -> None:
    X, y = stream
    a, b = build_stack(spec, wrapping, seed=3), build_stack(spec, wrapping, seed=3)
    assert train(a, X, y) == train(b, X, y)
    assert learned(a) == learned(b)


def test_a_stack_read_back_from_its_state_has_the_same_future(
    spec: str, wrapping: str, stream: Any
) -> None:
    X, y = stream
    model = build_stack(spec, wrapping, seed=5)
    train(model, X[:40], y[:40])
    clone = rebuild(model)
    assert learned(clone) == learned(model)
    assert train(clone, X[40:], y[40:]) == train(model, X[40:], y[40:])
    assert learned(clone) == learned(model)
    assert model.steps > 0


def test_a_stack_decides_a_batch_as_row_by_row(spec: str, wrapping: str, stream: Any) -> None:
    X, y = stream
    model = build_stack(spec, wrapping, seed=9)
    train(model, X[:25], y[:25])
    twin = rebuild(model)
    coins = np.random.default_rng(1).random(35)
    labels, scores, probs, queries = model.decide_many(X[25:], coins=coins)
    singles = [twin.decide(x, coin=float(c)) for x, c in zip(X[25:], coins, strict=True)]
    assert labels.tolist() == [d.label for d in singles]
    assert np.allclose(scores, [d.score for d in singles], rtol=1e-12, atol=1e-12)
    assert np.allclose(probs, [d.query_probability for d in singles], rtol=1e-9, atol=1e-15)
    assert queries.tolist() == [d.query for d in singles]


@pytest.mark.parametrize(("x", "error"), BAD_X)
def test_a_stack_refuses_bad_x_and_changes_nothing(
    spec: str, wrapping: str, stream: Any, x: Any, error: type[Exception]
) -> None:
    X, y = stream
    model = build_stack(spec, wrapping)
    train(model, X[:20], y[:20])
    before = learned(model)
    with pytest.raises(error):
        model.update(x, 1)
    with pytest.raises(error):
        model.decide(x)
    assert learned(model) == before


def test_a_stack_keeps_rho_at_or_above_zero_and_its_parameters_finite(
    spec: str, wrapping: str
) -> None:
    model = build_stack(spec, wrapping)
    rng = np.random.default_rng(2)
    for _ in range(300):
        x = rng.normal(size=N) * 3.0
        model.update(x, 1 if rng.random() < 0.9 else -1)
        assert model.rho >= 0.0
    inner = model.learner if isinstance(model, Budgeted) else model
    assert math.isfinite(inner.weight_norm())
