"""``abstain models seed`` against a running worker on the real broker: the seeded version
is signed, served and adopted by the learner (never overwritten by its republishing), the
labels that arrive afterwards are applied on top of it exactly once, and ``abstain
rebuild`` replays the same log to the same state."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults.checks import champion_record

from service.learning import serving_state
from service.stream.health.housekeeping import REPUBLISH_AFTER

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py

KEY = "seed-snapshot-key-for-tests-0123456789"  # noqa: S105 - >= 32 characters
MODELS = {
    "m": {"algorithm": "dsal", "cost": 0.25, "feature_names": ["a", "b", "c"], "audit_rate": 0.3},
}
WEIGHTS = np.array([1.0, 2.0, -1.0])


def _truth(x: list[float]) -> int:
    return 1 if float(np.dot(WEIGHTS, x)) >= 0 else -1


def _events(prefix: str, n: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    return [
        (
            f"{prefix}-{i}",
            {
                "id": f"{prefix}-{i}",
                "model": "m",
                "features": dict(zip("abc", rng.normal(size=3).round(4).tolist(), strict=True)),
            },
        )
        for i in range(n)
    ]


def _decisions(kio: KafkaIO, topic: str, prefix: str, n: int) -> list[dict[str, Any]]:
    def done(rs: list[Any]) -> bool:
        return sum(r.json()["id"].startswith(f"{prefix}-") for r in rs) >= n

    recs = kio.wait_for(topic, done, timeout=60)
    return [r.json() for r in recs if r.json()["id"].startswith(f"{prefix}-")]


def _states(kio: KafkaIO, topic: str) -> list[dict[str, Any]]:
    return [r.json() for r in kio.read(topic) if r.key == b"m"]


def _history(path: Path, n: int) -> Path:
    """Labelled history with the header in another order than the model's features."""
    rng = np.random.default_rng(5)
    lines = ["c,label,a,b"]
    for x in rng.normal(size=(n, 3)).round(4):
        lines.append(f"{x[2]},{_truth(x.tolist())},{x[0]},{x[1]}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def seeded(
    service_factory: Callable[..., Service],
    kafka_io: KafkaIO,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Service, Worker, dict[str, Any]]:
    """A running worker at version 0 (it rejects everything), then seeded from 400 rows."""
    service = service_factory(models=MODELS, default_model="m", snapshot_key=KEY)
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    kafka_io.produce_json(t["features"], _events("before", 40, seed=1))
    before = _decisions(kafka_io, t["decisions"], "before", 40)
    assert {(d["model_version"], d["action"]) for d in before} == {(0, "reject")}
    data = _history(tmp_path_factory.mktemp("seed") / "history.csv", 400)
    out = json.loads(service.cli("models", "seed", "--model", "m", str(data)).stdout)
    return service, worker, out


def test_the_seed_is_published_signed_and_the_worker_decides_with_it(
    seeded: tuple[Service, Worker, dict[str, Any]], kafka_io: KafkaIO
) -> None:
    service, worker, out = seeded
    t = service.topics
    assert (out["rows"], out["version"], out["published"]) == (400, 1, True)
    signed = [r for r in kafka_io.read(t["models"]) if r.key == b"m"]
    assert signed, "the seed is on the models topic"
    assert all(
        dict(r.headers or ()).get("abstain-signature", b"").startswith(b"v1:") for r in signed
    )
    # the CLI's record (placed nowhere in the labels log) and the learner's adoption of it
    cli_state, learner_state = None, None
    for s in _states(kafka_io, t["models"]):
        if s["version"] == 1:
            if s["labels_partition"] == -1:
                cli_state = s
            else:
                learner_state = s
    assert cli_state is not None
    assert cli_state["labels_applied"] == 400
    assert learner_state is not None, "the learner adopted the seed"
    # the learner publishes what a scorer reads of the state it adopted
    assert learner_state["learner"] == serving_state(cli_state["learner"])
    assert learner_state["pipeline"] == cli_state["pipeline"]
    # past the republishing delay, the worker still serves the seeded state: it decides
    time.sleep(REPUBLISH_AFTER + 2.0)
    assert worker.wait_ready()
    kafka_io.produce_json(t["features"], _events("after", 60, seed=2))
    after = _decisions(kafka_io, t["decisions"], "after", 60)
    assert {d["model_version"] for d in after} == {1}
    predicted = [d for d in after if d["action"] == "predict"]
    assert len(predicted) >= 40, f"only {len(predicted)} of 60 decided"
    truth = {e["id"]: _truth(list(e["features"].values())) for _, e in _events("after", 60, 2)}
    right = sum(d["label"] == truth[d["id"]] for d in predicted)
    assert right / len(predicted) >= 0.9
    assert worker.metric("abstain_dead_letters_total") == 0.0


def test_labels_after_the_seed_are_applied_on_top_once_and_rebuild_agrees(
    seeded: tuple[Service, Worker, dict[str, Any]], kafka_io: KafkaIO
) -> None:
    service, worker, _ = seeded
    t = service.topics
    kafka_io.produce_json(t["features"], _events("asked", 80, seed=3))

    def asked(rs: list[Any]) -> bool:
        return sum(r.json()["event_id"].startswith("asked-") for r in rs) >= 5

    requests = [r.json() for r in kafka_io.wait_for(t["label_requests"], asked, timeout=60)]
    mine = [q for q in requests if q["event_id"].startswith("asked-")][:5]
    assert all(q["model_version"] == 1 for q in mine)
    labels = [
        ("m", {"request_id": q["request_id"], "model": "m", "label": _truth(q["features"])})
        for q in mine
    ]
    kafka_io.produce_json(t["labels"], labels)
    kafka_io.wait_for(
        t["models"],
        lambda rs: any(r.key == b"m" and r.json()["version"] == 6 for r in rs),
        timeout=60,
    )
    kafka_io.produce_json(t["labels"], labels)  # the same answers again: already applied
    deadline = time.monotonic() + 30
    while worker.metric("abstain_dead_letters_total") < 5 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert worker.metric("abstain_dead_letters_total", {"reason": "already_applied"}) == 5.0
    assert worker.metric("abstain_labels_applied_total", {"model": "m"}) == 5.0
    final = _states(kafka_io, t["models"])[-1]
    assert (final["version"], final["labels_applied"]) == (6, 405)
    rebuilt = json.loads(service.cli("rebuild", "--model", "m").stdout)
    assert (rebuilt["version"], rebuilt["labels_applied"]) == (6, 405)
    assert rebuilt["rho"] == champion_record(final["learner"])["learned"]["rho"]
    assert rebuilt["weight_norm"] == pytest.approx(
        float(np.linalg.norm(champion_record(final["learner"])["learned"]["w"])), rel=1e-12
    )


def test_a_file_that_cannot_seed_publishes_nothing(
    seeded: tuple[Service, Worker, dict[str, Any]], kafka_io: KafkaIO, tmp_path: Path
) -> None:
    service, _, _ = seeded
    t = service.topics
    before = (len(kafka_io.read(t["labels"])), len(kafka_io.read(t["models"])))
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c,label\n" + "1,2,3,1\n" * 50 + "1,2,inf,1\n")
    with pytest.raises(subprocess.CalledProcessError) as failed:
        service.cli("models", "seed", "--model", "m", str(bad))
    assert failed.value.returncode == 2
    assert "not finite" in failed.value.stderr
    assert (len(kafka_io.read(t["labels"])), len(kafka_io.read(t["models"]))) == before


def test_seeding_before_the_model_serves(
    service_factory: Callable[..., Service], kafka_io: KafkaIO, tmp_path: Path
) -> None:
    """No topics yet: refused, nothing created. Topics made by a worker that then stopped:
    the seed waits in the log, and the next worker serves it and its learner adopts it."""
    service = service_factory(models=MODELS, default_model="m")
    data = _history(tmp_path / "history.csv", 200)
    with pytest.raises(subprocess.CalledProcessError) as failed:
        service.cli("models", "seed", "--model", "m", str(data))
    assert "does not exist" in failed.value.stderr
    # nothing was created with the broker's defaults: the worker accepts the topics it makes
    # (reading a missing topic here would create it, so it is not read)
    first = service.start()
    first.wait_ready()
    assert first.stop() == 0
    out = json.loads(service.cli("models", "seed", "--model", "m", str(data)).stdout)
    assert (out["version"], out["published"]) == (1, True)
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    kafka_io.wait_for(
        t["models"],
        lambda rs: any(
            r.key == b"m" and r.json()["version"] == 1 and r.json()["labels_partition"] >= 0
            for r in rs
        ),
        timeout=60,
    )
    kafka_io.produce_json(t["features"], _events("late", 40, seed=4))
    late = _decisions(kafka_io, t["decisions"], "late", 40)
    assert {d["model_version"] for d in late} == {1}
    assert sum(d["action"] == "predict" for d in late) >= 25
