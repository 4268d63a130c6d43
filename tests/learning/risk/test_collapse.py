"""The collapse detector: windows, verdicts, state."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from service.learning import HyperparameterError, InputError, StateError
from service.learning.errors import DimensionError
from service.learning.risk import CollapseWatch


def test_no_verdict_before_the_first_window_is_complete() -> None:
    watch = CollapseWatch(window=10)
    watch.observe_many([0] * 9, np.linspace(1.0, 2.0, 9))
    status = watch.status()
    assert (status.collapsed, status.rejecting, status.windows, status.streak) == (
        False,
        False,
        0,
        0,
    )
    assert math.isnan(status.reject_fraction)
    assert math.isnan(status.rho_growth)


def test_rejecting_everything_while_rho_grows_is_a_collapse() -> None:
    watch = CollapseWatch(window=100)
    for i in range(300):
        watch.observe(0, 1.0 + 0.01 * i)
    status = watch.status()
    assert status.collapsed
    assert status.rejecting
    assert (status.windows, status.streak) == (3, 3)
    assert status.rho_growth == pytest.approx(0.99)


def test_rejecting_everything_with_a_steady_rho_is_only_rejecting() -> None:
    watch = CollapseWatch(window=50)
    watch.observe_many([0] * 50, 2.0)
    status = watch.status()
    assert status.rejecting
    assert not status.collapsed


def test_a_window_that_predicts_enough_resets_the_streak() -> None:
    watch = CollapseWatch(window=20, reject_fraction=0.9)
    watch.observe_many([0] * 40, np.linspace(1.0, 3.0, 40))
    assert watch.status().streak == 2
    labels = [0] * 17 + [1, -1, 1]  # 85 % rejected: below the threshold
    watch.observe_many(labels, np.linspace(3.0, 4.0, 20))
    status = watch.status()
    assert not status.collapsed
    assert status.streak == 0
    assert status.reject_fraction == pytest.approx(0.85)


def test_min_growth_ignores_small_drifts_of_rho() -> None:
    watch = CollapseWatch(window=10, min_growth=0.5)
    watch.observe_many([0] * 10, np.linspace(1.0, 1.4, 10))
    assert not watch.status().collapsed
    watch.observe_many([0] * 10, np.linspace(1.4, 2.0, 10))
    assert watch.status().collapsed


def test_state_round_trips_through_json_mid_window() -> None:
    watch = CollapseWatch(window=30)
    watch.observe_many([0] * 45, np.linspace(1.0, 2.0, 45))
    clone = CollapseWatch.from_state(json.loads(json.dumps(watch.to_state())))
    assert clone.to_state() == watch.to_state()
    for w in (watch, clone):
        w.observe_many([0] * 15, 2.5)
    assert clone.status() == watch.status()
    assert clone.status().windows == 2


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"window": 0}, "window"),
        ({"reject_fraction": 0.0}, "reject_fraction"),
        ({"reject_fraction": 1.5}, "reject_fraction"),
        ({"min_growth": -1.0}, "min_growth"),
        ({"min_growth": math.inf}, "min_growth"),
    ],
)
def test_bad_parameters_are_named(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(HyperparameterError, match=name):
        CollapseWatch(**kwargs)


def test_bad_input_and_bad_states_are_refused() -> None:
    watch = CollapseWatch(window=5)
    with pytest.raises(DimensionError):
        watch.observe_many([[0, 0]], 1.0)
    with pytest.raises(InputError, match="finite"):
        watch.observe_many([0, 0], [1.0, math.nan])
    state = watch.to_state()
    with pytest.raises(StateError, match="window"):
        CollapseWatch.from_state({**state, "learned": {**state["learned"], "count": 5}})
    with pytest.raises(StateError, match="invalid"):
        CollapseWatch.from_state({**state, "params": {"window": 0}})
