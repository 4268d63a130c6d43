"""The project's drift streams: shapes, the change happens exactly where it is said to,
the label noise is the one asked for, and a seed fixes every number."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.replay.errors import ReplayConfigError
from service.replay.streams import (
    DRIFT_STREAMS,
    SEA_THRESHOLDS,
    label_flip,
    rotating_hyperplane,
    sea_shift,
)


@pytest.mark.parametrize("name", sorted(DRIFT_STREAMS))
def test_a_stream_has_the_documented_shape_and_types(name: str) -> None:
    s = DRIFT_STREAMS[name](seed=3)
    assert s.name == name
    assert s.n == 15_000
    assert s.change == 5_000
    assert s.seed == 3
    assert s.X.dtype == np.float64
    assert s.X.shape[0] == 15_000
    assert s.y.dtype == np.int64
    assert set(np.unique(s.y).tolist()) == {-1, 1}
    assert set(np.unique(s.clean).tolist()) == {-1, 1}
    assert np.isfinite(s.X).all()


@pytest.mark.parametrize("name", sorted(DRIFT_STREAMS))
def test_the_same_seed_gives_the_same_stream_and_another_seed_another(name: str) -> None:
    a, b, c = (DRIFT_STREAMS[name](seed=s) for s in (7, 7, 8))
    assert np.array_equal(a.X, b.X)
    assert np.array_equal(a.y, b.y)
    assert not np.array_equal(a.X, c.X)


@pytest.mark.parametrize("name", sorted(DRIFT_STREAMS))
def test_labels_are_the_clean_concept_with_the_requested_noise(name: str) -> None:
    s = DRIFT_STREAMS[name](seed=1)
    flipped = float((s.y != s.clean).mean())
    assert abs(flipped - s.noise) < 4 * math.sqrt(s.noise * (1 - s.noise) / s.n)
    quiet = DRIFT_STREAMS[name](seed=1, noise=0.0)
    assert np.array_equal(quiet.y, quiet.clean)


def test_sea_changes_its_threshold_exactly_at_the_change() -> None:
    s = sea_shift(seed=2, noise=0.0)
    total = s.X[:, 0] + s.X[:, 1]
    before = np.where(total > SEA_THRESHOLDS[0], 1, -1)
    after = np.where(total > SEA_THRESHOLDS[3], 1, -1)
    assert np.array_equal(s.clean[: s.change], before[: s.change])
    assert np.array_equal(s.clean[s.change :], after[s.change :])
    # the events the shift moves to the other class: those with 8 < x1 + x2 <= 9.5 (13 %)
    moved = float((before[s.change :] != after[s.change :]).mean())
    assert 0.11 < moved < 0.15
    assert ((s.X >= 0.0) & (s.X <= 10.0)).all()


def test_a_label_flip_negates_every_label_from_the_change_on() -> None:
    s = label_flip(seed=4, noise=0.0)
    concept = np.where(s.X[:, 0] + s.X[:, 1] > SEA_THRESHOLDS[0], 1, -1)
    assert np.array_equal(s.clean[: s.change], concept[: s.change])
    assert np.array_equal(s.clean[s.change :], -concept[s.change :])


def test_the_hyperplane_holds_still_before_the_change_and_turns_after_it() -> None:
    s = rotating_hyperplane(seed=5, noise=0.0)
    pre = slice(0, s.change)
    # a hyperplane through the origin fitted on the first concept classifies all of it
    w, *_ = np.linalg.lstsq(s.X[pre], s.clean[pre].astype(float), rcond=None)
    agree = np.sign(s.X @ w) == s.clean
    assert agree[pre].mean() > 0.97
    # and less and less of what follows: a quarter turn by the end (about half right)
    assert agree[s.change : s.change + 1000].mean() > 0.9
    assert agree[-1000:].mean() < 0.65
    assert ((s.X >= -1.0) & (s.X <= 1.0)).all()


def test_expected_loss_charges_the_noise_rate_not_the_coin() -> None:
    s = sea_shift(seed=0, noise=0.1)
    right = s.expected_loss(s.clean, 0.25)
    wrong = s.expected_loss(-s.clean, 0.25)
    rejected = s.expected_loss(np.zeros(s.n, dtype=np.int8), 0.25)
    assert set(right.tolist()) == {0.1}
    assert set(wrong.tolist()) == {0.9}
    assert set(rejected.tolist()) == {0.25}
    with pytest.raises(ReplayConfigError):
        s.expected_loss(np.zeros(3), 0.25)


@pytest.mark.parametrize(
    ("make", "kwargs"),
    [
        (sea_shift, {"n": 1}),
        (sea_shift, {"change": 0}),
        (sea_shift, {"change": 15_000}),
        (sea_shift, {"noise": 0.5}),
        (sea_shift, {"after": 4}),
        (label_flip, {"noise": -0.1}),
        (rotating_hyperplane, {"n_features": 1}),
        (rotating_hyperplane, {"angle": math.inf}),
    ],
)
def test_bad_stream_settings_are_refused(make: object, kwargs: dict[str, object]) -> None:
    with pytest.raises(ReplayConfigError):
        make(**kwargs)  # type: ignore[operator]
