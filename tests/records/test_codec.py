"""The model-state encoder refuses every non-finite number wherever it sits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.records.codec import RecordError, decode_object, encode_finite


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
