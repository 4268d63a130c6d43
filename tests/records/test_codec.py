"""The model-state encoder refuses every non-finite number wherever it sits."""

from __future__ import annotations

import math
import struct
import tracemalloc
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.records.codec import (
    MAX_SPARSE_SIZE,
    SPARSE_FROM,
    BadMessage,
    RecordError,
    SparseNumbers,
    _all_finite,
    array_of,
    decode_object,
    dumps,
    encode_finite,
    numbers_of,
    packed_numbers,
    read_numbers,
)


@pytest.mark.parametrize(
    "state",
    [
        {"w": [1.0, math.nan]},
        {"w": [1.0, 2, math.inf]},
        {"recall": [{"x": [0.0, -math.inf]}, "tag"]},
        {"mixed": [1.0, "a", [2.0, math.nan]]},
        {"ints": [2**62, 3, math.nan]},
        {"a": np.array([1.0, np.nan])},
        {"nested": {"deep": [[1.0], [None, math.nan]]}},
    ],
)
def test_a_non_finite_number_anywhere_is_refused(state: dict[str, object]) -> None:
    with pytest.raises(RecordError, match="non-finite"):
        encode_finite(state)


def test_finite_states_with_nulls_strings_and_wide_ints_pass() -> None:
    state = {
        "w": [1.0, -2.5, 3],
        "last": None,
        "rng": {"inc": str(2**100)},
        "records": [{"x": [0.5, 1e308]}, None, "mirror"],
        "wide": [2**62, 1.0],
    }
    assert decode_object(encode_finite(state)) == state


def _all_finite_by_recursion(value: object) -> bool:
    """The check as first written (one call per container): what the walk must agree with."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite_by_recursion(v) for v in value.values())
    if isinstance(value, list | tuple):
        try:
            return all(map(math.isfinite, value))  # type: ignore[arg-type]
        except (TypeError, OverflowError):
            return all(_all_finite_by_recursion(v) for v in value)
    if isinstance(value, np.ndarray):
        return value.dtype.kind not in "fc" or bool(np.isfinite(value).all())
    return True


_numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=1e300, max_value=1.7e308),  # finite, whose sums overflow
    st.integers(),
    st.integers(min_value=2**64, max_value=2**1100),  # past a float
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True).map(np.float64),
    st.floats(width=32, allow_nan=True, allow_infinity=True).map(np.float32),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(np.int64),
)
_leaves = st.one_of(
    _numbers,
    _numbers,
    st.none(),
    st.text(max_size=4),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=3).map(np.array),
    st.lists(st.floats(width=32), max_size=3).map(lambda v: np.array(v, dtype=np.float32)),
    st.lists(st.integers(-5, 5), max_size=3).map(lambda v: np.array(v, dtype=np.int64)),
)
_states = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=3), inner, max_size=5),
    ),
    max_leaves=30,
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_states)
def test_the_finiteness_walk_agrees_with_the_recursive_check(state: object) -> None:
    assert _all_finite(state) is _all_finite_by_recursion(state)


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.floats(allow_nan=False, allow_infinity=False) | st.none() | st.text(max_size=3),
        lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner),
        max_leaves=25,
    ),
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.integers(0, 10**6),
)
def test_one_non_finite_number_at_any_depth_is_refused(
    state: object, bad: float, where: int
) -> None:
    """A finite state encodes; the same state with one number made NaN or infinite, wherever
    it sits, is refused with the same error."""
    assert decode_object(encode_finite({"s": state})) == {"s": state}
    spots: list[tuple[list[object] | dict[str, object], object]] = []

    def collect(value: object) -> None:
        if isinstance(value, list):
            spots.extend((value, i) for i in range(len(value)))
            for v in value:
                collect(v)
        elif isinstance(value, dict):
            spots.extend((value, k) for k in value)
            for v in value.values():
                collect(v)

    top: list[object] = [state]
    collect(top)
    holder, key = spots[where % len(spots)]
    holder[key] = bad  # type: ignore[index]
    with pytest.raises(RecordError, match="^model state holds a non-finite number$"):
        encode_finite({"s": top})


_row = st.lists(
    st.one_of(st.just(0.0), st.just(-0.0), st.floats(-1e6, 1e6, allow_nan=False)),
    min_size=200,
    max_size=600,
)


@settings(max_examples=200, deadline=None)
@given(_row)
def test_a_row_kept_as_its_entries_is_written_as_one_searched_is(values: list[float]) -> None:
    row = np.array(values)
    kept = numbers_of(row)
    assert (type(kept) is SparseNumbers) == (len(values) >= SPARSE_FROM)
    assert kept == values
    assert list(kept) == values
    assert len(kept) == len(values)
    assert [kept[i] for i in range(len(values))] == values
    assert kept[-1] == values[-1]
    assert kept[3:9] == values[3:9]
    if isinstance(packed_numbers(values), dict):
        assert packed_numbers(kept) == packed_numbers(values)  # the kept entries, or a search
    else:
        assert packed_numbers(kept) == values
    assert [struct.pack("<d", v) for v in read_numbers(packed_numbers(kept), "f")] == [
        struct.pack("<d", v) for v in values
    ]
    # what is read back stays in its entries, equals the list, and is written as it reads
    written = packed_numbers(kept)
    back = read_numbers(orjson.loads(orjson.dumps(written)), "f")
    if isinstance(written, dict):
        assert type(back) is SparseNumbers  # (long rows with most numbers zero)
        assert back == kept
        assert kept == back
        assert back == values
    assert packed_numbers(back) == written
    assert array_of(back).tobytes() == row.tobytes()
    assert array_of(kept).tobytes() == row.tobytes()


def test_sparse_numbers_never_change_and_compare_by_value() -> None:
    s = SparseNumbers(300, np.array([2, 7]), np.array([1.5, -0.0]))
    t = SparseNumbers(300, np.array([2]), np.array([1.5]))
    assert s == t
    assert s == [0.0, 0.0, 1.5] + [0.0] * 297
    assert s != SparseNumbers(301, np.array([2]), np.array([1.5]))
    assert s != SparseNumbers(300, np.array([3]), np.array([1.5]))
    assert s != [0.0] * 300
    assert s != "x" * 300
    with pytest.raises(ValueError, match="read-only"):
        s.values[0] = 2.0
    with pytest.raises(ValueError, match="read-only"):
        s.at[0] = 3
    with pytest.raises(IndexError):
        s[300]
    with pytest.raises(TypeError):
        hash(s)


def test_a_huge_size_claimed_costs_the_entries_written() -> None:
    """A record claiming the most numbers with one written is read as that one entry: a
    few bytes never make a list of millions."""
    back = read_numbers({"size": MAX_SPARSE_SIZE, "at": [5], "values": [2]}, "features")
    assert type(back) is SparseNumbers
    assert len(back) == MAX_SPARSE_SIZE
    assert back.at.tolist() == [5]
    assert back[5] == 2.0
    assert packed_numbers(back) == {"size": MAX_SPARSE_SIZE, "at": [5], "values": [2.0]}
    with pytest.raises(BadMessage, match="size"):
        read_numbers({"size": MAX_SPARSE_SIZE + 1, "at": [5], "values": [2]}, "features")


def test_a_sparse_record_listing_a_zero_is_read_and_written_canonically() -> None:
    back = read_numbers({"size": 300, "at": [3, 9], "values": [0.0, 2.0]}, "features")
    assert isinstance(back, SparseNumbers)
    assert back.at.tolist() == [9]
    assert packed_numbers(back) == {"size": 300, "at": [9], "values": [2.0]}
    signed = read_numbers({"size": 300, "at": [3, 9], "values": [-0.0, 2.0]}, "features")
    assert packed_numbers(signed) == {"size": 300, "at": [3, 9], "values": [-0.0, 2.0]}


def _held_per_object(make: Any, n: int = 300) -> float:
    """The memory each of ``n`` objects ``make()`` returns holds while kept (traced)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [make() for _ in range(n)]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(kept) == n
    return held / n


def test_an_encoded_record_holds_memory_of_its_own_size() -> None:
    """A record kept for long (an answered request's mark, a history step) holds about its
    length, not the buffer orjson wrote it in (a power of two: 16 KiB for 1.5 KiB)."""
    record = {"features": np.random.default_rng(0).normal(size=68).tolist(), "id": "e1"}
    size = len(dumps(record))
    assert 1_000 < size < 2_000
    assert _held_per_object(lambda: dumps(record)) < size + 200
    assert _held_per_object(lambda: dumps({"a": 1})) < 200
