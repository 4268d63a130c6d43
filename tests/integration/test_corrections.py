"""Corrections on a real broker: a model (and its shadow) that learned a few hundred labels
is corrected and withdrawn from, with signed records (``snapshot_key``), through ``abstain
labels correct`` and straight on the labels topic.

- a correction makes new versions of the champion and the shadow, and the champion equals
  ``abstain rebuild`` of the log (the offline replay of the corrected log) field by field;
- forged and bad corrections (unsigned, mis-signed, another person's answer as its author,
  an unknown request, one beyond the reach) are dead-lettered with their reason and make no
  version;
- a ``kill -9`` of the learner in the middle of applying a correction (while it applies the
  later labels again, or once the corrected step is durable and before any version is
  written) leaves, after a restart, the model ``abstain rebuild`` gives, with every member
  corrected exactly once.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults.corrections import concept, truthful
from faults.kafkaio import Out, produce_records
from faults.workers import wait_until

from service.records import SIGNATURE_HEADER, Correction, Signer

pytestmark = pytest.mark.integration

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py
FAULT_WORKER = Path(__file__).resolve().parent / "faults" / "faultworker.py"
KEY = "correction-key-" + "x" * 30
MODELS = {
    "m": {
        "algorithm": "dsal",
        "cost": 0.25,
        "n_features": 3,
        "audit_rate": 0.05,
        "corrections": {"reach": 300},
    },
    "m-dral": {"algorithm": "dral", "cost": 0.25, "n_features": 3, "champion": "m"},
}
EVENTS = 160


@dataclass
class Answered:
    service: Service
    worker: Worker
    requests: list[dict[str, Any]]  # answered, in the order of their labels

    def states(self, kio: KafkaIO, model: str = "m") -> list[dict[str, Any]]:
        return [
            r.json() for r in kio.read(self.service.topics["models"]) if r.key == model.encode()
        ]

    def version(self, model: str = "m") -> float:
        return self.worker.metric("abstain_model_version", {"model": model})

    def send(self, kio: KafkaIO, correction: Correction, *, key: str | None = KEY) -> None:
        """The correction on the labels topic, signed with ``key`` (None: unsigned)."""
        value = correction.to_json()
        headers = (
            () if key is None else ((SIGNATURE_HEADER, Signer(key.encode()).sign(b"m", value)),)
        )
        produce_records(
            kio.bootstrap, self.service.topics["labels"], [Out(b"m", value, headers=headers)]
        )

    def dead(self, kio: KafkaIO) -> list[tuple[str, str]]:
        return [
            (r.json()["reason"], r.json()["detail"])
            for r in kio.read(self.service.topics["dead_letters"])
        ]


@pytest.fixture(scope="module")
def answered(service_factory: Callable[..., Service], kafka_io: KafkaIO) -> Answered:
    """A worker whose model learned the label of every request of 160 events (by alice)."""
    service = service_factory(
        models=MODELS,
        default_model="m",
        snapshot_key=KEY,
        partitions={"features": 1, "decisions": 1, "labels": 1, "models": 1},
    )
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    rng = np.random.default_rng(23)
    events = [
        {"id": f"e{i}", "model": "m", "features": rng.normal(size=3).round(4).tolist()}
        for i in range(EVENTS)
    ]
    kafka_io.produce_json(t["features"], [(e["id"], e) for e in events])
    kafka_io.wait_for(t["decisions"], lambda rs: len(rs) >= EVENTS, timeout=60)
    time.sleep(1.0)  # the requests follow their decisions
    requests = [r.json() for r in kafka_io.read(t["label_requests"])]
    assert len(requests) > 40
    kafka_io.produce_json(t["labels"], truthful(requests))
    run = Answered(service, worker, requests)
    wait_until(lambda: run.version() == len(requests), 90, "every label learned")
    return run


def _rebuilt_equals_served(run: Answered, kio: KafkaIO) -> dict[str, Any]:
    """``abstain rebuild --publish`` of the champion and what the learner serves agree."""
    served = run.states(kio)[-1]
    out = json.loads(run.service.cli("rebuild", "--model", "m", "--publish").stdout)
    rebuilt = run.states(kio)[-1]
    assert out["version"] == served["version"]
    for key in (
        "version",
        "learner",
        "pipeline",
        "labels_offset",
        "labels_applied",
        "corrections_from",
        "estimate",
    ):
        assert rebuilt[key] == served[key], key
    assert rebuilt["iw_loss"] == pytest.approx(served["iw_loss"], rel=1e-12)
    return served


def test_a_correction_makes_the_model_the_replay_of_the_corrected_log(
    answered: Answered, kafka_io: KafkaIO
) -> None:
    run = answered
    before, shadow = run.version(), run.version("m-dral")
    old = run.states(kafka_io)[-1]
    target = run.requests[5]
    y = concept(target["features"])
    out = run.service.cli(
        "labels",
        "correct",
        "--request-id",
        target["request_id"],
        "--label",
        str(-y),
        "--by",
        "alice",
        "--role",
        "author",
    )
    assert "corrected to" in out.stdout
    wait_until(
        lambda: run.version() == before + 1 and run.version("m-dral") == shadow + 1,
        30,
        "a version of the champion and of the shadow",
    )
    served = _rebuilt_equals_served(run, kafka_io)
    assert served["learner"] != old["learner"]  # it did change the model
    assert served["labels_applied"] == old["labels_applied"]
    assert 0 <= served["corrections_from"] <= old["labels_offset"]
    value = run.worker.metric("abstain_corrections_total", {"model": "m", "outcome": "changed"})
    assert value == 1.0
    # withdrawn (undo): one label fewer learned, and the replay still agrees
    run.service.cli(
        "labels",
        "correct",
        "--request-id",
        run.requests[8]["request_id"],
        "--label",
        "none",
        "--by",
        "carol",
        "--role",
        "reviewer",
    )
    wait_until(lambda: run.version() == before + 2, 30, "the withdrawal's version")
    served = _rebuilt_equals_served(run, kafka_io)
    assert served["labels_applied"] == old["labels_applied"] - 1


def test_forged_and_bad_corrections_are_dead_lettered_and_make_no_version(
    answered: Answered, kafka_io: KafkaIO
) -> None:
    run = answered
    before = run.version()
    rid = run.requests[12]["request_id"]
    run.send(kafka_io, Correction(rid, "m", -1, "alice", "author", 1.0), key=None)
    run.send(kafka_io, Correction(rid, "m", -1, "alice", "author", 1.0), key="y" * 40)
    run.send(kafka_io, Correction(rid, "m", -1, "mallory", "author", 1.0))
    run.send(kafka_io, Correction("no-such-request", "m", -1, "carol", "reviewer", 1.0))
    wait_until(lambda: len(run.dead(kafka_io)) >= 4, 30, "four dead letters")
    reasons = [reason for reason, _ in run.dead(kafka_io)]
    assert reasons[-4:] == ["unsigned", "bad_signature", "not_author", "unknown_request"]
    assert "answered by 'alice', not 'mallory'" in run.dead(kafka_io)[-2][1]
    time.sleep(1.0)
    assert run.version() == before


@pytest.mark.parametrize("where", ["replaying", "writing"])
def test_a_kill_9_in_the_middle_of_a_correction_leaves_the_replay_after_a_restart(
    answered: Answered, kafka_io: KafkaIO, where: str
) -> None:
    run = answered
    service = run.service
    assert run.worker.stop(signal.SIGTERM) == 0
    before = run.states(kafka_io)[-1]["version"]
    shadow = run.states(kafka_io, "m-dral")[-1]["version"]
    service.env["FAULTS_KILL_IN_CORRECTION"] = where
    doomed = service.start(argv=[sys.executable, str(FAULT_WORKER)])
    del service.env["FAULTS_KILL_IN_CORRECTION"]
    doomed.wait_ready()
    target = run.requests[3 if where == "replaying" else 4]
    run.send(
        kafka_io,
        Correction(
            target["request_id"], "m", -concept(target["features"]), "carol", "reviewer", 2.0
        ),
    )
    wait_until(lambda: doomed.proc.poll() is not None, 60, "the worker to die")
    assert doomed.proc.returncode == -signal.SIGKILL
    assert f"SIGKILL while {where}" in doomed.stderr.read_text()
    run.worker = service.start()
    run.worker.wait_ready()
    wait_until(
        lambda: run.version() == before + 1 and run.version("m-dral") == shadow + 1,
        60,
        "the correction redone after the restart",
    )
    served = _rebuilt_equals_served(run, kafka_io)
    assert served["version"] == before + 1  # one version for the correction, no more
    assert run.states(kafka_io, "m-dral")[-1]["version"] == shadow + 1
