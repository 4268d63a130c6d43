"""Label -> model as pure functions: equality with an offline replay, redelivery, redo
after a crash, refusals, importance-weighted risk, parking (no Kafka)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from service.config import ModelConfig, Settings
from service.learning import Pipeline, learner_for, make_learner, serving_pipeline
from service.learning.adaptive import tracking_steps
from service.learning.moments import Moments
from service.learning.preprocessing import OnlineStandardizer
from service.records import Label
from service.records.state import Deferred, Limits, ModelEnvelope, Stale, parse_parked_label
from service.records.wire import FeatureMoments
from service.stream.labels.protocol import (
    LiveModels,
    apply_label,
    park_label,
    zero_one_d_loss,
)
from service.stream.models.served import ServedModel, initial_envelope

from ..memory import CFG, pending


def _offline_learner() -> Any:
    """The model's learner with its update rule and tracking steps, built by hand."""
    rule = CFG.learner_hyperparameters
    learner = make_learner("dsal", n_features=4, cost=0.25, seed=0, **rule)
    return make_learner("dsal", n_features=4, cost=0.25, seed=0, **rule, **tracking_steps(learner))


@pytest.mark.parametrize("with_moments", [False, True])
def test_apply_label_equals_offline_replay_through_service_learning(with_moments: bool) -> None:
    rng = np.random.default_rng(7)
    xs = rng.normal(size=(30, 3)) * [1.0, 10.0, 0.1] + [0.0, 5.0, 0.0]
    others = rng.normal(size=(30, 4, 3)) * [1.0, 10.0, 0.1] + [0.0, 5.0, 0.0]  # unlabelled
    ys = [1 if x[0] > 0 else -1 for x in xs]
    state = initial_envelope("m", CFG)
    pipe = serving_pipeline(3)
    learner = _offline_learner()
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        seen = Moments(3)  # what the scorer gathered since its last request, x included
        seen.add_many(np.vstack([others[i], x]))
        moments = FeatureMoments(seen.count, tuple(seen.mean.tolist()), tuple(seen.m2.tolist()))
        entry = pending(list(map(float, x)), f"r{i}")
        if with_moments:
            entry = replace(entry, request=replace(entry.request, moments=moments))
        out = apply_label(CFG, state, entry, Label(f"r{i}", "m", y, "t", None), 10 + i, now=5.0)
        assert out.outcome == "applied"
        assert out.model is not None
        pipe.learn_label(x, seen if with_moments else None)
        learner.update(pipe.transform(x), y)
        state = out.model
        assert state.version == i + 1
        assert state.labels_offset == 10 + i
    served = ServedModel.from_envelope(CFG, state)
    np.testing.assert_allclose(served.learner.w, learner.w, rtol=1e-12, atol=1e-15)
    assert served.learner.rho == pytest.approx(learner.rho, rel=1e-12)
    assert served.learner.rho >= 0
    assert not np.allclose(learner.w, 0)
    first = Pipeline.from_state(dict(state.pipeline)).steps[0]
    assert isinstance(first, OnlineStandardizer)
    # with moments the first standardiser rests on every event scored; without it learns nothing
    assert first.count == (150 if with_moments else 0)


def test_apply_label_does_not_mutate_its_inputs() -> None:
    state = initial_envelope("m", CFG)
    entry = pending([1.0, 2.0, 3.0])
    snap_state, snap_entry = state.to_json(), entry.to_json()
    out = apply_label(CFG, state, entry, Label("r1", "m", 1, "t", None), 0, now=1.0)
    assert out.outcome == "applied"
    assert state.to_json() == snap_state  # the learner's arrays were copied, not updated
    assert entry.to_json() == snap_entry
    assert out.pending is not None
    assert out.pending.applied is True
    assert (out.pending.label, out.pending.applied_offset, out.pending.applied_version) == (1, 0, 1)


def test_redelivered_label_is_ignored_and_a_second_label_is_dead_lettered() -> None:
    state = initial_envelope("m", CFG)
    label = Label("r1", "m", 1, "t", None)
    first = apply_label(CFG, state, pending([1.0, 2.0, 3.0]), label, 5, now=1.0)
    assert first.model is not None
    assert first.pending is not None
    again = apply_label(CFG, first.model, first.pending, label, 5, now=1.0)
    assert (again.outcome, again.reason, again.model) == ("ignored", "redelivered", None)
    resent = apply_label(CFG, first.model, first.pending, label, 6, now=1.0)
    assert (resent.outcome, resent.reason) == ("dead", "already_applied")


def test_applied_mark_without_the_model_update_is_redone_once_even_past_expiry() -> None:
    # a crash after the applied mark was stored but before the model was: the label comes
    # back with the same offset and must be applied (it was in time when first applied)
    state = initial_envelope("m", CFG)
    label = Label("r1", "m", -1, "t", None)
    first = apply_label(CFG, state, pending([1.0, 2.0, 3.0]), label, 7, now=1.0)
    assert first.model is not None
    assert first.pending is not None
    late = replace(first.pending, request=replace(first.pending.request, expires_at=0.5))
    redo = apply_label(CFG, state, late, label, 7, now=2.0)
    assert redo.outcome == "applied"
    assert redo.model is not None
    assert replace(redo.model, updated_at=0.0) == replace(first.model, updated_at=0.0)
    # once the model has the update, the same offset is a redelivery and changes nothing
    again = apply_label(CFG, first.model, late, label, 7, now=2.0)
    assert (again.outcome, again.reason, again.model) == ("ignored", "redelivered", None)
    # another message answering the applied request is dead-lettered, never applied twice
    other = apply_label(CFG, state, late, label, 8, now=2.0)
    assert (other.outcome, other.reason) == ("dead", "already_applied")


@pytest.mark.parametrize(
    ("changes", "label", "reason"),
    [
        (None, Label("r1", "m", 1, "", None), "unknown_request"),
        ({"expires_at": 0.5}, Label("r1", "m", 1, "", None), "expired"),
        ({}, Label("r1", "other", 1, "", None), "unknown_request"),
    ],
)
def test_labels_that_cannot_be_joined_are_dead_lettered(
    changes: dict[str, object] | None, label: Label, reason: str
) -> None:
    entry = None if changes is None else pending([1.0, 2.0, 3.0], **changes)
    out = apply_label(CFG, initial_envelope("m", CFG), entry, label, 0, now=1.0)
    assert (out.outcome, out.reason, out.model) == ("dead", reason, None)


def test_non_finite_update_is_refused_and_changes_nothing() -> None:
    cfg = ModelConfig(
        algorithm="dsal", cost=0.25, n_features=3, standardize=False, hyperparameters={"eta": 1e300}
    )
    state = initial_envelope("m", cfg)
    out = apply_label(
        cfg, state, pending([1e308, 1e308, 1.0]), Label("r1", "m", 1, "", None), 0, now=1.0
    )
    assert (out.outcome, out.reason, out.model) == ("refused", "non_finite", None)
    assert state == initial_envelope("m", cfg)


def test_a_label_whose_version_would_not_fit_a_record_is_refused_and_changes_nothing() -> None:
    """A label whose new version would take more than its ``limits`` (the learner's state
    in its tables, or what a scorer reads of it on the models topic) is refused as
    ``oversize``, naming the sizes and the setting to raise, and the model stays as it was:
    a version no topic takes is never left for the writer to fail on. One that may not fit
    but does is encoded once (the bytes measured are the ones written); one that surely
    fits is not encoded here."""
    cfg = ModelConfig(algorithm="dsol", n_features=3000)
    state = initial_envelope("m", cfg)
    x = np.random.default_rng(0).normal(size=3000).tolist()
    label = Label("r1", "m", 1, "", None)
    free = apply_label(cfg, state, pending(x), label, 0, now=1.0)
    assert free.outcome == "applied"
    assert free.model is not None
    size, served = len(free.model.to_bytes()), len(free.model.served().to_bytes())
    assert served < size  # no challengers, nothing remembered, no normaliser sums
    big = 100 * size
    tight = apply_label(cfg, state, pending(x), label, 0, now=1.0, limits=Limits(size - 1, big))
    assert (tight.outcome, tight.reason, tight.model) == ("refused", "oversize", None)
    assert f"state of the version is {size} bytes, over the {size - 1} it may" in tight.detail
    assert "raise max_state_bytes" in tight.detail
    narrow = apply_label(cfg, state, pending(x), label, 0, now=1.0, limits=Limits(big, served - 1))
    assert (narrow.outcome, narrow.reason) == ("refused", "oversize")
    assert f"the version a scorer reads is {served} bytes, over the {served - 1}" in narrow.detail
    assert "raise max_message_bytes" in narrow.detail
    assert Settings().version_bytes == 1_000_000  # Kafka's record, max_message_bytes's default
    assert Settings(max_message_bytes=4096).version_bytes == 1_000_000  # events held smaller
    assert Settings(max_message_bytes=4_000_000).version_bytes == 4_000_000
    assert state == initial_envelope("m", cfg)
    exact = apply_label(cfg, state, pending(x), label, 0, now=1.0, limits=Limits(size, served))
    assert exact.outcome == "applied"
    assert exact.encoded == exact.encode() == free.model.to_bytes()  # measured, then kept
    assert exact.served == exact.serve() == free.model.served().to_bytes()
    roomy = apply_label(cfg, state, pending(x), label, 0, now=1.0, limits=Limits(big, big))
    assert roomy.outcome == "applied"
    assert (roomy.encoded, roomy.served) == (None, None)  # it surely fits: checked only


def test_importance_weighted_risk_accumulates_loss_over_p() -> None:
    assert zero_one_d_loss(0, 1, 0.25) == 0.25
    assert zero_one_d_loss(1, -1, 0.25) == 1.0
    assert zero_one_d_loss(-1, -1, 0.25) == 0.0
    state = initial_envelope("m", CFG)
    assert np.isnan(state.risk)
    cases = [(0, 1, 0.5), (1, -1, 0.25), (-1, -1, 1.0)]  # decided, true, p
    for i, (decided, y, p) in enumerate(cases):
        entry = pending([0.1 * i, 1.0, 2.0], f"r{i}", decided_label=decided, query_probability=p)
        out = apply_label(CFG, state, entry, Label(f"r{i}", "m", y, "", None), i, now=1.0)
        assert out.model is not None
        state = out.model
    # sum L/p = 0.25/0.5 + 1/0.25 + 0 = 4.5; sum 1/p = 2 + 4 + 1 = 7
    assert state.iw_loss == pytest.approx(4.5)
    assert state.iw_weight == pytest.approx(7.0)
    assert state.risk == pytest.approx(4.5 / 7)


def test_a_label_that_overtook_its_request_is_parked_then_applied() -> None:
    label = Label("r1", "m", -1, "ops", 2.0)
    entry = park_label(None, label, offset=7, partition=1, now=10.0, raw=b"{}")
    assert entry is not None
    assert park_label(entry, label, offset=7, partition=1, now=11.0) is None  # the same again
    assert parse_parked_label(entry.to_json()) == entry
    assert (entry.label, entry.offset, entry.partition, entry.parked_at) == (label, 7, 1, 10.0)
    # meanwhile a later label moved the watermark past 7: the parked one still applies
    state = initial_envelope("m", CFG).replace(labels_offset=9, labels_partition=0)
    out = apply_label(CFG, state, pending([1.0, 2.0, 3.0]), label, 7, now=12.0, parked=True)
    assert out.outcome == "applied"
    assert out.model is not None
    assert out.model.labels_offset == 9
    not_parked = apply_label(CFG, state, pending([1.0, 2.0, 3.0]), label, 7, now=12.0)
    assert (not_parked.outcome, not_parked.reason) == ("ignored", "redelivered")


def test_a_deferred_version_is_made_from_its_objects_until_the_next_label_takes_them() -> None:
    """``defer``: the version's states are made only when read, the same states as made at
    once; once the next label takes its objects, a state not made is lost (:class:`Stale`),
    and one whose objects are dropped unused (another version, or pushed out of the live
    models) is made first."""
    cfg, label = CFG, Label("r1", "m", 1, "", None)
    state = initial_envelope("m", cfg)
    now = apply_label(cfg, state, pending([1.0, 2.0, 3.0]), label, 0, now=1.0)
    deferred = apply_label(cfg, state, pending([1.0, 2.0, 3.0]), label, 0, now=1.0, defer=True)
    assert deferred.model is not None
    assert now.model is not None
    assert len(deferred.model.deferred) == 2
    assert deferred.encoded is None
    assert deferred.model.to_bytes() == now.model.to_bytes()  # made when read
    assert deferred.model.deferred == ()
    two = apply_label(cfg, state, pending([1.0, 2.0, 3.0]), label, 0, now=1.0, defer=True).model
    assert two is not None
    nxt = Label("r2", "m", -1, "", None)
    after = apply_label(cfg, two, pending([3.0, 1.0, 0.0], "r2"), nxt, 1, now=2.0, defer=True)
    assert after.model is not None  # it took two's objects: two's states are gone
    with pytest.raises(Stale):
        dict(two.learner)
    parts = cfg.adaptive.parts(intercept=cfg.intercept)

    def kept(live: LiveModels, name: str) -> ModelEnvelope:
        """A version of ``name`` whose deferred states ``live`` holds the objects of."""
        pipeline = Pipeline.from_state(dict(state.pipeline))
        learner = learner_for(dict(state.learner), parts)
        out = state.replace(
            model=name, pipeline=Deferred(pipeline.to_state), learner=Deferred(learner.to_state)
        )
        live.keep(out, parts, pipeline, learner)
        return out

    live = LiveModels(size=1)
    pushed = kept(live, "m")
    kept(live, "o")  # pushes ``pushed`` out: made first
    dropped = kept(live, "o")
    assert live.take(state.replace(model="o"), parts) is None  # another version: made first
    for version in (pushed, dropped):
        assert version.deferred == ()
        assert dict(version.learner) == dict(state.learner)
