"""Upgrading a deployment whose learner ran as a faust agent over faust tables: the learner's
own consumer group starts where the faust group (``<app_id>``) committed, and the pending
entries faust's table wrote to ``<app_id>-pending-changelog`` are the learner's.

What an earlier version leaves is written here by hand, record for record as faust wrote it
(raw key and value, the same record types): a label request the agent handled, its pending
entry in the changelog, the faust group's committed offsets, and one record on the labels
topic that the agent had already handled and that would be dead-lettered if it were read
again."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from faults.checks import learn_offline
from faults.kafkaio import create_topics

from service.records import LabelRequest, PendingEntry, request_id
from service.stream.labels.loop import learn_group

Service = KafkaIO = Any  # fixtures' types live in conftest.py
FAULT_WORKER = Path(__file__).resolve().parent / "faults" / "faultworker.py"
MODEL = {"algorithm": "dsal", "cost": 0.25, "n_features": 3}
FEATURES = [0.5, -0.2, 0.1]


def _replay(cfg: dict[str, Any], labelled: list[tuple[list[float], int]]) -> tuple[Any, float]:
    """Offline: the same labels, in the same order, through the learner a worker serves."""
    _, learner = learn_offline("offline", cfg, labelled)
    return learner.w, learner.rho


def _commit(bootstrap: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    async def run() -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            consumer.assign(list(offsets))
            await consumer.commit(offsets)
        finally:
            await consumer.stop()

    asyncio.run(run())


def _committed(bootstrap: str, group: str, tp: TopicPartition) -> int | None:
    async def run() -> int | None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
        )
        await consumer.start()
        try:
            offset: int | None = await consumer.committed(tp)
            return offset
        finally:
            await consumer.stop()

    return asyncio.run(run())


def test_the_learner_goes_on_from_what_the_faust_agent_and_tables_left(
    service_factory: Callable[..., Service], kafka_io: KafkaIO, kafka_bootstrap: str
) -> None:
    service = service_factory(
        models={"m": MODEL},
        default_model="m",
        partitions={"features": 1, "decisions": 1, "labels": 1, "models": 1},
    )
    t, app = service.topics, service.app_id
    create_topics(kafka_bootstrap, {t["label_requests"]: 1, t["labels"]: 1})
    changelogs = [service.changelog(n) for n in ("pending", "orphans", "models")]
    create_topics(kafka_bootstrap, dict.fromkeys(changelogs, 1), compacted=changelogs)
    now = time.time()
    rid = request_id("m", "old-1")
    request = LabelRequest(
        request_id=rid,
        event_id="old-1",
        model="m",
        features=FEATURES,
        score=0.1,
        rho=0.5,
        decided_label=0,
        query_probability=0.9,
        model_version=0,
        requested_at=now,
        expires_at=now + 600,
        priority=0.5,
    )
    kafka_io.produce(t["label_requests"], [(b"m", request.to_json())])
    kafka_io.produce(t["labels"], [(b"m", b"handled long ago, not JSON")])
    entry = PendingEntry(request, 0).to_json()  # what faust's table wrote for it
    kafka_io.produce(service.changelog("pending"), [(rid.encode(), entry)])
    handled = {TopicPartition(t["label_requests"], 0): 1, TopicPartition(t["labels"], 0): 1}
    _commit(kafka_bootstrap, app, handled)

    worker = service.start()
    worker.wait_ready()
    # the request the faust agent stored is pending here: its label applies at once
    kafka_io.produce_json(t["labels"], [("m", {"request_id": rid, "model": "m", "label": 1})])
    models = kafka_io.wait_for(
        t["models"], lambda rs: any(r.key == b"m" and r.json()["version"] == 1 for r in rs)
    )
    final = [r.json() for r in models if r.key == b"m"][-1]
    w, rho = _replay(MODEL, [(FEATURES, 1)])  # the learner a worker serves, offline
    np.testing.assert_allclose(final["learner"]["champion"]["learned"]["w"], w, rtol=1e-12)
    assert final["learner"]["champion"]["learned"]["rho"] == pytest.approx(rho, rel=1e-12)
    assert worker.metric("abstain_labels_applied_total", {"model": "m"}) == 1.0

    # nothing the faust group had committed was read again: the garbage at labels@0 was
    # never dead-lettered, and the learn group moved on from the faust group's offsets
    deadline = time.monotonic() + 30
    labels_tp = TopicPartition(t["labels"], 0)
    while _committed(kafka_bootstrap, learn_group(app), labels_tp) != 2:
        assert time.monotonic() < deadline, "the learn group never committed the label"
        time.sleep(0.5)
    requests_tp = TopicPartition(t["label_requests"], 0)
    assert _committed(kafka_bootstrap, learn_group(app), requests_tp) in (None, 1)
    letters = [r.json() for r in kafka_io.read(t["dead_letters"])]
    assert not [d for d in letters if d["topic"] == t["labels"]], letters
    assert worker.alive()


def test_a_start_kafka_cannot_tell_is_waited_for_never_taken_from_the_first_record(
    service_factory: Callable[..., Service], kafka_io: KafkaIO, kafka_bootstrap: str
) -> None:
    """The faust group committed past a garbage record on the features and labels topics.
    While where it left off cannot be read, the worker consumes neither topic (the garbage
    is not dead-lettered, a new event is not decided, a label not applied) and is not
    ready, yet alive; once Kafka answers, both loops start where the faust group left off."""
    service = service_factory(
        models={"m": {**MODEL, "algorithm": "dsol"}},  # DSOL asks about every event
        default_model="m",
        partitions={"features": 1, "decisions": 1, "labels": 1, "models": 1},
    )
    service.env["FAULTS_OLD_GROUP_DOWN"] = "1"
    t, app = service.topics, service.app_id
    create_topics(kafka_bootstrap, {t["features"]: 1, t["label_requests"]: 1, t["labels"]: 1})
    kafka_io.produce(t["features"], [(b"old", b"handled long ago, not JSON")])
    kafka_io.produce(t["labels"], [(b"m", b"handled long ago, not JSON")])
    _commit(
        kafka_bootstrap,
        app,
        {TopicPartition(t["features"], 0): 1, TopicPartition(t["labels"], 0): 1},
    )
    kafka_io.produce_json(t["features"], [("new-1", {"id": "new-1", "features": FEATURES})])

    worker = service.start(argv=[sys.executable, str(FAULT_WORKER)])
    deadline = time.monotonic() + 60
    while worker.status("/readyz") == 0:  # serving pages: the partitions are assigned soon
        assert time.monotonic() < deadline, worker.tail()
        time.sleep(0.25)
    while "cannot learn where" not in worker.tail(200):  # attempts for START_TIMEOUT_SECONDS
        assert time.monotonic() < deadline, worker.tail()
        time.sleep(0.5)
    time.sleep(3)  # and more attempts, a second apart
    assert worker.alive()
    assert worker.status("/readyz") == 503
    assert kafka_io.read(t["decisions"]) == []
    assert kafka_io.read(t["dead_letters"]) == []

    status, _ = worker.post("/__faults/old-group", b'{"down": false}')
    assert status == 200
    worker.wait_ready(60)
    decided = kafka_io.wait_for(t["decisions"], lambda rs: len(rs) >= 1)
    assert [r.json()["id"] for r in decided] == ["new-1"]
    (asked,) = kafka_io.wait_for(t["label_requests"], lambda rs: len(rs) >= 1)
    rid = asked.json()["request_id"]
    kafka_io.produce_json(t["labels"], [("m", {"request_id": rid, "model": "m", "label": 1})])
    kafka_io.wait_for(
        t["models"], lambda rs: any(r.key == b"m" and r.json()["version"] == 1 for r in rs)
    )
    assert kafka_io.read(t["dead_letters"]) == []  # neither garbage record was read
    assert worker.metric("abstain_labels_applied_total", {"model": "m"}) == 1.0
    assert worker.alive()


def test_hostile_changelog_records_are_skipped_on_recovery_and_learning_goes_on(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    """The changelogs are topics anyone with access can write. Records written straight to
    them while the worker is down -- a value that is not a record, a key that is not UTF-8,
    a tombstone for a real pending request (a record without a key the broker itself refuses
    on a compacted topic) -- are read back on recovery: nothing
    crashes, the tombstoned request is gone (its label waits, then is dead-lettered), every
    other request's label applies once."""
    service = service_factory(
        models={"m": {**MODEL, "algorithm": "dsol"}},  # DSOL asks about every event
        default_model="m",
        partitions={"features": 1, "decisions": 1, "labels": 1, "models": 1},
    )
    t = service.topics
    first = service.start()
    first.wait_ready()
    rng = np.random.default_rng(5)
    events = [{"id": f"h-{i}", "features": rng.normal(size=3).round(4).tolist()} for i in range(6)]
    kafka_io.produce_json(t["features"], [(e["id"], e) for e in events])
    requests = [r.json() for r in kafka_io.wait_for(t["label_requests"], lambda rs: len(rs) == 6)]
    pending = service.changelog("pending")
    kafka_io.wait_for(pending, lambda rs: len({r.key for r in rs}) == 6)
    assert first.stop() == 0

    gone = requests[0]["request_id"]
    kafka_io.produce(
        pending, [(b"forged", b"not a pending entry"), (b"\xff\xfe", b"{}"), (gone.encode(), None)]
    )
    kafka_io.produce(service.changelog("orphans"), [(b"forged", b"not a parked label")])
    kafka_io.produce(service.changelog("models"), [(b"m@999", b"not an envelope")])

    second = service.start()
    second.wait_ready()
    labels = [{"request_id": q["request_id"], "model": "m", "label": 1} for q in requests]
    kafka_io.produce_json(t["labels"], [("m", lab) for lab in labels])
    kafka_io.wait_for(
        t["models"], lambda rs: any(r.key == b"m" and r.json()["version"] == 5 for r in rs)
    )
    # the orphaned label waits orphan_label_seconds (2 s here), then is swept on the
    # learner's next record of that partition: one more event brings one
    time.sleep(2.5)
    kafka_io.produce_json(t["features"], [("h-late", {"id": "h-late", "features": [0, 0, 1]})])
    kafka_io.wait_for(
        t["dead_letters"], lambda rs: any(r.json()["reason"] == "unknown_request" for r in rs)
    )
    letters = [r.json() for r in kafka_io.read(t["dead_letters"])]
    assert [d["reason"] for d in letters if d["topic"] == t["labels"]] == ["unknown_request"]
    assert second.metric("abstain_labels_applied_total", {"model": "m"}) == 5.0
    assert second.alive()
    assert json.loads(second.get("/readyz")[1])["models"]["m"] == 5
