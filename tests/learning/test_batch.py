"""The batched engine does, row by row, what the single learners do."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.learning import DRAL, DSAL, DSOL, HyperparameterError, InputError
from service.learning.batch import BatchLearner, BatchStandardizer
from service.learning.errors import DimensionError, LabelError, NonFiniteError
from service.learning.preprocessing import OnlineStandardizer
from service.learning.schedules import Constant, InverseTime

from .strategies import noisy_stream


def mixed_learners() -> list:
    """One learner per (algorithm, cost, schedule), each with its own settings."""
    out = []
    for cost in (0.1, 0.25, 0.4):
        out.append(DRAL(n_features=5, cost=cost, eta=InverseTime(0.5, 50.0)))
        out.append(DSAL(n_features=5, cost=cost, gamma=1.5, eta=Constant(0.3)))
        out.append(DSOL(n_features=5, cost=cost, gamma=0.7, eta=InverseTime(0.2, 20.0)))
    return out


def test_batch_equals_sequential_learners_on_a_random_stream() -> None:
    learners = mixed_learners()
    batch = BatchLearner.from_learners(learners)
    b = len(learners)
    rng = np.random.default_rng(0)
    X, y = noisy_stream(400 * b, 5, seed=1)
    X, y = X.reshape(400, b, 5), y.reshape(400, b)
    coins = rng.random((400, b))
    queried_total = 0
    for t in range(400):
        labels, scores, probs, queried = batch.step(X[t], y[t], coins[t])
        for i, learner in enumerate(learners):
            d = learner.decide(X[t, i], coin=coins[t, i])
            assert labels[i] == d.label
            assert scores[i] == pytest.approx(d.score, rel=1e-12, abs=1e-12)
            assert probs[i] == pytest.approx(d.query_probability, rel=1e-12, abs=1e-12)
            assert queried[i] == d.query
            if d.query:
                learner.update(X[t, i], y[t, i])
        queried_total += int(queried.sum())
    assert queried_total > 400  # the stream really exercised the updates
    for i, learner in enumerate(learners):
        assert np.allclose(batch.W[i], learner.w, rtol=1e-12, atol=1e-12)
        assert batch.rho[i] == pytest.approx(learner.rho, rel=1e-12, abs=1e-12)
        assert batch.steps[i] == learner.steps


def test_single_algorithm_batch_equals_sequential_learners() -> None:
    learners = [DSAL(n_features=3, cost=0.25, eta=0.2, seed=s) for s in range(6)]
    batch = BatchLearner("dsal", n_features=3, cost=0.25, eta=0.2, n_rows=6)
    X, y = noisy_stream(6 * 200, 3, seed=2)
    X, y = X.reshape(200, 6, 3), y.reshape(200, 6)
    coins = np.random.default_rng(3).random((200, 6))
    for t in range(200):
        _, _, _, queried = batch.step(X[t], y[t], coins[t])
        for i, learner in enumerate(learners):
            if learner.decide(X[t, i], coin=coins[t, i]).query:
                learner.update(X[t, i], y[t, i])
    assert np.allclose(batch.W, np.stack([lrn.w for lrn in learners]), rtol=1e-12, atol=1e-12)


def test_default_rows_step_like_default_single_learners() -> None:
    # no eta anywhere: every row must build the single learner's default from its width
    # (and, for DSAL/DSOL, its own gamma) and then follow the same trajectory
    n, algorithms = 7, ["dral", "dsal", "dsol"] * 3
    gammas = [1.0, 0.5, 2.0, 1.0, 1.0, 0.7, 1.0, 3.0, 1.0]
    costs = [0.1] * 3 + [0.25] * 3 + [0.4] * 3
    batch = BatchLearner(algorithms, n_features=n, cost=costs, gamma=gammas)
    learners = [
        DRAL(n_features=n, cost=c)
        if a == "dral"
        else {"dsal": DSAL, "dsol": DSOL}[a](n_features=n, cost=c, gamma=g)
        for a, c, g in zip(algorithms, costs, gammas, strict=True)
    ]
    # the schedules are the same objects' values, bit for bit
    assert [lrn.eta for lrn in batch.to_learners()] == [lrn.eta for lrn in learners]
    assert len({lrn.eta for lrn in learners}) == 6  # rows really differ (gamma, algorithm)
    b = len(learners)
    X, y = noisy_stream(300 * b, n, seed=21)
    X, y = X.reshape(300, b, n), y.reshape(300, b)
    coins = np.random.default_rng(22).random((300, b))
    for t in range(300):
        labels, _, _, queried = batch.step(X[t], y[t], coins[t])
        for i, learner in enumerate(learners):
            d = learner.decide(X[t, i], coin=coins[t, i])
            assert (labels[i], queried[i]) == (d.label, d.query), (t, i)
            if d.query:
                learner.update(X[t, i], y[t, i])
    assert batch.steps.tolist() == [lrn.steps for lrn in learners]
    assert min(batch.steps) > 20  # every row learned, so its step size mattered
    for i, learner in enumerate(learners):
        assert np.allclose(batch.W[i], learner.w, rtol=1e-12, atol=1e-12)
        assert batch.rho[i] == pytest.approx(learner.rho, rel=1e-12, abs=1e-12)


def test_none_in_a_per_row_eta_takes_that_row_s_default() -> None:
    batch = BatchLearner(["dsal", "dral", "dsol"], n_features=4, cost=0.25, eta=[None, 0.3, None])
    rows = batch.to_learners()
    assert rows[0].eta == DSAL(n_features=4, cost=0.25).eta == InverseTime(1.0, 1000.0)
    assert rows[1].eta == Constant(0.3)
    assert rows[2].eta == InverseTime(1.0, 1000.0)  # 5 / (1 * (4 + 1))
    assert BatchLearner("dral", n_features=4, cost=0.25, n_rows=1).to_learners()[0].eta == (
        InverseTime(0.3, 1000.0)  # 1.5 / (4 + 1)
    )


def test_to_learners_and_from_learners_round_trip() -> None:
    learners = mixed_learners()
    batch = BatchLearner.from_learners(learners)
    X, y = noisy_stream(50 * len(learners), 5, seed=4)
    for t in range(50):
        rows = slice(t * len(learners), (t + 1) * len(learners))
        batch.step(X[rows], y[rows], np.full(len(learners), 0.3))
    again = BatchLearner.from_learners(batch.to_learners())
    assert np.array_equal(again.W, batch.W)
    assert np.array_equal(again.rho, batch.rho)
    assert np.array_equal(again.steps, batch.steps)
    assert again.algorithms == batch.algorithms


def test_bad_step_input_is_refused_and_nothing_changes() -> None:
    batch = BatchLearner("dsol", n_features=2, cost=0.25, n_rows=3)
    X, y, u = np.ones((3, 2)), np.array([1.0, -1.0, 1.0]), np.full(3, 0.5)
    batch.step(X, y, u)
    before = (batch.W.copy(), batch.rho, batch.steps)
    bad_X = X.copy()
    bad_X[1, 0] = np.nan
    cases = [
        (np.ones((2, 2)), y, u, DimensionError),
        (bad_X, y, u, NonFiniteError),
        (X, np.array([1.0, 0.0, 1.0]), u, LabelError),
        (X, y, np.array([0.5, 1.0, 0.5]), InputError),
        (X, y[:2], u, DimensionError),
    ]
    for X_, y_, u_, error in cases:
        with pytest.raises(error):
            batch.step(X_, y_, u_)
        assert np.array_equal(batch.W, before[0])
        assert np.array_equal(batch.rho, before[1])
        assert np.array_equal(batch.steps, before[2])


def test_a_step_that_would_overflow_is_refused() -> None:
    batch = BatchLearner("dsal", n_features=1, cost=0.25, eta=1e308, n_rows=2)
    with pytest.raises(NonFiniteError):
        batch.step(np.array([[1e300], [1.0]]), np.array([1.0, 1.0]), np.zeros(2))
    assert batch.W.tolist() == [[0.0], [0.0]]
    assert batch.steps.tolist() == [0, 0]


def test_rows_must_be_determined_consistently() -> None:
    with pytest.raises(HyperparameterError, match="number of rows"):
        BatchLearner("dral", n_features=2, cost=0.25)
    with pytest.raises(HyperparameterError, match="number of rows"):
        BatchLearner(["dral", "dsal"], n_features=2, cost=[0.1, 0.2, 0.3])
    with pytest.raises(HyperparameterError, match="unknown algorithm"):
        BatchLearner(["dral", "svm"], n_features=2, cost=0.1)
    with pytest.raises(HyperparameterError, match="cost"):
        BatchLearner("dral", n_features=2, cost=[0.1, 0.7])


def test_weights_view_is_read_only() -> None:
    batch = BatchLearner("dral", n_features=2, cost=0.25, n_rows=2)
    with pytest.raises(ValueError, match="read-only"):
        batch.W[0, 0] = 1.0


def test_batch_standardizer_equals_one_standardizer_per_row_bit_for_bit() -> None:
    rng = np.random.default_rng(2)
    data = rng.normal(size=(60, 4, 3)) * [1.0, 50.0, 1e-4]
    data[:, :, 2] = np.where(rng.random((60, 4)) < 0.9, 0.0, data[:, :, 2])  # sparse column
    batch = BatchStandardizer(n_rows=4, n_features=3)
    singles = [OnlineStandardizer(3) for _ in range(4)]
    for step in data:
        out = batch.transform(step)
        for i, z in enumerate(singles):
            assert out[i].tolist() == z.transform(step[i]).tolist()
            z.learn(step[i])
        batch.learn(step)
    assert batch.count == 60
    assert np.array_equal(batch.mean, np.stack([z.mean for z in singles]))


def test_batch_standardizer_refuses_bad_input_unchanged() -> None:
    batch = BatchStandardizer(n_rows=2, n_features=2)
    batch.learn(np.ones((2, 2)))
    bad = np.ones((2, 2))
    bad[1, 1] = math.inf
    with pytest.raises(NonFiniteError):
        batch.learn(bad)
    with pytest.raises(DimensionError):
        batch.learn(np.ones((3, 2)))
    assert batch.count == 1
    assert batch.mean.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_a_learner_with_a_tail_runs_alone() -> None:
    with pytest.raises(HyperparameterError, match="tail"):
        BatchLearner.from_learners([DSOL(n_features=2, cost=0.25, tail=1.0)])
