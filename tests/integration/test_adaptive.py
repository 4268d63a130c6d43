"""Adaptive learning on a real broker: a model with the default configuration (served inside
the adaptive wrapper) learns a concept from its labels, then the labels flip.

Rounds of 150 events: each round is decided by the model version in use once the last
round's labels are learned (the test waits for the worker's version gauge), every label
request of the round is answered (before the flip by the concept, after it by its
opposite), and the round ends when the model has learned them all. Then:

- the detector fired exactly once, after the flip (``abstain_drift_detected_total``), and a
  challenger took over (``abstain_takeovers_total``);
- the model recovered: the served decisions of the last rounds are right about the new
  concept (risk well below the cost of rejecting everything) and the risk since the change
  (``abstain_risk_since_change``) is low;
- every label was applied exactly once (versions 1..N, ``labels_applied``, the counter);
- ``abstain rebuild --publish`` replays the topics offline into the very same state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from service.learning import serving_state

pytestmark = pytest.mark.integration

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py

MODEL = {"algorithm": "dsal", "cost": 0.25, "n_features": 2, "audit_rate": 0.05}
ROUND = 150  # events per round
BEFORE, AFTER = 4, 5  # rounds before and after the flip


def concept(x: list[float]) -> int:
    return 1 if x[0] + 0.5 * x[1] > 0 else -1


def wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def loss(decision: dict[str, Any], y: int, cost: float) -> float:
    label = decision["label"]
    return cost if label is None else float(label != y)


def states(kio: KafkaIO, topic: str) -> list[dict[str, Any]]:
    return [r.json() for r in kio.read(topic) if r.key == b"m"]


@dataclass
class Flipped:
    service: Service
    worker: Worker
    losses: list[list[float]] = field(default_factory=list)  # served, per round
    answered: int = 0  # labels answered
    before: int = 0  # labels answered before the flip


@pytest.fixture(scope="module")
def flipped(service_factory: Callable[..., Service], kafka_io: KafkaIO) -> Flipped:
    """The worker after every round, the served losses per round (by the round's concept)
    and the labels answered."""
    service = service_factory(
        models={"m": MODEL},
        default_model="m",
        partitions={"features": 1, "decisions": 1, "labels": 1, "models": 1},
    )
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    rng = np.random.default_rng(11)
    run = Flipped(service, worker)
    for r in range(BEFORE + AFTER):
        sign = 1 if r < BEFORE else -1
        batch = [
            {"id": f"r{r}-{i}", "model": "m", "features": rng.normal(size=2).round(4).tolist()}
            for i in range(ROUND)
        ]
        kafka_io.produce_json(t["features"], [(e["id"], e) for e in batch])
        ids = {e["id"] for e in batch}
        decided = kafka_io.wait_for(
            t["decisions"], lambda rs, ids=ids: ids <= {r.json()["id"] for r in rs}, timeout=60
        )
        mine = {d["id"]: d for d in (x.json() for x in decided) if d["id"] in ids}
        truth = {e["id"]: sign * concept(e["features"]) for e in batch}
        run.losses.append([loss(mine[i], truth[i], MODEL["cost"]) for i in sorted(ids)])
        asked = sum(1 for d in mine.values() if d["queried"])
        requests = kafka_io.wait_for(
            t["label_requests"],
            lambda rs, ids=ids, n=asked: sum(r.json()["event_id"] in ids for r in rs) >= n,
            timeout=60,
        )
        round_requests = [q.json() for q in requests if q.json()["event_id"] in ids]
        assert len(round_requests) == asked  # one request per queried event, no more
        kafka_io.produce_json(
            t["labels"],
            [
                (
                    "m",
                    {
                        "request_id": q["request_id"],
                        "model": "m",
                        "label": sign * concept(q["features"]),
                        "labelled_by": "test",
                    },
                )
                for q in round_requests
            ],
        )
        run.answered += len(round_requests)
        run.before += len(round_requests) if sign > 0 else 0
        wait(
            lambda n=run.answered: worker.metric("abstain_model_version", {"model": "m"}) == n,
            90,
            f"version {run.answered} in use",
        )
    return run


def test_the_detector_fires_once_after_the_flip_and_a_challenger_takes_over(
    flipped: Flipped, kafka_io: KafkaIO
) -> None:
    worker = flipped.worker
    assert worker.metric("abstain_drift_detected_total", {"model": "m"}) == 1.0
    assert worker.metric("abstain_takeovers_total", {"model": "m"}) >= 1.0
    chain = states(kafka_io, flipped.service.changelog("models"))  # each group's newest
    changed = [s["version"] for s in chain if s["learner"]["learned"]["changes"] > 0]
    unchanged = [s["version"] for s in chain if s["learner"]["learned"]["changes"] == 0]
    final = chain[-1]["learner"]
    assert final["learned"]["changes"] == 1
    at = final["learned"]["last_change"]  # the label count (= version) at detection
    assert flipped.before < at <= flipped.before + 40  # within a few tens of labels after it
    # the versions written agree: none before the detection holds it, every one after does
    assert max(unchanged) < at <= min(changed)
    assert final["champion_origin"] in ("mirror", "fresh")


def test_the_model_recovers_from_the_flip(flipped: Flipped) -> None:
    losses = flipped.losses
    before = float(np.mean(losses[BEFORE - 1]))
    hit = float(np.mean(losses[BEFORE]))  # the first round after the flip, old model
    last = float(np.mean([v for rnd in losses[-2:] for v in rnd]))
    assert hit > 0.5  # the flip makes the old model wrong
    assert before < 0.15
    assert last < 0.15  # back: right about the new concept, far below rejecting (0.25)
    assert last <= 1.5 * before + 0.02
    risk = flipped.worker.metric("abstain_risk_since_change", {"model": "m"})
    assert 0.0 <= risk < 0.15
    assert flipped.worker.metric("abstain_labels_since_change", {"model": "m"}) > 0


def test_every_label_is_applied_once_and_the_rebuild_is_the_same_model(
    flipped: Flipped, kafka_io: KafkaIO
) -> None:
    service, answered = flipped.service, flipped.answered
    topic = service.topics["models"]
    # the learner's table holds each group's newest version, as the models topic does:
    # what the scorers were sent is among them, a version perhaps sent again (a republish,
    # when the scorers' version lagged behind the learner's on a busy machine), never changed
    chain = states(kafka_io, service.changelog("models"))
    sent = states(kafka_io, topic)
    assert max(s["version"] for s in chain) == answered
    assert {s["version"] for s in sent} <= {s["version"] for s in chain}
    by_version = {s["version"]: s["learner"] for s in chain}
    assert all(s["learner"] == by_version[s["version"]] for s in chain)
    # the topic carries what a scorer reads of each: no challengers' learners, no recall
    assert all(s["learner"] == serving_state(by_version[s["version"]]) for s in sent)
    assert sent[-1]["version"] == answered
    assert chain[-1]["labels_applied"] == answered
    assert flipped.worker.metric("abstain_labels_applied_total", {"model": "m"}) == answered
    out = json.loads(service.cli("rebuild", "--model", "m", "--publish").stdout)
    assert out["version"] == answered
    assert (out["changes_detected"], out["skipped"]) == (1, {})
    after = states(kafka_io, topic)
    assert len(after) > len(sent)
    rebuilt, served = after[-1], {**chain[-1], "learner": serving_state(chain[-1]["learner"])}
    for key in (
        "version",
        "learner",
        "pipeline",
        "labels_offset",
        "labels_applied",
        "corrections_from",
    ):
        assert rebuilt[key] == served[key], key
    assert rebuilt["iw_loss"] == pytest.approx(served["iw_loss"])
