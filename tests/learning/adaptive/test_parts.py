"""The learner a model serves: the wrapper by default, its parts switched by the
configuration, a plain record wrapped, the bare learner when the wrapper is off."""

from __future__ import annotations

import numpy as np
import pytest

from service.learning import DSAL, DSOL, Adaptive, KernelDSAL, Parts, StateError, learner_for
from service.learning.adaptive import is_adaptive_state, serving_learner, tracking_steps


def flipped(model: Adaptive, n: int = 600, seed: int = 0) -> Adaptive:
    """``model`` after a stream whose labels flip halfway."""
    rng = np.random.default_rng(seed)
    for t in range(n):
        x = [float(rng.normal()), 1.0]
        y = (1 if x[0] > 0 else -1) * (1 if t < n // 2 else -1)
        model.update(x, y)
    return model


def test_version_zero_is_the_wrapper_with_every_part_by_default() -> None:
    model = serving_learner("dsal", n_features=3, cost=0.25, seed=4, parts=Parts())
    assert isinstance(model, Adaptive)
    assert model.detector is not None
    assert model.collapse_window == 50
    assert model.challengers == ("mirror", "fresh", "tail")
    assert (model.explore_floor, model.after_floor, model.explore_start) == (0.5, 1.0, 10)
    assert model.seed == 4
    assert model.champion.seed == 4
    bare = serving_learner("dsal", n_features=3, cost=0.25, seed=4, parts=None)
    assert isinstance(bare, DSAL)
    assert (bare.rho_eta_max, bare.intercept_eta_min) == (None, None)
    served = bare.to_state()  # the bare learner with the tracking steps
    served["params"] |= {"rho_eta_max": 0.2, "intercept_eta_min": 1.25}
    assert model.champion.to_state() == served


def test_a_plain_record_is_wrapped_without_the_starts_exploration_once_it_has_learned() -> None:
    fresh = DSAL(n_features=2, cost=0.25)
    assert learner_for(fresh.to_state(), Parts()).exploring
    for _ in range(5):
        fresh.update([1.0, 1.0], 1)
    wrapped = learner_for(fresh.to_state(), Parts())
    assert isinstance(wrapped, Adaptive)
    assert not wrapped.exploring  # a model that serves already is not starting
    assert wrapped.champion.to_state()["learned"] == fresh.to_state()["learned"]
    assert wrapped.champion.rho_eta_max == 0.2  # it learns on with the tracking steps
    assert wrapped.decide([0.3, 1.0], coin=0.5) == fresh.decide([0.3, 1.0], coin=0.5)
    assert learner_for(fresh.to_state(), Parts(steps=False)).champion.to_state() == (
        fresh.to_state()
    )


def served(parts: Parts | None = None) -> Adaptive:
    """Version 0 of a DSAL model on two inputs (the last one an intercept)."""
    model = learner_for(DSAL(n_features=2, cost=0.25).to_state(), parts or Parts())
    assert isinstance(model, Adaptive)
    return model


def test_an_adaptive_record_round_trips_unchanged_when_its_parts_fit() -> None:
    model = flipped(served())
    assert model.changes_detected >= 1
    again = learner_for(model.to_state(), Parts())
    assert again.to_state() == model.to_state()


@pytest.mark.parametrize(
    "parts",
    [
        Parts(detector=False),
        Parts(challengers=False),
        Parts(explore=False),
        Parts(steps=False),
        Parts(False, False, False, False),
    ],
)
def test_each_part_turns_off_and_on_again(parts: Parts) -> None:
    model = flipped(served(), n=330)
    off = learner_for(model.to_state(), parts)
    assert (off.detector is not None) == parts.detector
    assert (off.collapse_window > 0) == parts.detector
    assert bool(off.challengers) == parts.challengers
    assert not parts.challengers or off.running == model.running
    assert off.running == () or parts.challengers
    assert (off.after_floor > 0) == parts.explore
    assert off.exploring is (parts.explore and model.exploring)
    assert (off.champion.rho_eta_max is not None) == parts.steps
    assert all((c.learner.rho_eta_max is not None) == parts.steps for c in off._contest.running)
    learned = off.champion.to_state()["learned"]
    assert learned == model.champion.to_state()["learned"]  # what it learned stays
    assert (off.labels, off.changes_detected) == (model.labels, model.changes_detected)
    on = learner_for(off.to_state(), Parts())
    assert on.detector is not None
    assert on.challengers
    assert on.after_floor == 1.0
    assert on.champion.to_state() == model.champion.to_state()


def test_the_tracking_steps_bound_rho_and_floor_the_intercept() -> None:
    rng = np.random.default_rng(3)
    X = np.c_[rng.normal(size=(600, 2)), np.ones(600)]
    y = np.where(X[:, 0] + X[:, 1] > 0.5, 1, -1)
    plain, tracked = DSAL(n_features=3, cost=0.25), served_model(3)
    moves, free = [], []
    for x, label in zip(X, y, strict=True):
        before = (tracked.rho, plain.rho)
        plain.update(x, int(label))
        tracked.champion.update(x, int(label))
        moves.append(abs(tracked.rho - before[0]))
        free.append(abs(plain.rho - before[1]))
    assert max(moves) <= 0.1  # one label moves rho by less than 0.2 x gamma / 2
    assert max(free) > 0.2  # at the default step (1.25 here) by more
    assert not np.array_equal(plain.w, tracked.champion.w)
    # after 600 labels the step is eta_0 / 1.6; the intercept's is still eta_0
    champion = tracked.champion
    w0, x = champion.w.copy(), np.array([0.2, -0.1, 1.0])
    dz, _ = champion._gradient(float(w0 @ x), champion.rho)  # label +1: z = f
    champion.update(x, 1)
    eta0 = champion.eta(0)
    np.testing.assert_allclose(champion.w - w0, -dz * np.array([eta0 / 1.6] * 2 + [eta0]) * x)
    assert tracking_steps(DSOL(n_features=3, cost=0.25)) == {
        "rho_eta_max": 0.2,
        "intercept_eta_min": 1.25,
    }
    assert tracking_steps(KernelDSAL(n_features=3, cost=0.25)) == {}
    narrow = serving_learner("dsal", n_features=3, cost=0.25, seed=0, parts=Parts(intercept=False))
    assert (narrow.champion.rho_eta_max, narrow.champion.intercept_eta_min) == (0.2, None)
    dral = serving_learner("dral", n_features=3, cost=0.25, seed=0, parts=Parts())
    assert dral.champion.rho_eta_max is None


def served_model(n: int) -> Adaptive:
    model = serving_learner("dsal", n_features=n, cost=0.25, seed=0, parts=Parts())
    assert isinstance(model, Adaptive)
    return model


def test_without_detection_a_flip_is_never_noticed_and_with_it_it_is() -> None:
    quiet = flipped(learner_for(DSAL(n_features=2, cost=0.25).to_state(), Parts(detector=False)))
    assert (quiet.changes_detected, quiet.takeovers) == (0, 0)
    loud = flipped(learner_for(DSAL(n_features=2, cost=0.25).to_state(), Parts()))
    assert loud.changes_detected >= 1
    assert loud.takeovers >= 1


def test_without_the_wrapper_a_model_serves_its_champion() -> None:
    model = flipped(Adaptive(DSAL(n_features=2, cost=0.25)))
    bare = learner_for(model.to_state(), None)
    assert isinstance(bare, DSAL)
    assert bare.to_state() == model.champion.to_state()
    assert not is_adaptive_state(bare.to_state())
    assert is_adaptive_state(model.to_state())


def test_a_kernel_learner_is_wrapped_too() -> None:
    model = serving_learner("kernel-dsal", n_features=2, cost=0.25, seed=0, parts=Parts())
    assert isinstance(model, Adaptive)
    assert isinstance(model.champion, KernelDSAL)
    assert learner_for(model.to_state(), Parts()).to_state() == model.to_state()


def test_a_record_it_cannot_read_is_a_state_error() -> None:
    model = Adaptive(DSAL(n_features=2, cost=0.25)).to_state()
    with pytest.raises(StateError):
        learner_for({**model, "champion": {"format": "nonsense"}}, Parts())
    with pytest.raises(StateError):
        learner_for({**model, "version": 99}, None)


def test_the_weight_cap_of_a_label_is_the_one_given() -> None:
    capped = Adaptive(DSAL(n_features=2, cost=0.25), detector=None, explore_floor=0.0)
    loose = Adaptive(DSAL(n_features=2, cost=0.25), detector=None, explore_floor=0.0)
    capped.update([1.0, 1.0], -1, query_probability=0.001, max_weight=100.0)
    loose.update([1.0, 1.0], -1, query_probability=0.001, max_weight=1000.0)
    assert capped.risk_since_change.weight == pytest.approx(100.0)
    assert loose.risk_since_change.weight == pytest.approx(1000.0)
    assert capped.risk_since_change.max_weight == 100.0


def test_a_record_from_before_the_tail_challenger_gets_it_for_the_next_change() -> None:
    model = served()
    record = model.to_state()
    record["params"]["challengers"] = ["mirror", "fresh"]  # as written before
    again = learner_for(record, Parts())
    assert again.challengers == ("mirror", "fresh", "tail")
    assert learner_for(record, Parts(challengers=False)).challengers == ()
    for bad in ("mirror", ["mirror", "mirror"], ["mirror", "ghost"], [{"kind": "fresh"}]):
        record["params"]["challengers"] = bad  # not an older record: its reader judges it
        with pytest.raises(StateError, match="challengers"):
            learner_for(record, Parts())
