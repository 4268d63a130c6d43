"""Without ``snapshot_key``, a snapshot on the models topic never makes a model that cannot
score, on a real broker:

1. A snapshot with huge but finite weights (1e308) is refused when read (``schema``, on the
   models topic): the events go on being decided by the version served.
2. A snapshot whose learned numbers are all within the bound but that overflows on every
   event (a standardiser centred on 9e99 dividing by 1e-154, weights of 1e99) is served
   until the first batch it fails: that batch is decided by the last version that scored,
   the snapshot is dead-lettered (``non_finite``, naming the models topic and its offset),
   and no event is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from faults.checks import champion_record
from faults.kafkaio import Out, produce_records
from faults.workers import wait_until

from service.config import ModelConfig
from service.records import ModelEnvelope
from service.stream.models.served import initial_envelope

pytestmark = pytest.mark.integration

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py


def forged(config: dict[str, Any], version: int, *, overflow: bool) -> bytes:
    """A snapshot of model ``m``: weights of 1e308, or (``overflow``) one within the bound
    that overflows on every event."""
    env = initial_envelope("m", ModelConfig(**config))
    learner = orjson.loads(orjson.dumps(dict(env.learner)))
    pipeline = orjson.loads(orjson.dumps(dict(env.pipeline)))
    inner = champion_record(learner)  # the learner that decides (inside the adaptive wrapper)
    n = len(inner["learned"]["w"])
    inner["learned"]["w"] = [1e99 if overflow else 1e308] * n
    if overflow:
        scaler = pipeline["steps"][0]
        width = len(scaler["learned"]["m2"])
        scaler["params"]["min_std"] = 1e-300
        scaler["learned"].update(count=10, mean=[9e99] * width, m2=[1e-307] * width)
    state = ModelEnvelope("m", version, pipeline, learner).to_dict()
    return orjson.dumps(state)  # as a forger writes it (no checks)


def decide(service: Service, kio: KafkaIO, prefix: str, n: int = 20) -> list[dict[str, Any]]:
    t = service.topics
    events = [
        (f"{prefix}{i}", {"id": f"{prefix}{i}", "model": "m", "features": [0.1 * i, -1.0, 2.0]})
        for i in range(n)
    ]
    kio.produce_json(t["features"], events)
    ids = {k for k, _ in events}

    def seen(rs: list[Any]) -> set[str]:
        return {r.json()["id"] for r in rs if r.json().get("id") in ids}

    def dead_ids() -> set[str]:
        rows = [r.json() for r in kio.read(t["dead_letters"]) if r.json()["topic"] == t["features"]]
        return {json.loads(d["raw"]).get("id") for d in rows}

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        decided = seen(kio.read(t["decisions"]))
        if decided | (dead_ids() & ids) >= ids:
            break
        time.sleep(0.3)
    assert not dead_ids() & ids, "events were dead-lettered"
    return [r.json() for r in kio.read(t["decisions"]) if r.json()["id"] in ids]


def models_dead(service: Service, kio: KafkaIO) -> list[tuple[int, str]]:
    rows = [r.json() for r in kio.read(service.topics["dead_letters"])]
    return [(d["offset"], d["reason"]) for d in rows if d["topic"] == service.topics["models"]]


def test_a_snapshot_that_cannot_score_never_dead_letters_the_events(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    service = service_factory(partitions={"features": 1, "decisions": 1, "labels": 1, "models": 1})
    worker = service.start()
    worker.wait_ready()
    config = service.config["models"]["m"]
    t, kio = service.topics, kafka_io
    assert {d["model_version"] for d in decide(service, kio, "a")} == {0}
    # 1. huge weights: refused when read
    [(_, huge)] = produce_records(
        service.bootstrap, t["models"], [Out(b"m", forged(config, 5, overflow=False))]
    )
    wait_until(lambda: (huge, "schema") in models_dead(service, kio), 30, "the refusal")
    assert {d["model_version"] for d in decide(service, kio, "b")} == {0}
    # 2. within the bound, overflows on every event: refused at its first batch
    [(_, bad)] = produce_records(
        service.bootstrap, t["models"], [Out(b"m", forged(config, 6, overflow=True))]
    )
    wait_until(
        lambda: json.loads(worker.get("/readyz")[1])["models"]["m"] == 6,
        30,
        "the snapshot read",
        every=0.05,
    )
    assert {d["model_version"] for d in decide(service, kio, "c")} == {0}
    assert (bad, "non_finite") in models_dead(service, kio)
    assert json.loads(worker.get("/readyz")[1])["models"]["m"] == 0
    assert (
        worker.metric("abstain_dead_letters_total", {"source": "models", "reason": "non_finite"})
        == 1
    )
    assert not worker.metric(
        "abstain_dead_letters_total", {"source": "features", "reason": "non_finite"}
    )
