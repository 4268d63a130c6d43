"""Model envelopes: a learned number beyond the bound is never written nor read."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from service.config import ModelConfig
from service.records import BadMessage, ModelEnvelope, RecordError, parse_model_envelope
from service.records.state import MAX_MAGNITUDE
from service.stream.models.served import initial_envelope

CONFIG = ModelConfig(algorithm="dsal", cost=0.25, n_features=3)


def with_w(w: list[float], rho: float = 1.0) -> ModelEnvelope:
    env = initial_envelope("m", CONFIG)
    learner = orjson.loads(orjson.dumps(dict(env.learner)))
    learner["learned"]["w"], learner["learned"]["rho"] = w, rho
    return env.replace(version=3, learner=learner)


@pytest.mark.parametrize(
    ("w", "rho"),
    [([1e308, 0.0, 0.0, 0.0], 1.0), ([0.0, -1e100, 0.0, 0.0], 1.0), ([0.0] * 4, 2e150)],
)
def test_a_learned_number_beyond_the_bound_is_refused_both_ways(w: list[float], rho: float) -> None:
    env = with_w(w, rho)
    with pytest.raises(RecordError, match="magnitude"):
        env.to_json()
    raw = orjson.dumps(env.to_dict())  # as a forger writes it
    with pytest.raises(BadMessage, match="schema: .*magnitude"):
        parse_model_envelope(raw, model="m")


def test_numbers_below_the_bound_and_configured_params_pass() -> None:
    env = with_w([9.9e99, -1e99, 1e-300, 0.0], rho=-9e99)
    assert parse_model_envelope(env.to_json(), model="m") == env
    eta = initial_envelope(
        "b", ModelConfig(algorithm="dsal", cost=0.25, n_features=3, hyperparameters={"eta": 1e300})
    )
    assert parse_model_envelope(eta.to_json(), model="b") == eta  # a step size is no weight
    big = np.full(4, MAX_MAGNITUDE)
    with pytest.raises(RecordError):
        with_w([0.0] * 4).replace(learner={"learned": {"w": big}}).to_json()


@pytest.mark.parametrize(
    "literal",
    [b"1E100", b"1e100", b"1e+0100", b"-2.5E+123", b"1" + b"0" * 100, b"1" + b"0" * 100 + b".25"],
)
def test_a_forged_number_beyond_the_bound_is_refused_however_it_is_written(literal: bytes) -> None:
    # not only as orjson writes it (1e+100): an upper-case exponent, one with leading zeros,
    # a mantissa of 101 digits
    written = orjson.dumps(with_w([0.0, 1.0, 2.0, 3.0]).to_dict())
    raw = written.replace(b"[0.0,1.0,", b"[" + literal + b",1.0,")
    assert literal in raw
    with pytest.raises(BadMessage, match="schema: .*magnitude"):
        parse_model_envelope(raw, model="m")
    below = parse_model_envelope(raw.replace(literal, b"9" * 99), model="m")  # about 1e99
    assert below.learner["learned"]["w"][0] == pytest.approx(1e99)


def test_a_record_read_to_serve_says_so_and_nothing_else_does() -> None:
    """What the models topic carries is marked ``serving`` (both encodings read it back);
    a whole state is written without the mark, as before it existed; anything but true or
    false there is refused."""
    whole = with_w([0.5, -0.25, 1.0, 0.0])
    served = whole.served()
    assert (whole.serving, served.serving, served.served() is served) == (False, True, True)
    assert "serving" not in whole.to_dict()
    assert served.to_dict()["serving"] is True
    assert served.learner["recall"] == {}
    assert whole.learner["recall"] != {}
    for encoded in (served.to_json(), served.to_bytes()):
        assert parse_model_envelope(encoded, model="m") == served
    assert parse_model_envelope(whole.to_bytes(), model="m").serving is False
    for value in (b'"yes"', b"1", b"null"):
        raw = whole.to_json()[:-1] + b',"serving":' + value + b"}"
        with pytest.raises(BadMessage, match="'serving' must be true or false"):
            parse_model_envelope(raw, model="m")
