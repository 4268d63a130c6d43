"""The rig of the lying-moments tests: a model of three features taught 300 honest events
(every request answered), then ``LIES`` well-formed label requests written straight to the
label-requests topic whose moments lie, with honest labels, and what they did: the versions
before and after, the dead letters of their moments, and the probe decisions of the model
served against those of the model the same labels make without any moments."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.learning import Pipeline
from service.records import request_id

from .checks import served_learner
from .data import label_request
from .kafkaio import Out, produce_records
from .workers import wait_until

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py

PARTITIONS = {"features": 1, "decisions": 1, "labels": 1, "models": 1}
MODEL = {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "label_budget": {"fraction": 0.2}}
CENTRE, SPREAD = np.array([100.0, -5.0, 0.01]), np.array([20.0, 1.0, 0.001])
LIES = 30


def truth(x: Any) -> int:
    return 1 if (x[0] - 100.0) / 20.0 + (x[1] + 5.0) > 0 else -1


def versions(kio: KafkaIO, service: Service) -> dict[int, dict[str, Any]]:
    return {
        int(s["version"]): s
        for s in (r.json() for r in kio.read(service.changelog("models")) if r.key == b"m")
    }


def decisions(state: dict[str, Any], probe: np.ndarray) -> np.ndarray:
    pipeline = Pipeline.from_state(state["pipeline"])
    labels, *_ = served_learner(state["learner"]).decide_many(pipeline.transform_many(probe))
    return np.asarray(labels)


def without_moments(state: dict[str, Any], taught: list[tuple[list[float], int]]) -> Any:
    """The pipeline and learner ``state`` gives after ``taught`` (features, label), each
    request learnt without moments (as the label path learns one whose moments it refused)."""
    pipeline = Pipeline.from_state(state["pipeline"])
    learner = served_learner(state["learner"])
    for x, y in taught:
        pipeline.learn_label(np.asarray(x), None)
        learner.update(pipeline.transform(np.asarray(x)), y)
    return pipeline, learner


def answer(kio: KafkaIO, service: Service, requests: list[dict[str, Any]]) -> None:
    """Honest labels for ``requests`` on the labels topic."""
    kio.produce_json(
        service.topics["labels"],
        [
            ("m", {"request_id": q["request_id"], "model": "m", "label": truth(q["features"])})
            for q in requests
        ],
    )


@dataclass
class Taught:
    """A worker whose model learnt 300 honest events; the requests it asked."""

    service: Service
    worker: Worker
    requests: list[dict[str, Any]]


def taught(service_factory: Callable[..., Service], kio: KafkaIO, **settings: Any) -> Taught:
    """A model (``settings`` beside it) taught 300 honest events in batches of 50, every
    request answered."""
    service = service_factory(
        models={"m": MODEL}, default_model="m", partitions=PARTITIONS, **settings
    )
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    rows = np.random.default_rng(5).normal(size=(300, 3)) * SPREAD + CENTRE
    for start in range(0, 300, 50):
        batch = [
            (f"e{i}", {"id": f"e{i}", "model": "m", "features": rows[i].tolist()})
            for i in range(start, start + 50)
        ]
        kio.produce_json(t["features"], batch)
        kio.wait_for(t["decisions"], lambda rs, n=start + 50: len(rs) >= n, timeout=60)
    requests = [r.json() for r in kio.read(t["label_requests"]) if r.key == b"m"]
    answer(kio, service, requests)
    wait_until(
        lambda: max(versions(kio, service), default=0) == len(requests),
        90,
        "every honest label applied",
    )
    return Taught(service, worker, requests)


@dataclass
class Lied:
    """What ``LIES`` lying requests did."""

    before: dict[str, Any]  # the version before them
    after: dict[str, Any]  # the version their labels made
    offsets: list[int]  # where they were written on the label-requests topic
    changed: float  # share of the probe decisions that differ from the labels-alone model
    learnt: float  # share the labels alone changed against the version before
    control: Pipeline  # the labels-alone model's pipeline
    dead: list[dict[str, Any]]  # their dead letters (reason moments)


def lie(
    kio: KafkaIO,
    service: Service,
    tag: str,
    claimed: Callable[[Any], dict[str, Any]],
    seed: int,
) -> Lied:
    """Write ``LIES`` requests of made-up events of the real distribution (ids derived with
    the public hash, event ids starting with ``tag``) whose moments are ``claimed(first)``
    (``first``: the model's first standardiser before them), then honest labels for them;
    wait until the labels are applied."""
    t = service.topics
    all_versions = versions(kio, service)
    start = max(all_versions)
    before = all_versions[start]
    first = Pipeline.from_state(before["pipeline"]).steps[0]
    rng = np.random.default_rng(seed)
    probe = rng.normal(size=(2000, 3)) * SPREAD + CENTRE
    moments = claimed(first)
    far = time.time() + 3600
    events = rng.normal(size=(LIES, 3)) * SPREAD + CENTRE
    lies = [
        label_request(
            request_id("m", f"{tag}-{i}"),
            "m",
            events[i].tolist(),
            expires_at=far,
            event_id=f"{tag}-{i}",
            moments=moments,
        )
        for i in range(LIES)
    ]
    where = produce_records(
        service.bootstrap, t["label_requests"], [Out(b"m", json.dumps(q).encode()) for q in lies]
    )
    time.sleep(1)
    answer(kio, service, lies)
    wait_until(lambda: max(versions(kio, service)) == start + LIES, 90, "the lies' labels applied")
    after = versions(kio, service)[start + LIES]
    # the model the same labels make without any moments (the labels are honest; what the
    # moments may change is what the model decides beyond that)
    pipeline, learner = without_moments(
        before, [(q["features"], truth(q["features"])) for q in lies]
    )
    control = learner.decide_many(pipeline.transform_many(probe))[0]
    dead = [
        d.json()
        for d in kio.read(t["dead_letters"])
        if d.json()["topic"] == t["label_requests"] and d.json()["reason"] == "moments"
    ]
    return Lied(
        before=before,
        after=after,
        offsets=sorted(o for _, o in where),
        changed=float(np.mean(decisions(after, probe) != control)),
        learnt=float(np.mean(control != decisions(before, probe))),
        control=pipeline,
        dead=[d for d in dead if json.loads(d["raw"])["event_id"].startswith(f"{tag}-")],
    )
