"""One run with people through the worker's stack: with perfect people and no review it is
the plain replay; a reviewer's corrections leave the model the right answers would have
made, within the reach; the budget holds; a seed gives the same run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from service.config import CorrectionsConfig, LabelBudget, ModelConfig, SecondOpinions
from service.learning import Parts, learner_for, serving_pipeline
from service.records import Label, ModelEnvelope
from service.replay.features import RunFeatures
from service.replay.options import ReplayOptions
from service.replay.people import MODEL, Draws, MemoryService, People, simulate
from service.replay.prequential import run_stream
from service.replay.protocol import plan_trials
from service.replay.results import Variant
from service.replay.sequential import replay_sequential, variant_learner

Dataset = tuple[np.ndarray, np.ndarray]
BUDGET = 0.2


def _config(n_features: int, **kw: Any) -> ModelConfig:
    return ModelConfig(
        algorithm="dsal",
        cost=0.25,
        n_features=n_features,
        seed=3,
        label_budget=LabelBudget(fraction=BUDGET),
        **kw,
    )


def learned(model: ModelEnvelope) -> tuple[Any, ...]:
    """What a model learned, without where and when it was written."""
    return (
        model.pipeline,
        model.learner,
        model.labels_applied,
        model.iw_loss,
        model.iw_weight,
        model.estimate,
    )


def test_with_perfect_people_and_no_review_it_is_the_plain_replay(guide_like: Dataset) -> None:
    X, y = guide_like
    options = ReplayOptions(
        algorithms=("dsal",),
        costs=(0.25,),
        runs=2,
        trials=600,
        seed=3,
        scaler_fit="moments",
        label_budgets=(BUDGET,),
        adaptive=Parts(),
        update_rule="normalized",
    )
    variant = Variant("dsal", BUDGET, "budget")
    plan = plan_trials(X.shape[0], options.runs, options.trials, options.seed, "permutation")
    features = RunFeatures(X, plan, standardize=True, intercept=True)
    (series,) = replay_sequential(y, plan, features, options, [variant])
    for r in range(options.runs):
        rows = plan.indices[r]
        draws = Draws.draw(options.trials, seed=0, run=r)
        run = simulate(X[rows], y[rows], plan.coins[r], _config(X.shape[1]), People(), draws)
        plain = run_stream(
            variant_learner(variant, 0.25, features.n_features, options),
            X[rows],
            y[rows],
            plan.coins[r],
            0.25,
            pipeline=serving_pipeline(X.shape[1]),
        )
        assert np.array_equal(run.loss, plain.loss)  # every decision, every event
        assert np.array_equal(run.decided, plain.decision)
        assert np.array_equal(run.asked, plain.asked)
        at = series.grid - 1
        assert np.array_equal(np.cumsum(run.loss)[at], series.counts["loss"][:, r])
        assert np.array_equal(np.cumsum(run.asked)[at], series.counts["asked"][:, r])
        served = learner_for(dict(run.model.learner), Parts())
        assert float(served.rho) == series.rho[r]
        assert run.work.labels == run.asked.sum() > 50
        assert run.wrong_in_force == run.work.wrong == run.work.second_opinions == 0


def _answers_right(requests: list[Any], truth: dict[str, int], config: ModelConfig) -> Any:
    """The model the same requests make when every answer is right from the start."""
    import asyncio

    service = MemoryService(config)

    async def feed() -> None:
        for request in requests:
            service.now = request.requested_at
            await service.send(request)
            label = Label(request.request_id, MODEL, truth[request.event_id], "x", service.now)
            await service.send(label)

    asyncio.run(feed())
    return service.model()


def test_a_reviewer_who_sees_every_wrong_answer_leaves_the_model_right_answers_make(
    guide_like: Dataset,
) -> None:
    X, y = guide_like
    # labeller 0 errs often, labeller 1 never: every answer gets a second opinion, so
    # every wrong answer (labeller 0's) meets a right one, and a perfect reviewer decides
    people = People(
        noise=(0.4, 0.0),
        second_opinions=SecondOpinions(share=1.0),
        reviewer_noise=0.0,
        review_delay=7,
    )
    plan = plan_trials(X.shape[0], 1, 600, seed=1, sampling="permutation")
    rows = plan.indices[0]
    config = _config(X.shape[1])
    draws = Draws.draw(600, seed=4, run=0, team=2)
    run = simulate(X[rows], y[rows], plan.coins[0], config, people, draws, keep_requests=True)
    assert run.work.wrong > 10
    assert run.corrections["changed"] == run.work.wrong  # each one caught and corrected
    assert run.wrong_in_force == 0
    assert run.work.second_opinions == run.work.labels
    truth = {f"e{t}": int(y[rows][t]) for t in range(600)}
    assert learned(run.model) == learned(_answers_right(run.requests, truth, config))
    noisy = simulate(X[rows], y[rows], plan.coins[0], config, People(noise=(0.4, 0.0)), draws)
    assert learned(noisy.model) != learned(run.model)  # without review it stays wrong


def test_a_review_that_lands_beyond_the_reach_is_refused_and_changes_nothing(
    guide_like: Dataset,
) -> None:
    X, y = guide_like
    config = _config(X.shape[1], corrections=CorrectionsConfig(reach=10))
    plan = plan_trials(X.shape[0], 1, 1200, seed=2)
    rows, coins = plan.indices[0], plan.coins[0]
    draws = Draws.draw(1200, seed=0, run=0)
    late = People(noise=0.2, second_opinions=SecondOpinions(share=1.0), review_delay=40)
    run = simulate(X[rows], y[rows], coins, config, late, draws)
    alone = simulate(X[rows], y[rows], coins, config, People(noise=0.2), draws)
    assert run.work.reviews == run.work.disagreements > run.work.late
    # every review that lands during the run is 40 labels late, beyond the last 10: refused
    # (those sent after the last event may still reach their label)
    assert run.work.refused >= run.work.reviews - run.work.late > 10
    assert np.array_equal(run.loss, alone.loss)  # no decision changed
    assert run.model.labels_applied == alone.model.labels_applied


@pytest.mark.parametrize(
    "people",
    [
        People(noise=0.2),
        People(noise=0.2, second_opinions=SecondOpinions(share=1.0)),
        People(noise=0.2, undo=1.0),
    ],
    ids=["no review", "every answer checked", "authors undo"],
)
def test_the_label_budget_holds_and_the_peoples_work_comes_on_top(
    guide_like: Dataset, people: People
) -> None:
    X, y = guide_like
    plan = plan_trials(X.shape[0], 1, 1500, seed=0)
    rows = plan.indices[0]
    run = simulate(
        X[rows],
        y[rows],
        plan.coins[0],
        _config(X.shape[1]),
        people,
        Draws.draw(1500, seed=0, run=0),
    )
    assert run.work.labels == int(run.asked.sum())  # one model label per request
    # a ceiling, not a quota: a model sure of most events asks less
    assert 0.1 * BUDGET * 1500 < run.work.labels <= 1.05 * BUDGET * 1500
    assert run.model.labels_applied == run.work.labels  # corrections learn no extra label
    if people.reviewed:
        assert run.work.second_opinions == run.work.labels
    if people.undo:
        assert run.work.undos == run.work.wrong > 0


def test_a_run_is_reproducible_for_a_seed(guide_like: Dataset) -> None:
    X, y = guide_like
    plan = plan_trials(X.shape[0], 1, 500, seed=0)
    rows, coins = plan.indices[0], plan.coins[0]
    people = People(noise=0.2, second_opinions=SecondOpinions(), undo=0.5)
    config = _config(X.shape[1])

    def once(seed: int) -> Any:
        return simulate(X[rows], y[rows], coins, config, people, Draws.draw(500, seed=seed, run=0))

    first, again, other = once(1), once(1), once(2)
    assert np.array_equal(first.loss, again.loss)
    assert first.work == again.work
    assert first.model.to_json() == again.model.to_json()
    assert first.work != other.work  # the seed draws the people's answers
