"""The worker end to end on a real broker: decisions, label requests, learning, dead
letters, metrics and the labels API. One worker serves the module; each test uses its own
model (configured below) so tests do not depend on each other's traffic."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from faults.checks import learn_offline

from service.learning import serving_state
from service.records import request_id

KafkaIO = Record = Service = Worker = Any  # fixtures' types live in conftest.py

MODELS: dict[str, dict[str, Any]] = {
    name: {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05}
    for name in ("happy", "learn", "bad", "metrics", "web")
}
MODELS["boom"] = {  # a step size that overflows: its updates are refused
    "algorithm": "dsal",
    "cost": 0.25,
    "n_features": 3,
    "standardize": False,
    "hyperparameters": {"eta": 1e300},
}
SERIES = [
    "abstain_events_total",
    "abstain_decisions_total",
    "abstain_label_requests_total",
    "abstain_label_requests_expired_total",
    "abstain_labels_applied_total",
    "abstain_labels_ignored_total",
    "abstain_updates_refused_total",
    "abstain_pending_requests",
    "abstain_oldest_pending_age_seconds",
    "abstain_label_turnaround_seconds",
    "abstain_model_version",
    "abstain_model_rho",
    "abstain_model_weight_norm",
    "abstain_query_rate",
    "abstain_risk_estimate",
    "abstain_iw_loss_total",
    "abstain_dead_letters_total",
    "abstain_decide_latency_seconds",
    "abstain_consumer_lag",
    "abstain_last_progress_timestamp_seconds",
    "abstain_ready",
    "abstain_live",
]


@pytest.fixture(scope="module")
def svc(service_factory: Callable[..., Service]) -> tuple[Service, Worker]:
    service = service_factory(models=MODELS, default_model="happy", max_message_bytes=4096)
    worker = service.start()
    worker.wait_ready()
    return service, worker


def _events(model: str, n: int, seed: int, prefix: str) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {"id": f"{prefix}-{i}", "model": model, "features": rng.normal(size=3).round(4).tolist()}
        for i in range(n)
    ]


def _send_events(kio: KafkaIO, topic: str, events: list[dict[str, Any]]) -> None:
    kio.produce_json(topic, [(e["id"], e) for e in events])


def _of(model: str) -> Callable[[Record], bool]:
    return lambda r: r.json().get("model") == model


def _truth(x: list[float]) -> int:
    return 1 if x[0] + x[1] > 0 else -1


def _replay(cfg: dict[str, Any], labelled: list[tuple[Any, int]]) -> tuple[Any, float]:
    """Offline: the same labels, in the same order, through the learner a worker serves."""
    _, learner = learn_offline("offline", cfg, labelled)
    return learner.w, learner.rho


def _model_states(kio: KafkaIO, topic: str, model: str) -> list[dict[str, Any]]:
    return [r.json() for r in kio.read(topic) if r.key == model.encode()]


def test_every_event_gets_exactly_one_decision_and_queried_ones_a_request(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, _ = svc
    t = service.topics
    events = _events("happy", 40, seed=1, prefix="happy")
    _send_events(kafka_io, t["features"], events)
    recs = kafka_io.wait_for(
        t["decisions"], lambda rs: sum(map(_of("happy"), rs)) >= 40, timeout=60
    )
    decisions = [r.json() for r in recs if _of("happy")(r)]
    assert sorted(d["id"] for d in decisions) == sorted(e["id"] for e in events)
    assert all(r.key == r.json()["id"].encode() for r in recs if _of("happy")(r))
    for d in decisions:
        assert d["model_version"] == 0
        assert d["action"] in ("predict", "reject")
        assert (d["label"] is None) == (d["action"] == "reject")
        assert 0.0 < d["query_probability"] <= 1.0
    queried = {d["id"] for d in decisions if d["queried"]}
    assert queried, "DSAL at w = 0 queries most events"
    reqs = kafka_io.wait_for(
        t["label_requests"], lambda rs: sum(map(_of("happy"), rs)) >= len(queried)
    )
    requests = [r.json() for r in reqs if _of("happy")(r)]
    assert {q["event_id"] for q in requests} == queried
    assert all(q["request_id"] == request_id("happy", q["event_id"]) for q in requests)
    by_id = {e["id"]: e for e in events}
    assert all(q["features"] == by_id[q["event_id"]]["features"] for q in requests)
    # nothing extra trickles in later
    again = [r for r in kafka_io.read(t["decisions"]) if _of("happy")(r)]
    assert len(again) == 40


def test_labels_update_the_model_exactly_like_an_offline_replay(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = svc
    t = service.topics
    _send_events(kafka_io, t["features"], _events("learn", 30, seed=2, prefix="learn"))
    reqs = kafka_io.wait_for(t["label_requests"], lambda rs: sum(map(_of("learn"), rs)) >= 10)
    requests = [r.json() for r in reqs if _of("learn")(r)][:10]
    labels = [(q["request_id"], _truth(q["features"])) for q in requests]
    kafka_io.produce_json(
        t["labels"],
        [
            ("learn", {"request_id": rid, "model": "learn", "label": y, "labelled_by": "test"})
            for rid, y in labels
        ],
    )
    kafka_io.wait_for(
        t["models"], lambda rs: any(r.key == b"learn" and r.json()["version"] == 10 for r in rs)
    )
    # the learner's table is written each group's newest version (a version counts the
    # labels it holds), as the scorers are sent
    states = _model_states(kafka_io, service.changelog("models"), "learn")
    versions = [s["version"] for s in states]
    assert versions == sorted(set(versions))
    assert versions[-1] == 10
    # the models topic carries what a scorer reads of the same version
    served = {**states[-1], "learner": serving_state(states[-1]["learner"]), "serving": True}
    assert _model_states(kafka_io, t["models"], "learn")[-1] == served
    final = states[-1]
    w, rho = _replay(  # each request with its moments, as the worker's learner took it
        MODELS["learn"], [(q, y) for q, (_, y) in zip(requests, labels, strict=True)]
    )
    np.testing.assert_allclose(
        final["learner"]["champion"]["learned"]["w"], w, rtol=1e-12, atol=1e-15
    )
    assert final["learner"]["champion"]["learned"]["rho"] == pytest.approx(rho, rel=1e-12)
    assert final["labels_applied"] == 10

    # the same label sent again (a new message) is dead-lettered and changes nothing
    rid, y = labels[0]
    kafka_io.produce_json(
        t["labels"], [("learn", {"request_id": rid, "model": "learn", "label": y})]
    )
    kafka_io.wait_for(
        t["dead_letters"],
        lambda rs: any(
            r.json()["reason"] == "already_applied" and rid in r.json()["raw"] for r in rs
        ),
    )
    assert [s["version"] for s in _model_states(kafka_io, t["models"], "learn")][-1] == 10
    assert (
        worker.metric(
            "abstain_labels_ignored_total", {"model": "learn", "reason": "already_applied"}
        )
        == 1.0
    )
    assert worker.metric("abstain_labels_applied_total", {"model": "learn"}) == 10.0
    assert worker.metric("abstain_model_version", {"model": "learn"}) == 10.0


def test_bad_inputs_are_dead_lettered_with_their_reason_and_change_nothing(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = svc
    t = service.topics
    mark = "BADTEST"
    now = time.time()
    features: list[tuple[bytes | None, bytes]] = [
        (b"k1", f"not json {mark}".encode()),
        (b"k2", json.dumps({"model": "bad", "features": [1, 2, 3], "x": mark}).encode()),
        (b"k3", json.dumps({"id": f"{mark}-3", "model": "bad", "features": [1, 2]}).encode()),
        (b"k4", f'{{"id": "{mark}-4", "model": "bad", "features": [1, NaN, 3]}}'.encode()),
        (b"k5", json.dumps({"id": f"{mark}-5", "model": "nope", "features": [1, 2, 3]}).encode()),
        (
            b"k6",
            json.dumps(
                {"id": f"{mark}-6", "model": "bad", "features": [1.0] * 3, "pad": mark + "x" * 5000}
            ).encode(),
        ),
    ]
    kafka_io.produce(t["features"], features)
    stale = {  # a request that expired long ago, and one whose update overflows
        "request_id": request_id("bad", f"{mark}-stale"),
        "event_id": f"{mark}-stale",
        "model": "bad",
        "features": [1, 2, 3],
        "score": 0.0,
        "rho": 1.0,
        "decided_label": 0,
        "query_probability": 0.5,
        "model_version": 0,
        "requested_at": now - 100,
        "expires_at": now - 50,
        "priority": 0.5,
    }
    huge = {
        **stale,
        "request_id": request_id("boom", f"{mark}-huge"),
        "model": "boom",
        "event_id": f"{mark}-huge",
        "features": [1e308, 1e308, 1.0],
        "expires_at": 4.0e9,
    }
    kafka_io.produce_json(t["label_requests"], [("bad", stale), ("boom", huge)])
    labels: list[tuple[bytes | None, bytes]] = [
        (b"bad", f"{{{mark}".encode()),
        (b"bad", json.dumps({"request_id": f"{mark}-x", "model": "bad", "label": 0}).encode()),
        (b"bad", json.dumps({"request_id": f"{mark}-u", "model": "bad", "label": 1}).encode()),
        (
            b"bad",
            json.dumps(
                {"request_id": stale["request_id"], "model": "bad", "label": 1, "labelled_by": mark}
            ).encode(),
        ),
        (b"bad", json.dumps({"request_id": f"{mark}-m", "model": "nope", "label": 1}).encode()),
        (
            b"boom",
            json.dumps(
                {"request_id": huge["request_id"], "model": "boom", "label": 1, "labelled_by": mark}
            ).encode(),
        ),
    ]
    kafka_io.produce(t["labels"], labels)
    expected = Counter(
        {
            ("features", "not_json"): 1,
            ("features", "schema"): 1,
            ("features", "feature_count"): 1,
            ("features", "non_finite"): 1,
            ("features", "unknown_model"): 1,
            ("features", "oversize"): 1,
            ("labels", "not_json"): 1,
            ("labels", "bad_label"): 1,
            ("labels", "unknown_request"): 1,
            ("labels", "expired"): 1,
            ("labels", "unknown_model"): 1,
            ("labels", "non_finite"): 1,
        }
    )
    source = {t["features"]: "features", t["labels"]: "labels"}

    def seen(rs: list[Record]) -> Counter[tuple[str, str]]:
        return Counter(
            (source.get(r.json()["topic"], "?"), r.json()["reason"])
            for r in rs
            if mark in r.json()["raw"]
        )

    # a label whose request never comes waits orphan_label_seconds (2 s here), then is swept
    # on the learner's next event of that partition: send one
    time.sleep(2.5)
    tick = {
        **stale,
        "request_id": request_id("bad", f"tick-{mark}"),
        "event_id": f"tick-{mark}",
        "expires_at": 4.0e9,
        "features": [0, 0, 0],
    }
    kafka_io.produce_json(t["label_requests"], [("bad", tick)])
    recs = kafka_io.wait_for(t["dead_letters"], lambda rs: seen(rs) == expected)
    letter = next(r.json() for r in recs if r.json()["reason"] == "feature_count")
    assert letter["topic"] == t["features"]
    assert letter["offset"] >= 0
    assert f"{mark}-3" in letter["raw"]
    for (src, reason), n in expected.items():
        value = worker.metric("abstain_dead_letters_total", {"source": src, "reason": reason})
        assert value is not None
        assert value >= n
    assert (
        worker.metric("abstain_updates_refused_total", {"model": "boom", "reason": "non_finite"})
        == 1.0
    )
    assert (
        worker.metric("abstain_labels_ignored_total", {"model": "bad", "reason": "expired"}) == 1.0
    )
    assert _model_states(kafka_io, t["models"], "bad") == []
    assert _model_states(kafka_io, t["models"], "boom") == []
    # both agents are still running
    _send_events(kafka_io, t["features"], _events("bad", 1, seed=3, prefix=f"{mark}-ok"))
    kafka_io.wait_for(t["decisions"], lambda rs: any(r.key == f"{mark}-ok-0".encode() for r in rs))
    assert worker.get("/readyz")[0] == 200
    ready = json.loads(worker.get("/readyz")[1])
    assert ready["models"]["bad"] == 0
    assert ready["models"]["boom"] == 0


def test_metrics_endpoint_exposes_every_series_with_sane_values(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = svc
    t = service.topics
    _send_events(kafka_io, t["features"], _events("metrics", 25, seed=4, prefix="metrics"))
    kafka_io.wait_for(t["decisions"], lambda rs: sum(map(_of("metrics"), rs)) >= 25)
    status, body = worker.get("/metrics")
    assert status == 200
    text = body.decode()
    for name in SERIES:
        assert f"\n{name}" in text or text.startswith(name), name
    predict = worker.metric("abstain_decisions_total", {"model": "metrics", "action": "predict"})
    reject = worker.metric("abstain_decisions_total", {"model": "metrics", "action": "reject"})
    assert predict is not None
    assert reject is not None
    assert predict + reject == 25.0
    assert worker.metric("abstain_events_total", {"model": "metrics"}) == 25.0
    requests = worker.metric("abstain_label_requests_total", {"model": "metrics"})
    assert requests is not None
    assert 0 < requests <= 25
    assert worker.metric("abstain_decide_latency_seconds_count", {"model": "metrics"}) == 25.0
    assert worker.metric("abstain_ready") == 1.0
    assert worker.metric("abstain_live") == 1.0
    assert worker.metric("abstain_model_version", {"model": "metrics"}) == 0.0
    assert worker.metric("abstain_model_rho", {"model": "metrics"}) == 1.0
    deadline = time.monotonic() + 5  # gauges are refreshed by a one-second timer
    while not worker.metric("abstain_query_rate", {"model": "metrics"}) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.2)
    rate = worker.metric("abstain_query_rate", {"model": "metrics"})
    assert 0.0 < rate <= 1.0
    lags = [
        v
        for n, lab, v in worker.samples()
        if n == "abstain_consumer_lag" and lab.get("topic") == t["features"]
    ]
    assert len(lags) == 4  # one per partition of the features topic
    assert min(lags) >= 0
    assert "label_token" not in text
    assert "test-token-0123456789" not in text
    assert worker.get("/healthz")[0] == 200


def test_label_queue_api_needs_the_token_and_feeds_the_learner(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = svc
    t = service.topics
    _send_events(kafka_io, t["features"], _events("web", 12, seed=5, prefix="web"))
    recs = kafka_io.wait_for(t["decisions"], lambda rs: sum(map(_of("web"), rs)) >= 12)
    queried = sum(r.json()["queried"] for r in recs if _of("web")(r))
    assert queried >= 2
    reqs = kafka_io.wait_for(t["label_requests"], lambda rs: sum(map(_of("web"), rs)) >= queried)
    wanted = {r.json()["request_id"] for r in reqs if _of("web")(r)}

    auth = {"Authorization": "Bearer test-token-0123456789"}
    assert worker.get("/labels")[0] == 401  # reading the queue needs the token too

    def listed() -> set[str]:
        body = json.loads(worker.get("/labels?limit=500", auth)[1])
        return {p["request_id"] for p in body["pending"] if p["model"] == "web"}

    deadline = time.monotonic() + 20
    while listed() != wanted and time.monotonic() < deadline:
        time.sleep(0.3)
    assert listed() == wanted
    rid = sorted(wanted)[0]
    body = json.dumps({"request_id": rid, "model": "web", "label": 1}).encode()
    assert worker.post("/labels", body)[0] == 401
    assert worker.post("/labels", body, {"Authorization": "Bearer wrong"})[0] == 401
    assert worker.post("/labels", b"{", {"Authorization": "Bearer test-token-0123456789"})[0] == 400
    assert not any(rid in r.value.decode() for r in kafka_io.read(t["labels"]))
    status, _ = worker.post("/labels", body, {"Authorization": "Bearer test-token-0123456789"})
    assert status == 202
    kafka_io.wait_for(t["models"], lambda rs: any(r.key == b"web" for r in rs))
    assert rid not in listed()
    # the command line sees the same queue (from the topics)
    out = service.cli("labels", "list", "--limit", "1000")
    cli = {json.loads(line)["request_id"] for line in out.stdout.splitlines()}
    assert wanted - {rid} <= cli
    assert rid not in cli
    # ... and submits labels through the labels topic
    other = sorted(wanted - {rid})[0]
    service.cli("labels", "submit", "--request-id", other, "--label", "-1", "--model", "web")
    kafka_io.wait_for(t["models"], lambda rs: sum(r.key == b"web" for r in rs) == 2)
    assert other not in listed()
