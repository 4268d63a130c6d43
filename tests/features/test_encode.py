"""Events as producers write them: the declaration, the encoding, its stability, and each kind
of bad field refused with its name (no Kafka: the scoring path is pure)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
from typing import Any

import mmh3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from stream.memory import msg

from service.config import ModelConfig, Settings
from service.features import MAX_HASH_BITS, Encoder, FieldError, FieldsConfig, bucket, encoder_of
from service.features.declaration import version_room
from service.learning.sparse import SparseRows
from service.records import BadMessage, LabelRequest, Reason, parse_label_request, request_id
from service.stream.labels.admission import admission, inputs_of
from service.stream.labels.seed import seed_model
from service.stream.models.served import ServedModel
from service.stream.scoring.decide import Limits, score_batch

DECL: dict[str, Any] = {
    "hash_bits": 9,
    "seed": 7,
    "fields": {
        "amount": "number",
        "age": {"kind": "number", "missing": "indicator"},
        "country": "category",
        "merchant": {"kind": "category", "missing": "indicator"},
        "new_device": "boolean",
        "tokens": {"kind": "tokens", "max_tokens": 500},
        "ref": {"kind": "category", "missing": "refuse"},
        "debug": "ignore",
    },
    "cross": [["country", "new_device"]],
}
EVENT: dict[str, Any] = {
    "amount": 12.5,
    "age": None,
    "country": "SE",
    "merchant": None,
    "new_device": True,
    "tokens": [f"t{i % 120}" for i in range(300)],
    "ref": 4711,
    "debug": {"anything": ["goes"]},
}


def enc() -> Encoder:
    return Encoder(FieldsConfig.model_validate(DECL))


def test_murmurhash3_known_answers_keep_every_bucket_stable_across_versions() -> None:
    # MurmurHash3_x86_32's published test vectors: a hasher that changed would move every
    # model's weights to other buckets
    assert mmh3.hash(b"", 0, signed=False) == 0
    assert mmh3.hash(b"", 1, signed=False) == 0x514E28B7
    assert mmh3.hash("The quick brown fox jumps over the lazy dog", 0, signed=False) == 0x2E4FF723
    assert bucket("country=SE", seed=0, bits=4) == mmh3.hash("country=SE", 0, signed=False) & 15
    assert bucket("country=SE", seed=0, bits=4) == 12  # and never another bucket


def test_the_layout_numbers_first_then_buckets_and_each_key_where_it_hashes() -> None:
    e = enc()
    assert e.width == 2 + 512
    x = e.dense(EVENT)
    assert x[0] == 12.5
    assert x[1] == 0.0

    def at(key: str) -> int:
        return 2 + bucket(key, seed=7, bits=9)

    expected = np.zeros(e.width)
    for key, value in [
        ("age?", 1.0),
        ("country=SE", 1.0),
        ("merchant?", 1.0),
        ("new_device", 1.0),
        ("ref=4711", 1.0),
        ("country=SE*new_device", 1.0),
    ]:
        expected[at(key)] += value
    for i in range(120):
        expected[at(f"tokens^t{i}")] += 300 // 120 + (1 if i < 300 % 120 else 0)
    expected[0] = 12.5
    np.testing.assert_array_equal(x, expected)
    assert x[2:].sum() == 300 + 6


def test_the_same_event_hashes_alike_in_another_process_with_another_hash_seed() -> None:
    # Python salts str hashes per process (PYTHONHASHSEED): a worker elsewhere, or restarted,
    # must encode an event to the very same inputs
    probe = (
        "import json, sys; from service.features import Encoder, FieldsConfig; "
        "d, ev = json.loads(sys.argv[1]), json.loads(sys.argv[2]); "
        "print(json.dumps(Encoder(FieldsConfig.model_validate(d)).dense(ev).tolist()))"
    )
    outs = []
    for salt in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", probe, json.dumps(DECL), json.dumps(EVENT)],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": salt, "PATH": "/usr/bin:/bin"},
            cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]),
        )
        outs.append(json.loads(done.stdout))
    assert outs[0] == outs[1] == enc().dense(EVENT).tolist()


def test_another_seed_or_width_moves_the_buckets() -> None:
    other = Encoder(FieldsConfig.model_validate({**DECL, "seed": 8}))
    assert not np.array_equal(other.dense(EVENT), enc().dense(EVENT))
    assert encoder_of(FieldsConfig.model_validate(DECL)).width == 514


def test_undeclared_fields_are_refused_by_default_and_dropped_when_asked() -> None:
    with pytest.raises(FieldError) as bad:
        enc().dense({**EVENT, "surprise": 1})
    assert bad.value.field == "surprise"
    lax = Encoder(FieldsConfig.model_validate({**DECL, "undeclared": "ignore"}))
    np.testing.assert_array_equal(lax.dense({**EVENT, "surprise": 1}), enc().dense(EVENT))


def test_missing_fields_are_absent_or_indicated_or_refused() -> None:
    e = enc()
    base = {"ref": "r"}
    x = e.dense(base)
    # absent: nothing; indicated: the two indicators; the numbers hold 0
    assert x[0] == 0.0
    assert x[1] == 0.0
    assert x[2:].sum() == 1 + 2  # ref=r, age?, merchant?
    with pytest.raises(FieldError, match="'ref': missing or null"):
        e.dense({"amount": 1.0})
    with pytest.raises(FieldError, match="'ref': missing or null"):
        e.dense({"ref": None})


def test_a_string_of_tokens_is_split_at_white_space() -> None:
    e = enc()
    a = e.dense({"ref": "r", "tokens": "refund  urgent\trefund"})
    b = e.dense({"ref": "r", "tokens": ["refund", "urgent", "refund"]})
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("decl", "why"),
    [
        ({"fields": {}}, "at least one field"),
        ({"fields": {"a": "ignore"}}, "every field is ignored"),
        ({"fields": {"a": "number"}, "hash_bits": 4}, "no field is hashed"),
        ({"fields": {"a": "category"}, "hash_bits": 19}, "less than or equal to 18"),
        ({"fields": {"a": "category"}, "hash_bits": 0}, "greater than or equal to 1"),
        ({"fields": {"a": "colour"}, "hash_bits": 4}, "Input should be"),
        ({"fields": {" ": "number"}}, "field name"),
        (
            {"fields": {"a": "number", "b": "category"}, "hash_bits": 4, "cross": [["a", "b"]]},
            "'a' is a number",
        ),
        ({"fields": {"b": "category"}, "hash_bits": 4, "cross": [["b", "z"]]}, "not a declared"),
        ({"fields": {"a": {"kind": "number", "max_tokens": 3}}}, "max_tokens is for a tokens"),
        ({"fields": {"a": "number"}, "seed": -1}, "greater than or equal to 0"),
        ({"fields": {"a": "number"}, "colour": 1}, "Extra inputs"),
    ],
)
def test_a_bad_declaration_is_refused_when_the_settings_are_read(decl: Any, why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        ModelConfig(fields=decl)


def test_a_model_gives_fields_or_a_width_never_both() -> None:
    with pytest.raises(ValidationError, match="not both"):
        ModelConfig(fields={"fields": {"a": "number"}}, n_features=1)
    assert ModelConfig(fields=DECL).n_inputs == 514


# each kind of field, a value of every other JSON kind, refused with the field's name
_JSON = {
    "a string": st.text(max_size=8),
    "a boolean": st.booleans(),
    "an integer": st.integers(-(10**6), 10**6),
    "a number": st.floats(allow_nan=False, allow_infinity=False),
    "a list": st.lists(st.integers(-(2**53), 2**53), min_size=0, max_size=3),
    "an object": st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=2),
}
_TAKES = {
    "number": {"an integer", "a number"},
    "boolean": {"a boolean"},
    "category": {"a string", "an integer"},
    "tokens": {"a string"},  # a list of strings too: lists of integers are refused
}


@st.composite
def _misfit(draw: st.DrawFn) -> tuple[str, str, Any]:
    kind = draw(st.sampled_from(sorted(_TAKES)))
    wrong = draw(st.sampled_from(sorted(set(_JSON) - _TAKES[kind])))
    value = draw(_JSON[wrong])
    if kind == "tokens" and wrong == "a list" and not value:
        value = [1]  # an empty list is no tokens: fine
    return kind, wrong, value


@settings(max_examples=200, deadline=None)
@given(_misfit(), st.text(min_size=1, max_size=20).filter(lambda s: s.strip() not in ("", "ok")))
def test_each_kind_of_bad_field_is_dead_lettered_naming_it(
    misfit: tuple[str, str, Any], name: str
) -> None:
    kind, _, value = misfit
    cfg = ModelConfig(fields={"hash_bits": 4, "fields": {"ok": "category", name: kind}})
    models = {"m": ServedModel.initial("m", cfg)}
    event = {"id": "e1", "features": {"ok": "fine", name: value}}
    result = score_batch(
        models, [msg(event, 0)], limits=Limits(default_model="m", request_ttl=60.0), now=1.0
    )
    assert not result.blocks
    (dead,) = result.dead_letters
    assert dead.reason == Reason.FIELD
    assert f"field {name!r:.80}" in dead.detail, dead.detail


@settings(max_examples=100, deadline=None)
@given(
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=12),
    st.booleans(),
    st.lists(st.text(max_size=6), max_size=40),
)
def test_well_formed_events_are_scored_and_encoded_as_the_encoder_says(
    amount: float, country: str, device: bool, tokens: list[str]
) -> None:
    cfg = ModelConfig(fields=DECL)
    models = {"m": ServedModel.initial("m", cfg)}
    fields = {
        "amount": amount,
        "country": country,
        "new_device": device,
        "tokens": tokens,
        "ref": "r",
    }
    result = score_batch(
        models,
        [msg({"id": "e1", "features": fields}, 0)],
        limits=Limits(default_model="m", request_ttl=60.0),
        now=1.0,
    )
    assert not result.dead_letters
    (block,) = result.blocks
    assert [d.id for d in block.decisions(1.0)] == ["e1"]
    assert isinstance(block.x, SparseRows)  # the inputs it sets, never a row of its width
    np.testing.assert_array_equal(block.x.toarray()[0], enc().dense(fields))


def _uncached(e: Encoder, name: str, tokens: list[str]) -> np.ndarray:
    """The inputs of a tokens field the long way: each distinct key hashed, its count added."""
    out = np.zeros(e.width)
    for token in tokens:
        out[e.offset + bucket(f"{name}^{token}", seed=e.seed, bits=e.declaration.hash_bits)] += 1
    return out


_WORDS = st.lists(
    st.one_of(st.sampled_from(["a", "b", "refund", "ö", "東京", "a b"[:1]]), st.text(max_size=6)),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_WORDS, min_size=1, max_size=6))
def test_cached_tokens_land_where_their_keys_hash_event_after_event(
    events: list[list[str]],
) -> None:
    # one encoder across events (its cache warm after the first), against each key hashed
    e = Encoder(FieldsConfig.model_validate({"hash_bits": 6, "seed": 3, "fields": {"t": "tokens"}}))
    cold = Encoder(e.declaration)
    for tokens in events:
        want = _uncached(e, "t", tokens)
        np.testing.assert_array_equal(e.dense({"t": tokens}), want)
        np.testing.assert_array_equal(e.dense({"t": tokens}), want)  # again, all cached
        # the desk's keys come the long way and agree
        assert set(e.keys({"t": tokens})) == {int(i) for i in np.flatnonzero(want)}
    assert set(e._cached["t"]) == {t for tokens in events for t in tokens}
    np.testing.assert_array_equal(cold.dense({"t": events[-1]}), e.dense({"t": events[-1]}))


def test_the_token_cache_is_bounded_and_stays_right_when_emptied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import service.features.encode as encode

    monkeypatch.setattr(encode, "CACHED_TOKENS", 5)
    e = Encoder(FieldsConfig.model_validate({"hash_bits": 8, "fields": {"t": "tokens"}}))
    for k in range(30):
        tokens = [f"w{k}", f"w{k + 1}", f"w{k}", "common"]
        np.testing.assert_array_equal(e.dense({"t": tokens}), _uncached(e, "t", tokens))
        assert len(e._cached["t"]) <= 5


def test_a_long_token_is_hashed_each_time_never_cached() -> None:
    # an event of a few huge tokens must not pin megabytes per token in the cache
    import service.features.encode as encode

    e = Encoder(FieldsConfig.model_validate({"hash_bits": 8, "fields": {"t": "tokens"}}))
    edge, long = "x" * encode.CACHED_LENGTH, "y" * (encode.CACHED_LENGTH + 1)
    for tokens in ([edge, long], [long, "z" * 100_000, edge], [long, long]):
        np.testing.assert_array_equal(e.dense({"t": tokens}), _uncached(e, "t", tokens))
    assert set(e._cached["t"]) == {edge}


def test_a_warm_cache_still_refuses_a_token_that_is_not_a_string() -> None:
    e = enc()
    e.dense({**EVENT, "tokens": ["1", "a"]})  # "1" and "a" are cached
    for bad, kind in ((1, "an integer"), (True, "a boolean"), (["a"], "a list"), (None, "None")):
        with pytest.raises(FieldError, match=f"'tokens': token 1 is {kind}"):
            e.dense({**EVENT, "tokens": ["a", bad]})
    with pytest.raises(FieldError, match="'tokens': text that is not valid Unicode"):
        e.dense({**EVENT, "tokens": ["a", "x\ud800"]})
    assert "x\ud800" not in e._cached["tokens"]


def test_a_crossed_tokens_field_is_hashed_with_its_counts_never_cached() -> None:
    decl = {"hash_bits": 6, "fields": {"t": "tokens", "c": "category"}, "cross": [["t", "c"]]}
    e = Encoder(FieldsConfig.model_validate(decl))
    assert e._cached == {}
    x = e.dense({"t": ["a", "a", "b"], "c": "SE"})
    cross = bucket("t^a*c=SE", seed=0, bits=6)
    assert x[e.offset + cross] >= 2.0  # the cross of a token seen twice weighs 2


@pytest.mark.parametrize(
    "raw",
    [
        rb'{"id": "e1", "features": {"ok": "x\ud800"}}',
        rb'{"id": "e1", "features": {"ok": "fine", "words": ["a", "\udfff"]}}',
        rb'{"id": "e1", "features": {"ok": "fine", "words": "a \ud800 b"}}',
    ],
)
def test_text_with_a_lone_surrogate_is_dead_lettered_not_hashed(raw: bytes) -> None:
    # no encoding holds a lone surrogate; handed to the hasher as a str it would crash the
    # process (mmh3 5.3.1), so the encoder makes the bytes itself and refuses the field
    cfg = ModelConfig(fields={"hash_bits": 4, "fields": {"ok": "category", "words": "tokens"}})
    result = score_batch(
        {"m": ServedModel.initial("m", cfg)},
        [msg(raw, 0)],
        limits=Limits(default_model="m", request_ttl=60.0),
        now=1.0,
    )
    assert not result.blocks
    (dead,) = result.dead_letters
    assert dead.reason in (Reason.FIELD, Reason.NOT_JSON, Reason.SCHEMA), dead
    if dead.reason == Reason.FIELD:
        assert "not valid Unicode" in dead.detail


def test_a_request_carries_the_fields_a_person_is_shown_and_parses_back() -> None:
    cfg = ModelConfig(fields=DECL, audit_rate=0.5)
    models = {"m": ServedModel.initial("m", cfg)}
    events = [{"id": f"e{i}", "features": {**EVENT, "ref": 2**62 + i}} for i in range(20)]
    result = score_batch(
        models,
        [msg(json.dumps(e).encode(), i) for i, e in enumerate(events)],
        limits=Limits(default_model="m", request_ttl=60.0),
        now=1.0,
    )
    (block,) = result.blocks
    requests = block.label_requests(1.0, 60.0)
    assert requests
    for request in requests:
        shown = dict(request.fields or {})
        assert "debug" not in shown  # ignored: never shown
        assert shown["country"] == "SE"
        assert shown["merchant"] is None
        assert shown["ref"] == str(2**62 + int(request.event_id[1:]))  # as it is hashed
        assert parse_label_request(request.to_json()) == request


def test_the_widest_declared_model_writes_versions_under_the_record_limit() -> None:
    # every input weighs in a version (weights, standardisers, challengers, recall): the
    # widest declaration the default settings take must still fit max_message_bytes once
    # the adaptive wrapper's parts have all grown (its versions stop growing by ~300 labels)
    room = Settings().version_bytes
    widest = max(b for b in range(1, MAX_HASH_BITS + 1) if version_room(b, 4) <= room)
    assert widest == 12
    decl = {
        "hash_bits": widest,
        "fields": {f"n{i}": "number" for i in range(4)} | {"c": "category", "t": "tokens"},
    }
    cfg = ModelConfig(fields=decl)
    settings_ = Settings(models={"m": cfg.model_dump()}, default_model="m")
    enc = encoder_of(cfg.fields)  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    rows, labels = [], []
    for _ in range(600):
        words = [f"w{int(k)}" for k in rng.integers(0, 3000, size=30)]
        fields = {f"n{i}": float(rng.normal()) for i in range(4)} | {
            "c": f"c{int(rng.integers(0, 50))}",
            "t": words,
        }
        rows.append(enc.dense(fields))
        labels.append(1 if "w1" in words or fields["n0"] > 0.5 else -1)
    seeded = seed_model(settings_, "m", np.vstack(rows), np.asarray(labels), now=1.0)
    size = len(seeded.model.to_bytes())
    # at least the champion's weights, whole (a trained model's touch most buckets)
    assert 8 * 2**widest < size < 0.6 * Settings().max_message_bytes, size
    assert size < version_room(widest, 4)


def test_a_declaration_that_hashes_and_does_not_say_how_wide_takes_2_to_the_18() -> None:
    assert FieldsConfig.model_validate({"fields": {"a": "category"}}).hash_bits == 18
    assert ModelConfig(fields={"fields": {"a": "category"}}).n_inputs == 2**18
    assert FieldsConfig.model_validate({"fields": {"a": "number"}}).hash_bits is None


@pytest.mark.parametrize("bits", [13, MAX_HASH_BITS])
def test_the_learners_state_gets_room_for_a_declaration_unless_max_state_bytes_says_less(
    bits: int,
) -> None:
    """Unset, ``max_state_bytes`` is room for the widest state the configured models may
    reach (the changelogs the worker creates are given it; every client fetches it); set
    below that, the settings are refused naming it. What a scorer reads stays within
    ``max_message_bytes`` (``version_bytes``), whatever the width."""
    decl = {"hash_bits": bits, "fields": {"n": "number", "t": "tokens"}}
    models = {"m": {"algorithm": "dsol", "fields": decl}}
    room = version_room(bits, 1)
    roomy = Settings(models=models, default_model="m")
    assert (roomy.version_bytes, roomy.state_bytes) == (1_000_000, room)
    assert roomy.fetch_bytes >= room + 4096
    assert roomy.models["m"].n_inputs == 1 + 2**bits
    with pytest.raises(ValidationError, match=f"raise max_state_bytes to at least {room:,}"):
        Settings(models=models, default_model="m", max_state_bytes=room - 1)
    with pytest.raises(ValidationError, match=f"2\\^{bits} hashed buckets"):
        Settings(models=models, default_model="m", max_state_bytes=room - 1)
    taken = Settings(models=models, default_model="m", max_state_bytes=room)
    assert (taken.state_bytes, taken.version_bytes) == (room, 1_000_000)
    narrow = Settings()  # nothing hashed: the state's room is a version's, as the topic's
    assert narrow.state_bytes == narrow.version_bytes == 1_000_000
    assert narrow.fetch_bytes == 2_000_000


_FIELD_VALUES = {
    "amount": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-9, 9)),
    "age": st.one_of(st.none(), st.floats(-1e6, 1e6), st.just(-0.0)),
    "country": st.one_of(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1)),
    "merchant": st.one_of(st.none(), st.text(max_size=8)),
    "new_device": st.booleans(),
    "tokens": st.one_of(st.text(max_size=40), st.lists(st.text(max_size=6), max_size=60)),
    "ref": st.one_of(st.text(min_size=1, max_size=8), st.integers(0, 2**62)),
    "debug": st.one_of(st.none(), st.lists(st.integers(-9, 9), max_size=3)),
}


@st.composite
def _declared_event(draw: st.DrawFn) -> dict[str, Any]:
    """An event :data:`DECL` takes: any of its fields left out but ``ref``."""
    return {
        name: draw(values)
        for name, values in _FIELD_VALUES.items()
        if name == "ref" or draw(st.booleans())
    }


@settings(max_examples=150, deadline=None)
@given(st.lists(_declared_event(), min_size=1, max_size=5))
def test_a_request_carries_fields_the_learner_encodes_to_the_inputs_scored(
    events: list[dict[str, Any]],
) -> None:
    # a declared model's request carries the event's fields and no features; what the
    # learner makes of them after the topic (inputs_of) is what the scorer scored, bit for bit
    cfg = ModelConfig(fields=DECL, algorithm="dsol")  # DSOL asks about every event
    models = {"m": ServedModel.initial("m", cfg)}
    result = score_batch(
        models,
        [msg({"id": f"e{i}", "features": e}, i) for i, e in enumerate(events)],
        limits=Limits(default_model="m", request_ttl=60.0),
        now=1.0,
    )
    assert not result.dead_letters
    (block,) = result.blocks
    assert isinstance(block.x, SparseRows)
    scored = block.x.toarray()
    requests = result.label_requests
    assert len(requests) == len(events)
    admit = admission(Settings(models={"m": cfg.model_dump()}, default_model="m"))
    for k, request in enumerate(requests):
        read = parse_label_request(request.to_json())
        assert read.features is None
        admit.request(read)  # the learner takes it
        learned = inputs_of(read, cfg)
        np.testing.assert_array_equal(learned, scored[k])
        assert np.signbit(learned).tolist() == np.signbit(scored[k]).tolist()


_DECLARED_AS = {"number": "amount", "category": "country", "boolean": "new_device"}


@settings(max_examples=150, deadline=None)
@given(_misfit())
def test_a_request_whose_fields_do_not_fit_is_refused_naming_the_field(
    misfit: tuple[str, str, Any],
) -> None:
    # the label-requests topic is input too: fields no scorer of this declaration wrote
    kind, _, value = misfit
    name = _DECLARED_AS.get(kind, "tokens")
    cfg = ModelConfig(fields=DECL, algorithm="dsol")
    admit = admission(Settings(models={"m": cfg.model_dump()}, default_model="m"))
    good = {"ref": "r", "country": "SE"}
    request = LabelRequest(
        request_id("m", "e1"),
        "e1",
        "m",
        None,
        0.0,
        1.0,
        0,
        1.0,
        0,
        0.0,
        60.0,
        0.5,
        fields={**good, name: value},
    )
    with pytest.raises(BadMessage) as refused:
        admit.request(parse_label_request(request.to_json()))
    assert refused.value.reason == Reason.FIELD
    assert f"field {name!r}" in refused.value.detail
    with pytest.raises(BadMessage, match=f"field {name!r}"):
        inputs_of(request, cfg)
    fine = dataclasses.replace(request, fields=good)
    assert admit.request(fine) is fine
    # a request without features for a model that declares no fields: refused, named
    plain = Settings(models={"m": {"n_features": 3}}, default_model="m")
    with pytest.raises(BadMessage, match="got none"):
        admission(plain).request(fine)


_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=6),
    st.sampled_from(["\ud800", "a\udfffb", "t1", "t2 t3"]),
    st.lists(
        st.one_of(st.sampled_from(["t1", "t2", "é", "\udc00", ""]), st.integers(0, 3)),
        max_size=8,
    ),
    st.dictionaries(st.text(max_size=2), st.integers(0, 2), max_size=1),
)
# a declaration of every kind and missing rule, a crossed tokens field, fields whose names no
# encoding holds, and a tokens field whose max_tokens a list can pass
ODD: dict[str, Any] = {
    "hash_bits": 6,
    "fields": {
        "n": {"kind": "number", "missing": "indicator"},
        "c": "category",
        "b": {"kind": "boolean", "missing": "refuse"},
        "t": {"kind": "tokens", "max_tokens": 5},
        "x": "tokens",
        "s\udc80": {"kind": "category", "missing": "indicator"},
        "u\udc81": "tokens",
        "i": "ignore",
    },
    "cross": [["c", "x"]],
}
_FITS = {
    "number": st.one_of(st.none(), st.floats(-9, 9), st.integers(-9, 9)),
    "category": st.one_of(st.none(), st.sampled_from(["SE", 7])),
    "boolean": st.booleans(),
    "tokens": st.one_of(st.none(), st.lists(st.sampled_from(["t1", "t2", "é"]), max_size=4)),
    "ignore": _ANY,
}


@st.composite
def _mostly_fitting(draw: st.DrawFn, decl: dict[str, Any]) -> dict[str, Any]:
    """Fields of ``decl``, each left out, fitting its kind or anything; and one undeclared."""
    out: dict[str, Any] = {}
    for name, spec in decl["fields"].items():
        kind = spec if isinstance(spec, str) else spec["kind"]
        how = draw(st.sampled_from(["out", "fits", "fits", "any"]))
        if how != "out":
            out[name] = draw(_FITS[kind] if how == "fits" else _ANY)
    if draw(st.booleans()):
        out["zz"] = draw(_ANY)
    return out


@settings(max_examples=800, deadline=None)
@given(
    st.sampled_from([DECL, ODD, {**ODD, "undeclared": "ignore"}]).flatmap(
        lambda d: st.tuples(st.just(d), _mostly_fitting(d), st.booleans())
    )
)
def test_the_learners_check_refuses_exactly_what_the_encoding_refuses_in_the_same_words(
    case: tuple[dict[str, Any], dict[str, Any], bool],
) -> None:
    decl, fields, warm = case
    e = Encoder(FieldsConfig.model_validate(decl))
    if warm:  # the tokens already cached (the scorer's encoder has seen them)
        for name in e._cached:
            with contextlib.suppress(FieldError):  # (never under a name no encoding holds)
                e._token_inputs(name, ["t1", "t2", "é", ""])
    try:
        e.sparse(fields)
    except FieldError as bad:
        encoded: tuple[str, str] | None = (bad.field, bad.detail)
    else:
        encoded = None
    try:
        Encoder(FieldsConfig.model_validate(decl)).check(fields)
    except FieldError as bad:
        checked: tuple[str, str] | None = (bad.field, bad.detail)
    else:
        checked = None
    assert checked == encoded
