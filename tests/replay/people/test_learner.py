"""The worker's stack in memory: its decision is the scorer's, and keeping the envelopes the
learner writes changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import orjson
import pytest

from service.config import LabelBudget, ModelConfig, SecondOpinions
from service.learning import QueryBudget
from service.records import Label, RawMessage, coin
from service.replay.errors import ReplayConfigError
from service.replay.people import MODEL, Draws, MemoryService, People, simulate
from service.replay.protocol import plan_trials
from service.stream.scoring.decide import Limits, score_batch

Dataset = tuple[np.ndarray, np.ndarray]
CONFIG = ModelConfig(
    algorithm="dsal", cost=0.25, n_features=4, seed=1, label_budget=LabelBudget(fraction=0.3)
)


async def _learn(service: MemoryService, X: np.ndarray, y: np.ndarray) -> None:
    """Decide each row; learn the asked ones with their true label."""
    coins = np.random.default_rng(0).random(X.shape[0])
    for t in range(X.shape[0]):
        service.now = float(t)
        d = service.decide(X[t], coin=float(coins[t]))
        if d.query:
            request = service.request(f"warm-{t}", X[t], d)
            await service.send(request)
            await service.send(Label(request.request_id, MODEL, int(y[t]), "a", service.now))


def test_a_decision_is_the_scorers_on_the_same_model_budget_and_coin(
    guide_like: Dataset,
) -> None:
    X, y = guide_like
    service = MemoryService(CONFIG)
    asyncio.run(_learn(service, X[:200], y[:200]))
    served = service.served
    assert served.version > 10
    since, asked = 0, False  # events decided since the last request (its moments' count)
    for t in range(200, 260):
        event = f"event-{t}"
        # the scorer's batch of one, with a copy of the model's budget as it stands
        budget = QueryBudget.from_state(service.budget.to_state())
        message = RawMessage(
            orjson.dumps({"id": event, "features": X[t].tolist()}), "abstain.features", 0, t
        )
        result = score_batch(
            {MODEL: service.served},
            [message],
            budgets={MODEL: budget},
            limits=Limits(default_model=MODEL, request_ttl=1e9),
            now=float(t),
        )
        (decision,) = result.decisions
        service.now = float(t)
        mine = service.decide(X[t], coin=coin(MODEL, event, served.version))
        assert (mine.label or None, mine.score, mine.query, mine.query_probability) == (
            decision.label,
            decision.score,
            decision.queried,
            decision.query_probability,
        )
        assert budget.to_state() == service.budget.to_state()
        since += 1
        if mine.query:
            (request,) = result.label_requests
            made = service.request(event, X[t], mine)
            # it carries the moments of the events decided since the last request, as the
            # scorer's requests do (the warm-up's last ones too, for the first)
            assert made.moments is not None
            assert made.moments.count >= since
            if asked:
                assert made.moments.count == since
            assert dataclasses.replace(made, moments=None) == request
            since, asked = 0, True


def test_keeping_the_written_envelopes_changes_nothing(guide_like: Dataset) -> None:
    X, y = guide_like
    plan = plan_trials(X.shape[0], 1, 500, seed=0)
    rows, coins = plan.indices[0], plan.coins[0]
    people = People(noise=0.25, second_opinions=SecondOpinions(share=0.5), undo=0.5)
    draws = Draws.draw(500, seed=0, run=0)
    kept = simulate(X[rows], y[rows], coins, CONFIG, people, draws)
    parsed = simulate(X[rows], y[rows], coins, CONFIG, people, draws, keep_models=False)
    assert kept.corrections["changed"] > 0
    assert np.array_equal(kept.loss, parsed.loss)
    assert kept.work == parsed.work
    assert kept.model.to_json() == parsed.model.to_json()


def test_a_replay_with_people_needs_a_label_budget() -> None:
    with pytest.raises(ReplayConfigError, match="label budget"):
        MemoryService(ModelConfig(algorithm="dsal", n_features=4))
