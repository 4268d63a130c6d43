"""The worker's web port on a real broker: the label queue needs the token, faust's own pages
are gone, a 202 means the label is in Kafka, and with the broker stopped a label is refused
(503) within the timeout, nothing is applied, and retrying applies it exactly once.

The last test stops the session's broker (``kafka_broker``) and starts it again."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from service.localkafka import LocalKafka
from service.records import LabelRequest, request_id

KafkaIO = Service = Worker = Any  # fixtures' types live in conftest.py

ACK_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def svc(service_factory: Callable[..., Service]) -> tuple[Service, Worker]:
    service = service_factory(label_ack_timeout_seconds=ACK_TIMEOUT, default_model="m")
    worker = service.start()
    worker.wait_ready()
    return service, worker


def auth(service: Service) -> dict[str, str]:
    return {"Authorization": f"Bearer {service.token}"}


def ask(kafka_io: KafkaIO, service: Service, event_id: str, priority: float = 0.5) -> str:
    """Put a well-formed label request for ``event_id`` of model ``m`` on the topic."""
    now = time.time()
    request = LabelRequest(
        request_id("m", event_id),
        event_id,
        "m",
        [0.5, -1.0, 2.0],
        0.1,
        1.0,
        0,
        0.5,
        0,
        now,
        now + 600,
        priority,
    )
    kafka_io.produce(service.topics["label_requests"], [(b"m", request.to_json())])
    return request.request_id


def queued(worker: Worker, service: Service) -> list[str]:
    status, body = worker.get("/labels?limit=500", auth(service))
    assert status == 200, body
    return [p["request_id"] for p in json.loads(body)["pending"]]


def wait_listed(worker: Worker, service: Service, rids: set[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not rids <= set(queued(worker, service)):
        assert time.monotonic() < deadline, f"{rids} not listed: {queued(worker, service)}"
        time.sleep(0.3)


def label_body(rid: str, label: int = 1) -> bytes:
    return json.dumps({"request_id": rid, "model": "m", "label": label}).encode()


def test_the_label_queue_needs_the_token_and_pages(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = svc
    rids = {ask(kafka_io, service, f"q{i}", priority=i / 10) for i in range(5)}
    wait_listed(worker, service, rids)
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": service.token},
    ):
        status, body = worker.get("/labels", headers)
        assert status == 401, headers
        assert b"features" not in body
    first = json.loads(worker.get("/labels?limit=2", auth(service))[1])
    assert first["count"] == 2
    rest = json.loads(worker.get(f"/labels?limit=500&cursor={first['next']}", auth(service))[1])
    order = [p["request_id"] for p in first["pending"] + rest["pending"]]
    assert order == [request_id("m", f"q{i}") for i in reversed(range(5))]


def test_faust_pages_are_not_served(svc: tuple[Service, Worker]) -> None:
    _, worker = svc
    for path in (
        "/router/",
        "/table/",
        "/table/pending/",
        "/graph/",
        "/stats/",
        "/assignment/",
        "/performance/",
    ):
        assert worker.status(path) == 404, path
    assert json.loads(worker.get("/")[1]) == {"status": "OK"}
    for path in ("/healthz", "/readyz", "/metrics"):
        assert worker.status(path) == 200, path


def test_a_202_label_is_in_the_labels_topic_when_the_reply_arrives(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = svc
    rid = ask(kafka_io, service, "durable")
    wait_listed(worker, service, {rid})
    status, body = worker.post("/labels", label_body(rid), auth(service))
    assert status == 202, body
    mine = [r for r in kafka_io.read(service.topics["labels"]) if r.json()["request_id"] == rid]
    assert len(mine) == 1
    assert mine[0].key == b"m"


def test_with_the_broker_stopped_a_label_gets_503_and_a_retry_applies_it_once(
    svc: tuple[Service, Worker], kafka_io: KafkaIO, kafka_broker: LocalKafka
) -> None:
    service, worker = svc
    rid = ask(kafka_io, service, "outage")
    wait_listed(worker, service, {rid})
    applied = worker.metric("abstain_labels_applied_total", {"model": "m"})

    assert kafka_broker.stop()
    try:
        began = time.monotonic()
        status, body = worker.post("/labels", label_body(rid), auth(service))
        took = time.monotonic() - began
        assert status == 503, body
        assert json.loads(body)["error"].endswith("not saved, try again")
        assert ACK_TIMEOUT - 0.1 <= took < ACK_TIMEOUT + 3.0
        time.sleep(1.0)
        assert rid in queued(worker, service)  # still open: nothing applied
        assert worker.metric("abstain_labels_applied_total", {"model": "m"}) == applied
        assert worker.status("/healthz") == 200  # a lost broker is no reason to restart
    finally:
        kafka_broker.start()

    worker.wait_ready(timeout=120)
    deadline = time.monotonic() + 60
    while (status := worker.post("/labels", label_body(rid), auth(service))[0]) != 202:
        assert time.monotonic() < deadline, f"the retry still gets {status}"
        time.sleep(1.0)
    deadline = time.monotonic() + 90
    while worker.metric("abstain_labels_applied_total", {"model": "m"}) < applied + 1:
        assert time.monotonic() < deadline, "the label was never applied"
        time.sleep(0.5)
    # every copy that reached the topic is accounted for: one applied, the others (a 503'd
    # label may still be written from the producer's buffer) dead-lettered as already_applied
    t = service.topics
    copies = kafka_io.wait_for(t["labels"], lambda rs: rid in {r.json()["request_id"] for r in rs})
    n = sum(r.json()["request_id"] == rid for r in copies)

    def refused(records: list[Any]) -> int:
        return sum(
            r.json()["reason"] == "already_applied" and rid in r.json()["raw"] for r in records
        )

    kafka_io.wait_for(t["dead_letters"], lambda rs: refused(rs) == n - 1)
    time.sleep(2.0)
    assert worker.metric("abstain_labels_applied_total", {"model": "m"}) == applied + 1
    assert rid not in queued(worker, service)
