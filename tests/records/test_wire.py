"""Wire parsing: every malformed input becomes a BadMessage with its dead-letter reason."""

from __future__ import annotations

import base64
import json
import math
import re
import struct
from dataclasses import replace

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.records import (
    BadMessage,
    DeadLetter,
    Label,
    LabelRequest,
    parse_feature_event,
    parse_label,
    parse_label_request,
)
from service.records.codec import (
    DEAD_LETTER_REASONS,
    MAX_SPARSE_SIZE,
    MAX_SPREAD_SIZE,
    decode_json,
    obj,
    packed_numbers,
    read_numbers,
)
from service.records.wire import FeatureMoments, _label_request, label_request_from_dict


def _reason(fn, raw: bytes, **kw) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(BadMessage) as info:
        fn(raw, **kw)
    assert info.value.reason in DEAD_LETTER_REASONS
    return info.value.reason


def test_feature_event_with_list_and_default_model() -> None:
    ev = parse_feature_event(b'{"id": 7, "features": [1, -2.5, 0], "ts": 12.5}', default_model="d")
    assert (ev.id, ev.model, ev.features, ev.ts) == ("7", "d", [1.0, -2.5, 0.0], 12.5)


def test_feature_event_with_named_features_and_model() -> None:
    ev = parse_feature_event(
        b'{"id": "a", "model": "m", "features": {"x": 1, "y": 2}}', default_model="d"
    )
    assert ev.model == "m"
    assert ev.features == {"x": 1.0, "y": 2.0}
    assert ev.ts is None


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", "not_json"),
        (b"\xff\xfe", "not_json"),
        (b"[1, 2]", "schema"),
        (b'{"features": [1]}', "schema"),
        (b'{"id": "a"}', "schema"),
        (b'{"id": "a", "features": "1,2"}', "schema"),
        (b'{"id": "a", "features": [1, "x"]}', "schema"),
        (b'{"id": "a", "features": [1, true]}', "schema"),
        (b'{"id": "", "features": [1]}', "schema"),
        (b'{"id": {"n": 1}, "features": [1]}', "schema"),
        (b'{"id": "a", "features": [1, NaN]}', "non_finite"),
        (b'{"id": "a", "features": [1e999]}', "non_finite"),
        (b'{"id": "a", "features": {"x": -Infinity}}', "non_finite"),
        (b'{"id": "a", "features": [1], "ts": "now"}', "schema"),
    ],
)
def test_bad_feature_events_are_classified(raw: bytes, reason: str) -> None:
    assert _reason(parse_feature_event, raw, default_model="d") == reason


def test_oversize_and_too_many_features() -> None:
    raw = orjson.dumps({"id": "a", "features": [0.0] * 50})
    assert _reason(parse_feature_event, raw, default_model="d", max_bytes=64) == "oversize"
    assert _reason(parse_feature_event, raw, default_model="d", max_features=10) == (
        "feature_count"
    )


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (0, "bad_label"),
        (2, "bad_label"),
        (1.0, "bad_label"),
        ("1", "bad_label"),
        (True, "bad_label"),
        (None, "bad_label"),
    ],
)
def test_label_must_be_plus_or_minus_one(value: object, reason: str) -> None:
    raw = orjson.dumps({"request_id": "r", "model": "m", "label": value})
    assert _reason(parse_label, raw) == reason


def test_label_round_trip() -> None:
    label = Label(request_id="r1", model="m", label=-1, labelled_by="ops", ts=3.0)
    assert parse_label(label.to_json()) == label
    assert _reason(parse_label, b'{"model": "m", "label": 1}') == "schema"


def test_label_request_round_trip_and_checks() -> None:
    req = LabelRequest(
        request_id="r",
        event_id="e",
        model="m",
        features=[1.0, 2.0],
        score=0.3,
        rho=0.5,
        decided_label=0,
        query_probability=0.25,
        model_version=3,
        requested_at=10.0,
        expires_at=20.0,
        priority=0.7,
    )
    assert parse_label_request(req.to_json()) == req
    bad = {**req.to_dict(), "query_probability": 0.0}
    assert _reason(parse_label_request, orjson.dumps(bad)) == "schema"
    bad = {**req.to_dict(), "decided_label": 2}
    assert _reason(parse_label_request, orjson.dumps(bad)) == "schema"


def test_a_label_request_carries_the_moments_of_the_events_scored_since_the_last() -> None:
    base = LabelRequest("r", "e", "m", [1.0, 2.0], 0.3, 0.5, 0, 0.25, 3, 10.0, 20.0, 0.7)
    req = replace(base, moments=FeatureMoments(5, (1.0, -2.5), (4.0, 0.0)))
    assert parse_label_request(req.to_json()) == req
    assert parse_label_request(base.to_json()).moments is None  # as before they existed
    old = {k: v for k, v in base.to_dict().items() if k != "moments"}
    assert parse_label_request(orjson.dumps(old)) == base
    # of the first features alone (a declared model's numbers, not its buckets)
    head = replace(base, moments=FeatureMoments(5, (1.0,), (4.0,)))
    assert parse_label_request(head.to_json()) == head


@pytest.mark.parametrize(
    "moments",
    [
        "many",
        {"count": 2, "mean": [], "m2": []},
        {"count": 2, "mean": 0.0, "m2": [0.0]},
        {"count": 0, "mean": [0.0, 0.0], "m2": [0.0, 0.0]},
        {"count": 2.5, "mean": [0.0, 0.0], "m2": [0.0, 0.0]},
        {"count": 2, "mean": [0.0], "m2": [0.0, 0.0]},
        {"count": 2, "mean": [0.0, 0.0, 0.0], "m2": [0.0, 0.0]},
        {"count": 2, "mean": [0.0, "x"], "m2": [0.0, 0.0]},
        {"count": 2, "mean": [0.0, 2e100], "m2": [0.0, 0.0]},
        {"count": 2, "mean": [0.0, 0.0], "m2": [-1.0, 0.0]},
        {"count": 2, "mean": [0.0, 0.0], "m2": [3e200, 0.0]},
        {"count": 2, "mean": [0.0, 0.0]},
    ],
)
def test_a_label_request_with_moments_that_are_not_is_dead_lettered(moments: object) -> None:
    base = LabelRequest("r", "e", "m", [1.0, 2.0], 0.3, 0.5, 0, 0.25, 3, 10.0, 20.0, 0.7)
    raw = orjson.dumps({**base.to_dict(), "moments": moments})
    assert _reason(parse_label_request, raw) == "schema"


def _wide_request(n: int = 1024, *, held: int = 40) -> LabelRequest:
    """A request of a declared model: ``n`` inputs, ``held`` of them set, with moments
    that have a -0.0 mean and a bucket whose mean is zero but whose sum is not."""
    features = [0.0] * n
    for i in range(0, n, n // held):
        features[i] = 1.0
    features[:2] = [0.25, -3.5]
    mean, m2 = [0.0] * n, [0.0] * n
    for i in range(0, n, n // held):
        mean[i], m2[i] = 0.5, 0.25
    mean[7], m2[9] = -0.0, 2.0
    moments = FeatureMoments(4, tuple(mean), tuple(m2), "v1:key:sig")
    base = LabelRequest("r", "e", "m", features, 0.3, 0.5, 0, 0.25, 3, 10.0, 20.0, 0.7)
    return replace(base, moments=moments, fields={"amount": 0.25, "words": ["a", "b"]})


def test_a_wide_request_is_written_as_its_non_zero_inputs_and_read_back_bit_for_bit() -> None:
    req = _wide_request()
    record = orjson.loads(req.to_json())
    assert set(record["features"]) == {"size", "at", "values"}
    assert record["features"]["size"] == 1024
    assert record["features"]["at"] == [i for i, v in enumerate(req.features) if v]
    assert req.moments is not None
    held = {
        i for i, (a, b) in enumerate(zip(req.moments.mean, req.moments.m2, strict=True)) if a or b
    }
    assert record["moments"]["at"] == sorted({*held, 7})  # the -0.0 mean kept
    assert 9 in held  # a sum without a mean kept
    back = parse_label_request(req.to_json())
    assert back == req
    assert back.moments is not None
    assert math.copysign(1.0, back.moments.mean[7]) == -1.0
    assert len(req.to_json()) * 5 < len(orjson.dumps(req))  # what it wrote whole
    assert record["moments"]["size"] == 1024
    # sparse moments of the first 300 inputs of the 1024 read back as 300
    mean = tuple(0.5 if i % 50 == 0 else 0.0 for i in range(300))
    head = replace(req, moments=FeatureMoments(4, mean, mean, "v1:key:sig"))
    assert orjson.loads(head.to_json())["moments"]["size"] == 300
    assert parse_label_request(head.to_json()) == head
    # whole lists of a wide request, as written before, are read as ever
    whole = {**req.to_dict(), "features": req.features, "moments": req.moments.to_dict()}
    assert parse_label_request(orjson.dumps(whole)) == req
    # a pending entry and a history step carry it the same way
    from service.records.state import PendingEntry, parse_pending_entry  # noqa: PLC0415

    entry = PendingEntry(req, 0, request_offset=5)
    assert b'"at":' in entry.to_json()
    assert parse_pending_entry(entry.to_json()) == entry


def test_narrow_or_dense_requests_are_written_whole_as_before() -> None:
    narrow = LabelRequest("r", "e", "m", [0.0] * 254 + [1.0], 0.3, 0.5, 0, 0.25, 3, 1.0, 2.0, 0.7)
    assert narrow.to_json() == orjson.dumps(narrow)
    undeclared = replace(_wide_request(), fields=None)  # a model of n_features: as ever
    assert undeclared.to_json() == orjson.dumps(undeclared)
    assert parse_label_request(undeclared.to_json()) == undeclared
    dense = replace(_wide_request(), features=[1.0] * 1024)
    record = orjson.loads(dense.to_json())
    assert record["features"] == [1.0] * 1024
    assert "at" in record["moments"]
    longest = [0.0] * MAX_SPARSE_SIZE + [1.0]  # more than a reader takes sparsely: whole
    assert isinstance(packed_numbers(longest), list)
    assert isinstance(packed_numbers(longest[1:]), dict)
    busy = replace(_wide_request(held=512), moments=None)  # half the inputs set
    assert isinstance(orjson.loads(busy.to_json())["features"], list)


@pytest.mark.parametrize(
    ("features", "says"),
    [
        ({"size": 4, "at": [1], "values": [1.0], "extra": 1}, "an object of size, at and values"),
        ({"size": 0, "at": [], "values": []}, "'size' must be an integer from 1"),
        ({"size": True, "at": [], "values": []}, "'size' must be an integer from 1"),
        ({"size": (1 << 23) + 1, "at": [0], "values": [1.0]}, "'size' must be an integer from 1"),
        ({"size": 10**30, "at": [0], "values": [1.0]}, "'size' must be an integer from 1"),
        ({"size": 4, "at": [2, 1], "values": [1.0, 1.0]}, "increasing indices below 4"),
        ({"size": 4, "at": [1, 1], "values": [1.0, 1.0]}, "increasing indices below 4"),
        ({"size": 4, "at": [-1], "values": [1.0]}, "increasing indices below 4"),
        ({"size": 4, "at": [4], "values": [1.0]}, "increasing indices below 4"),
        ({"size": 4, "at": [True], "values": [1.0]}, "increasing indices below 4"),
        ({"size": 4, "at": [1.0], "values": [1.0]}, "increasing indices below 4"),
        ({"size": 4, "at": "01", "values": [1.0]}, "increasing indices below 4"),
        ({"size": 4, "at": [1], "values": [1.0, 2.0]}, "as long as 'at'"),
        ({"size": 4, "at": [1], "values": ["x"]}, "must be a number"),
        ({"size": 4, "at": [1], "values": [True]}, "must be a number"),
        ("many", "must be a list of numbers, or an object"),
    ],
)
def test_a_sparse_feature_list_that_is_not_is_dead_lettered_naming_why(
    features: object, says: str
) -> None:
    base = LabelRequest("r", "e", "m", [1.0, 2.0], 0.3, 0.5, 0, 0.25, 3, 10.0, 20.0, 0.7)
    raw = json.dumps({**base.to_dict(), "features": features}).encode()
    with pytest.raises(BadMessage, match=re.escape(says)) as caught:
        parse_label_request(raw)
    assert caught.value.reason == "schema"


@pytest.mark.parametrize(
    "moments",
    [
        {"count": 2, "at": [3, 1], "mean": [0.0, 0.0], "m2": [0.0, 0.0]},
        {"count": 2, "at": [300], "mean": [0.0], "m2": [0.0]},
        {"count": 2, "at": [1], "mean": [0.0, 1.0], "m2": [0.0]},
        {"count": 2, "at": [1], "mean": [2e100], "m2": [0.0]},
        {"count": 2, "at": [1], "mean": [0.0], "m2": [-1.0]},
        {"count": 10**17, "at": [1], "mean": [0.0], "m2": [1e300]},
        {"count": 2, "at": {"1": 1}, "mean": [0.0], "m2": [0.0]},
        {"count": 2, "size": 257, "at": [1], "mean": [0.0], "m2": [0.0]},
        {"count": 2, "size": 0, "at": [], "mean": [], "m2": []},
        {"count": 2, "size": True, "at": [0], "mean": [0.0], "m2": [0.0]},
        {"count": 2, "size": 2.0, "at": [0], "mean": [0.0], "m2": [0.0]},
        {"count": 2, "size": 3, "at": [3], "mean": [0.0], "m2": [0.0]},
    ],
)
def test_sparse_moments_that_are_not_are_dead_lettered(moments: object) -> None:
    req = _wide_request(256, held=8)
    raw = json.dumps({**req.to_dict(), "moments": moments}).encode()
    assert _reason(parse_label_request, raw) == "schema"


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.integers(0, 599), st.floats(allow_nan=False, allow_infinity=False), max_size=200
    )
)
def test_any_feature_list_is_read_back_as_it_was_written(held: dict[int, float]) -> None:
    features = [0.0] * 600
    for i, v in held.items():
        features[i] = v
    written = packed_numbers(features)
    assert isinstance(written, dict) == (
        4 * sum(1 for v in features if v or math.copysign(1, v) < 0) <= 600
    )
    back = read_numbers(orjson.loads(orjson.dumps(written)), "features")
    assert [struct.pack("<d", v) for v in back] == [struct.pack("<d", v) for v in features]


def test_bad_message_rejects_reasons_outside_the_closed_set() -> None:
    with pytest.raises(ValueError, match="unknown dead-letter reason"):
        BadMessage("whatever", "x")


def test_dead_letter_keeps_text_or_base64_of_the_raw_input() -> None:
    text = orjson.loads(DeadLetter("features", "t", 1, 5, "not_json", "d", b"oops").to_json())
    assert text == {
        "topic": "t",
        "partition": 1,
        "offset": 5,
        "reason": "not_json",
        "detail": "d",
        "raw": "oops",
        "raw_encoding": "utf-8",
        "truncated": False,
    }
    binary = orjson.loads(DeadLetter("features", "t", 0, 0, "not_json", "d", b"\xff\x00").to_json())
    assert binary["raw_encoding"] == "base64"
    assert base64.b64decode(binary["raw"]) == b"\xff\x00"
    big = orjson.loads(DeadLetter("features", "t", 0, 0, "oversize", "d", b"a" * 100_000).to_json())
    assert big["truncated"] is True
    assert len(big["raw"]) < 100_000


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"id": "\\ud800x", "features": [1, 2, 3]}', "schema"),
        (b'{"id": "a", "features": {"\\udc00": 1}}', "schema"),
        (b'{"id": "a", "features": [1, 2, 1' + b"0" * 400 + b"]}", "non_finite"),
        (b'{"id": "a", "features": [1], "ts": 1' + b"0" * 400 + b"}", "non_finite"),
        (b"[" * 5000 + b"]" * 5000, "not_json"),
        (b"", "not_json"),
    ],
)
def test_hostile_feature_events_are_refused_not_crashed_on(raw: bytes, reason: str) -> None:
    assert _reason(parse_feature_event, raw, default_model="d") == reason


def test_labels_with_text_that_cannot_be_written_back_are_schema_errors() -> None:
    assert _reason(parse_label, b'{"request_id": "\\ud800", "model": "m", "label": 1}') == (
        "schema"
    )
    raw = b'{"request_id": "r", "model": "m", "label": 1, "labelled_by": "\\udfff"}'
    assert _reason(parse_label, raw) == "schema"


def test_dead_letter_of_a_message_with_broken_text_still_serialises() -> None:
    letter = DeadLetter("features", "t", 0, 1, "schema", "feature \udc00 bad", b'{"\\udc00": 1}')
    out = orjson.loads(letter.to_json())
    assert out["reason"] == "schema"
    assert "\\udc00" in out["detail"]


# --------------------------------------------------------------------------- label requests

_value = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0.0, 1.0),
    st.text(max_size=4),
    st.sampled_from(["\ud800", "x" * 257, ""]),
    st.just([1.0]),
    st.just({}),
    st.just({"s": 1}),
    st.just({"s": True}),
)
_FIELDS = (
    "request_id",
    "event_id",
    "model",
    "features",
    "score",
    "rho",
    "decided_label",
    "query_probability",
    "model_version",
    "requested_at",
    "expires_at",
    "priority",
    "shadow_labels",
    "served_by",
    "moments",
    "fields",
)


@st.composite
def _request_record(draw: st.DrawFn) -> dict[str, object]:
    """A label request as a scorer writes it, with some fields changed or left out."""
    record: dict[str, object] = LabelRequest(
        request_id="r",
        event_id="e",
        model="m",
        features=draw(st.lists(st.floats(-1e6, 1e6), max_size=4)),
        score=0.5,
        rho=1.0,
        decided_label=0,
        query_probability=0.5,
        model_version=2,
        requested_at=1.5,
        expires_at=9.5,
        priority=0.25,
    ).to_dict()
    if draw(st.booleans()):  # a declared model's: the event's fields alone
        record["features"] = None
        record["fields"] = draw(
            st.dictionaries(
                st.one_of(st.text(max_size=3), st.sampled_from(["\ud800", "x" * 300, ""])),
                _value,
                max_size=3,
            )
        )
    features = record["features"]
    if draw(st.booleans()) and isinstance(features, list):  # moments as a scorer writes them
        record["moments"] = {"count": 3, "mean": [0.5] * len(features), "m2": [2.0] * len(features)}
    for name in draw(st.lists(st.sampled_from(_FIELDS), max_size=3)):
        if draw(st.booleans()):
            record.pop(name, None)
        else:
            record[name] = draw(_value)
    if draw(st.booleans()) and isinstance(record.get("features"), list):
        record["features"] = [*record["features"], draw(_value)]  # type: ignore[misc]
    return record


def _outcome(parse: object, raw: object) -> object:
    try:
        return parse(raw)  # type: ignore[operator]
    except BadMessage as bad:
        return (bad.reason, bad.detail)


@settings(max_examples=400, deadline=None)
@given(_request_record())
def test_a_label_request_parses_as_checking_it_field_by_field_does(
    record: dict[str, object],
) -> None:
    raw = json.dumps(record).encode()  # NaN, Infinity and lone surrogates as Python writes them
    by_field = _outcome(lambda r: _label_request(obj(decode_json(r))), raw)
    assert _outcome(parse_label_request, raw) == by_field
    assert _outcome(label_request_from_dict, json.loads(raw)) == _outcome(
        _label_request, json.loads(raw)
    )


def test_sparse_moments_of_more_than_a_reader_spreads_are_refused_for_any_width() -> None:
    """A request's features may stand for millions of numbers (kept as their entries), its
    moments are read whole: a few bytes claiming 2^17 of them are refused before any list
    of that size is made, however wide the request says it is."""
    wide = {"size": 1 << 20, "at": [0, 5], "values": [1.0, 2.0]}
    base = _wide_request(256, held=8).to_dict()
    most = {"count": 2, "size": MAX_SPREAD_SIZE, "at": [0], "mean": [1.0], "m2": [0.0]}
    request = parse_label_request(json.dumps({**base, "features": wide, "moments": most}).encode())
    assert len(request.features) == 1 << 20
    assert request.moments is not None
    assert len(request.moments.mean) == MAX_SPREAD_SIZE
    beyond = {**most, "size": MAX_SPREAD_SIZE + 1}
    raw = json.dumps({**base, "features": wide, "moments": beyond}).encode()
    with pytest.raises(
        BadMessage, match=f"moments 'size' must be an integer from 1 to {MAX_SPREAD_SIZE}"
    ):
        parse_label_request(raw)
