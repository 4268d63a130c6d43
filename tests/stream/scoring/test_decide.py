"""Scoring as a pure function: determinism, dead letters, batching, equality with the
learner event by event (no Kafka)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.config import ModelConfig, Settings
from service.learning import make_learner, serving_pipeline
from service.records import (
    BadMessage,
    DeadLetter,
    Label,
    PendingEntry,
    RawMessage,
    coin,
    parse_label_request,
    parse_model_envelope,
    request_id,
)
from service.stream.labels.admission import inputs_of
from service.stream.labels.protocol import apply_label
from service.stream.models.served import ServedModel, initial_envelope
from service.stream.scoring.batch import Shown
from service.stream.scoring.decide import Limits, ScoreResult, _parse_all, parse_event, score_batch

from ..memory import CFG, msg, trained


def models_(**configs: ModelConfig) -> dict[str, ServedModel]:
    return {name: ServedModel.initial(name, cfg) for name, cfg in configs.items()}


def score(
    models: dict[str, ServedModel], msgs: list[RawMessage], now: float = 100.0
) -> ScoreResult:
    return score_batch(models, msgs, limits=Limits(default_model="m", request_ttl=60.0), now=now)


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
    models = models_(m=CFG)
    msgs = [
        msg({"id": "a", "features": [1, 2, 3]}, 0),
        msg(b"{", 1),
        msg({"id": "b", "features": [1, 2]}, 2),
        msg({"id": "c", "model": "zzz", "features": [1, 2, 3]}, 3),
        msg(b'{"id": "d", "features": [1, NaN, 3]}', 4),
        msg({"id": "e", "features": [0, 0, 1]}, 5),
        msg({"features": [0, 0, 1]}, 6),
    ]
    out = score(models, msgs)
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
    served = trained(CFG, 40)
    events = [{"id": f"e{i}", "features": [float(i % 7) - 3, 1.5, -0.5 * i]} for i in range(60)]
    out = score({"m": served}, [msg(e, i) for i, e in enumerate(events)])
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
    served = {"m": trained(CFG, 25)}
    msgs = [msg({"id": f"e{i}", "features": [i * 0.3, -1.0, 2.0 - i * 0.1]}, i) for i in range(30)]
    whole = score(served, msgs)
    single = [d for m in msgs for d in score(served, [m]).decisions]
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
        "m": trained(ModelConfig(algorithm="dral", cost=0.2, n_features=3, audit_rate=0.99), 10)
    }
    out = score(served, [msg({"id": "x", "features": [5, -2, 0.5]})], now=50.0)
    (req,) = out.label_requests
    assert req.features == [5.0, -2.0, 0.5]
    assert req.request_id == request_id("m", "x")
    assert (req.requested_at, req.expires_at) == (50.0, 110.0)
    assert req.decided_label in (-1, 0, 1)
    assert 0 < req.priority <= 1
    assert parse_label_request(req.to_json()) == req


def test_named_features_are_put_in_configured_order() -> None:
    cfg = ModelConfig(algorithm="dsal", cost=0.25, feature_names=["a", "b", "c"], audit_rate=0)
    models = {"m": trained(cfg, 10)}
    named = score(models, [msg({"id": "1", "features": {"c": 3, "a": 1, "b": 2}})])
    listed = score(models, [msg({"id": "1", "features": [1, 2, 3]})])
    assert named.decisions[0].score == listed.decisions[0].score
    missing = score(models, [msg({"id": "1", "features": {"a": 1, "b": 2}})])
    assert missing.dead_letters[0].reason == "feature_count"


def test_every_algorithm_scores_and_learns_from_its_initial_state() -> None:
    settings = Settings()
    for algo in ("dral", "dsal", "dsol"):
        cfg = ModelConfig(algorithm=algo, cost=0.2, n_features=3)
        served = ServedModel.initial("m", cfg)
        assert served.version == 0
        out = score({"m": served}, [msg({"id": "a", "features": [1, 2, 3]})])
        assert len(out.decisions) == 1
    assert settings.models["default"].n_inputs == 68


@pytest.mark.parametrize("algo", ["kernel-dral", "kernel-dsal", "kernel-dsol"])
def test_kernel_model_scores_requests_labels_and_learns_like_an_offline_replay(
    algo: str,
) -> None:
    cfg = ModelConfig(algorithm=algo, cost=0.25, n_features=3, audit_rate=0.2)
    state = initial_envelope("m", cfg)
    rng = np.random.default_rng(4)
    events = [{"id": f"k{i}", "features": rng.normal(size=3).round(3).tolist()} for i in range(40)]
    out = score({"m": ServedModel.from_envelope(cfg, state)}, [msg(e) for e in events])
    assert len(out.decisions) == 40
    assert {d.action for d in out.decisions} == {"reject"}  # f = 0 at the start: inside rho
    assert out.label_requests, "an untrained model must ask for labels"
    pipe = serving_pipeline(3)  # the requests carry no moments (the Scorer attaches them)
    offline = make_learner(algo, n_features=4, cost=0.25, seed=0)
    for offset, req in enumerate(out.label_requests):
        y = 1 if req.features[0] - req.features[1] > 0 else -1
        entry = PendingEntry(req, 0)
        outcome = apply_label(
            cfg, state, entry, Label(req.request_id, "m", y, "t", None), offset, now=101.0
        )
        assert outcome.outcome == "applied", outcome
        assert outcome.model is not None
        # the wire form is the state itself, 128-bit generator words included
        assert parse_model_envelope(outcome.encode(), model="m") == outcome.model
        state = parse_model_envelope(outcome.encode(), model="m")
        x = np.array(req.features)
        pipe.learn_label(x, None)  # as the label path learns a request without moments
        offline.update(pipe.transform(x), y)
    assert state.version == len(out.label_requests)
    served = ServedModel.from_envelope(cfg, state)
    assert served.learner.steps == offline.steps > 0
    probe = rng.normal(size=(10, 3))
    z = pipe.transform_many(probe)
    assert served.learner.decide_many(z)[1].tolist() == offline.decide_many(z)[1].tolist()
    rescored = score({"m": served}, [msg(e) for e in events])
    assert [d.model_version for d in rescored.decisions] == [state.version] * 40


def test_finite_event_whose_score_overflows_is_refused_as_non_finite_alone() -> None:
    cfg = ModelConfig(
        algorithm="dsal",
        cost=0.25,
        n_features=3,
        standardize=False,
        hyperparameters={"w": [1.0, 1.0, 1.0, 0.0]},
    )
    models = models_(m=cfg)
    good = {"id": "ok", "features": [0.5, -0.2, 0.1]}
    huge = {"id": "big", "features": [1.7e308, 1.7e308, 1.7e308]}  # w.x = 5.1e308 = inf
    out = score(models, [msg(good, 0), msg(huge, 1), msg(good | {"id": "ok2"}, 2)])
    assert [d.id for d in out.decisions] == ["ok", "ok2"]
    assert [(d.offset, d.reason) for d in out.dead_letters] == [(1, "non_finite")]
    alone = score(models, [msg(good, 0)])
    assert alone.decisions[0].score == out.decisions[0].score == pytest.approx(0.4)


# -- the batch parse is the per-event parse, faster -------------------------------------------

_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**1100), max_value=2**1100),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)


def _event() -> st.SearchStrategy[bytes]:
    good = st.lists(st.floats(-1e6, 1e6), min_size=3, max_size=3)
    odd = st.lists(_VALUES, min_size=0, max_size=4)
    record = st.fixed_dictionaries(
        {"id": st.one_of(st.text(min_size=0, max_size=4), st.integers(0, 9), st.none())},
        optional={
            "features": st.one_of(
                good,
                good,
                odd,
                st.dictionaries(st.text(max_size=2), _VALUES),
                st.fixed_dictionaries({}, optional={"a": _VALUES, "c": _VALUES}),
            ),
            "model": st.sampled_from(["m", "w", "s", "f", "nope", 3]),
            "ts": _VALUES,
        },
    )
    raw = st.sampled_from([b"", b"{", b"[1, 2]", b'{"id": "x", "features": [1e999, 0, 0]}'])
    return st.one_of(record.map(lambda r: json.dumps(r).encode()), raw)


@settings(max_examples=150, deadline=None)
@given(st.lists(_event(), max_size=12))
def test_the_batch_parse_gives_what_parsing_each_event_alone_gives(raws: list[bytes]) -> None:
    shadow = ModelConfig(algorithm="dral", cost=0.25, n_features=3, champion="m")
    # f declares fields and takes 3 inputs (a number and 2 buckets): a list of 3 is refused
    declared = ModelConfig(fields={"hash_bits": 1, "fields": {"a": "number", "c": "category"}})
    assert declared.n_inputs == 3
    w = ModelConfig(algorithm="dral", cost=0.2, n_features=2)
    models = models_(m=CFG, w=w, s=shadow, f=declared)
    limits = Limits(default_model="m", request_ttl=60.0, max_bytes=120, max_features=3)
    messages = [msg(raw, i, partition=i % 2) for i, raw in enumerate(raws)]
    dead: list[DeadLetter] = []
    batch = _parse_all(messages, models, limits, dead)
    alone, refused = [], []
    for m in messages:
        try:
            alone.append(parse_event(m, models, limits))
        except BadMessage as bad:
            refused.append((m.offset, bad.reason, bad.detail))
    assert [(p.message.offset, p.event.id, p.event.model, p.model.name) for p in batch] == [
        (p.message.offset, p.event.id, p.event.model, p.model.name) for p in alone
    ]
    for a, b in zip(batch, alone, strict=True):
        np.testing.assert_array_equal(a.x, b.x)
        assert a.event.ts == b.event.ts
    assert [(d.offset, d.reason, d.detail) for d in dead] == refused


def test_a_list_sent_to_a_model_that_declares_fields_is_refused_in_a_batch_as_alone() -> None:
    # a list as long as the declared model's inputs once passed the batch's common shape
    declared = ModelConfig(fields={"hash_bits": 1, "fields": {"a": "number", "c": "category"}})
    models = models_(m=CFG, f=declared)
    as_list = {"id": "e1", "model": "f", "features": [1.0] * declared.n_inputs}
    as_fields = {"id": "e2", "model": "f", "features": {"a": 2.5, "c": "SE"}}
    out = score(models, [msg(as_list, 0), msg(as_fields, 1)])
    assert [d.id for d in out.decisions] == ["e2"]
    ((offset, reason, detail),) = [(d.offset, d.reason, d.detail) for d in out.dead_letters]
    assert (offset, reason) == (0, "schema")
    assert "declares fields; send them as an object" in detail


def test_what_a_person_is_shown_is_made_for_the_rows_read_and_is_what_the_model_shows() -> None:
    declared = ModelConfig(fields={"hash_bits": 2, "fields": {"a": "number", "c": "category"}})
    models = models_(f=declared)
    limits = Limits(default_model="f", request_ttl=60.0)
    events = [
        parse_event(msg({"id": f"e{i}", "features": {"a": i, "c": f"c{i}"}}, i), models, limits)
        for i in range(4)
    ]
    shown = Shown(events)
    assert Shown.any_of(events)
    assert not Shown.any_of([])
    assert not shown._made  # nothing made until read
    assert shown[2] == {"a": 2.0, "c": "c2"} == models["f"].shown(events[2].event)
    assert list(shown._made) == [2]
    assert shown[-1] == {"a": 3.0, "c": "c3"}
    assert shown[1:3] == [{"a": 1.0, "c": "c1"}, {"a": 2.0, "c": "c2"}]
    with pytest.raises(IndexError):
        shown[4]


def test_a_declared_models_requests_carry_the_fields_the_learner_encodes_as_scored() -> None:
    declared = ModelConfig(
        algorithm="dsol",
        fields={"hash_bits": 9, "fields": {"a": "number", "t": "tokens", "z": "ignore"}},
    )
    models = models_(f=declared)
    limits = Limits(default_model="f", request_ttl=60.0)
    events = [
        {"id": f"e{i}", "features": {"a": -0.0 if i else 2.0, "t": f"x{i} y", "z": [1] * 50}}
        for i in range(3)
    ]
    messages = [msg(e, i) for i, e in enumerate(events)]
    out = score_batch(models, messages, limits=limits, now=1.0)
    requests = out.label_requests
    assert len(requests) == 3  # DSOL asks about every event
    for m, request in zip(messages, requests, strict=True):
        assert request.features is None  # the fields alone: the learner encodes them
        assert request.fields is not None
        assert set(request.fields) == {"a", "t"}  # what the model reads
        scored = models["f"].raw_vector(parse_event(m, models, limits).event)
        learned = inputs_of(request, declared)
        assert learned.tolist() == scored.tolist()
        assert np.signbit(learned).tolist() == np.signbit(scored).tolist()
        assert parse_label_request(request.to_json()) == request
        assert b'"features":null' in request.to_json()


def test_a_declared_models_events_are_scored_without_a_row_of_its_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared = ModelConfig(
        algorithm="dsal", fields={"hash_bits": 12, "fields": {"a": "number", "t": "tokens"}}
    )
    models = models_(f=declared)
    served = models["f"]
    assert served.sparse is not None
    limits = Limits(default_model="f", request_ttl=60.0)
    rng = np.random.default_rng(5)
    events = [
        {"id": f"e{i}", "features": {"a": float(rng.normal()), "t": [f"w{j}" for j in range(i)]}}
        for i in range(20)
    ]
    messages = [msg(e, i) for i, e in enumerate(events)]
    whole = [served.raw_vector(parse_event(m, models, limits).event) for m in messages]
    want = served.learner.decide_many(served.pipeline.transform_many(np.vstack(whole)))[1]

    def refused(*_: object) -> None:
        raise AssertionError("a row of the model's width was made")

    monkeypatch.setattr(type(served.pipeline), "transform_many", refused)
    out = score_batch(models, messages, limits=limits, now=1.0)
    scores = [d.score for d in out.decisions]
    np.testing.assert_allclose(scores, want, rtol=1e-12, atol=1e-12)
    assert out.moments["f"].count == 20  # of the number alone, not of the 2^12 buckets
    assert out.moments["f"].n_features == 1
    np.testing.assert_allclose(out.moments["f"].mean, np.vstack(whole)[:, :1].mean(axis=0))
    # an event whose score overflows takes the whole path, which refuses it alone
    monkeypatch.undo()
    fields = {"hash_bits": 12, "fields": {"a": "number", "b": "number", "t": "tokens"}}
    ones = ModelConfig(algorithm="dsal", fields=fields, hyperparameters={"w": [1.0] * 4099})
    big = {"a": 1.7e308, "b": 1.7e308, "t": ["w1"]}  # w . x = 3.4e308 = inf
    out = score_batch(
        models_(f=ones),
        [msg({"id": "ok", "features": {**big, "b": 1.0}}, 0), msg({"id": "x", "features": big}, 1)],
        limits=limits,
        now=1.0,
    )
    assert [(d.offset, d.reason) for d in out.dead_letters] == [(1, "non_finite")]
    assert [d.id for d in out.decisions] == ["ok"]
    assert out.decisions[0].score == pytest.approx(1.7e308 + 3.0)
    # the others are decided as they are alone, bit for bit
    ok = msg({"id": "ok", "features": {**big, "b": 1.0}}, 0)
    alone = score_batch(models_(f=ones), [ok], limits=limits, now=1.0)
    assert alone.decisions == out.decisions


def test_a_scorer_gathers_the_moments_the_version_it_serves_learns() -> None:
    from service.learning import Pipeline
    from service.learning.moments import Moments
    from service.learning.preprocessing import Intercept, OnlineStandardizer
    from service.stream.scoring.decide import gathered

    declared = ModelConfig(
        algorithm="dsal", fields={"hash_bits": 6, "fields": {"a": "number", "t": "tokens"}}
    )
    n = declared.n_inputs
    events = [{"id": f"e{i}", "features": {"a": float(i), "t": f"w{i} x"}} for i in range(8)]
    messages = [msg(e, i) for i, e in enumerate(events)]
    limits = Limits(default_model="f", request_ttl=60.0)
    now = score_batch(models_(f=declared), messages, limits=limits, now=1.0)
    assert now.moments["f"].n_features == declared.moments_inputs == 1
    assert now.moments["f"].mean.tolist() == [3.5]
    # a version written under the earlier layout (its first standardiser learnt every
    # bucket) is sent the moments of every input, which it takes
    earlier = Pipeline(
        [
            OnlineStandardizer(n, uncentred_binary=True, uncentred_from=1),
            OnlineStandardizer(n, prior=n, passes_from=1),
            Intercept(),
        ],
        n_features=n,
    )
    envelope = initial_envelope("f", declared)
    envelope = envelope.replace(pipeline=earlier.to_state())
    served = ServedModel.from_envelope(declared, envelope)
    assert served.pipeline.moments_width == n
    before = score_batch({"f": served}, messages, limits=limits, now=1.0)
    seen = before.moments["f"]
    assert seen.n_features == n
    assert served.pipeline.moments_refusal(seen) is None
    # a route's moments follow the version: others replace them, the same merge
    kept: dict[str, Moments] = {}
    gathered(kept, "f", seen)
    gathered(kept, "f", now.moments["f"])
    assert kept["f"] is now.moments["f"]
    again = Moments(1)
    again.add_many([[1.0], [2.0]])
    gathered(kept, "f", again)
    assert kept["f"].count == 10


def test_a_declared_model_without_numbers_gathers_no_moments_and_learns_its_buckets() -> None:
    from service.records import Label, PendingEntry
    from service.stream.scoring.scorer import gathers_moments

    cfg = ModelConfig(
        algorithm="dsol", fields={"hash_bits": 5, "fields": {"t": "tokens", "c": "category"}}
    )
    assert cfg.moments_inputs == 0
    assert not gathers_moments(cfg, 1_000_000)
    served = models_(m=cfg)["m"]
    assert served.pipeline.moments_width == 0
    events = [
        {"id": f"e{i}", "features": {"t": ["a", f"w{i % 3}"], "c": "x" if i % 2 else "y"}}
        for i in range(6)
    ]
    messages = [msg(e, i) for i, e in enumerate(events)]
    limits = Limits(default_model="m", request_ttl=60.0)
    out = score_batch({"m": served}, messages, limits=limits, now=1.0)
    assert out.moments == {}
    envelope = initial_envelope("m", cfg)
    for i, request in enumerate(out.label_requests):
        label = Label(request.request_id, "m", 1 if i % 2 else -1, "t", None)
        applied = apply_label(cfg, envelope, PendingEntry(request, 0), label, i, now=1.0)
        assert applied.outcome == "applied", applied.detail
        assert applied.model is not None
        envelope = applied.model
    learnt = ServedModel.from_envelope(cfg, envelope)
    scores = [
        d.score for d in score_batch({"m": learnt}, messages, limits=limits, now=1.0).decisions
    ]
    assert [s > 0 for s in scores] == [i % 2 == 1 for i in range(6)]  # "x" is +1, "y" -1
