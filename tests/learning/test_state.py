"""State records: versioned, JSON-safe, bit-exact, and clear about what to do when unreadable."""

from __future__ import annotations

import copy
import json
import math
import struct
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from service.learning import (
    DSAL,
    KernelDSAL,
    LearningError,
    StateError,
    learner_from_state,
    make_learner,
)
from service.learning import state as st

from .strategies import noisy_stream


def trained_dsal() -> DSAL:
    learner = DSAL(n_features=3, cost=0.25, seed=2)
    X, y = noisy_stream(40, 3, seed=5)
    for x, label in zip(X, y, strict=True):
        learner.update(x, label)
    return learner


def test_record_has_the_documented_envelope() -> None:
    state = trained_dsal().to_state()
    assert state["format"] == "abstain.learner"
    assert state["version"] == 1
    assert state["algorithm"] == "dsal"
    assert set(state["params"]) == {"n_features", "cost", "gamma", "eta", "seed"}
    assert {"w", "rho", "steps", "rng"} <= set(state["learned"])
    # strict JSON: no NaN/inf, only plain types
    json.dumps(state, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(hst.lists(hst.floats(allow_nan=False, allow_infinity=False), min_size=3, max_size=3))
def test_weights_survive_json_bit_for_bit(values: list[float]) -> None:
    learner = DSAL(n_features=3, cost=0.25, w=values)
    back = DSAL.from_state(json.loads(json.dumps(learner.to_state())))
    assert [v.hex() for v in back.w.tolist()] == [float(v).hex() for v in values]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.update(format="pickle"), "format"),
        (lambda s: s.update(version=2), "version 2 is not readable"),
        (lambda s: s.update(version=True), "version"),
        (lambda s: s.update(algorithm="svm"), "unknown algorithm"),
        (lambda s: s["learned"].update(w=[1.0, 2.0]), "shape"),
        (lambda s: s["learned"].update(w=[1.0, "x", 2.0]), "w"),
        (lambda s: s["learned"].update(w=[1.0, math.nan, 2.0]), "non-finite"),
        (lambda s: s["learned"].update(rho=-1.0), "rho"),
        (lambda s: s["learned"].update(steps=-3), "steps"),
        (lambda s: s["learned"].update(rng={"bit_generator": "MT19937"}), "rng"),
        (lambda s: s["params"].update(cost=0.9), "cost"),
        (lambda s: s["params"].update(colour="red"), "unknown hyperparameters"),
        (lambda s: s.update(params=[]), "params"),
    ],
)
def test_unreadable_state_raises_state_error(mutate: Any, message: str) -> None:
    state = trained_dsal().to_state()
    mutate(state)
    with pytest.raises(StateError, match=message) as info:
        learner_from_state(state)
    assert isinstance(info.value, LearningError)


def test_unknown_version_tells_the_operator_what_to_do() -> None:
    state = trained_dsal().to_state()
    state["version"] = 7
    with pytest.raises(StateError) as info:
        learner_from_state(state)
    text = str(info.value)
    assert "upgrade abstain" in text
    assert "replaying its label log" in text


def test_not_a_dict_is_refused() -> None:
    for bad in (None, [], "abc", 3):
        with pytest.raises(StateError, match="JSON object"):
            learner_from_state(bad)


def test_class_from_state_refuses_another_algorithm() -> None:
    state = trained_dsal().to_state()
    with pytest.raises(StateError, match="not 'kernel-dsal'"):
        KernelDSAL.from_state(state)


def test_dumps_and_loads_wrap_json_errors() -> None:
    with pytest.raises(StateError, match="JSON-safe"):
        st.dumps({"w": math.nan})
    with pytest.raises(StateError, match="valid JSON"):
        st.loads("{not json")
    state = trained_dsal().to_state()
    assert st.loads(st.dumps(state)) == state


def test_generator_state_round_trips() -> None:
    rng = np.random.default_rng(123)
    rng.random(5)
    clone = st.rng_from_state(json.loads(json.dumps(st.rng_state(rng))))
    assert clone.random(3).tolist() == rng.random(3).tolist()


@pytest.mark.parametrize(
    "make", [trained_dsal, lambda: KernelDSAL(n_features=3, cost=0.25, seed=4)]
)
def test_orjson_round_trip_gives_identical_future_decisions(make: Any) -> None:
    learner = make()
    for _ in range(7):  # advance the generator past its initial state
        learner.decide(np.array([0.1, -0.2, 0.3]))
    clone = learner_from_state(orjson.loads(orjson.dumps(learner.to_state())))
    X, y = noisy_stream(30, 3, seed=9)
    for x, label in zip(X, y, strict=True):
        a, b = learner.decide(x), clone.decide(x)
        assert (a.label, a.query, a.score, a.rho) == (b.label, b.query, b.score, b.rho)
        learner.update(x, label)
        clone.update(x, label)
    assert clone.to_state() == learner.to_state()


def test_generator_words_are_decimal_strings_and_ints_are_still_read() -> None:
    rng = np.random.default_rng(7)
    rng.random(3)
    state = st.rng_state(rng)
    assert all(isinstance(v, str) for v in state["state"].values())
    as_ints = {**state, "state": {k: int(v) for k, v in state["state"].items()}}
    assert st.rng_from_state(as_ints).random(4).tolist() == rng.random(4).tolist()


@pytest.mark.parametrize("word", ["-5", "12a", 1.5, None, True])
def test_corrupt_generator_word_is_a_state_error(word: Any) -> None:
    state = st.rng_state(np.random.default_rng(1))
    state["state"]["inc"] = word
    with pytest.raises(StateError, match="rng.state.inc"):
        st.rng_from_state(state)


_bits = hst.sampled_from([0.0, -0.0, 1.0, -2.5, 1e-300, 5e-324, 1e300])


@settings(max_examples=150, deadline=None)
@given(
    hst.integers(1, 700),
    hst.lists(hst.tuples(hst.integers(0, 699), _bits), max_size=300),
    hst.lists(hst.tuples(hst.integers(0, 699), _bits), max_size=300),
    hst.booleans(),
)
def test_a_list_made_from_the_last_one_is_the_list_made_afresh_bit_for_bit(
    n: int,
    old_set: list[tuple[int, float]],
    new_set: list[tuple[int, float]],
    touched: bool,
) -> None:
    old, new = np.zeros(n), np.zeros(n)
    for i, v in old_set:
        old[i % n] = v
    new[:] = old
    for i, v in new_set:
        new[i % n] = v
    since = st.float_list(old)
    if touched:  # a list changed since it was made is never made from
        since.append(9.0)
    made = st.float_list(new, since=since)
    fresh = st.float_list(new)
    assert type(made) is st.FloatList
    assert made.array is not None
    assert made.array.tobytes() == new.tobytes() == fresh.array.tobytes()
    assert [struct.pack("<d", v) for v in made] == [struct.pack("<d", v) for v in fresh]
    shared = sum(a is b for a, b in zip(made, since, strict=False))
    changed = int((old.view(np.int64) != new.view(np.int64)).sum())
    if not touched and n >= st.SHARED_FROM and 4 * changed <= n:
        assert shared == n - changed  # the floats that did not move are the same objects
    else:
        assert shared == 0


def test_a_learners_next_state_shares_what_a_label_left_and_a_copy_starts_afresh() -> None:
    learner = make_learner("dsol", n_features=1000, cost=0.25, update_rule="normalized")
    learner.update(np.ones(1000), -1)  # every weight set: the weights are written whole
    x = np.zeros(1000)
    x[[3, 50, 999]] = 1.0
    learner.update(x, 1)
    first = learner.to_state()["learned"]["w"]
    learner.update(x, -1)
    second = learner.to_state()["learned"]["w"]
    assert sum(a is b for a, b in zip(first, second, strict=True)) == 997
    assert second == learner.w.tolist()
    twin = copy.deepcopy(learner)
    assert twin.to_state() == learner.to_state()
    assert not any(a is b for a, b in zip(twin.to_state()["learned"]["w"], second, strict=True))
