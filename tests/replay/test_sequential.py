"""The replay's one-by-one engine runs the learner a stream worker builds for a model: the
same builder (``serving_learner``), inside the adaptive wrapper when asked."""

from __future__ import annotations

import numpy as np
import pytest

from service.config import ModelConfig
from service.learning import Adaptive, Budgeted, Parts
from service.replay import cli
from service.replay.errors import ReplayConfigError
from service.replay.options import ReplayOptions
from service.replay.results import Variant
from service.replay.runner import replay
from service.replay.sequential import variant_learner
from service.stream.models.served import initial_envelope


def test_the_replays_learner_is_version_zero_of_the_workers_model() -> None:
    options = ReplayOptions(
        algorithms=("dsal",), costs=(0.25,), seed=3, adaptive=Parts(), update_rule="normalized"
    )
    learner = variant_learner(Variant("dsal"), 0.25, 4, options)
    config = ModelConfig(algorithm="dsal", cost=0.25, n_features=3, seed=3)
    assert isinstance(learner, Adaptive)
    assert learner.to_state() == dict(initial_envelope("m", config).learner)
    held = variant_learner(Variant("dsal", 0.1, "budget"), 0.25, 4, options)
    assert isinstance(held, Budgeted)
    assert isinstance(held.learner, Adaptive)
    bare = variant_learner(Variant("dsal"), 0.25, 4, ReplayOptions(costs=(0.25,), seed=3))
    off = ModelConfig.model_validate(
        {**config.model_dump(), "adaptive": {"enabled": False}, "update_rule": "sgd"}
    )
    assert bare.to_state() == dict(initial_envelope("m", off).learner)


def test_an_adaptive_replay_runs_one_by_one_and_learns_each_asked_label() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = np.where(X[:, 0] + 0.3 * X[:, 1] > 0, 1, -1)
    on = ReplayOptions(algorithms=("dsal",), costs=(0.25,), runs=2, trials=300, adaptive=Parts())
    result = replay(X, y, on)
    (series,) = result.series
    assert result.settings["adaptive"] == {
        "detector": True,
        "challengers": True,
        "explore": True,
        "steps": True,
    }
    assert series.seconds > 0  # the sequential engine times its learners
    assert 0.0 <= series.summary()["risk_mean"] < 0.25


@pytest.mark.parametrize(
    ("value", "parts"),
    [
        (None, None),
        ("detector,challengers,explore,steps", Parts()),
        ("detector", Parts(detector=True, challengers=False, explore=False, steps=False)),
        (
            " explore , challengers",
            Parts(detector=False, challengers=True, explore=True, steps=False),
        ),
        ("steps", Parts(detector=False, challengers=False, explore=False, steps=True)),
        ("", Parts(False, False, False, False)),
    ],
)
def test_adaptive_parts_on_the_command_line(value: str | None, parts: Parts | None) -> None:
    assert cli._adaptive_parts(value) == parts  # noqa: SLF001 - the flag's parser


def test_an_unknown_part_is_refused() -> None:
    with pytest.raises(ReplayConfigError, match="detectr"):
        cli._adaptive_parts("detectr")  # noqa: SLF001
