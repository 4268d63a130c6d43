"""service.features.raw: a declared model's event read from its bytes reads as orjson reads it."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import mmh3
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stream.memory import msg

from service.config import ModelConfig
from service.features import FieldsConfig, encoder_of
from service.features import raw as raw_module
from service.features.raw import RawTokens, _kernel, reader_of
from service.learning.sparse import SparseRows
from service.stream.models.served import ServedModel
from service.stream.scoring import batch
from service.stream.scoring.decide import Limits, ScoreResult, score_batch

DECL: dict[str, Any] = {
    "hash_bits": 9,
    "seed": 7,
    "fields": {
        "amount": "number",
        "country": "category",
        "merchant": {"kind": "category", "missing": "indicator"},
        "new_device": "boolean",
        "text": {"kind": "tokens", "max_tokens": 6},
        "words": "tokens",
        "debug": "ignore",
    },
}
PREFIX = np.frombuffer(b"text^", dtype=np.uint8)


def _inputs(tokens: list[str], seed: int = 7, bits: int = 9, offset: int = 1) -> list[int]:
    return [
        offset + (mmh3.hash(f"text^{t}".encode(), seed, False) & ((1 << bits) - 1)) for t in tokens
    ]


def _read(raw: bytes, room: int = 64) -> tuple[int, list[int]]:
    out = np.empty(room, dtype=np.int64)
    count = _kernel()(np.frombuffer(raw, dtype=np.uint8), PREFIX, 7, 511, 1, out)
    return count, out[: max(count, 0)].tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=20), st.sampled_from([b"", b" ", b"\n\t "]))
def test_an_array_of_strings_gives_the_inputs_mmh3_gives_or_is_left_to_orjson(
    tokens: list[str], space: bytes
) -> None:
    raw = space + b"[" + (b"," + space).join(map(orjson.dumps, tokens)) + b"]" + space
    count, inputs = _read(raw)
    plain = all('"' not in t and "\\" not in t and all(ord(c) >= 32 for c in t) for t in tokens)
    if plain:  # no escape in the bytes: read here, each token's input as the encoder's
        assert count == len(tokens)
        assert inputs == _inputs(tokens)
    else:  # an escape: orjson reads it
        assert count == -1


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=6), max_size=4), st.binary(max_size=3))
def test_any_bytes_read_here_are_what_orjson_reads(parts: list[bytes], tail: bytes) -> None:
    """Whatever the bytes (invalid UTF-8, surrogates, overlong forms, stray characters),
    a count here means orjson reads an array of that many strings of those inputs."""
    raw = b"[" + b",".join(b'"' + p + b'"' for p in parts) + b"]" + tail
    count, inputs = _read(raw)
    try:
        want = orjson.loads(raw)
    except orjson.JSONDecodeError:
        assert count == -1
        return
    if count >= 0:
        assert want == [p.decode() for p in parts]
        assert inputs == _inputs(want)


def test_utf8_that_orjson_refuses_is_never_read_here() -> None:
    for bad in (
        b"\xed\xa0\x80",
        b"\xc0\xaf",
        b"\xe0\x80\xaf",
        b"\xf4\x90\x80\x80",
        b"\xff",
        b"\xc3",
    ):
        raw = b'["ok", "' + bad + b'"]'
        assert _read(raw)[0] == -1, bad
    assert _read('["é", "日本", "\U0001f600"]'.encode())[1] == _inputs(["é", "日本", "\U0001f600"])


def test_more_tokens_than_room_are_left_to_orjson() -> None:
    assert _read(orjson.dumps(["a"] * 5), room=5)[0] == 5
    assert _read(orjson.dumps(["a"] * 6), room=5)[0] == -1


def test_a_reader_gives_the_fields_and_the_encoder_the_same_inputs() -> None:
    encoder = encoder_of(FieldsConfig.model_validate(DECL))
    reader = reader_of(encoder)
    assert reader is not None
    assert reader_of(encoder) is reader  # made once
    fields = {"amount": 2, "country": "SE", "merchant": None, "text": ["a", "b"], "debug": 1}
    read = reader.fields(orjson.dumps(fields))
    assert read is not None
    assert isinstance(read["text"], RawTokens)
    assert read["text"].tokens() == ["a", "b"]
    np.testing.assert_array_equal(encoder.sparse(read)[0], encoder.sparse(fields)[0])
    assert encoder.shown(read) == encoder.shown(fields)
    assert encoder.keys(read) == encoder.keys(fields)
    # a field of a name msgspec cannot match: orjson reads that model's events
    odd = encoder_of(FieldsConfig.model_validate({"fields": {'a"b': "tokens"}}))
    assert reader_of(odd) is None


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.lists(st.text(max_size=5), max_size=8),
    st.lists(st.one_of(st.integers(-(2**65), 2**65), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=2),
)
_WORDS = st.lists(st.text(max_size=5), max_size=8)
_FITS = {
    "amount": st.floats(allow_nan=False, allow_infinity=False),
    "country": st.text(max_size=4),
    "merchant": st.one_of(st.none(), st.text(max_size=4)),
    "new_device": st.booleans(),
    "text": _WORDS,
    "words": _WORDS,
    "debug": st.integers(-5, 5),
}
_RAW_TOKENS = st.sampled_from(
    [
        b'["\xed\xa0\x80"]',
        b'["\xc0\xaf"]',
        b'["a",]',
        b'["a" "b"]',
        b' [ "a" , "b" ] ',
        b'["\\u00e9"]',
        b"[]",
    ]
)


@st.composite
def _event(draw: st.DrawFn) -> bytes:
    """An event's bytes: the declared fields (some missing, some of the wrong kind), maybe an
    undeclared field, an odd id, model or ts, a duplicate key, a tokens field's raw bytes."""
    names = ["amount", "country", "merchant", "new_device", "text", "words", "debug"]
    fields: dict[str, Any] = {}
    for name in names:
        if draw(st.integers(0, 3)) > 0:  # mostly a value that fits, sometimes any
            fields[name] = draw(_FITS[name] if draw(st.integers(0, 7)) else _VALUES)
    if draw(st.integers(0, 5)) == 0:
        fields[draw(st.text(max_size=4))] = draw(_VALUES)
    dumps = lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")).encode()  # noqa: E731
    feats = dumps(fields)
    if draw(st.integers(0, 3)) == 0:  # a tokens field's own bytes (a duplicate key, maybe)
        feats = feats[:-1] + (b"," if fields else b"") + b'"text":' + draw(_RAW_TOKENS) + b"}"
    parts = [
        b'"id":' + dumps(draw(st.sampled_from(["e1", "e1", "e1", "", 7, None]))),
        b'"features":' + feats,
    ]
    if draw(st.booleans()):
        parts.append(b'"model":' + dumps(draw(st.sampled_from(["m", "other", None, 3]))))
    if draw(st.booleans()):
        ts = draw(st.one_of(st.none(), st.floats(allow_nan=False), st.integers(-(2**66), 2**66)))
        parts.append(b'"ts":' + dumps(ts))
    if draw(st.integers(0, 5)) == 0:  # a duplicate key of the envelope's
        parts.append(b'"id":"e2"')
    if draw(st.integers(0, 7)) == 0:  # a key the envelope does not know
        parts.append(b'"extra":[1]')
    return b"{" + b",".join(draw(st.permutations(parts))) + b"}"


def _summary(result: ScoreResult) -> list[Any]:
    out: list[Any] = [(d.reason, d.detail) for d in result.dead_letters]
    for block in result.blocks:
        x = block.x.toarray() if isinstance(block.x, SparseRows) else np.asarray(block.x)
        out.append((x.tolist(), [(d.id, d.action, d.score) for d in block.decisions(1.0)]))
    return out


@settings(max_examples=400, deadline=None)
@given(st.lists(_event(), min_size=1, max_size=4))
def test_an_event_reads_the_same_whether_read_from_its_bytes_or_by_orjson(
    events: list[bytes],
) -> None:
    """The same decisions, inputs and dead letters (reason and detail) either way."""
    models = {"m": ServedModel.initial("m", ModelConfig(fields=DECL))}
    messages = [msg(raw, i) for i, raw in enumerate(events)]
    limits = Limits(default_model="m", request_ttl=60.0)
    read = score_batch(models, messages, limits=limits, now=1.0)
    with mock.patch.object(batch, "_readers", return_value={}):
        decoded = score_batch(models, messages, limits=limits, now=1.0)
    assert _summary(read) == _summary(decoded)


def test_a_worker_reads_a_declared_models_tokens_from_the_bytes() -> None:
    """The path is taken (the test above would pass if it never were)."""
    models = {"m": ServedModel.initial("m", ModelConfig(fields=DECL))}
    raw = orjson.dumps({"id": "e1", "features": {"amount": 1.5, "text": ["a", "b", "a"]}})
    record = batch._read_declared(raw, batch._readers(models), "m")
    assert record is not None
    assert record["features"]["text"].inputs.tolist() == _inputs(["a", "b", "a"])
    result = score_batch(models, [msg(raw, 0)], limits=Limits("m", 60.0), now=1.0)
    (block,) = result.blocks
    assert isinstance(block.x, SparseRows)
    want = encoder_of(FieldsConfig.model_validate(DECL)).dense(
        {"amount": 1.5, "text": ["a", "b", "a"]}
    )
    np.testing.assert_array_equal(block.x.toarray()[0], want)


_PLAIN = st.lists(
    st.text(st.characters(exclude_characters='"\\', exclude_categories=["Cc", "Cs"]), max_size=5),
    max_size=9,
)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries({}, optional={**_FITS, "text": _PLAIN, "words": _PLAIN}),
    st.one_of(st.none(), st.floats(-1e9, 1e9)),
)
def test_events_that_fit_are_read_from_their_bytes_as_orjson_reads_them(
    fields: dict[str, Any], ts: float | None
) -> None:
    models = {"m": ServedModel.initial("m", ModelConfig(fields=DECL))}
    raw = orjson.dumps({"id": "e1", "features": fields, "ts": ts})
    record = batch._read_declared(raw, batch._readers(models), "m")
    # read here (one token more than text takes too: the encoder names the excess); more
    # than that: orjson reads them, and the encoder names the excess all the same
    assert (record is None) == (len(fields.get("text", ())) > 7)
    if record is not None:
        assert {k: v for k, v in record["features"].items() if k not in ("text", "words")} == {
            k: v for k, v in fields.items() if k not in ("text", "words")
        }
    limits = Limits(default_model="m", request_ttl=60.0)
    read = score_batch(models, [msg(raw, 0)], limits=limits, now=1.0)
    with mock.patch.object(batch, "_readers", return_value={}):
        decoded = score_batch(models, [msg(raw, 0)], limits=limits, now=1.0)
    assert _summary(read) == _summary(decoded)


def test_values_nested_deep_read_as_orjson_reads_them() -> None:
    """msgspec refuses nesting orjson takes (and the other way round): orjson's way, and
    the same decisions and dead letters as ever (never an exception out of the batch)."""
    models = {"m": ServedModel.initial("m", ModelConfig(fields=DECL))}
    limits = Limits(default_model="m", request_ttl=60.0)
    events = []
    for depth in (500, 1000, 1100, 100_000):
        deep = b"[" * depth + b"]" * depth
        events += [
            b'{"id":"e1","features":{"amount":1,"debug":' + deep + b"}}",
            b'{"id":"e1","features":{"text":' + deep + b"}}",
            b'{"id":"e1","features":' + deep + b"}",
            b'{"id":' + deep + b',"features":{"amount":1}}',
        ]
    messages = [msg(raw, i) for i, raw in enumerate(events)]
    read = score_batch(models, messages, limits=limits, now=1.0)
    with mock.patch.object(batch, "_readers", return_value={}):
        decoded = score_batch(models, messages, limits=limits, now=1.0)
    assert _summary(read) == _summary(decoded)
    assert read.dead_letters  # the deepest are refused


def test_without_a_compiled_pass_events_are_read_through_orjson(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """numba or llvmlite that cannot load (a platform without its wheels) costs speed, never
    a decision: the worker reads the fields through orjson and says so."""
    declared = {**DECL, "seed": 11}  # a declaration of its own: a reader not yet made
    models = {"m": ServedModel.initial("m", ModelConfig(fields=declared))}
    raw = orjson.dumps({"id": "e1", "features": {"amount": 1.5, "text": ["a", "b", "a"]}})
    with mock.patch.object(raw_module, "_kernel", side_effect=ImportError("no llvmlite")):
        assert batch._readers(models) == {}
        result = score_batch(models, [msg(raw, 0)], limits=Limits("m", 60.0), now=1.0)
    assert "no compiled pass (no llvmlite)" in caplog.text
    (block,) = result.blocks
    assert isinstance(block.x, SparseRows)
    want = encoder_of(FieldsConfig.model_validate(declared)).dense(
        {"amount": 1.5, "text": ["a", "b", "a"]}
    )
    np.testing.assert_array_equal(block.x.toarray()[0], want)
