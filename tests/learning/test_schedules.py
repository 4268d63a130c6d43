"""Step-size schedules."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from service.learning import HyperparameterError
from service.learning.schedules import (
    Constant,
    DSALTheory,
    InverseTime,
    as_schedule,
    schedule_from_config,
)


def test_inverse_time_halves_after_tau_labels() -> None:
    s = InverseTime(eta0=0.8, tau=50.0)
    assert s(0) == 0.8
    assert s(50) == pytest.approx(0.4)
    assert s(150) == pytest.approx(0.2)
    assert s(np.array([0, 50, 150])).tolist() == pytest.approx([0.8, 0.4, 0.2])


def test_dsal_theory_value() -> None:
    assert DSALTheory(gamma=2.0, radius=1.0)(123) == pytest.approx(5.0 / (4.0 * 2.0))


@pytest.mark.parametrize(
    "schedule", [Constant(0.3), InverseTime(0.1, 1000.0), DSALTheory(1.5, 8.3)]
)
def test_configs_round_trip_through_json(schedule: object) -> None:
    config = schedule.to_config()  # type: ignore[attr-defined]
    assert schedule_from_config(json.loads(json.dumps(config))) == schedule


@pytest.mark.parametrize(
    "config",
    [
        {"kind": "cosine"},
        {"kind": "constant"},
        {"kind": "constant", "eta": 0.1, "extra": 1},
        {"kind": "inverse-time", "eta0": 0.1, "tau": 0.0},
        {"kind": "constant", "eta": math.nan},
        {"kind": "constant", "eta": "fast"},
        ["constant", 0.1],
    ],
)
def test_bad_configs_are_refused(config: object) -> None:
    with pytest.raises(HyperparameterError):
        schedule_from_config(config)  # type: ignore[arg-type]


def test_numbers_become_constant_steps_and_other_things_are_refused() -> None:
    assert as_schedule(0.5) == Constant(0.5)
    assert as_schedule(2) == Constant(2.0)
    for bad in (True, None, "0.1", -1.0, math.inf):
        with pytest.raises(HyperparameterError, match="eta"):
            as_schedule(bad)  # type: ignore[arg-type]
