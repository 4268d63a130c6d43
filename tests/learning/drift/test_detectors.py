"""The change detectors against River's on the same sequences, their state, their bounds.

River's ``drift.ADWIN`` and ``drift.PageHinkley`` are the reference: the same values give
the same detections at the same positions (and ADWIN the same window, value by value),
for River's defaults and for other settings, on sequences with and without changes.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from river import drift as river_drift

from service.learning import DSAL, Budgeted, QueryBudget, default_pipeline
from service.learning.drift import ADWIN, DRIFT_FORMAT, PageHinkley, detector_from_state
from service.learning.errors import HyperparameterError, InputError, StateError
from service.learning.losses import zero_d_one_loss


def _losses_of_a_flipped_stream() -> list[float]:
    """What a budgeted DSAL's labels cost it on a stream whose labels flip half way."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(6000, 3))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] > 0, 1, -1) * np.where(np.arange(6000) < 3000, 1, -1)
    model, pipe = Budgeted(DSAL(n_features=4, cost=0.25), QueryBudget(0.2)), default_pipeline(3)
    out = []
    for t in range(6000):
        d = model.decide(pipe.transform(X[t]), coin=float(rng.random()))
        if d.query:
            out.append(zero_d_one_loss(y[t] * d.score, d.rho, 0.25))
            pipe.learn(X[t])
            model.update(pipe.transform(X[t]), y[t])
    return out


#: a served model's margin errors on a stream it gets nearly always right (Shuttle): after
#: the drop of its oldest bucket the window holds only zeros, and its running variance comes
#: out a rounding error below zero
RARE_ERRORS = [1.0 if t in (3, 6, 7, 21, 27, 32, 50) else 0.0 for t in range(370)]


def _sequences() -> dict[str, list[float]]:
    rng = np.random.default_rng(0)
    return {
        "bernoulli-shift": np.r_[rng.random(3000) < 0.2, rng.random(3000) < 0.6]
        .astype(float)
        .tolist(),
        "gaussian-shifts": np.r_[
            rng.normal(0, 1, 2000), rng.normal(0.5, 1, 2000), rng.normal(-1, 2, 2000)
        ].tolist(),
        "stationary-losses": rng.choice([0.0, 0.25, 1.0], p=[0.7, 0.2, 0.1], size=8000).tolist(),
        "many-steps": (np.repeat(rng.normal(0, 3, 24), 250) + rng.normal(0, 1, 6000)).tolist(),
        "dsal-losses": _losses_of_a_flipped_stream(),
        "rare-errors": RARE_ERRORS,
    }


SEQUENCES = _sequences()
ADWIN_SETTINGS: list[dict[str, Any]] = [
    {},
    {"clock": 1},
    {"delta": 0.05, "clock": 4},
    {"delta": 1e-5, "clock": 1, "max_buckets": 3, "min_window_length": 10, "grace_period": 30},
]
PH_SETTINGS: list[dict[str, Any]] = [
    {},
    {"threshold": 5.0, "mode": "up"},
    {"threshold": 10.0, "delta": 0.01, "alpha": 0.99, "mode": "down", "min_instances": 5},
]


@pytest.mark.parametrize("settings", ADWIN_SETTINGS, ids=str)
@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_adwin_detects_where_river_detects(name: str, settings: dict[str, Any]) -> None:
    ours, theirs = ADWIN(**settings), river_drift.ADWIN(**settings)
    hits, their_hits = [], []
    for t, v in enumerate(SEQUENCES[name]):
        if ours.update(v):
            hits.append(t)
        theirs.update(v)
        if theirs.drift_detected:
            their_hits.append(t)
        assert ours.width == theirs.width, t
        assert ours.estimation == pytest.approx(theirs.estimation, rel=1e-12, abs=1e-12)
    assert hits == their_hits
    assert ours.detections == len(hits)


@pytest.mark.parametrize("settings", PH_SETTINGS, ids=str)
@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_page_hinkley_detects_where_river_detects(name: str, settings: dict[str, Any]) -> None:
    ours, theirs = PageHinkley(**settings), river_drift.PageHinkley(**settings)
    hits, their_hits = [], []
    for t, v in enumerate(SEQUENCES[name]):
        if ours.update(v):
            hits.append(t)
        theirs.update(v)
        if theirs.drift_detected:
            their_hits.append(t)
    assert hits == their_hits
    assert ours.detections == len(hits)


def test_the_sequences_do_hold_changes_to_detect() -> None:
    """The parity above is not the parity of two detectors that never fire."""
    for name in ("bernoulli-shift", "gaussian-shifts", "many-steps", "dsal-losses"):
        adwin = ADWIN()
        assert sum(adwin.update(v) for v in SEQUENCES[name]) >= 1, name
    adwin = ADWIN()
    assert not any(adwin.update(v) for v in SEQUENCES["stationary-losses"])


def test_adwin_takes_a_window_of_equal_values_after_a_drop() -> None:
    # once dropped to zeros, the variance is a rounding error below zero: no cut, no error
    adwin = ADWIN(delta=0.2, clock=1)
    hits = [t for t, v in enumerate(RARE_ERRORS + [0.0] * 200) if adwin.update(v)]
    assert hits
    assert adwin.variance >= -1e-12
    assert not adwin.update(0.0)


def test_adwin_says_where_and_which_way_the_change_went() -> None:
    adwin = ADWIN(clock=1)
    values = [0.1] * 300 + [0.9] * 40
    at = next(t for t, v in enumerate(values) if adwin.update(v))
    assert adwin.rising
    assert adwin.drift_detected
    assert adwin.recent == at - 300 + 1  # the values since the change
    down = ADWIN(clock=1)
    assert any(down.update(v) for v in [0.9] * 300 + [0.1] * 40)
    assert not down.rising


def test_a_detector_starts_afresh_after_a_detection() -> None:
    adwin = ADWIN(clock=1)
    for v in [0.0] * 200 + [1.0] * 200:
        if adwin.update(v):
            break
    assert adwin.width > 0
    adwin.update(1.0)
    assert adwin.width == 1
    assert not adwin.drift_detected
    assert adwin.detections == 1


def _feed(det: Any, values: list[float]) -> list[bool]:
    return [det.update(v) for v in values]


@pytest.mark.parametrize(
    "make",
    [lambda: ADWIN(clock=1), lambda: ADWIN(), lambda: PageHinkley(threshold=5.0, mode="up")],
    ids=["adwin-clock-1", "adwin", "page-hinkley"],
)
@pytest.mark.parametrize("cut", [0, 1, 777, 3001])
def test_a_json_round_trip_of_the_state_keeps_the_future(make: Any, cut: int) -> None:
    values = SEQUENCES["bernoulli-shift"]
    det = make()
    _feed(det, values[:cut])
    copy = detector_from_state(json.loads(json.dumps(det.to_state(), allow_nan=False)))
    assert type(copy) is type(det)
    assert copy.get_params() == det.get_params()
    assert _feed(copy, values[cut:]) == _feed(det, values[cut:])
    assert copy.to_state() == det.to_state()


def test_state_records_are_checked() -> None:
    good = ADWIN(clock=1)
    _feed(good, [0.0, 1.0] * 50)
    record = good.to_state()
    assert record["format"] == DRIFT_FORMAT
    assert record["kind"] == "adwin"
    bad_width = {**record, "learned": {**record["learned"], "width": 7}}
    with pytest.raises(StateError, match="buckets"):
        ADWIN.from_state(bad_width)
    with pytest.raises(StateError, match="page-hinkley"):
        PageHinkley.from_state(record)
    with pytest.raises(StateError, match="unknown change detector"):
        detector_from_state({**record, "kind": "ddm"})
    nan_total = {**record, "learned": {**record["learned"], "totals": [[math.nan]]}}
    with pytest.raises(StateError):
        ADWIN.from_state(nan_total)
    with pytest.raises(StateError):
        PageHinkley.from_state({**PageHinkley().to_state(), "params": {"mode": "sideways"}})


@pytest.mark.parametrize(
    ("make", "kwargs"),
    [
        (ADWIN, {"delta": 0.0}),
        (ADWIN, {"delta": 1.0}),
        (ADWIN, {"clock": 0}),
        (ADWIN, {"max_buckets": 0}),
        (ADWIN, {"delta": "0.1"}),
        (PageHinkley, {"threshold": 0.0}),
        (PageHinkley, {"alpha": 1.5}),
        (PageHinkley, {"mode": "sideways"}),
        (PageHinkley, {"delta": -1.0}),
    ],
)
def test_bad_parameters_are_refused(make: Any, kwargs: dict[str, Any]) -> None:
    with pytest.raises(HyperparameterError):
        make(**kwargs)


@pytest.mark.parametrize("make", [ADWIN, PageHinkley])
@pytest.mark.parametrize("value", [math.nan, math.inf, "x", None])
def test_a_bad_value_is_refused_and_changes_nothing(make: Any, value: Any) -> None:
    det = make()
    _feed(det, [0.5] * 40)
    before = det.to_state()
    with pytest.raises(InputError):
        det.update(value)
    assert det.to_state() == before
