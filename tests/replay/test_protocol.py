"""Trial plans, cost validation and the batched protocol loop."""

from __future__ import annotations

import numpy as np
import pytest

from service.replay.errors import ReplayConfigError, ReplayError
from service.replay.protocol import plan_trials, validate_costs
from service.replay.results import time_grid


def test_plan_has_one_row_per_run_and_one_column_per_trial() -> None:
    plan = plan_trials(50, runs=4, trials=30, seed=1)
    assert plan.indices.shape == (4, 30)
    assert plan.coins.shape == (4, 30)
    assert plan.runs == 4
    assert plan.trials == 30
    assert plan.indices.min() >= 0
    assert plan.indices.max() < 50
    assert ((plan.coins >= 0.0) & (plan.coins < 1.0)).all()


def test_plan_is_reproducible_and_depends_on_the_seed() -> None:
    a = plan_trials(100, runs=3, trials=40, seed=7)
    b = plan_trials(100, runs=3, trials=40, seed=7)
    c = plan_trials(100, runs=3, trials=40, seed=8)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.coins, b.coins)
    assert not np.array_equal(a.indices, c.indices)


def test_run_r_does_not_depend_on_the_number_of_runs() -> None:
    few = plan_trials(100, runs=2, trials=25, seed=3)
    many = plan_trials(100, runs=5, trials=25, seed=3)
    np.testing.assert_array_equal(few.indices, many.indices[:2])
    np.testing.assert_array_equal(few.coins, many.coins[:2])


def test_runs_differ_from_each_other() -> None:
    plan = plan_trials(1000, runs=2, trials=50, seed=0)
    assert not np.array_equal(plan.indices[0], plan.indices[1])


def test_permutation_visits_every_row_once_per_epoch() -> None:
    plan = plan_trials(7, runs=2, trials=17, seed=0, sampling="permutation")
    for row in plan.indices:
        assert sorted(row[:7].tolist()) == list(range(7))
        assert sorted(row[7:14].tolist()) == list(range(7))
        assert len(set(row[14:].tolist())) == 3  # a partial third epoch has no repeats


def test_sampling_with_replacement_repeats_rows() -> None:
    plan = plan_trials(10, runs=1, trials=200, seed=0)
    counts = np.bincount(plan.indices[0], minlength=10)
    assert counts.sum() == 200
    assert (counts > 0).all()
    assert counts.max() > 1


def test_plan_rejects_bad_sizes_and_sampling() -> None:
    with pytest.raises(ReplayConfigError, match="no rows"):
        plan_trials(0, runs=1, trials=1, seed=0)
    with pytest.raises(ReplayConfigError, match=">= 1"):
        plan_trials(5, runs=0, trials=1, seed=0)
    with pytest.raises(ReplayConfigError, match="sampling"):
        plan_trials(5, runs=1, trials=1, seed=0, sampling="bootstrap")  # type: ignore[arg-type]


@pytest.mark.parametrize("cost", [0.0, 0.5, -0.1, 0.7])
def test_costs_outside_the_open_interval_are_refused(cost: float) -> None:
    with pytest.raises(ReplayConfigError, match=r"\(0, 0.5\)"):
        validate_costs([0.1, cost])


def test_duplicate_or_missing_costs_are_refused() -> None:
    with pytest.raises(ReplayConfigError, match="duplicate"):
        validate_costs([0.1, 0.1])
    with pytest.raises(ReplayConfigError, match="at least one"):
        validate_costs([])


def test_config_error_is_a_replay_error_and_a_value_error() -> None:
    assert issubclass(ReplayConfigError, ReplayError)
    assert issubclass(ReplayError, ValueError)


@pytest.mark.parametrize("trials", [1, 2, 7, 99, 3000, 10_000])
def test_time_grid_is_increasing_within_range_and_ends_at_t(trials: int) -> None:
    grid = time_grid(trials)
    assert grid[0] == 1
    assert grid[-1] == trials
    assert (np.diff(grid) > 0).all()
    assert len(grid) <= 100
