"""Query budgets: the controller's properties (Hypothesis), its state, its batched rows, and
learners held to a budget inside the batched engine.

The contract every budgeted learner keeps (input untouched, same seed, state round trip,
decide_many row by row) is in ``test_contract.py``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from service.learning import (
    DRAL,
    DSAL,
    DSOL,
    Budgeted,
    HyperparameterError,
    InputError,
    QueryBudget,
    StateError,
)
from service.learning.batch import BatchLearner
from service.learning.budget import BudgetRows
from service.learning.errors import DimensionError

from ..strategies import noisy_stream

rates = hst.floats(min_value=0.01, max_value=0.6)
sharpnesses = hst.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0])
explores = hst.floats(min_value=0.0, max_value=0.5)
horizons = hst.sampled_from([50, 200, 1000])
unit = hst.floats(min_value=0.0, max_value=1.0)


def stream_of_utilities(seed: int, n: int, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """A stationary stream: utilities iid Beta(a, b), coins iid uniform."""
    rng = np.random.default_rng(seed)
    return rng.beta(a, b, n), rng.random(n)


@settings(max_examples=60, deadline=None)
@given(
    rate=rates,
    sharpness=sharpnesses,
    explore=explores,
    horizon=horizons,
    utilities=hst.lists(unit, min_size=1, max_size=60),
    seed=hst.integers(0, 2**32 - 1),
)
def test_probabilities_are_in_0_1_and_never_below_the_exploration_floor(
    rate: float,
    sharpness: float,
    explore: float,
    horizon: int,
    utilities: list[float],
    seed: int,
) -> None:
    budget = QueryBudget(rate, sharpness=sharpness, explore=explore, horizon=horizon, seed=seed)
    probs, queries = budget.ask_many(utilities)
    assert ((probs >= 0.0) & (probs <= 1.0)).all()
    assert (probs >= explore * rate * (1 - 1e-12)).all()
    assert queries.sum() == budget.report().asked


@settings(max_examples=25, deadline=None)
@given(
    rate=hst.floats(min_value=0.02, max_value=0.5),
    sharpness=hst.sampled_from([0.0, 1.0, 4.0]),
    a=hst.floats(min_value=0.5, max_value=5.0),
    b=hst.floats(min_value=0.5, max_value=5.0),
    seed=hst.integers(0, 2**32 - 1),
)
def test_long_run_query_rate_is_the_target_on_a_stationary_stream(
    rate: float, sharpness: float, a: float, b: float, seed: int
) -> None:
    n = 20_000
    utilities, coins = stream_of_utilities(seed, n, a, b)
    budget = QueryBudget(rate, sharpness=sharpness)
    budget.ask_many(utilities, coins)
    report = budget.report()
    assert report.allowance == pytest.approx(rate * n)
    # the credit feedback keeps labels asked within a bounded distance of the allowance
    assert abs(report.asked - rate * n) <= 0.05 * rate * n + 20
    assert abs(report.fraction_asked - rate) <= 0.1 * rate


@settings(max_examples=15, deadline=None)
@given(
    labels_per_second=hst.floats(min_value=0.05, max_value=2.0),
    events_per_second=hst.floats(min_value=5.0, max_value=50.0),
    seed=hst.integers(0, 2**32 - 1),
)
def test_a_budget_per_second_spends_its_rate_over_event_time(
    labels_per_second: float, events_per_second: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    n = 20_000
    ts = np.cumsum(rng.exponential(1.0 / events_per_second, n))  # a Poisson stream
    utilities, coins = stream_of_utilities(seed + 1, n, 1.0, 2.0)
    budget = QueryBudget(labels_per_second, per="second")
    budget.ask_many(utilities, coins, ts=ts)
    report = budget.report()
    elapsed = float(ts[-1] - ts[0])
    # every gap counts, except a rare long Poisson gap while the mean gap is still young,
    # which the budget takes for a pause and clips: never more, at most 0.1 % less
    assert report.allowance <= labels_per_second * elapsed * (1 + 1e-9)
    assert report.allowance >= 0.999 * labels_per_second * elapsed
    assert abs(report.asked - report.allowance) <= 0.1 * report.allowance + 20


@settings(max_examples=40, deadline=None)
@given(
    low=unit,
    high=unit,
    sharpness=hst.sampled_from([0.5, 1.0, 4.0]),
    history=hst.lists(unit, min_size=0, max_size=30),
)
def test_a_more_informative_event_is_at_least_as_likely_to_be_asked(
    low: float, high: float, sharpness: float, history: list[float]
) -> None:
    low, high = min(low, high), max(low, high)
    budget = QueryBudget(0.1, sharpness=sharpness)
    budget.ask_many(history)
    twin = QueryBudget.from_state(budget.to_state())
    assert budget.ask(low)[0] <= twin.ask(high)[0]


def test_sharpness_zero_is_uniform_sampling_whatever_the_utility() -> None:
    a, b = QueryBudget(0.2, sharpness=0.0), QueryBudget(0.2, sharpness=0.0)
    rng = np.random.default_rng(0)
    pa, _ = a.ask_many(rng.random(500), coins=np.full(500, 0.99))
    pb, _ = b.ask_many(rng.random(500), coins=np.full(500, 0.99))
    np.testing.assert_array_equal(pa, pb)


def test_importance_weights_one_over_p_are_unbiased() -> None:
    # E[q / p] = 1 for every event, so the importance-weighted mean of any quantity (here
    # the utility itself and the count of events) estimates its mean over all events
    utilities, coins = stream_of_utilities(7, 40_000, 0.7, 3.0)
    budget = QueryBudget(0.2)
    probs, queries = budget.ask_many(utilities, coins)
    weights = queries / probs  # 1/p on asked events, 0 elsewhere; 1/p <= 1/(v rate) = 50
    assert weights.max() <= 1.0 / (0.1 * 0.2) + 1e-9
    assert np.mean(weights) == pytest.approx(1.0, abs=0.1)
    assert np.mean(weights * utilities) == pytest.approx(utilities.mean(), rel=0.1)


def test_report_is_pure_and_counts_what_was_asked() -> None:
    budget = QueryBudget(0.1)
    probs, queries = budget.ask_many([0.5] * 100, coins=np.linspace(0.0, 0.99, 100))
    before = budget.to_state()
    report = budget.report()
    assert budget.to_state() == before
    assert (report.events, report.asked) == (100, int(queries.sum()))
    assert report.expected == pytest.approx(float(probs.sum()))
    assert report.allowance == pytest.approx(10.0)
    assert report.spent_ratio == pytest.approx(report.asked / 10.0)
    assert math.isnan(QueryBudget(0.1).report().spent_ratio)


def test_ask_many_matches_ask_row_by_row_with_and_without_coins() -> None:
    utilities, coins = stream_of_utilities(3, 300, 1.0, 1.5)
    for given_coins in (coins, None):
        a, b = QueryBudget(0.1, seed=4), QueryBudget(0.1, seed=4)
        pa, qa = a.ask_many(utilities, given_coins)
        pairs = zip(utilities, coins, strict=True)
        rows = [b.ask(u, None if given_coins is None else c) for u, c in pairs]
        assert pa.tolist() == [p for p, _ in rows]
        assert qa.tolist() == [q for _, q in rows]
        assert a.to_state() == b.to_state()


def test_state_round_trips_through_json_and_keeps_the_future() -> None:
    utilities, _ = stream_of_utilities(5, 400, 1.0, 1.0)
    ts = np.arange(400) * 0.5
    budget = QueryBudget(0.5, per="second", horizon=50, seed=2)
    budget.ask_many(utilities[:200], ts=ts[:200])
    clone = QueryBudget.from_state(json.loads(json.dumps(budget.to_state())))
    assert clone.to_state() == budget.to_state()
    pa, qa = budget.ask_many(utilities[200:], ts=ts[200:])
    pb, qb = clone.ask_many(utilities[200:], ts=ts[200:])
    assert pa.tolist() == pb.tolist()
    assert qa.tolist() == qb.tolist()


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda b: b.ask(1.5), InputError, "utility"),
        (lambda b: b.ask(math.nan), InputError, "utility"),
        (lambda b: b.ask(0.5, coin=1.0), InputError, "coin"),
        (lambda b: b.ask_many([0.5, -0.1]), InputError, "utilities"),
        (lambda b: b.ask_many([[0.5]]), DimensionError, "1-D"),
        (lambda b: b.ask_many([0.5, 0.5], coins=[0.1]), DimensionError, "coins"),
        (lambda b: b.ask_many([0.5], coins=[1.0]), InputError, "coins"),
        (lambda b: b.ask_many([0.5], ts=[math.inf]), InputError, "ts"),
        (lambda b: b.ask_many([0.5, 0.5], ts=[0.0]), DimensionError, "ts"),
    ],
)
def test_bad_input_is_refused_and_the_budget_unchanged(call: Any, error: type, match: str) -> None:
    budget = QueryBudget(0.1)
    budget.ask_many([0.3, 0.7])
    before = budget.to_state()
    with pytest.raises(error, match=match):
        call(budget)
    assert budget.to_state() == before


def test_a_budget_per_second_needs_timestamps() -> None:
    budget = QueryBudget(1.0, per="second")
    with pytest.raises(InputError, match="timestamps"):
        budget.ask(0.5)
    with pytest.raises(InputError, match="timestamps"):
        budget.ask_many([0.5])
    assert budget.report().events == 0
    # the first event opens the clock: nothing is allowed yet, but it is rated as if the
    # last event was a second ago (never p = 0: every event must be askable)
    p, _ = budget.ask(1.0, coin=0.0, ts=100.0)
    assert p > 0.0
    assert budget.report().allowance == 0.0


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"rate": 0.0}, "rate"),
        ({"rate": 1.5}, "rate"),
        ({"rate": math.nan}, "rate"),
        ({"rate": 0.1, "per": "hour"}, "per"),
        ({"rate": 0.1, "sharpness": -1.0}, "sharpness"),
        ({"rate": 0.1, "explore": 1.5}, "explore"),
        ({"rate": 0.1, "horizon": 0}, "horizon"),
        ({"rate": 0.1, "burst": 0.0}, "burst"),
        ({"rate": 0.1, "seed": -1}, "seed"),
    ],
)
def test_bad_hyperparameters_are_named(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(HyperparameterError, match=name):
        QueryBudget(**kwargs)


def test_a_corrupt_or_foreign_state_is_refused() -> None:
    state = QueryBudget(0.1).to_state()
    with pytest.raises(StateError, match="format"):
        QueryBudget.from_state({**state, "format": "abstain.learner"})
    with pytest.raises(StateError, match="version"):
        QueryBudget.from_state({**state, "version": 2})
    with pytest.raises(StateError, match="unknown"):
        QueryBudget.from_state({**state, "params": {**state["params"], "speed": 1}})
    with pytest.raises(StateError, match="invalid"):
        QueryBudget.from_state({**state, "params": {**state["params"], "rate": 2.0}})
    with pytest.raises(StateError, match="credit"):
        QueryBudget.from_state({**state, "learned": {**state["learned"], "credit": "x"}})


def test_budget_rows_follow_the_single_budgets() -> None:
    settings_ = [
        {"rate": 0.05},
        {"rate": 0.2, "sharpness": 1.0},
        {"rate": 0.1, "sharpness": 0.0, "explore": 0.0},
        {"rate": 0.3, "horizon": 30, "burst": 5.0},
    ]
    singles = [QueryBudget(**s) for s in settings_]
    rows = BudgetRows([QueryBudget(**s) for s in settings_])
    rng = np.random.default_rng(8)
    for _ in range(2000):
        u, c = rng.random(4), rng.random(4)
        p, q = rows.ask(u, c)
        rows.commit()
        expected = [b.ask(float(ui), float(ci)) for b, ui, ci in zip(singles, u, c, strict=True)]
        np.testing.assert_allclose(p, [e[0] for e in expected], rtol=1e-9, atol=1e-15)
        assert q.tolist() == [e[1] for e in expected]
    assert rows.asked.tolist() == [b.report().asked for b in singles]


def test_budget_rows_refuse_used_or_per_second_budgets() -> None:
    used = QueryBudget(0.1)
    used.ask(0.5)
    for bad in (used, QueryBudget(1.0, per="second")):
        with pytest.raises(HyperparameterError, match="fresh and per event"):
            BudgetRows([bad])


def test_batch_rows_held_to_a_budget_match_budgeted_single_learners() -> None:
    X, y = noisy_stream(1500, 4, seed=12)
    specs = [
        (DRAL, 0.25, QueryBudget(0.1, horizon=100)),
        (DSAL, 0.1, QueryBudget(0.05, sharpness=2.0, horizon=100)),
        (DSOL, 0.4, QueryBudget(0.2, sharpness=0.0, horizon=100)),
        (DSAL, 0.25, None),
    ]
    singles = [
        cls(n_features=4, cost=c) if b is None else Budgeted(cls(n_features=4, cost=c), b)
        for cls, c, b in specs
    ]
    batch = BatchLearner(
        [cls.algorithm for cls, _, _ in specs],
        4,
        [c for _, c, _ in specs],
        budgets=[None if b is None else QueryBudget(**b.get_params()) for _, _, b in specs],
    )
    coins = np.random.default_rng(2).random(1500)
    asked = np.zeros(4)
    for x, label, u in zip(X, y, coins, strict=True):
        labels, _, probs, queried = batch.step(np.tile(x, (4, 1)), np.full(4, label), np.full(4, u))
        for i, learner in enumerate(singles):
            d = learner.decide(x, coin=u)
            assert (d.label, d.query) == (labels[i], queried[i])
            assert d.query_probability == pytest.approx(probs[i], rel=1e-9, abs=1e-15)
            if d.query:
                learner.update(x, label)
        asked += queried
    assert asked[:3] == pytest.approx([150, 75, 300], rel=0.1)
    np.testing.assert_allclose(batch.rho, [lrn.rho for lrn in singles], rtol=1e-9, atol=1e-12)


def test_budgeted_refuses_what_is_not_a_learner_or_a_budget() -> None:
    with pytest.raises(HyperparameterError, match="learner"):
        Budgeted(object(), QueryBudget(0.1))
    with pytest.raises(HyperparameterError, match="QueryBudget"):
        Budgeted(DSAL(n_features=2, cost=0.25), 0.1)  # type: ignore[arg-type]
    state = Budgeted(DSAL(n_features=2, cost=0.25), QueryBudget(0.1)).to_state()
    del state["budget"]
    with pytest.raises(StateError, match="budget"):
        Budgeted.from_state(state)


def test_a_pause_in_the_stream_does_not_release_a_burst_of_labels() -> None:
    # 10 labels/s on 200 events/s in batches of 20 (one timestamp a batch), a 60 s pause,
    # then the stream goes on: the first second after the pause asks about as many as any
    budget = QueryBudget(10.0, per="second", seed=1)
    rng = np.random.default_rng(0)
    t = 1000.0

    def second() -> int:
        nonlocal t
        asked = 0
        for _ in range(10):
            t += 0.1
            _, q = budget.ask_many(rng.uniform(size=20), ts=np.full(20, t))
            asked += int(q.sum())
        return asked

    before = [second() for _ in range(30)]
    t += 60.0
    after = second()
    assert sum(before[10:]) == pytest.approx(200, rel=0.1)  # on target before the pause
    assert after <= 2 * max(before[10:])  # was ~200 in one second when the gap set beta


def test_the_first_event_of_a_budget_per_second_can_be_asked() -> None:
    p, _ = QueryBudget(0.5, per="second", explore=0.2).ask(0.9, coin=0.5, ts=10.0)
    assert p > 0.0
