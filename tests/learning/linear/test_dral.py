"""DRAL (Algorithm 1), checked by hand on each branch."""

from __future__ import annotations

import numpy as np
import pytest

from service.learning import DRAL
from service.learning.schedules import InverseTime


def make(w: list[float], rho: float, d: float = 0.2, eta: float = 0.5) -> DRAL:
    return DRAL(n_features=len(w), cost=d, eta=eta, w=w, rho=rho)


def test_starts_as_algorithm_1_says() -> None:
    learner = DRAL(n_features=3, cost=0.2)
    assert learner.w.tolist() == [0.0, 0.0, 0.0]
    assert learner.rho == 1.0
    assert learner.steps == 0


def test_first_ramp_moves_w_by_eta_d_y_x_and_shrinks_rho() -> None:
    # w.x = 2*1 + 1*0.5 = 2.5; y = +1 so z = 2.5 in [rho - 1, rho + 1] = [1, 3]
    learner = make([2.0, 1.0], rho=2.0, d=0.2, eta=0.5)
    x = np.array([1.0, 0.5])
    assert learner.update(x, +1) is True
    # w + 0.5 * 0.2 * (+1) * x = [2.1, 1.05]; rho - 0.5 * 0.2 = 1.9
    assert learner.w.tolist() == pytest.approx([2.1, 1.05], abs=1e-15)
    assert learner.rho == pytest.approx(1.9, abs=1e-15)


def test_second_ramp_moves_w_by_eta_1_minus_d_y_x_and_grows_rho() -> None:
    # w.x = 2.5, y = -1 so z = -2.5 in [-rho - 1, -rho + 1] = [-3, -1]
    learner = make([2.0, 1.0], rho=2.0, d=0.2, eta=0.5)
    x = np.array([1.0, 0.5])
    assert learner.update(x, -1) is True
    # w + 0.5 * 0.8 * (-1) * x = [1.6, 0.8]; rho + 0.5 * 0.8 = 2.4
    assert learner.w.tolist() == pytest.approx([1.6, 0.8], abs=1e-15)
    assert learner.rho == pytest.approx(2.4, abs=1e-15)


@pytest.mark.parametrize("y", [+1, -1])
def test_outside_both_ramps_nothing_moves(y: int) -> None:
    # w.x = 5 > rho + 1 = 3: confidently right for y=+1, confidently wrong (beyond the
    # second ramp) for y=-1; either way L_dr is flat there
    learner = make([5.0, 0.0], rho=2.0)
    x = np.array([1.0, 7.0e-17])
    assert learner.update(x, y) is False
    assert learner.w.tolist() == [5.0, 0.0]
    assert learner.rho == 2.0
    assert learner.steps == 1


def test_flat_middle_of_a_wide_reject_band_moves_nothing() -> None:
    # rho = 3: z = 0 lies in neither [2, 4] nor [-4, -2]
    learner = make([0.0, 0.0], rho=3.0)
    assert learner.update([1.0, 1.0], +1) is False
    assert learner.decide([1.0, 1.0]).query is False


def test_overlapping_ramps_take_the_first_branch_like_algorithm_1() -> None:
    # rho = 0.5: ramps [-0.5, 1.5] and [-1.5, 0.5] overlap on [-0.5, 0.5]; z = 0.25
    learner = make([0.25, 0.0], rho=0.5, d=0.2, eta=1.0)
    learner.update([1.0, 0.0], +1)
    assert learner.w.tolist() == pytest.approx([0.45, 0.0], abs=1e-15)  # + 1 * 0.2 * x
    assert learner.rho == pytest.approx(0.3, abs=1e-15)  # - 1 * 0.2


def test_rho_is_clipped_at_zero() -> None:
    learner = make([0.0], rho=0.1, d=0.4, eta=1.0)
    learner.update([1.0], +1)  # z = 0 on the first ramp: rho - 0.4 < 0
    assert learner.rho == 0.0


@pytest.mark.parametrize(
    ("score", "query"),
    [(0.0, True), (1.0, True), (2.0, True), (2.0001, False), (-2.0, True), (-2.5, False)],
)
def test_queries_exactly_on_the_band_rho_minus_1_to_rho_plus_1(score: float, query: bool) -> None:
    learner = make([score], rho=1.0)
    decision = learner.decide([1.0])
    assert decision.query is query
    assert decision.query_probability == (1.0 if query else 0.0)
    assert decision.score == score


def test_decisions_use_h_rho() -> None:
    learner = make([1.0], rho=1.0)
    assert [learner.decide([v]).label for v in (1.5, 1.0, 0.0, -1.0, -1.5)] == [1, 0, 0, 0, -1]


def test_step_size_schedule_uses_the_label_count() -> None:
    learner = DRAL(n_features=1, cost=0.25, eta=InverseTime(eta0=1.0, tau=1.0))
    learner.update([1.0], +1)  # t = 0: eta = 1, first ramp: w = 0.25, rho = 0.75
    assert learner.w.tolist() == [0.25]
    # t = 1: eta = 1/2; z = 0.25 is on the first ramp [-0.25, 1.75]
    learner.update([1.0], +1)
    assert learner.w.tolist() == pytest.approx([0.25 + 0.5 * 0.25], abs=1e-15)
    assert learner.rho == pytest.approx(0.75 - 0.5 * 0.25, abs=1e-15)


def test_weights_are_read_only_snapshots() -> None:
    learner = make([1.0, 2.0], rho=2.0)
    w = learner.w
    with pytest.raises(ValueError, match="read-only"):
        w[0] = 5.0
    learner.update([1.0, 0.5], +1)
    assert w.tolist() == [1.0, 2.0]
    assert learner.w.tolist() != [1.0, 2.0]


def test_non_finite_update_is_refused_and_the_model_unchanged() -> None:
    from service.learning.errors import NonFiniteError

    learner = DRAL(n_features=2, cost=0.25, eta=1e308)
    with pytest.raises(NonFiniteError, match="update refused"):
        learner.update([1e300, 1.0], +1)
    assert learner.w.tolist() == [0.0, 0.0]
    assert learner.rho == 1.0
    assert learner.steps == 0
