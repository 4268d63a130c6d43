"""The moments of every event, from the scorers to the learner, on a real broker.

1. A worker's label requests carry the moments of the events it scored since its last
   request for the model: together they are the moments of every event scored, in order,
   each counted once; the model the labels make standardises by exactly those moments
   first (its first step's count and mean are theirs), so a score depends on the version
   alone.
2. A request whose moments are not moments is dead-lettered (``schema``); one whose moments
   lie (a huge count, a far mean) has its label applied without them: the moments are
   dead-lettered (``moments``) and the first standardiser does not move
   (``test_moments_trust.py``: thirty of them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from faults.data import label_request
from faults.kafkaio import Out, produce_records
from faults.workers import wait_until

from service.learning import Pipeline
from service.learning.moments import Moments
from service.records import request_id

pytestmark = pytest.mark.integration

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py

PARTITIONS = {"features": 1, "decisions": 1, "labels": 1, "models": 1}
MODEL = {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "label_budget": {"fraction": 0.2}}
CENTRE, SPREAD = np.array([100.0, -5.0, 0.01]), np.array([20.0, 1.0, 0.001])


def _truth(x: list[float]) -> int:
    return 1 if (x[0] - 100.0) / 20.0 + (x[1] + 5.0) > 0 else -1


def _versions(kio: KafkaIO, service: Service) -> list[dict[str, Any]]:
    """The versions of ``m`` written, in order: the learner's table holds the newest of each
    group of labels (as the models topic does)."""
    return [r.json() for r in kio.read(service.changelog("models")) if r.key == b"m"]


def _first_step(state: dict[str, Any]) -> Any:
    return Pipeline.from_state(state["pipeline"]).steps[0]


@pytest.fixture(scope="module")
def taught(service_factory: Callable[..., Service], kafka_io: KafkaIO) -> dict[str, Any]:
    """300 events scored in batches, every request answered; what was sent and read."""
    service = service_factory(models={"m": MODEL}, default_model="m", partitions=PARTITIONS)
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    rng = np.random.default_rng(5)
    rows = rng.normal(size=(300, 3)) * SPREAD + CENTRE
    for start in range(0, 300, 50):
        batch = [
            (f"e{i}", {"id": f"e{i}", "model": "m", "features": rows[i].tolist()})
            for i in range(start, start + 50)
        ]
        kafka_io.produce_json(t["features"], batch)
        kafka_io.wait_for(t["decisions"], lambda rs, n=start + 50: len(rs) >= n, timeout=60)
    requests = [r.json() for r in kafka_io.read(t["label_requests"]) if r.key == b"m"]
    assert requests, "a budget of 20 % asks"
    kafka_io.produce_json(
        t["labels"],
        [
            ("m", {"request_id": q["request_id"], "model": "m", "label": _truth(q["features"])})
            for q in requests
        ],
    )
    wait_until(
        lambda: (
            max((s["version"] for s in _versions(kafka_io, service)), default=0) == len(requests)
        ),
        90,
        "every label applied",
    )
    return {"service": service, "worker": worker, "rows": rows, "requests": requests}


def test_the_requests_carry_every_events_moments_once_in_order(taught: dict[str, Any]) -> None:
    rows, requests = taught["rows"], taught["requests"]
    carried = [q["moments"] for q in requests if q.get("moments") is not None]
    assert carried
    assert carried[0]["count"] >= 1
    total = Moments(3)
    for m in carried:
        total.merge(Moments.from_record(m, 3))
    k = total.count
    assert 0 < k <= 300
    scored = rows[:k]  # one partition, one worker: the events in the order they were sent
    np.testing.assert_allclose(total.mean, scored.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(
        total.m2, ((scored - scored.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-7
    )
    last = max(i for i, q in enumerate(requests) if q.get("moments") is not None)
    assert int(requests[last]["event_id"][1:]) < k  # the last carrier saw its own event


def test_the_model_standardises_by_the_moments_of_its_labelled_requests(
    taught: dict[str, Any], kafka_io: KafkaIO
) -> None:
    final = _versions(kafka_io, taught["service"])[-1]
    first = _first_step(final)
    carried = Moments(3)
    for q in taught["requests"]:
        if q.get("moments") is not None:
            carried.merge(Moments.from_record(q["moments"], 3))
    assert first.count == carried.count
    np.testing.assert_allclose(first.mean, carried.mean, rtol=1e-9)
    np.testing.assert_allclose(first.std, np.sqrt(carried.m2 / carried.count), rtol=1e-7)
    # standardised by every event scored: the raw centre maps near 0 whatever its scale
    z = Pipeline.from_state(final["pipeline"]).transform(CENTRE)
    assert np.all(np.abs(z[:3]) < 1.0)


def test_moments_that_are_not_are_refused_and_moments_that_lie_are_not_merged(
    taught: dict[str, Any], kafka_io: KafkaIO
) -> None:
    service = taught["service"]
    t = service.topics
    before = _versions(kafka_io, service)[-1]
    first_before = _first_step(before)
    far = time.time() + 3600
    broken = label_request(
        request_id("m", "broken"),
        "m",
        [100.0, -5.0, 0.01],
        expires_at=far,
        event_id="broken",
        moments={"count": 3, "mean": [0.0, 0.0, 0.0], "m2": [0.0, -1.0, 0.0]},
    )
    lying = label_request(
        request_id("m", "lying"),
        "m",
        [100.0, -5.0, 0.01],
        expires_at=far,
        event_id="lying",
        moments={"count": 10**12, "mean": [1e6, 1e6, 1e6], "m2": [0.0] * 3},
    )
    where = produce_records(
        service.bootstrap,
        t["label_requests"],
        [Out(b"m", json.dumps(broken).encode()), Out(b"m", json.dumps(lying).encode())],
    )
    broken_at, lying_at = where[0][1], where[1][1]
    time.sleep(1)
    kafka_io.produce_json(
        t["labels"], [("m", {"request_id": lying["request_id"], "model": "m", "label": 1})]
    )
    version = int(before["version"]) + 1
    wait_until(
        lambda: any(s["version"] == version for s in _versions(kafka_io, service)),
        60,
        "the lying request's label applied",
    )
    dead = [d.json() for d in kafka_io.read(t["dead_letters"])]
    assert [(d["offset"], d["reason"]) for d in dead if d["topic"] == t["label_requests"]] == [
        (broken_at, "schema"),
        (lying_at, "moments"),
    ]
    after = next(s for s in _versions(kafka_io, service) if s["version"] == version)
    first_after = _first_step(after)
    assert first_after.count == first_before.count  # the label applied, its moments not
    np.testing.assert_array_equal(first_after.mean, first_before.mean)
