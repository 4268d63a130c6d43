"""Crash and restart on a real broker: a killed worker's successor recovers the model from
the table changelog, re-consumes what was not committed without applying any label twice,
and goes on learning exactly as an offline replay of the same labels."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from faults.checks import learn_offline

Service = KafkaIO = Any  # fixtures' types live in conftest.py
MODEL = {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05}


def _truth(x: list[float]) -> int:
    return 1 if x[0] - x[2] > 0 else -1


def _replay(cfg: dict[str, Any], labelled: list[tuple[dict[str, Any], int]]) -> tuple[Any, float]:
    """Offline: the same labels, in the same order, through the learner a worker serves (each
    with its request, whose moments the standardisers learn from as the worker's do)."""
    _, learner = learn_offline("offline", cfg, labelled)
    return learner.w, learner.rho


def _versions(kio: KafkaIO, topic: str) -> list[int]:
    return [r.json()["version"] for r in kio.read(topic) if r.key == b"r"]


def _wait_metric(worker: Any, name: str, labels: dict[str, str], value: float) -> None:
    deadline = time.monotonic() + 30
    while worker.metric(name, labels) != value and time.monotonic() < deadline:
        time.sleep(0.3)
    assert worker.metric(name, labels) == value


def test_killed_worker_is_recovered_and_redelivered_labels_change_nothing(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    # no offset commit before the kill: everything is consumed a second time after it
    service = service_factory(models={"r": MODEL}, default_model="r", commit_interval_seconds=600)
    t = service.topics
    first = service.start()
    first.wait_ready()
    rng = np.random.default_rng(11)
    events = [{"id": f"r-{i}", "features": rng.normal(size=3).round(4).tolist()} for i in range(30)]
    kafka_io.produce_json(t["features"], [(e["id"], e) for e in events])
    reqs = kafka_io.wait_for(t["label_requests"], lambda rs: len(rs) >= 8)
    requests = [r.json() for r in reqs][:8]
    labels = [
        {"request_id": q["request_id"], "model": "r", "label": _truth(q["features"])}
        for q in requests
    ]
    kafka_io.produce_json(t["labels"], [("r", lab) for lab in labels[:6]])
    kafka_io.wait_for(t["models"], lambda rs: 6 in [r.json()["version"] for r in rs])
    time.sleep(1.0)  # let the table changelog writes leave the producer
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL

    second = service.start()
    ready = second.wait_ready()
    assert ready["models"]["r"] == 6  # the newest snapshot, before any new label
    _wait_metric(
        second, "abstain_labels_ignored_total", {"model": "r", "reason": "redelivered"}, 6.0
    )
    assert second.metric("abstain_labels_applied_total", {"model": "r"}) == 0.0
    # each version once in the learner's table, the newest of each group of labels (the
    # scorers are sent the same): nothing was written again after the restart
    stored = _versions(kafka_io, service.changelog("models"))
    assert stored == sorted(set(stored))
    assert stored[-1] == 6
    assert _versions(kafka_io, t["models"])[-1] == 6
    # events whose offsets were not committed are scored again: same ids, never a new one
    decided = kafka_io.read(t["decisions"])
    assert len(decided) >= 30
    assert {r.json()["id"] for r in decided} == {e["id"] for e in events}

    # the model and the pending requests came back from the changelog: learning goes on
    kafka_io.produce_json(t["labels"], [("r", lab) for lab in labels[6:8]])
    kafka_io.wait_for(t["models"], lambda rs: 8 in [r.json()["version"] for r in rs])
    final = [r.json() for r in kafka_io.read(t["models"]) if r.key == b"r"][-1]
    w, rho = _replay(MODEL, [(q, lab["label"]) for q, lab in zip(requests, labels, strict=True)])
    np.testing.assert_allclose(
        final["learner"]["champion"]["learned"]["w"], w, rtol=1e-12, atol=1e-15
    )
    assert final["learner"]["champion"]["learned"]["rho"] == pytest.approx(rho, rel=1e-12)
    assert final["version"] == 8
    assert final["labels_applied"] == 8

    # a label sent again as a new message is dead-lettered, not applied twice
    kafka_io.produce_json(t["labels"], [("r", labels[0])])
    kafka_io.wait_for(
        t["dead_letters"],
        lambda rs: any(r.json()["reason"] == "already_applied" for r in rs),
    )
    assert _versions(kafka_io, t["models"])[-1] == 8
    body = json.loads(second.get("/readyz")[1])
    assert body["models"]["r"] == 8
    assert second.stop(signal.SIGTERM) == 0
