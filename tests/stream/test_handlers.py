"""Scoring and learning handlers, without Kafka: determinism, dead letters, and equality
with an offline replay through service.learning."""

from __future__ import annotations

import copy

import numpy as np
import orjson
import pytest

from service.config import ModelConfig, Settings
from service.learning import Intercept, OnlineStandardizer, Pipeline, make_learner
from service.stream.handlers import (
    RawMessage,
    ServedModel,
    apply_label,
    coin,
    initial_state,
    park_label,
    request_id,
    risk_estimate,
    score_batch,
    store_request,
    sweep_expired,
    sweep_orphans,
    unpark_label,
    zero_one_d_loss,
)
from service.stream.records import Label, LabelRequest, parse_label_request

CFG = ModelConfig(algorithm="dsal", cost=0.25, n_features=3, audit_rate=0.05)


def _msg(value: object, offset: int = 0) -> RawMessage:
    raw = value if isinstance(value, bytes) else orjson.dumps(value)
    return RawMessage(raw, "features", 0, offset)


def _models(**configs: ModelConfig) -> dict[str, ServedModel]:
    return {name: ServedModel.initial(name, cfg) for name, cfg in configs.items()}


def _score(models: dict[str, ServedModel], msgs: list[RawMessage], now: float = 100.0):  # type: ignore[no-untyped-def]
    return score_batch(models, msgs, default_model="m", request_ttl=60.0, now=now)


def _trained(cfg: ModelConfig, n: int, seed: int = 1) -> ServedModel:
    """A model moved away from w = 0 by ``n`` labels, so scores and p vary."""
    rng = np.random.default_rng(seed)
    state = initial_state("m", cfg)
    for i in range(n):
        x = rng.normal(size=cfg.n_inputs)
        y = 1 if x[0] + 0.3 * x[1] > 0 else -1
        pending = _pending([float(v) for v in x], request_id("m", f"t{i}"))
        out = apply_label(
            cfg, state, pending, Label(pending["request_id"], "m", y, "t", None), i, now=1.0
        )
        assert out.state is not None
        state = out.state
    return ServedModel.from_state("m", cfg, state)


def _pending(features: list[float], rid: str = "r1", **kw: object) -> dict[str, object]:
    req = LabelRequest(
        request_id=rid,
        event_id="e",
        model="m",
        features=features,
        score=0.0,
        rho=1.0,
        decided_label=0,
        query_probability=0.5,
        model_version=0,
        requested_at=0.0,
        expires_at=1e9,
        priority=0.5,
    )
    entry = store_request(None, req, 0)
    assert entry is not None
    entry.update(kw)
    return entry


def test_request_id_and_coins_are_deterministic_hashes() -> None:
    assert request_id("m", "e1") == request_id("m", "e1")
    assert request_id("m", "e1") != request_id("n", "e1")
    coins = np.array([coin("m", str(i), 0) for i in range(4000)])
    assert ((coins >= 0) & (coins < 1)).all()
    assert abs(coins.mean() - 0.5) < 0.02  # uniform: mean 1/2, sd of mean ~0.0046
    assert abs((coins < 0.3).mean() - 0.3) < 0.03
    assert coin("m", "1", 0) != coin("m", "1", 1)  # a new version draws a new coin
    assert coin("m", "1", 0) != coin("m", "1", 0, "audit")  # independent audit coin


def test_one_decision_per_valid_event_in_order_with_dead_letters_for_the_rest() -> None:
    models = _models(m=CFG)
    msgs = [
        _msg({"id": "a", "features": [1, 2, 3]}, 0),
        _msg(b"{", 1),
        _msg({"id": "b", "features": [1, 2]}, 2),
        _msg({"id": "c", "model": "zzz", "features": [1, 2, 3]}, 3),
        _msg(b'{"id": "d", "features": [1, NaN, 3]}', 4),
        _msg({"id": "e", "features": [0, 0, 1]}, 5),
        _msg({"features": [0, 0, 1]}, 6),
    ]
    out = _score(models, msgs)
    assert [d.id for d in out.decisions] == ["a", "e"]
    assert [(d.offset, d.reason) for d in out.dead_letters] == [
        (1, "not_json"),
        (2, "feature_count"),
        (3, "unknown_model"),
        (4, "non_finite"),
        (6, "schema"),
    ]
    assert all(d.source == "features" for d in out.dead_letters)


def test_decisions_match_the_learner_and_coins_event_by_event() -> None:
    served = _trained(CFG, 40)
    events = [{"id": f"e{i}", "features": [float(i % 7) - 3, 1.5, -0.5 * i]} for i in range(60)]
    out = _score({"m": served}, [_msg(e, i) for i, e in enumerate(events)])
    assert len(out.decisions) == 60
    requested = {r.event_id: r for r in out.label_requests}
    for ev, d in zip(events, out.decisions, strict=True):
        z = served.pipeline.transform(np.array(ev["features"], dtype=float))
        ref = served.learner.decide(z, coin=coin("m", ev["id"], served.version))
        audited = coin("m", ev["id"], served.version, "audit") < CFG.audit_rate
        assert d.score == pytest.approx(ref.score)
        assert d.label == (None if ref.label == 0 else ref.label)
        assert d.action == ("reject" if ref.label == 0 else "predict")
        assert d.queried == (ref.query or audited)
        p, a = ref.query_probability, CFG.audit_rate
        assert d.query_probability == pytest.approx(1 - (1 - p) * (1 - a))
        assert d.model_version == served.version == 40
        assert (ev["id"] in requested) == d.queried
    assert 0 < len(out.label_requests) < 60


def test_batching_never_changes_a_decision() -> None:
    served = {"m": _trained(CFG, 25)}
    msgs = [_msg({"id": f"e{i}", "features": [i * 0.3, -1.0, 2.0 - i * 0.1]}, i) for i in range(30)]
    whole = _score(served, msgs)
    single = [d for m in msgs for d in _score(served, [m]).decisions]
    assert len(whole.decisions) == len(single) == 30
    for a, b in zip(whole.decisions, single, strict=True):
        # same choice; the score may differ in the last bit (matrix product vs dot product)
        assert (a.id, a.action, a.label, a.queried, a.model_version) == (
            b.id,
            b.action,
            b.label,
            b.queried,
            b.model_version,
        )
        assert a.score == pytest.approx(b.score, rel=1e-12, abs=1e-12)
        assert a.query_probability == pytest.approx(b.query_probability, rel=1e-12)


def test_label_request_carries_raw_features_and_round_trips() -> None:
    served = {
        "m": _trained(ModelConfig(algorithm="dral", cost=0.2, n_features=3, audit_rate=0.99), 10)
    }
    out = _score(served, [_msg({"id": "x", "features": [5, -2, 0.5]})], now=50.0)
    (req,) = out.label_requests
    assert req.features == [5.0, -2.0, 0.5]
    assert req.request_id == request_id("m", "x")
    assert (req.requested_at, req.expires_at) == (50.0, 110.0)
    assert req.decided_label in (-1, 0, 1)
    assert 0 < req.priority <= 1
    assert parse_label_request(req.to_json()) == req


def test_named_features_are_put_in_configured_order() -> None:
    cfg = ModelConfig(algorithm="dsal", cost=0.25, feature_names=["a", "b", "c"], audit_rate=0)
    models = {"m": _trained(cfg, 10)}
    named = _score(models, [_msg({"id": "1", "features": {"c": 3, "a": 1, "b": 2}})])
    listed = _score(models, [_msg({"id": "1", "features": [1, 2, 3]})])
    assert named.decisions[0].score == listed.decisions[0].score
    missing = _score(models, [_msg({"id": "1", "features": {"a": 1, "b": 2}})])
    assert missing.dead_letters[0].reason == "feature_count"


def test_apply_label_equals_offline_replay_through_service_learning() -> None:
    rng = np.random.default_rng(7)
    xs = rng.normal(size=(30, 3)) * [1.0, 10.0, 0.1] + [0.0, 5.0, 0.0]
    ys = [1 if x[0] > 0 else -1 for x in xs]
    state = initial_state("m", CFG)
    pipe = Pipeline([OnlineStandardizer(3), Intercept()])
    learner = make_learner("dsal", n_features=4, cost=0.25, seed=0)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        out = apply_label(
            CFG,
            state,
            _pending(list(map(float, x)), f"r{i}"),
            Label(f"r{i}", "m", y, "t", None),
            10 + i,
            now=5.0,
        )
        assert out.kind == "applied"
        assert out.state is not None
        pipe.learn(x)
        learner.update(pipe.transform(x), y)
        state = out.state
        assert state["version"] == i + 1
        assert state["labels_offset"] == 10 + i
    served = ServedModel.from_state("m", CFG, state)
    np.testing.assert_allclose(served.learner.w, learner.w, rtol=1e-12, atol=1e-15)
    assert served.learner.rho == pytest.approx(learner.rho, rel=1e-12)
    assert served.learner.rho >= 0
    assert not np.allclose(learner.w, 0)


def test_apply_label_does_not_mutate_its_inputs() -> None:
    state = initial_state("m", CFG)
    pending = _pending([1.0, 2.0, 3.0])
    snap_state, snap_pending = copy.deepcopy(state), dict(pending)
    out = apply_label(CFG, state, pending, Label("r1", "m", 1, "t", None), 0, now=1.0)
    assert out.kind == "applied"
    assert state == snap_state
    assert pending == snap_pending
    assert out.pending is not None
    assert out.pending["applied"] is True


def test_redelivered_label_is_ignored_and_a_second_label_is_dead_lettered() -> None:
    state = initial_state("m", CFG)
    label = Label("r1", "m", 1, "t", None)
    first = apply_label(CFG, state, _pending([1.0, 2.0, 3.0]), label, 5, now=1.0)
    assert first.state is not None
    assert first.pending is not None
    again = apply_label(CFG, first.state, first.pending, label, 5, now=1.0)
    assert (again.kind, again.reason, again.state) == ("ignored", "redelivered", None)
    resent = apply_label(CFG, first.state, first.pending, label, 6, now=1.0)
    assert (resent.kind, resent.reason) == ("dead", "already_applied")


def test_applied_mark_without_the_model_update_is_redone_once_even_past_expiry() -> None:
    # a crash after the applied mark was stored but before the model was: the label comes
    # back with the same offset and must be applied (it was in time when first applied)
    state = initial_state("m", CFG)
    label = Label("r1", "m", -1, "t", None)
    first = apply_label(CFG, state, _pending([1.0, 2.0, 3.0]), label, 7, now=1.0)
    assert first.state is not None
    assert first.pending is not None
    late = dict(first.pending, expires_at=0.5)
    redo = apply_label(CFG, state, late, label, 7, now=2.0)
    assert redo.kind == "applied"
    assert redo.state is not None
    same = {k: v for k, v in redo.state.items() if k != "updated_at"}
    assert same == {k: v for k, v in first.state.items() if k != "updated_at"}
    # once the model has the update, the same offset is a redelivery and changes nothing
    again = apply_label(CFG, first.state, late, label, 7, now=2.0)
    assert (again.kind, again.reason, again.state) == ("ignored", "redelivered", None)
    # another message answering the applied request is dead-lettered, never applied twice
    other = apply_label(CFG, state, late, label, 8, now=2.0)
    assert (other.kind, other.reason) == ("dead", "already_applied")


@pytest.mark.parametrize(
    ("pending", "label", "reason"),
    [
        (None, Label("r1", "m", 1, "", None), "unknown_request"),
        ({"expires_at": 0.5}, Label("r1", "m", 1, "", None), "expired"),
        ({}, Label("r1", "other", 1, "", None), "unknown_request"),
    ],
)
def test_labels_that_cannot_be_joined_are_dead_lettered(
    pending: dict[str, object] | None, label: Label, reason: str
) -> None:
    entry = None if pending is None else _pending([1.0, 2.0, 3.0], **pending)
    out = apply_label(CFG, initial_state("m", CFG), entry, label, 0, now=1.0)
    assert (out.kind, out.reason, out.state) == ("dead", reason, None)


def test_non_finite_update_is_refused_and_changes_nothing() -> None:
    cfg = ModelConfig(
        algorithm="dsal", cost=0.25, n_features=3, standardize=False, hyperparameters={"eta": 1e300}
    )
    state = initial_state("m", cfg)
    out = apply_label(
        cfg, state, _pending([1e308, 1e308, 1.0]), Label("r1", "m", 1, "", None), 0, now=1.0
    )
    assert (out.kind, out.reason, out.state) == ("refused", "non_finite", None)
    assert state == initial_state("m", cfg)


def test_importance_weighted_risk_accumulates_loss_over_p() -> None:
    assert zero_one_d_loss(0, 1, 0.25) == 0.25
    assert zero_one_d_loss(1, -1, 0.25) == 1.0
    assert zero_one_d_loss(-1, -1, 0.25) == 0.0
    state = initial_state("m", CFG)
    assert np.isnan(risk_estimate(state))
    cases = [(0, 1, 0.5), (1, -1, 0.25), (-1, -1, 1.0)]  # decided, true, p
    for i, (decided, y, p) in enumerate(cases):
        entry = _pending([0.1 * i, 1.0, 2.0], f"r{i}", decided_label=decided, query_probability=p)
        out = apply_label(CFG, state, entry, Label(f"r{i}", "m", y, "", None), i, now=1.0)
        assert out.state is not None
        state = out.state
    # sum L/p = 0.25/0.5 + 1/0.25 + 0 = 4.5; sum 1/p = 2 + 4 + 1 = 7
    assert state["iw_loss"] == pytest.approx(4.5)
    assert state["iw_weight"] == pytest.approx(7.0)
    assert risk_estimate(state) == pytest.approx(4.5 / 7)


def test_store_request_keeps_an_existing_entry() -> None:
    first = _pending([1.0, 2.0, 3.0])
    req = parse_label_request(
        orjson.dumps({k: v for k, v in first.items() if k not in {"partition", "applied"}})
    )
    assert store_request(first, req, 0) is None
    assert store_request(None, req, 1) == {**first, "partition": 1}


def test_sweep_drops_expired_entries_of_the_partition_only() -> None:
    entries = [
        ("a", _pending([0.0] * 3, "a", expires_at=10.0)),
        ("b", _pending([0.0] * 3, "b", expires_at=10.0, applied=True)),
        ("c", _pending([0.0] * 3, "c", expires_at=30.0)),
        ("d", _pending([0.0] * 3, "d", expires_at=10.0, partition=1)),
    ]
    drop, unanswered = sweep_expired(entries, partition=0, now=20.0)
    assert drop == ["a", "b"]
    assert unanswered == ["m"]
    assert sweep_expired(entries, partition=0, now=20.0, grace=15.0) == ([], [])


def test_every_algorithm_scores_and_learns_from_its_initial_state() -> None:
    settings = Settings()
    for algo in ("dral", "dsal", "dsol"):
        cfg = ModelConfig(algorithm=algo, cost=0.2, n_features=3)
        served = ServedModel.initial("m", cfg)
        assert served.version == 0
        out = _score({"m": served}, [_msg({"id": "a", "features": [1, 2, 3]})])
        assert len(out.decisions) == 1
    assert settings.models["default"].n_inputs == 68


def test_a_label_that_overtook_its_request_is_parked_then_applied() -> None:
    label = Label("r1", "m", -1, "ops", 2.0)
    entry = park_label(None, label, 7, 1, now=10.0)
    assert entry is not None
    assert park_label(entry, label, 7, 1, now=11.0) is None  # the same message again
    assert unpark_label(entry) == (label, 7)
    # meanwhile a later label moved the watermark past 7: the parked one still applies
    state = {**initial_state("m", CFG), "labels_offset": 9}
    out = apply_label(CFG, state, _pending([1.0, 2.0, 3.0]), label, 7, now=12.0, parked=True)
    assert out.kind == "applied"
    assert out.state is not None
    assert out.state["labels_offset"] == 9
    not_parked = apply_label(CFG, state, _pending([1.0, 2.0, 3.0]), label, 7, now=12.0)
    assert (not_parked.kind, not_parked.reason) == ("ignored", "redelivered")


def test_orphans_are_swept_after_their_wait_on_their_partition_only() -> None:
    entries = [
        ("a", {"partition": 0, "parked_at": 0.0}),
        ("b", {"partition": 0, "parked_at": 9.0}),
        ("c", {"partition": 1, "parked_at": 0.0}),
    ]
    assert sweep_orphans(entries, partition=0, now=10.0, wait=5.0) == ["a"]


@pytest.mark.parametrize("algo", ["kernel-dral", "kernel-dsal", "kernel-dsol"])
def test_kernel_model_scores_requests_labels_and_learns_like_an_offline_replay(
    algo: str,
) -> None:
    cfg = ModelConfig(algorithm=algo, cost=0.25, n_features=3, audit_rate=0.2)
    state = initial_state("m", cfg)
    rng = np.random.default_rng(4)
    events = [{"id": f"k{i}", "features": rng.normal(size=3).round(3).tolist()} for i in range(40)]
    out = _score({"m": ServedModel.from_state("m", cfg, state)}, [_msg(e) for e in events])
    assert len(out.decisions) == 40
    assert {d.action for d in out.decisions} == {"reject"}  # f = 0 at the start: inside rho
    assert out.label_requests, "an untrained model must ask for labels"
    pipe = Pipeline([OnlineStandardizer(3), Intercept()])
    offline = make_learner(algo, n_features=4, cost=0.25, seed=0)
    for offset, req in enumerate(out.label_requests):
        y = 1 if req.features[0] - req.features[1] > 0 else -1
        entry = store_request(None, req, 0)
        outcome = apply_label(
            cfg, state, entry, Label(req.request_id, "m", y, "t", None), offset, now=101.0
        )
        assert outcome.kind == "applied", outcome
        assert outcome.state is not None
        assert outcome.encoded is not None
        # the wire form (orjson) is the state itself, 128-bit generator words included
        assert orjson.loads(outcome.encoded) == outcome.state
        state = orjson.loads(outcome.encoded)
        x = np.array(req.features)
        pipe.learn(x)
        offline.update(pipe.transform(x), y)
    assert state["version"] == len(out.label_requests)
    served = ServedModel.from_state("m", cfg, state)
    assert served.learner.steps == offline.steps > 0
    probe = rng.normal(size=(10, 3))
    z = pipe.transform_many(probe)
    assert served.learner.decide_many(z)[1].tolist() == offline.decide_many(z)[1].tolist()
    rescored = _score({"m": served}, [_msg(e) for e in events])
    assert [d.model_version for d in rescored.decisions] == [state["version"]] * 40


def test_finite_event_whose_score_overflows_is_refused_as_non_finite_alone() -> None:
    cfg = ModelConfig(
        algorithm="dsal", cost=0.25, n_features=3, standardize=False,
        hyperparameters={"w": [1.0, 1.0, 1.0, 0.0]},
    )  # fmt: skip
    models = _models(m=cfg)
    good = {"id": "ok", "features": [0.5, -0.2, 0.1]}
    huge = {"id": "big", "features": [1.7e308, 1.7e308, 1.7e308]}  # w.x = 5.1e308 = inf
    out = _score(models, [_msg(good, 0), _msg(huge, 1), _msg(good | {"id": "ok2"}, 2)])
    assert [d.id for d in out.decisions] == ["ok", "ok2"]
    assert [(d.offset, d.reason) for d in out.dead_letters] == [(1, "non_finite")]
    alone = _score(models, [_msg(good, 0)])
    assert alone.decisions[0].score == out.decisions[0].score == pytest.approx(0.4)
