"""Rebuilding a model from its label log, without Kafka: the learner's code path, with what
the learner would skip skipped."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import orjson
import pytest

from service.config import Settings
from service.features import encoder_of
from service.records import Label, PendingEntry, RawMessage, parse_label_request
from service.stream.labels.protocol import apply_label
from service.stream.labels.rebuild import LogRecord, rebuild_model, summary
from service.stream.models.served import ServedModel, initial_envelope
from service.stream.scoring.decide import Limits, score_batch

SETTINGS = Settings(
    models={
        "m": {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.1},
        "other": {"algorithm": "dral", "cost": 0.25, "n_features": 3},
    },
    default_model="m",
)


def _requests(n: int) -> list[LogRecord]:
    cfg = SETTINGS.models["m"]
    rng = np.random.default_rng(3)
    msgs = [
        RawMessage(
            orjson.dumps({"id": f"e{i}", "features": rng.normal(size=3).tolist()}), "f", 0, i
        )
        for i in range(n)
    ]
    limits = Limits(default_model="m", request_ttl=100.0)
    out = score_batch({"m": ServedModel.initial("m", cfg)}, msgs, limits=limits, now=1000.0)
    return [LogRecord(0, i, 1_000_000, r.to_json()) for i, r in enumerate(out.label_requests)]


def _label(offset: int, request_id: str, y: int, at: float, model: str = "m") -> LogRecord:
    body = {"request_id": request_id, "model": model, "label": y}
    return LogRecord(0, offset, int(at * 1000), orjson.dumps(body))


def test_rebuild_applies_labels_in_log_order_and_skips_what_the_learner_skips() -> None:
    requests = _requests(20)
    ids = [orjson.loads(r.value)["request_id"] for r in requests]
    assert len(ids) >= 6
    labels = [
        _label(0, ids[0], 1, 1010.0),
        _label(1, "no-such-request", 1, 1010.0),  # unknown_request
        _label(2, ids[1], -1, 1020.0),
        _label(3, ids[0], -1, 1030.0),  # a second label: already_applied
        _label(4, ids[2], 1, 1200.0),  # after expires_at = 1100: expired
        _label(5, ids[3], 1, 1040.0, model="other"),  # another model's label
        _label(6, ids[4], -1, 1050.0),
        LogRecord(0, 7, 0, b"{not json"),
    ]
    # shuffled input: the rebuild sorts by (partition, offset)
    rebuilt = rebuild_model(SETTINGS, "m", requests[::-1], labels[::-1])
    cfg = SETTINGS.models["m"]
    state = initial_envelope("m", cfg)
    pending = {orjson.loads(r.value)["request_id"]: parse_label_request(r.value) for r in requests}
    for offset, rid, y, now in [
        (0, ids[0], 1, 1010.0),
        (2, ids[1], -1, 1020.0),
        (6, ids[4], -1, 1050.0),
    ]:
        entry = PendingEntry(pending[rid], 0)
        out = apply_label(cfg, state, entry, Label(rid, "m", y, "", None), offset, now=now)
        assert out.model is not None
        state = out.model
    # every version says where the reach of corrections begins: the first label kept
    assert rebuilt.model == state.replace(corrections_from=0)
    assert summary(rebuilt)["version"] == 3
    assert summary(rebuilt)["labels_offset"] == 6
    assert summary(rebuilt)["skipped"] == {
        "already_applied": 1,
        "expired": 1,
        "not_json": 1,
        "unknown_request": 1,
    }


def test_a_resent_request_does_not_reset_an_answered_one() -> None:
    requests = _requests(5)
    rid = orjson.loads(requests[0].value)["request_id"]
    again = LogRecord(0, 99, 1_000_000, requests[0].value)  # re-scored after a crash
    labels = [_label(0, rid, 1, 1010.0), _label(1, rid, 1, 1011.0)]
    rebuilt = rebuild_model(SETTINGS, "m", [*requests, again], labels)
    assert rebuilt.model.version == 1
    assert dict(rebuilt.skipped) == {"already_applied": 1}


@pytest.mark.parametrize("bits", [6, 10])  # 2^10 buckets: a learner that takes rows
def test_a_declared_models_requests_are_rebuilt_from_their_fields_as_from_their_inputs(
    bits: int,
) -> None:
    # a declared model's requests carry the event's fields alone: a rebuild encodes them as
    # the learner does, to the model a request carrying the scored inputs would have made
    # (the learner takes the fields as the entries they set, the inputs whole: the same
    # model, bit for bit); one whose fields do not fit the declaration is skipped, as the
    # learner refuses it
    declared = {
        "algorithm": "dsol",  # asks about every event
        "cost": 0.25,
        "fields": {"hash_bits": bits, "fields": {"a": "number", "c": "category", "t": "tokens"}},
    }
    settings = Settings(models={"d": declared}, default_model="d")
    cfg = settings.models["d"]
    rng = np.random.default_rng(8)
    events = [
        {
            "a": float(rng.normal()),
            "c": f"c{i % 3}",
            "t": [f"w{int(k)}" for k in rng.integers(0, 40, 9)],
        }
        for i in range(12)
    ]
    msgs = [
        RawMessage(orjson.dumps({"id": f"e{i}", "features": e}), "f", 0, i)
        for i, e in enumerate(events)
    ]
    limits = Limits(default_model="d", request_ttl=100.0)
    out = score_batch({"d": ServedModel.initial("d", cfg)}, msgs, limits=limits, now=1000.0)
    requests = out.label_requests
    assert len(requests) == len(events)
    assert all(q.features is None for q in requests)
    bad = replace(requests[5], fields={**(requests[5].fields or {}), "a": "1.5"})
    log = [LogRecord(0, i, 1_000_000, q.to_json()) for i, q in enumerate(requests)]
    log[5] = LogRecord(0, 5, 1_000_000, bad.to_json())
    labels = [
        _label(i, q.request_id, 1 if i % 2 else -1, 1010.0 + i, "d") for i, q in enumerate(requests)
    ]
    rebuilt = rebuild_model(settings, "d", log, labels)
    assert summary(rebuilt)["skipped"] == {"unknown_request": 1}
    encoder = encoder_of(cfg.fields)  # type: ignore[arg-type]
    state = initial_envelope("d", cfg)
    for i, q in enumerate(requests):
        if i == 5:
            continue
        scored = replace(q, features=encoder.dense(events[i]).tolist())  # the inputs, carried
        label = Label(q.request_id, "d", 1 if i % 2 else -1, "", None)
        applied = apply_label(cfg, state, PendingEntry(scored, 0), label, i, now=1010.0 + i)
        assert applied.model is not None
        state = applied.model
    assert rebuilt.model == state.replace(corrections_from=0)
