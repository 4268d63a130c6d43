"""The packed form of model versions: the same record back, bit for bit, and anything else
a clear refusal (a version record is read from topics anyone with write access can fill)."""

from __future__ import annotations

import math
import re
import struct
from typing import Any

import cramjam
import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.config import ModelConfig
from service.learning.state import FrozenRecord, IndexList, float_list
from service.records import BadMessage, RecordError, parse_model_envelope
from service.records.packed import (
    COMPRESS_FROM,
    EXPANSION,
    MAGIC,
    MAGIC_2,
    MAX_ELEMENTS,
    MIN_PACKED,
    ZMAGIC,
    check,
    checked,
    header_of,
    pack,
    squeeze,
    unpack,
)
from service.records.state import MAX_MAGNITUDE
from service.stream.models.served import initial_envelope

finite = st.floats(allow_nan=False, allow_infinity=False)
scalars = st.one_of(
    finite, st.integers(-(2**53), 2**53), st.booleans(), st.none(), st.text(max_size=5)
)
float_lists = st.one_of(
    st.lists(finite, min_size=MIN_PACKED, max_size=40),
    # mostly one fill value: the sparse form, with -0.0 and the fill among the others
    st.builds(
        lambda fill, n, picks: [picks.get(i, fill) for i in range(n)],
        st.sampled_from([0.0, 1.0]),
        st.integers(MIN_PACKED, 600),
        st.dictionaries(st.integers(0, 599), finite, max_size=30),
    ),
)
#: increasing indices (where one list differs from another), written as their gaps
index_lists = st.builds(
    lambda picks: IndexList(np.array(sorted(picks), dtype=np.int64)),
    st.sets(st.integers(0, (1 << 32) - 1), max_size=40),
)
records = st.recursive(
    st.one_of(scalars, float_lists, index_lists),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)


def bits(value: Any) -> Any:
    """``value`` with every float as its bit pattern (so -0.0 and 0.0 differ)."""
    if isinstance(value, float):
        return ("f", struct.pack("<d", value))
    if isinstance(value, dict):
        return {k: bits(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [bits(v) for v in value]
    return value


@given(st.dictionaries(st.text(max_size=6), records, max_size=6))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_a_record_reads_back_bit_for_bit(record: dict[str, Any]) -> None:
    raw = pack(record)
    assert raw.startswith(MAGIC)
    assert bits(unpack(raw)) == bits(record)


@given(st.dictionaries(st.text(max_size=6), records, max_size=6))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_the_most_bytes_counted_is_never_below_what_is_packed(record: dict[str, Any]) -> None:
    """What a learner counts of a version without encoding it bounds its packed length (so
    a version counted within a record's size is one that fits), and within a few times."""
    most = checked(record)[1]
    assert most >= len(pack(record))
    frozen = {"r": FrozenRecord(record), "again": FrozenRecord(record)}
    assert checked(frozen)[1] >= len(pack(frozen))
    assert checked(frozen)[1] == checked(frozen)[1]  # the memo counts alike


def test_a_record_s_own_object_named_like_a_reference_reads_back_as_itself() -> None:
    for record in ({"$d": [0, 1]}, {"x": {"$s": []}}, {"$$": {"$d": [1.5] * 20}}):
        assert unpack(pack(record)) == record


def test_float_lists_go_to_the_arrays_and_the_rest_stays_json() -> None:
    wide = [i / 7 for i in range(1000)]
    record = {
        "w": wide,
        "untouched": [0.0] * 5000 + [2.5],  # sparse: one value of 5,001
        "short": [0.25, 0.5],
        "counts": list(range(40)),  # integers stay integers
        "params": {"scales": [1.5] * 40},  # hyperparameters stay as written
    }
    raw = pack(record)
    assert unpack(raw) == record
    assert type(unpack(raw)["counts"][0]) is int
    assert len(raw) < 8 * 1000 + 12 + 1000  # 8 bytes a weight, 12 a sparse value, a header
    assert b'"scales":[1.5,' in raw
    assert b'"short":[0.25,0.5]' in raw
    assert len(raw) * 2 < len(orjson.dumps(record))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["array", "scalar", "sparse"])
def test_a_non_finite_number_is_never_written(bad: float, where: str) -> None:
    record: dict[str, Any] = {"w": [0.5] * 20, "rho": 1.0, "z": [0.0] * 400}
    {"array": record["w"], "sparse": record["z"]}.get(where, [None])[0] = bad
    if where == "scalar":
        record["rho"] = bad
    with pytest.raises(RecordError, match="non-finite"):
        pack(record)


any_float = st.one_of(st.floats(), st.sampled_from([1e100, -1e100, 9.99e99, 1e308]))
wild_records = st.recursive(
    st.one_of(any_float, st.integers(-5, 5), st.lists(any_float, min_size=MIN_PACKED, max_size=20)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from("abc"), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(["w", "x"]), wild_records, max_size=3))
@settings(max_examples=400)
def test_checking_a_record_refuses_what_packing_refuses_and_no_more(
    record: dict[str, Any],
) -> None:
    """What a learner checks of a version it may never write is what writing it checks
    (settings, under ``params``, are neither walked nor judged: the envelope's test below)."""
    bound = 1e100
    refused: str | None = None
    try:
        raw = pack(record, bound=bound)
    except RecordError as exc:
        refused = str(exc)
    if refused is not None:
        with pytest.raises(RecordError) as checked:
            check(record, bound=bound)
        assert str(checked.value) == refused
        return
    # the numbers left in the header: one of the bound or more shows in it as e+NNN
    assert check(record, bound=bound) == (re.search(rb"e\+\d{3}", header_of(raw)) is not None)


def test_a_learned_number_beyond_the_bound_is_refused_both_ways() -> None:
    config = ModelConfig(algorithm="dsal", cost=0.25, n_features=30)
    env = initial_envelope("m", config)
    learner = orjson.loads(orjson.dumps(dict(env.learner)))
    learned = learner["champion"]["learned"]  # the adaptive wrapper's champion
    learned["w"] = [i / 3 for i in range(len(learned["w"]))]
    learned["w"][7] = -2e100
    forged = env.replace(learner=learner)
    with pytest.raises(RecordError, match="magnitude"):
        forged.to_bytes()
    with pytest.raises(RecordError, match="magnitude"):
        forged.check()  # what a learner checks of each version it makes
    raw = pack(forged.to_dict())  # as a forger writes it
    with pytest.raises(BadMessage, match="schema: .*magnitude"):
        parse_model_envelope(raw, model="m")
    learned["rho"] = 3e100  # a learned number left in the header
    learned["w"][7] = -9e99
    with pytest.raises(RecordError, match="magnitude"):
        env.replace(learner=learner).check()
    learned["rho"] = 1.0
    fine = env.replace(learner=learner)
    fine.check()
    assert parse_model_envelope(fine.to_bytes(), model="m") == fine
    learner["champion"]["params"] = {"limit": 1e200}  # a setting, not a learned number
    env.replace(learner=learner).check()
    env.replace(learner=learner).to_bytes()


def learned_everywhere(value: Any, rng: np.random.Generator) -> Any:
    """``value`` with every learned float list filled as learning fills it."""
    if isinstance(value, dict):
        return {k: v if k == "params" else learned_everywhere(v, rng) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) >= MIN_PACKED and all(type(v) is float for v in value):
            return rng.normal(size=len(value)).tolist()
        return [learned_everywhere(v, rng) for v in value]
    return value


def test_a_version_reads_the_same_in_either_form_and_packed_is_smaller() -> None:
    config = ModelConfig(algorithm="dsal", cost=0.25, n_features=68)
    env = initial_envelope("m", config)
    assert parse_model_envelope(env.to_bytes(), model="m") == env
    assert parse_model_envelope(env.to_json(), model="m") == env
    assert len(env.to_bytes()) < 0.8 * len(env.to_json())  # zeros: sparse
    rng = np.random.default_rng(0)
    learned = env.replace(
        pipeline=learned_everywhere(env.pipeline, rng), learner=learned_everywhere(env.learner, rng)
    )
    assert parse_model_envelope(learned.to_bytes(), model="m") == learned
    assert len(learned.to_bytes()) < 0.6 * len(learned.to_json())


def forge(header: Any, tail: bytes = b"") -> bytes:
    head = orjson.dumps(header)
    return MAGIC + struct.pack("<I", len(head)) + head + tail


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (MAGIC, "not a packed record"),
        (MAGIC + struct.pack("<I", 99) + b"[0,{}]", "header reaches past"),
        (forge({"a": 1}), r"not \[doubles, object\]"),
        (forge([1, {}]), r"not \[doubles, object\]"),  # doubles past the end
        (forge([0, {"w": {"$d": [0, 3]}}]), "reaches past"),
        (forge([1, {"w": {"$d": [-1, 1]}}], b"\0" * 8), "reaches past"),
        (forge([1, {"w": {"$d": [0, True]}}], b"\0" * 8), "malformed"),
        (forge([1, {"w": {"$d": "x"}}], b"\0" * 8), "malformed"),
        (forge([1, {}], struct.pack("<d", math.nan)), "non-finite"),
        (forge([1, {}], struct.pack("<d", 1e300)), "magnitude"),
        (forge([0, {"w": {"$s": [0, 4, 1, 0.5]}}], b"\0" * 12), "malformed"),  # fill
        (forge([0, {"w": {"$s": [0, 4, 5, 0.0]}}], b"\0" * 60), "malformed"),  # k > n
        (forge([0, {"w": {"$s": [0, 4, 1, 0.0]}}], b"\0" * 4), "reaches past"),
        (forge([0, {"w": {"$s": [0, 4, 1, 0.0]}}], struct.pack("<Id", 4, 1.0)), "out of order"),
        (
            forge([0, {"w": {"$s": [0, 9, 2, 0.0]}}], struct.pack("<IIdd", 3, 3, 1.0, 1.0)),
            "out of order",
        ),
        (
            forge([0, {"w": {"$s": [0, 9, 2, 0.0]}}], struct.pack("<IIdd", 5, 3, 1.0, 1.0)),
            "out of order",
        ),
        (forge([0, {"w": {"$s": [0, 4, 1, 0.0]}}], struct.pack("<Id", 1, math.inf)), "non-finite"),
        (forge([0, {"w": {"$z": [0, 9, 2, 0.0]}}], struct.pack("<IIdd", 3, 0, 1.0, 1.0)), "not"),
        (forge([0, {"w": {"$z": [0, 9, 2, 0.0]}}], struct.pack("<IIdd", 3, 6, 1.0, 1.0)), "order"),
        (forge([0, {"w": {"$z": [0, 9, 1, 0.0]}}], struct.pack("<I", 3)), "reaches past"),
        (forge([0, {"at": {"$i": [0, 3]}}], struct.pack("<III", 3, 1, 0)), "not increasing"),
        (forge([0, {"at": {"$i": [0, 3]}}], struct.pack("<II", 3, 1)), "reaches past"),
        (forge([0, {"at": {"$i": [0, -1]}}]), "malformed"),
        (forge([0, {"at": {"$i": [0, 2, 1]}}], struct.pack("<II", 3, 1)), "malformed"),
        (forge([0, {"rho": 1e200}]), "magnitude"),
        (MAGIC + struct.pack("<I", 3) + b"[0,", "not_json"),
    ],
)
def test_a_malformed_packed_record_is_refused_with_a_reason(raw: bytes, why: str) -> None:
    with pytest.raises(BadMessage, match=why):
        unpack(raw, bound=MAX_MAGNITUDE)


def test_the_earlier_form_is_read_as_it_was_written() -> None:
    """A version of the earlier form (``MAGIC_2``: a sparse array's indices as they are) is
    read as before; what is a reference only in the current form stays an object there."""
    tail = struct.pack("<II", 2, 7) + struct.pack("<dd", 1.5, 2.5)
    head = orjson.dumps([0, {"w": {"$s": [0, 20, 2, 0.0]}, "at": {"$i": [0, 2]}}])
    old = MAGIC_2 + struct.pack("<I", len(head)) + head + tail
    out = unpack(old)
    assert out["w"] == [0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 2.5] + [0.0] * 12
    assert out["at"] == {"$i": [0, 2]}
    now = pack({"w": out["w"], "at": IndexList(np.arange(3, 60, 3))})
    assert now[:4] == MAGIC
    back = unpack(now)
    assert back["w"] == out["w"]
    assert type(back["at"]) is IndexList
    assert back["at"] == list(range(3, 60, 3))


def test_a_wide_models_indices_are_written_as_gaps_that_compress() -> None:
    """Where a list of 2^18 numbers differs from another at 30,000 increasing indices, the
    indices take 4 bytes each packed and compress to well under 2: their gaps are small."""
    rng = np.random.default_rng(0)
    at = np.sort(rng.choice(1 << 18, 30_000, replace=False))
    raw = pack({"at": IndexList(at)})
    assert len(raw) < 4 * at.size + 200
    assert len(squeeze(raw)) < 1.5 * at.size
    assert unpack(squeeze(raw))["at"] == at.tolist()


def test_a_small_record_cannot_expand_without_bound() -> None:
    # a few hundred bytes naming the same sparse array again and again: refused before
    # anything of that size is made
    n = MAX_ELEMENTS // 4
    raw = forge([0, {"w": [{"$s": [0, n, 0, 0.0]}] * 5}])
    assert len(raw) < 300
    with pytest.raises(BadMessage, match="expands past"):
        unpack(raw)


def test_an_oversize_record_is_refused_before_it_is_read() -> None:
    raw = pack({"w": [0.5] * 1000})
    with pytest.raises(BadMessage, match="oversize"):
        unpack(raw, max_bytes=len(raw) - 1)


@given(st.binary(max_size=64), st.integers(0, 10_000), st.integers(0, 255))
@settings(max_examples=400)
def test_any_damage_is_a_refusal_or_a_finite_record(noise: bytes, at: int, byte: int) -> None:
    record = {"format": "x", "w": [i / 3 for i in range(50)], "z": [0.0] * 300 + [1.5]}
    raw = bytearray(pack(record))
    raw[at % len(raw)] = byte
    for damaged in (bytes(raw), bytes(raw) + noise, bytes(raw[: at % len(raw)])):
        try:
            out = unpack(damaged, bound=MAX_MAGNITUDE)
        except BadMessage:
            continue
        floats = np.array(
            [v for k in ("w", "z") if isinstance(out.get(k), list) for v in out[k]], dtype=object
        )
        assert all(isinstance(v, float) and math.isfinite(v) for v in floats)


# -- a frozen record (a remembered label, shared by many versions) is checked once -----------


def _frozen(x: list[float], **more: Any) -> FrozenRecord:
    return FrozenRecord(n=3, x=float_list(np.array(x)), y=1.0, p=0.5, loss=0.25, **more)


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=1, max_size=40))
@settings(max_examples=200)
def test_checking_a_frozen_record_says_what_checking_its_plain_copy_says(x: list[float]) -> None:
    record = {"labels": [_frozen(x)], "rho": 1.0}
    plain = {"labels": [dict(_frozen(x))], "rho": 1.0}
    for _ in range(2):  # the second time from its memo
        outcomes = []
        for r in (record, plain):
            try:
                outcomes.append(("ok", check(r, bound=1e100)))
            except RecordError as exc:
                outcomes.append(("refused", str(exc)))
        assert outcomes[0] == outcomes[1]


def test_a_frozen_record_changed_in_place_is_checked_again() -> None:
    record = _frozen([0.5] * 20)
    state = {"labels": [record]}
    assert check(state) is False
    assert record.memo  # remembered
    record["x"][3] = math.nan  # a list inside can still be changed: its array is dropped
    with pytest.raises(RecordError, match="non-finite"):
        check(state)
    with pytest.raises(TypeError, match="does not change"):
        record["y"] = math.nan


def test_a_frozen_record_s_memo_holds_for_its_bound_only() -> None:
    record = _frozen([0.5] * 20, big=1e120)
    assert check({"r": record}, bound=math.inf) is False
    assert check({"r": record}, bound=1e100) is True  # the header number judged anew
    record2 = _frozen([0.5] * 19 + [1e120])
    check({"r": record2})
    with pytest.raises(RecordError, match="magnitude"):
        check({"r": record2}, bound=1e100)


def test_a_frozen_record_packs_and_reads_back_as_its_plain_copy() -> None:
    record = {"labels": [_frozen([0.25] * 20), _frozen([1.0] * 3)]}
    check(record)
    assert bits(unpack(pack(record))) == bits(
        unpack(pack({"labels": [dict(r) for r in record["labels"]]}))
    )


def _wide_version() -> Any:
    """A declared model of 2^12 buckets whose learned lists are written whole: numbers of
    16 varying bits at most places, zero elsewhere."""
    config = ModelConfig.model_validate(
        {"algorithm": "dsal", "fields": {"hash_bits": 12, "fields": {"t": "tokens"}}}
    )
    env = initial_envelope("m", config)
    rng = np.random.default_rng(1)

    def fill(value: Any, n: int | None = None) -> Any:
        if isinstance(value, dict):
            params = value.get("params")
            if isinstance(params, dict) and type(params.get("n_features")) is int:
                n = params["n_features"]
            value = dict(value)
            pairs = [k for k in value if k.endswith("_at") and f"{k[:-3]}_to" in value]
            for key in [] if "fill" in value else pairs:
                assert n is not None  # a list written as its entries: whole (all zero)
                del value[key], value[f"{key[:-3]}_to"]
                value[key[:-3]] = [0.0] * n
            return {k: v if k == "params" else fill(v, n) for k, v in value.items()}
        if isinstance(value, list):
            if len(value) >= MIN_PACKED and all(type(v) is float for v in value):
                out = np.zeros(len(value))
                at = rng.random(len(value)) < 0.9
                out[at] = rng.integers(1, 2**16, int(at.sum())) / 2**10
                return out.tolist()
            return [fill(v, n) for v in value]
        return value

    return env.replace(pipeline=fill(env.pipeline), learner=fill(env.learner))


def test_a_large_version_is_written_compressed_and_reads_back_bit_for_bit() -> None:
    version = _wide_version()
    raw = version.to_bytes()
    whole = pack(version.to_dict(), bound=MAX_MAGNITUDE)
    assert len(whole) >= COMPRESS_FROM
    assert raw[:4] == ZMAGIC
    assert len(raw) < 0.7 * len(whole)
    back = parse_model_envelope(raw, model="m", max_bytes=len(raw))
    assert back == version
    assert squeeze(raw) == raw  # compressed once
    small = initial_envelope("m", ModelConfig(n_features=3)).to_bytes()
    assert small[:4] == MAGIC  # below the size: as it is


def forge_z(size: int, frame: bytes) -> bytes:
    return ZMAGIC + struct.pack("<I", size) + frame


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda raw, frame: ZMAGIC, "not a packed record"),
        (lambda raw, frame: forge_z(len(raw), b"garbage!" * 5000), "does not expand"),
        (lambda raw, frame: forge_z(len(raw), frame[:-10]), "does not expand"),
        (lambda raw, frame: forge_z(len(raw) + 1, frame), "expands to"),
        (lambda raw, frame: forge_z(len(raw) - 1, frame), "does not expand"),
        (lambda raw, frame: forge_z(2**31, frame), "claims"),  # refused before it is made
        (lambda raw, frame: forge_z(len(raw), forge_z(len(raw), frame)), "does not expand"),
        (lambda raw, frame: forge_z(100, bytes(cramjam.zstd.compress(b"{" * 100))), "not a"),
    ],
)
def test_a_malformed_compressed_record_is_refused_with_a_reason(make: Any, why: str) -> None:
    raw = pack(_wide_version().to_dict())
    frame = bytes(cramjam.zstd.compress(raw, level=1))
    with pytest.raises(BadMessage, match=why):
        unpack(make(raw, frame), max_bytes=1 << 20)


def test_a_small_compressed_record_cannot_expand_past_sixteen_times_its_size() -> None:
    zeros = bytes(cramjam.zstd.compress(MAGIC + b"\0" * (1 << 24), level=1))
    assert len(zeros) < 2000
    raw = forge_z((1 << 24) + 4, zeros)  # 16 MiB from 2 KB: refused before it is made
    with pytest.raises(BadMessage, match=f"at most {EXPANSION * len(raw)}"):
        unpack(raw)
    with pytest.raises(BadMessage, match="oversize"):  # the limit is on what was sent
        unpack(raw, max_bytes=len(raw) - 1)


def test_the_header_of_a_compressed_record_is_the_packed_ones() -> None:
    raw = pack(_wide_version().to_dict())
    assert header_of(squeeze(raw)) == header_of(raw)


@given(st.dictionaries(st.text(max_size=6), records, max_size=6))
@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_lists_counted_one_by_one_or_all_at_once_are_written_alike(
    record: dict[str, Any],
) -> None:
    from service.records import packed

    at_once = pack(record)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packed, "_COUNTED_EACH", 0)  # every list counted on its own
        each = pack(record)
    assert each == at_once
    assert bits(unpack(each)) == bits(record)
