"""Champion and challengers on a real broker: a DSAL champion (d = 0.25) with a DRAL shadow.

1. **Shadow learning**: the champion decides 150 events and asks for labels; 60 of its
   questions are answered. The shadow then holds exactly the state of an offline replay of
   those 60 labels in order, each with the champion's query probability as importance
   weight (:func:`service.learning.learn_from_champion`), and its risk sums charge the
   decisions it made when the events were scored. The decisions topic holds only the
   champion's decisions, one per event; the shadow's are counted (metrics), shown by
   ``GET /models`` and ``abstain models compare``.
2. **Promotion**: while 400 events stream in (one features partition, so the decisions keep
   their order), ``abstain models promote s`` runs: the decisions switch from ``c`` to
   ``s`` at one place and never back, every event is decided exactly once, and the
   promoted shadow's decisions name it with its version.
3. **Rollback**: after a few labels for the promoted model, ``abstain models rollback s
   --to-version N`` serves the state of version N again under a higher version; new events
   are decided by it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from service.config import ModelConfig
from service.learning import learn_from_champion
from service.learning.moments import Moments
from service.records import parse_model_envelope
from service.stream.models.served import ServedModel, served_learner

pytestmark = pytest.mark.integration

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py

CHAMPION = {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05}
SHADOW = {"algorithm": "dral", "cost": 0.25, "n_features": 3, "champion": "c", "seed": 1}
ANSWERED = 60  # labels answered in phase 1
MAX_WEIGHT = 100.0  # max_importance_weight (the default)


def truth(x: list[float]) -> int:
    return 1 if x[0] + 0.5 * x[1] > 0 else -1


def events(prefix: str, n: int, seed: int) -> list[tuple[str, dict[str, Any]]]:
    rng = np.random.default_rng(seed)
    return [
        (
            f"{prefix}{i}",
            {"id": f"{prefix}{i}", "model": "c", "features": rng.normal(size=3).round(4).tolist()},
        )
        for i in range(n)
    ]


def states(kio: KafkaIO, topic: str, model: str) -> list[Any]:
    """Every snapshot of ``model`` on the models topic, in order (parsed)."""
    return [
        parse_model_envelope(r.value, model=model)
        for r in kio.read(topic)
        if r.key == model.encode()
    ]


@dataclass
class Run:
    service: Service
    worker: Worker
    answered: list[dict[str, Any]] = field(default_factory=list)  # requests, label order
    phase1: list[dict[str, Any]] = field(default_factory=list)  # decisions
    promoted: list[dict[str, Any]] = field(default_factory=list)  # phase-2 decisions
    compare_page: list[dict[str, Any]] = field(default_factory=list)
    compare_cli: list[dict[str, Any]] = field(default_factory=list)
    shown: dict[str, Any] = field(default_factory=dict)  # abstain models show s
    seconds: dict[str, float] = field(default_factory=dict)


def wait_decisions(kio: KafkaIO, topic: str, ids: set[str], timeout: float = 60) -> list[Any]:
    recs = kio.wait_for(topic, lambda rs: ids <= {r.json()["id"] for r in rs}, timeout=timeout)
    return [r.json() for r in recs if r.json()["id"] in ids]


def learn_phase(run: Run, kio: KafkaIO) -> None:
    t = run.service.topics
    batch = events("a", 150, seed=5)
    kio.produce_json(t["features"], batch)
    run.phase1 = wait_decisions(kio, t["decisions"], {k for k, _ in batch})
    asked = sum(d["queried"] for d in run.phase1)
    requests = [r.json() for r in kio.wait_for(t["label_requests"], lambda rs: len(rs) >= asked)]
    run.answered = requests[:ANSWERED]
    labels = [
        ("c", {"request_id": q["request_id"], "model": "c", "label": truth(q["features"])})
        for q in run.answered
    ]
    kio.produce_json(t["labels"], labels)

    def learned(rs: list[Any]) -> bool:
        top = {
            m: max((r.json()["version"] for r in rs if r.key == m.encode()), default=0)
            for m in ("c", "s")
        }
        return top == {"c": ANSWERED, "s": ANSWERED}

    kio.wait_for(t["models"], learned, timeout=60)
    ok = lambda: run.worker.metric("abstain_labels_applied_total", {"model": "s"}) == ANSWERED  # noqa: E731
    deadline = time.monotonic() + 20
    while not ok() and time.monotonic() < deadline:
        time.sleep(0.2)
    run.compare_page = json.loads(run.worker.get("/models")[1])["models"]
    out = run.service.cli("models", "compare").stdout
    run.compare_cli = [json.loads(line) for line in out.splitlines()]
    run.shown = json.loads(run.service.cli("models", "show", "s").stdout)


def promote_phase(run: Run, kio: KafkaIO) -> None:
    t = run.service.topics
    batch = events("b", 400, seed=6)
    done = threading.Event()

    def feed() -> None:
        for i in range(0, len(batch), 10):
            kio.produce_json(t["features"], batch[i : i + 10])
            time.sleep(0.15)
        done.set()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    time.sleep(1.5)
    run.service.cli("models", "promote", "s")
    feeder.join(timeout=60)
    assert done.is_set(), "the feed did not finish"
    order = {k: i for i, (k, _) in enumerate(batch)}
    got = wait_decisions(kio, t["decisions"], set(order))
    run.promoted = got


@pytest.fixture(scope="module")
def run(service_factory: Callable[..., Service], kafka_io: KafkaIO) -> Run:
    started = time.monotonic()
    service = service_factory(
        models={"c": CHAMPION, "s": SHADOW},
        default_model="c",
        partitions={"features": 1, "decisions": 1, "labels": 2, "models": 1},
    )
    worker = service.start()
    worker.wait_ready()
    r = Run(service, worker)
    r.seconds["start"] = time.monotonic() - started
    learn_phase(r, kafka_io)
    r.seconds["learn"] = time.monotonic() - started
    promote_phase(r, kafka_io)
    r.seconds["promote"] = time.monotonic() - started
    return r


def test_the_shadow_equals_an_offline_replay_of_the_champions_labels(
    run: Run, kafka_io: KafkaIO
) -> None:
    mine = states(kafka_io, run.service.topics["models"], "s")[-1]
    assert mine.version == ANSWERED
    offline = ServedModel.initial("s", ModelConfig(**SHADOW))
    learner = served_learner(ModelConfig(**SHADOW), dict(offline.envelope.learner), serving=False)
    loss = weight = 0.0
    for q in run.answered:
        x, y, p = np.asarray(q["features"]), truth(q["features"]), q["query_probability"]
        moments = q.get("moments")  # of the events scored before the request, when it has them
        offline.pipeline.learn_label(
            x, None if moments is None else Moments.from_record(moments, 3)
        )
        learn_from_champion(learner, offline.pipeline.transform(x), y, p, max_weight=MAX_WEIGHT)
        decided = q["shadow_labels"]["s"]
        h = 1.0 / max(p, 1.0 / MAX_WEIGHT)
        loss += (0.25 if decided == 0 else float(decided != y)) * h
        weight += h
    live = ServedModel.from_envelope(ModelConfig(**SHADOW), mine)
    np.testing.assert_allclose(live.learner.w, learner.w, rtol=1e-9, atol=1e-12)
    assert live.learner.rho == pytest.approx(learner.rho, rel=1e-9)
    assert (mine.iw_loss, mine.iw_weight) == pytest.approx((loss, weight), rel=1e-9)
    print(
        f"\nshadow after {ANSWERED} labels: risk {mine.risk:.3f}, "
        f"||w|| {np.linalg.norm(live.learner.w):.3f}; timings {run.seconds}"
    )


def test_the_decisions_topic_holds_only_the_champions_decisions(run: Run) -> None:
    assert {d["model"] for d in run.phase1} == {"c"}
    assert len(run.phase1) == len({d["id"] for d in run.phase1}) == 150
    switch = sum(d["model"] == "c" for d in run.promoted)  # decisions of c before promotion

    def shadow(model: str) -> float:
        return sum(
            run.worker.metric("abstain_shadow_decisions_total", {"model": model, "action": a})
            for a in ("predict", "reject")
        )

    # every event decided by the server and counted once for the other member
    assert (shadow("s"), shadow("c")) == (150 + switch, 400 - switch)
    assert run.worker.metric("abstain_events_total", {"model": "s"}) == 400 - switch


def test_models_page_and_cli_compare_the_champion_and_its_challenger(run: Run) -> None:
    for rows in (run.compare_page, run.compare_cli):
        by = {r["model"]: r for r in rows}
        assert (by["c"]["role"], by["s"]["role"]) == ("champion", "challenger")
        assert by["s"]["labels"] == by["c"]["labels"] == ANSWERED
        assert by["s"]["low"] <= by["s"]["risk"] <= by["s"]["high"]
    page = {r["model"]: r for r in run.compare_page}
    assert page["s"]["events"] == page["c"]["events"] == 150
    assert page["c"]["reject_rate"] is not None
    # the version served, as JSON (it travels packed): what a worker reads, record for record
    shown = run.shown
    assert (shown["format"], shown["model"]) == ("abstain.model", "s")
    assert shown["version"] == shown["labels_applied"] == ANSWERED
    assert parse_model_envelope(json.dumps(shown).encode(), model="s").version == ANSWERED


def test_promotion_switches_at_one_offset_and_decides_every_event_once(
    run: Run, kafka_io: KafkaIO
) -> None:
    decided = run.promoted
    ids = [d["id"] for d in decided]
    assert len(ids) == len(set(ids)) == 400
    assert ids == [f"b{i}" for i in range(400)]  # one partition: the feed's order
    models = "".join(d["model"] for d in decided)
    switch = models.index("s")
    assert models == "c" * switch + "s" * (400 - switch), models
    assert 0 < switch < 400, "the promotion landed while the events streamed"
    assert {d["model_version"] for d in decided[switch:]} == {ANSWERED}
    print(f"\npromotion: decisions switch at offset {switch} of the 400 streamed")


def test_rollback_serves_the_old_weights_under_a_higher_version(
    run: Run, kafka_io: KafkaIO
) -> None:
    t, kio = run.service.topics, kafka_io
    served = {d["id"] for d in run.promoted if d["model"] == "s" and d["queried"]}
    requests = [
        r.json()
        for r in kio.wait_for(
            t["label_requests"], lambda rs: len({r.json()["event_id"] for r in rs} & served) >= 5
        )
    ]
    mine = [q for q in requests if q["event_id"] in served][:5]
    assert {q["served_by"] for q in mine} == {"s"}
    labels = [
        ("c", {"request_id": q["request_id"], "model": "c", "label": truth(q["features"])})
        for q in mine
    ]
    kio.produce_json(t["labels"], labels)
    top = ANSWERED + len(mine)
    kio.wait_for(
        t["models"],
        lambda rs: any(r.key == b"s" and r.json()["version"] == top for r in rs),
        timeout=60,
    )
    run.service.cli("models", "rollback", "s", "--to-version", str(ANSWERED))
    kio.wait_for(
        t["models"],
        lambda rs: any(r.key == b"s" and r.json()["version"] == top + 1 for r in rs),
        timeout=60,
    )
    history = {e.version: e for e in states(kio, t["models"], "s")}
    restored, old = history[top + 1], history[ANSWERED]
    assert (restored.learner, restored.pipeline) == (old.learner, old.pipeline)
    assert history[top].learner != old.learner
    batch = events("d", 5, seed=7)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the worker serves the restored version
        if json.loads(run.worker.get("/readyz")[1])["models"]["s"] == top + 1:
            break
        time.sleep(0.2)
    kio.produce_json(t["features"], batch)
    after = wait_decisions(kio, t["decisions"], {k for k, _ in batch})
    assert {(d["model"], d["model_version"]) for d in after} == {("s", top + 1)}
