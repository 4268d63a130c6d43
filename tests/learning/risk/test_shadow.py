"""Shadow models: weighted updates against an independent replay of the rule, the plain
path unchanged, the scorecard's counts and record, refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hst

from service.learning import (
    DRAL,
    DSAL,
    DSOL,
    HyperparameterError,
    InputError,
    KernelDRAL,
    StateError,
    learn_from_champion,
)
from service.learning.losses import (
    double_ramp_gradient,
    double_sigmoid_gradient,
    reject_decision,
    zero_d_one_loss,
)
from service.learning.risk import Scorecard, decision_loss, importance_weight
from service.learning.state import dumps, loads

from ..strategies import costs, margins, rhos


def _by_hand(
    rule: str,
    events: list[tuple[np.ndarray, int, float]],
    eta: float,
    cost: float,
    max_weight: float,
) -> tuple[np.ndarray, float]:
    """The weighted update written out from the loss gradients: weight h = 1/max(p, 1/cap)
    taken as ceil(h) equal sub-steps at a constant step size."""
    w, rho = np.zeros(events[0][0].shape[0]), 1.0
    for x, y, p in events:
        h = 1.0 / max(p, 1.0 / max_weight)
        n = max(1, math.ceil(h))
        for _ in range(n):
            z = y * float(w @ x)
            if rule == "dral":
                dz, drho = double_ramp_gradient(z, rho, cost)
            else:
                dz, drho = double_sigmoid_gradient(z, rho, cost, 1.0)
            w = w - (h / n) * eta * dz * y * x
            rho = max(rho - (h / n) * eta * drho, 0.0)
    return w, rho


@pytest.mark.parametrize(("cls", "rule"), [(DRAL, "dral"), (DSAL, "dsal"), (DSOL, "dsol")])
def test_shadow_after_a_sequence_equals_a_replay_of_the_weighted_updates_by_hand(
    cls: type, rule: str
) -> None:
    rng = np.random.default_rng(11)
    events = [
        (rng.normal(size=4), int(rng.choice([-1, 1])), float(p))
        for p in rng.choice([1.0, 0.5, 0.3, 0.07, 0.002], size=60)
    ]
    shadow = cls(n_features=4, cost=0.25, eta=0.05)
    for x, y, p in events:
        learn_from_champion(shadow, x, y, p, max_weight=50.0)
    w, rho = _by_hand(rule, events, 0.05, 0.25, 50.0)
    np.testing.assert_allclose(shadow.w, w, rtol=1e-10, atol=1e-12)
    assert shadow.rho == pytest.approx(rho, rel=1e-10, abs=1e-12)
    assert shadow.steps == 60  # one step of the clock per label, whatever its weight


@pytest.mark.parametrize("cls", [DRAL, DSAL, DSOL])
def test_weight_one_is_the_plain_update_bit_for_bit(cls: type) -> None:
    rng = np.random.default_rng(5)
    plain, weighted = cls(n_features=3, cost=0.2), cls(n_features=3, cost=0.2)
    for _ in range(200):
        x, y = rng.normal(size=3), int(rng.choice([-1, 1]))
        assert plain.update(x, y) == weighted.update(x, y, weight=1.0)
    assert plain.to_state() == weighted.to_state()


def test_weighting_none_updates_as_the_champion_updates_itself() -> None:
    plain, shadow = DSAL(n_features=2, cost=0.25), DSAL(n_features=2, cost=0.25)
    for x, y in [([1.0, 0.5], 1), ([-0.3, 2.0], -1), ([0.2, 0.1], 1)]:
        plain.update(x, y)
        learn_from_champion(shadow, x, y, 0.01, weighting="none")
    assert shadow.to_state() == plain.to_state()


def test_a_heavy_dral_label_moves_the_margin_to_the_end_of_its_ramp_not_beyond() -> None:
    x = np.array([1.0, 1.0, 1.0, 1.0])
    heavy = DRAL(n_features=4, cost=0.25, eta=0.1)
    learn_from_champion(heavy, x, 1, 0.01)  # weight 100
    z = float(heavy.w @ x)
    # each sub-step moves z - rho by eta d (|x|^2 + 1) = 0.125: it stops once past rho + 1
    assert heavy.rho + 1.0 < z <= heavy.rho + 1.0 + 0.125 + 1e-12
    one_long_step = 100 * 0.1 * 0.25 * 4  # what a single step of weight 100 would add to z
    assert z < one_long_step / 5


def test_a_kernel_shadow_learns_unweighted_and_refuses_weights() -> None:
    shadow = KernelDRAL(n_features=2, cost=0.25, eta=0.5, kernel="linear")
    with pytest.raises(HyperparameterError, match="weighting='none'"):
        learn_from_champion(shadow, [1.0, 0.0], 1, 0.5)
    assert learn_from_champion(shadow, [1.0, 0.0], 1, 0.5, weighting="none")
    with pytest.raises(HyperparameterError, match="weighting"):
        learn_from_champion(shadow, [1.0, 0.0], 1, 0.5, weighting="half")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, 2e6, "2", True])
def test_bad_weights_are_refused_and_the_model_is_unchanged(bad: object) -> None:
    learner = DRAL(n_features=2, cost=0.25)
    before = learner.to_state()
    with pytest.raises(InputError, match="weight"):
        learner.update([1.0, 0.0], 1, weight=bad)  # type: ignore[arg-type]
    assert learner.to_state() == before


def test_bad_query_probabilities_are_refused_before_the_shadow_moves() -> None:
    shadow = DRAL(n_features=2, cost=0.25)
    before = shadow.to_state()
    for p in (-0.1, 1.5, math.nan):
        with pytest.raises(InputError):
            learn_from_champion(shadow, [1.0, 0.0], 1, p)
    assert shadow.to_state() == before


@given(f=margins, rho=rhos, cost=costs, y=hst.sampled_from([1, -1]))
def test_decision_loss_of_the_decision_equals_the_margin_loss(
    f: float, rho: float, cost: float, y: int
) -> None:
    label = int(reject_decision(f, rho))
    assert decision_loss(label, y, cost) == zero_d_one_loss(y * f, rho, cost)


def test_scorecard_counts_decisions_and_charges_labels_with_the_champions_probability() -> None:
    card = Scorecard(cost=0.25, max_weight=10.0)
    for label in [1, 0, -1, 0, 1] * 4:
        card.decided(label)
    assert card.labelled(0, 1, 0.5) == 0.5  # a rejection costs d = 0.25, weight 2
    assert card.labelled(1, -1, 0.05) == 10.0  # wrong, weight capped at 10
    assert card.labelled(-1, -1, 1.0) == 0.0
    report = card.report(0.9)
    assert (report.events, report.rejected, report.labels) == (20, 8, 3)
    assert report.reject_rate == 0.4
    assert report.estimator == "horvitz-thompson"
    assert report.risk == pytest.approx(10.5 / 20)  # weighted losses over the events
    assert report.low <= report.risk <= report.high
    assert report.level == 0.9
    ratio = card.report(0.9, estimator="ratio")
    assert ratio.risk == pytest.approx(10.5 / 13.0)  # over the weights: the envelope's risk
    assert ratio.risk == card.estimate.risk
    assert importance_weight(0.05, 10.0) == 10.0
    with pytest.raises(HyperparameterError, match="estimator"):
        card.report(estimator="mean")  # type: ignore[arg-type]


def test_scorecard_state_round_trips_and_a_fresh_record_is_json_safe() -> None:
    card = Scorecard(cost=0.1)
    assert card.report().to_dict()["risk"] is None  # NaN is not JSON
    card.decided(0)
    card.labelled(0, 1, 0.3)
    again = Scorecard.from_state(loads(dumps(card.to_state())))
    assert again.to_state() == card.to_state()
    assert again.report() == card.report()
    broken = card.to_state()
    broken["learned"]["rejected"] = 5
    with pytest.raises(StateError, match="more rejections"):
        Scorecard.from_state(broken)


@pytest.mark.parametrize("label", [2, -2, 0.5])
def test_a_decision_is_plus_one_minus_one_or_zero(label: float) -> None:
    card = Scorecard(cost=0.25)
    with pytest.raises(InputError):
        card.decided(label)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        card.labelled(label, 1, 0.5)  # type: ignore[arg-type]
    assert card.events == 0
    assert card.estimate.labels == 0
