"""The learner checks what it reads with the label desk's function, on a real broker:

1. A pending entry forged on the learner's changelog (five features for a model of three,
   under the id of a request still to come), read by a restarted worker, neither blocks the
   genuine request nor takes its label: the label is applied to the genuine request.
2. Two labels for one request that overtook it: the first waits, the second is a second
   answer (``already_applied``), and the first is the one applied when the request comes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from faults.data import label_request
from faults.kafkaio import Out, produce_records
from faults.workers import wait_until

from service.records import PendingEntry, request_id
from service.records.wire import label_request_from_dict

pytestmark = pytest.mark.integration

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py

PARTITIONS = {"features": 1, "decisions": 1, "labels": 1, "models": 1}


def request_record(event: str, features: list[float]) -> dict[str, Any]:
    return label_request(
        request_id("m", event), "m", features, expires_at=time.time() + 3600, event_id=event
    )


def label(event: str, y: int) -> bytes:
    return json.dumps({"request_id": request_id("m", event), "model": "m", "label": y}).encode()


def dead(kio: KafkaIO, service: Service) -> list[tuple[str, int, str]]:
    rows = [r.json() for r in kio.read(service.topics["dead_letters"])]
    return [(d["topic"], d["offset"], d["reason"]) for d in rows]


def versions(kio: KafkaIO, service: Service) -> list[int]:
    return [r.json()["version"] for r in kio.read(service.topics["models"]) if r.key == b"m"]


def test_a_forged_pending_entry_neither_blocks_nor_takes_the_genuine_request(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    service = service_factory(partitions=PARTITIONS)
    worker = service.start()
    worker.wait_ready()
    worker.stop()
    forged = PendingEntry(label_request_from_dict(request_record("e1", [9.0] * 5)), 0)
    key = request_id("m", "e1").encode()
    produce_records(
        service.bootstrap, service.changelog("pending"), [Out(key, forged.to_json(), partition=0)]
    )
    worker = service.start()  # recovers the changelog
    worker.wait_ready()
    t = service.topics
    genuine = json.dumps(request_record("e1", [0.5, -1.0, 2.0])).encode()
    produce_records(service.bootstrap, t["label_requests"], [Out(b"m", genuine)])
    time.sleep(1)
    produce_records(service.bootstrap, t["labels"], [Out(b"m", label("e1", 1))])
    wait_until(lambda: 1 in versions(kafka_io, service), 60, "the label applied")
    assert dead(kafka_io, service) == []


def test_a_second_label_for_a_waiting_request_does_not_replace_the_first(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    service = service_factory(partitions=PARTITIONS, orphan_label_seconds=30)
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    where = produce_records(
        service.bootstrap, t["labels"], [Out(b"m", label("e2", -1)), Out(b"m", label("e2", 1))]
    )
    first, second = (o for _, o in where)
    wait_until(
        lambda: (t["labels"], second, "already_applied") in dead(kafka_io, service),
        60,
        "the second answer refused",
    )
    record = json.dumps(request_record("e2", [0.5, -1.0, 2.0])).encode()
    produce_records(service.bootstrap, t["label_requests"], [Out(b"m", record)])
    wait_until(lambda: 1 in versions(kafka_io, service), 60, "the waiting label applied")
    entries = [
        r
        for r in kafka_io.read(service.changelog("pending"))
        if r.key == request_id("m", "e2").encode() and r.value
    ]
    applied = [r.json() for r in entries if r.json().get("applied")]
    assert applied, entries
    assert applied[-1]["label"] == -1
    assert applied[-1]["applied_offset"] == first
    assert dead(kafka_io, service) == [(t["labels"], second, "already_applied")]
