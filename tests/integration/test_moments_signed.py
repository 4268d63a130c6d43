"""With ``snapshot_key``, a writer of the label-requests topic without the key cannot touch
the scaling, on a real broker.

After 300 honest events and their labels (every request's moments signed by the worker's
scorer and merged by its learner), 30 well-formed label requests written straight to the
topic carry moments that lie (a variance of 1e12 in every feature, 10**12 rows), unsigned or
with a made-up signature. Every one is dead-lettered (``moments``, the detail saying why) at
its own offset and counted (``abstain_moments_refused_total{reason}``), its label is still
applied, the first standardiser does not move, and the decisions on a probe set are exactly
those of the model the same labels make without any moments.
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
from test_moments_trust import CENTRE, LIES, MODEL, PARTITIONS, SPREAD
from test_moments_trust import _decisions as decisions
from test_moments_trust import _truth as truth
from test_moments_trust import _versions as versions
from test_moments_trust import _without_moments as without_moments

from service.learning import Pipeline
from service.records import request_id

pytestmark = pytest.mark.integration

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py

KEY = "signed-moments-key-0123456789abcdef"  # noqa: S105 - >= 32 characters


@pytest.fixture(scope="module")
def keyed(service_factory: Callable[..., Service], kafka_io: KafkaIO) -> dict[str, Any]:
    """A keyed model taught 300 honest events in batches, every request answered."""
    service = service_factory(
        models={"m": MODEL}, default_model="m", partitions=PARTITIONS, snapshot_key=KEY
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
        kafka_io.produce_json(t["features"], batch)
        kafka_io.wait_for(t["decisions"], lambda rs, n=start + 50: len(rs) >= n, timeout=60)
    requests = [r.json() for r in kafka_io.read(t["label_requests"]) if r.key == b"m"]
    kafka_io.produce_json(
        t["labels"],
        [
            ("m", {"request_id": q["request_id"], "model": "m", "label": truth(q["features"])})
            for q in requests
        ],
    )
    wait_until(
        lambda: max(versions(kafka_io, service), default=0) == len(requests),
        90,
        "every honest label applied",
    )
    return {"service": service, "worker": worker, "requests": requests}


def test_the_workers_own_signed_moments_are_merged(
    keyed: dict[str, Any], kafka_io: KafkaIO
) -> None:
    service, worker, requests = keyed["service"], keyed["worker"], keyed["requests"]
    carried = [q["moments"] for q in requests if q["moments"] is not None]
    assert carried
    assert all(m["signature"] for m in carried)
    newest = versions(kafka_io, service)[len(requests)]
    first = Pipeline.from_state(newest["pipeline"]).steps[0]
    assert first.count == sum(m["count"] for m in carried)  # every record merged, in full
    for reason in ("unsigned", "bad_signature", "mean", "spread"):
        assert worker.metric("abstain_moments_refused_total", {"model": "m", "reason": reason}) == 0


@pytest.mark.parametrize("forgery", ["unsigned", "bad_signature"])
def test_thirty_lying_unsigned_moments_are_refused_and_change_fewer_than_5_percent_of_decisions(
    keyed: dict[str, Any], kafka_io: KafkaIO, forgery: str
) -> None:
    service, worker = keyed["service"], keyed["worker"]
    t = service.topics
    all_versions = versions(kafka_io, service)
    start = max(all_versions)
    before = all_versions[start]
    first = Pipeline.from_state(before["pipeline"]).steps[0]
    rng = np.random.default_rng(21 if forgery == "unsigned" else 22)
    probe = rng.normal(size=(2000, 3)) * SPREAD + CENTRE
    claimed: dict[str, Any] = {
        "count": 10**12,
        "mean": first.mean.tolist(),
        "m2": [1e12 * 10**12] * 3,
    }
    if forgery == "bad_signature":
        claimed["signature"] = "v1:0123456789abcdef:" + "ab" * 32
    far = time.time() + 3600
    events = rng.normal(size=(LIES, 3)) * SPREAD + CENTRE
    lies = [
        label_request(
            request_id("m", f"{forgery}-{i}"),
            "m",
            events[i].tolist(),
            expires_at=far,
            event_id=f"{forgery}-{i}",
            moments=claimed,
        )
        for i in range(LIES)
    ]
    where = produce_records(
        service.bootstrap,
        t["label_requests"],
        [Out(b"m", json.dumps(q).encode()) for q in lies],
    )
    time.sleep(1)
    kafka_io.produce_json(
        t["labels"],
        [
            ("m", {"request_id": q["request_id"], "model": "m", "label": truth(q["features"])})
            for q in lies
        ],
    )
    wait_until(
        lambda: max(versions(kafka_io, service)) == start + LIES, 90, "the lies' labels applied"
    )
    after = versions(kafka_io, service)[start + LIES]
    pipeline, learner = without_moments(
        before, [(q["features"], truth(q["features"])) for q in lies]
    )
    served = decisions(after, probe)
    control = learner.decide_many(pipeline.transform_many(probe))[0]
    changed = float(np.mean(served != control))
    assert changed < 0.05, f"{changed:.1%} of the probe decisions changed"
    assert changed == 0.0  # the labels alone made the model
    assert Pipeline.from_state(after["pipeline"]).steps[0].count == first.count
    dead = [
        d.json()
        for d in kafka_io.read(t["dead_letters"])
        if d.json()["topic"] == t["label_requests"] and d.json()["reason"] == "moments"
    ]
    mine = [d for d in dead if json.loads(d["raw"])["event_id"].startswith(f"{forgery}-")]
    assert sorted(d["offset"] for d in mine) == sorted(o for _, o in where)
    words = "unsigned" if forgery == "unsigned" else "bad signature"
    assert all(words in d["detail"] for d in mine)
    count = worker.metric("abstain_moments_refused_total", {"model": "m", "reason": forgery})
    assert count == LIES
