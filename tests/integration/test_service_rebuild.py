"""A kernel model through the real stream, and ``abstain rebuild``: replaying the label log
from the topics gives the state the worker's learner holds."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py

MODELS: dict[str, dict[str, Any]] = {
    "lin": {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05},
    "ker": {"algorithm": "kernel-dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05},
}


def _truth(x: list[float]) -> int:
    return 1 if x[0] + x[1] > 0 else -1


def _states(kio: KafkaIO, topic: str, model: str) -> list[dict[str, Any]]:
    return [r.json() for r in kio.read(topic) if r.key == model.encode()]


@pytest.fixture(scope="module")
def labelled(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> tuple[Service, Worker, dict[str, int]]:
    """A worker that has scored 30 events per model and applied 8 labels per model."""
    service = service_factory(models=MODELS, default_model="lin")
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    rng = np.random.default_rng(21)
    events = [
        {"id": f"{m}-{i}", "model": m, "features": rng.normal(size=3).round(4).tolist()}
        for m in MODELS
        for i in range(30)
    ]
    kafka_io.produce_json(t["features"], [(e["id"], e) for e in events])

    def enough(rs: list[Any]) -> bool:
        return all(sum(r.json()["model"] == m for r in rs) >= 8 for m in MODELS)

    reqs = [r.json() for r in kafka_io.wait_for(t["label_requests"], enough, timeout=60)]
    labels = []
    for m in MODELS:
        mine = [q for q in reqs if q["model"] == m][:8]
        labels += [
            (m, {"request_id": q["request_id"], "model": m, "label": _truth(q["features"])})
            for q in mine
        ]
    labels.append(("lin", {"request_id": "nobody-asked", "model": "lin", "label": 1}))
    kafka_io.produce_json(t["labels"], labels)
    kafka_io.wait_for(
        t["models"],
        lambda rs: all(
            any(r.key == m.encode() and r.json()["version"] == 8 for r in rs) for m in MODELS
        ),
        timeout=60,
    )
    return service, worker, {m: 8 for m in MODELS}


def test_kernel_dsal_model_scores_requests_labels_and_learns(
    labelled: tuple[Service, Worker, dict[str, int]], kafka_io: KafkaIO
) -> None:
    service, worker, _ = labelled
    t = service.topics
    states = _states(kafka_io, service.changelog("models"), "ker")  # each group's newest
    versions = [s["version"] for s in states]
    assert versions == sorted(set(versions))
    assert versions[-1] == 8
    assert states[-1]["learner"]["format"] == "abstain.adaptive"  # served adaptive by default
    champion = states[-1]["learner"]["champion"]
    learned = champion["learned"]
    assert champion["algorithm"] == "kernel-dsal"
    assert learned["steps"] == 8
    assert any(c != 0.0 for c in learned["coef"]), "labels moved the kernel expansion"
    assert worker.metric("abstain_labels_applied_total", {"model": "ker"}) == 8.0
    # the scorer swapped in the learned version: new events are decided with it
    kafka_io.produce_json(
        t["features"],
        [("ker-new", {"id": "ker-new", "model": "ker", "features": [0.5, 0.4, -0.1]})],
    )
    recs = kafka_io.wait_for(
        t["decisions"], lambda rs: any(r.json()["id"] == "ker-new" for r in rs), timeout=30
    )
    (new,) = [r.json() for r in recs if r.json()["id"] == "ker-new"]
    assert new["model_version"] == 8


@pytest.mark.parametrize("model", ["lin", "ker"])
def test_rebuild_from_the_topics_equals_the_workers_model(
    labelled: tuple[Service, Worker, dict[str, int]], kafka_io: KafkaIO, model: str
) -> None:
    service, _, versions = labelled
    worker_state = _states(kafka_io, service.topics["models"], model)[-1]
    out = json.loads(service.cli("rebuild", "--model", model).stdout)
    assert out["version"] == worker_state["version"] == versions[model]
    assert out["labels_applied"] == worker_state["labels_applied"]
    assert out["labels_offset"] == worker_state["labels_offset"]
    assert out["rho"] == worker_state["learner"]["champion"]["learned"]["rho"]
    if model == "lin":
        assert out["weight_norm"] == pytest.approx(
            float(np.linalg.norm(worker_state["learner"]["champion"]["learned"]["w"])), rel=1e-12
        )
        assert out["skipped"] == {"unknown_request": 1}
    assert out["published"] is False


def test_rebuild_publish_writes_the_same_learner_state_to_the_models_topic(
    labelled: tuple[Service, Worker, dict[str, int]], kafka_io: KafkaIO
) -> None:
    service, _, _ = labelled
    topic = service.topics["models"]
    before = _states(kafka_io, topic, "lin")
    out = json.loads(service.cli("rebuild", "--model", "lin", "--publish").stdout)
    assert out["published"] is True
    after = _states(kafka_io, topic, "lin")
    assert len(after) == len(before) + 1
    rebuilt, worker_state = after[-1], before[-1]
    for key in ("version", "learner", "pipeline", "labels_offset", "labels_applied"):
        assert rebuilt[key] == worker_state[key], key
    assert rebuilt["iw_loss"] == pytest.approx(worker_state["iw_loss"])
