"""Real producers: kcat (librdkafka, the client behind most non-Java producers) writes every
wire format the README documents with every compression codec Kafka has; transactional
producers commit and abort; and a batch the worker cannot read stops its partition loudly,
never the stream, until ``abstain skip`` moves past it.

The worker runs beside a steady stream of events from the project's own producer (what the
demo writes): it must be decided throughout, whatever kcat writes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from faults.kafkaio import Out, produce, produce_records
from faults.kcat import kcat, kcat_read, write_unreadable

from service.records import request_id

KafkaIO = Record = Service = Worker = Any  # fixtures' types live in conftest.py

pytestmark = pytest.mark.integration

CODECS = ("none", "gzip", "lz4", "zstd", "snappy")
MODELS: dict[str, dict[str, Any]] = {
    "m": {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05},
    "named": {"algorithm": "dsal", "cost": 0.25, "feature_names": ["a", "b", "c"]},
}


class Stream(threading.Thread):
    """Events of model ``m`` from the project's own producer, every ``every`` seconds, until
    :meth:`halt` (bounded: at most ``limit``)."""

    def __init__(
        self, bootstrap: str, topic: str, name: str, *, every: float = 0.2, limit: int = 600
    ) -> None:
        super().__init__(daemon=True)
        self.name = name
        self.bootstrap, self.topic, self.every, self.limit = bootstrap, topic, every, limit
        self.sent: list[str] = []
        self.halted = threading.Event()

    def run(self) -> None:
        for i in range(self.limit):
            if self.halted.wait(self.every):
                return
            event = {"id": f"{self.name}-{i}", "model": "m", "features": [i % 7 - 3.0, 1.0, -0.5]}
            produce(
                self.bootstrap, self.topic, [(event["id"].encode(), json.dumps(event).encode())]
            )
            self.sent.append(event["id"])

    def halt(self) -> list[str]:
        self.halted.set()
        self.join(30)
        return list(self.sent)


@pytest.fixture(scope="module")
def svc(service_factory: Callable[..., Service]) -> Iterator[tuple[Service, Worker]]:
    service = service_factory(
        models=MODELS,
        default_model="m",
        partitions={"features": 3, "decisions": 1, "labels": 1, "models": 1},
    )
    worker = service.start()
    worker.wait_ready()
    return service, worker


def _decided(kio: KafkaIO, topic: str) -> Counter[str]:
    return Counter(r.json()["id"] for r in kio.read(topic))


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out: {what}")


def test_kcat_writes_every_wire_format_with_every_codec_and_each_event_is_decided_once(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = svc
    b, t = service.bootstrap, service.topics
    stream = Stream(b, t["features"], "codecs")
    stream.start()
    ids: list[str] = []
    try:
        for codec in CODECS:
            listed = {"id": f"kcat-{codec}-0", "features": [1.0, -2.0, 0.5], "ts": 1.5}
            named = {
                "id": f"kcat-{codec}-1",
                "model": "named",
                "features": {"c": 3, "a": 1, "b": 2},
            }
            keyless = {"id": f"kcat-{codec}-2", "model": "m", "features": [0.0, 0.25, -1]}
            lines = "".join(f"{e['id']}\t{json.dumps(e)}\n" for e in (listed, named))
            # -K: key and value split at a tab; headers are carried and ignored
            kcat(
                b,
                "-P",
                "-t",
                t["features"],
                "-z",
                codec,
                "-K",
                "\t",
                "-H",
                "trace=kcat",
                "-H",
                f"codec={codec}",
                data=lines.encode(),
            )
            kcat(b, "-P", "-t", t["features"], "-z", codec, data=json.dumps(keyless).encode())
            ids += [listed["id"], named["id"], keyless["id"]]
            time.sleep(1.0)
        # a tombstone: no decision, a dead letter (not_json)
        kcat(b, "-P", "-t", t["features"], "-Z", "-K", "\t", "-z", "lz4", data=b"gone\t\n")
        _wait(
            lambda: set(ids) <= set(_decided(kafka_io, t["decisions"])),
            60,
            "every kcat event decided",
        )
    finally:
        sent = stream.halt()
    _wait(
        lambda: set(sent) <= set(_decided(kafka_io, t["decisions"])),
        60,
        "every event of the stream decided",
    )
    decided = _decided(kafka_io, t["decisions"])
    assert {i: decided[i] for i in ids} == dict.fromkeys(ids, 1)
    assert {i: decided[i] for i in sent} == dict.fromkeys(sent, 1)
    assert len(sent) >= 10
    # the stream was decided throughout: no gap of seconds between two decisions
    records = [r for r in kafka_io.read(t["decisions"]) if r.json()["id"].startswith("codecs-")]
    times = sorted(r.timestamp for r in records)
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) < 3000
    letters = [r.json() for r in kafka_io.read(t["dead_letters"])]
    assert [x["reason"] for x in letters if x["topic"] == t["features"]].count("not_json") == 1
    # what kcat reads of the decisions is what the README says
    by_id = {}
    for env in kcat_read(b, t["decisions"]):
        body = json.loads(env["payload"])
        assert env["key"] == body["id"]
        by_id[body["id"]] = body
    for eid in ids:
        d = by_id[eid]
        assert set(d) >= {
            "id",
            "model",
            "action",
            "label",
            "score",
            "rho",
            "model_version",
            "queried",
            "query_probability",
            "ts",
        }
        assert d["action"] in ("predict", "reject")
        assert (d["label"] is None) == (d["action"] == "reject")
        assert d["model"] == ("named" if eid.endswith("-1") else "m")
    assert worker.status("/readyz") == 200


def test_kcat_answers_a_label_request_it_read_with_lz4_and_the_model_learns(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = svc
    b, t = service.bootstrap, service.topics
    events = [
        {"id": f"ask-{i}", "model": "named", "features": {"a": i, "b": -1, "c": 0.5}}
        for i in range(20)
    ]
    lines = "\n".join(f"{e['id']}\t{json.dumps(e)}" for e in events) + "\n"
    kcat(b, "-P", "-t", t["features"], "-z", "zstd", "-K", "\t", data=lines.encode())
    asked: list[dict[str, Any]] = []

    def requests_read() -> bool:
        asked[:] = [
            json.loads(env["payload"])
            for env in kcat_read(b, t["label_requests"])
            if env["key"] == "named"
        ]
        return bool(asked)

    _wait(requests_read, 60, "a label request for model named")
    request = asked[0]
    assert request["request_id"] == request_id("named", request["event_id"])
    assert set(request) >= {
        "request_id",
        "event_id",
        "model",
        "features",
        "score",
        "rho",
        "decided_label",
        "query_probability",
        "model_version",
        "requested_at",
        "expires_at",
        "priority",
    }
    label = {
        "request_id": request["request_id"],
        "model": "named",
        "label": 1,
        "labelled_by": "kcat",
    }
    kcat(
        b,
        "-P",
        "-t",
        t["labels"],
        "-z",
        "lz4",
        "-K",
        "\t",
        data=f"named\t{json.dumps(label)}\n".encode(),
    )

    def learned() -> bool:
        return any(
            r.key == b"named" and r.json()["version"] >= 1 for r in kafka_io.read(t["models"])
        )

    _wait(learned, 60, "model named at version 1")
    assert worker.metric("abstain_labels_applied_total", {"model": "named"}) == 1


def _transaction(bootstrap: str, topic: str, events: list[dict[str, Any]], *, commit: bool) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, transactional_id=f"tx-{events[0]['id']}"
        )
        await producer.start()
        try:
            async with producer.transaction() if commit else _aborting(producer):
                for e in events:
                    await producer.send_and_wait(
                        topic, json.dumps(e).encode(), key=e["id"].encode()
                    )
        finally:
            await producer.stop()

    asyncio.run(run())


class _aborting:  # noqa: N801 - used like producer.transaction()
    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer

    async def __aenter__(self) -> None:
        await self.producer.begin_transaction()

    async def __aexit__(self, *exc: object) -> None:
        await self.producer.abort_transaction()


def test_an_aborted_transaction_is_never_decided_and_a_committed_one_once(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = svc
    b, t = service.bootstrap, service.topics

    def batch(name: str) -> list[dict[str, Any]]:
        return [{"id": f"{name}-{i}", "model": "m", "features": [1.0, i, -1.0]} for i in range(6)]

    _transaction(b, t["features"], batch("aborted"), commit=False)
    _transaction(b, t["features"], batch("committed"), commit=True)
    after = [{"id": f"after-tx-{i}", "model": "m", "features": [0.5, 0.5, 0.5]} for i in range(3)]
    produce(b, t["features"], [(e["id"].encode(), json.dumps(e).encode()) for e in after])
    want = {e["id"] for e in batch("committed") + after}
    _wait(lambda: want <= set(_decided(kafka_io, t["decisions"])), 60, "committed decided")
    time.sleep(2.0)  # anything aborted would have come with them
    decided = _decided(kafka_io, t["decisions"])
    assert not [i for i in decided if i.startswith("aborted-")]
    assert {i: decided[i] for i in want} == dict.fromkeys(want, 1)
    # the transactions' control records are offsets no record is handed out for: the lag
    # still comes back to 0 (no false stall) and the group commits past them
    _wait(
        lambda: worker.metric("abstain_consumer_lag", {"topic": t["features"]}) == 0,
        20,
        "no lag left on the features topic",
    )
    assert worker.status("/healthz") == 200


def test_a_batch_the_worker_cannot_read_stops_its_partition_loudly_until_skipped(
    svc: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = svc
    b, t = service.bootstrap, service.topics
    stream = Stream(b, t["features"], "stopped")
    stream.start()
    try:
        before = [
            Out(
                f"pre-{i}".encode(),
                json.dumps({"id": f"pre-{i}", "model": "m", "features": [1, 2, 3]}).encode(),
                partition=1,
            )
            for i in range(3)
        ]
        produce_records(b, t["features"], before)
        # a header key that is not UTF-8: the broker takes it, the client cannot read it
        bad = {"id": "bad-header", "model": "m", "features": [1, 2, 3]}
        write_unreadable(b, t["features"], 1, [bad])
        after = [
            Out(
                f"post-{i}".encode(),
                json.dumps({"id": f"post-{i}", "model": "m", "features": [1, 2, 3]}).encode(),
                partition=1,
            )
            for i in range(3)
        ]
        produce_records(b, t["features"], after)
        began = time.monotonic()
        _wait(lambda: worker.status("/readyz") == 503, 10, "/readyz 503 within 10 s")
        seconds = time.monotonic() - began
        status, body = worker.get("/healthz")
        health = json.loads(body)
        assert status == 503
        assert not health["live"]
        (line,) = [s for s in health["stalled"] if "cannot be read" in s]
        assert f"{t['features']}[1]" in line
        assert "UnicodeDecodeError" in line
        ready = json.loads(worker.get("/readyz")[1])
        assert ready["unreadable"] == [line]
        assert worker.metric("abstain_unreadable_partitions", {"topic": t["features"]}) == 1
        decided = _decided(kafka_io, t["decisions"])
        assert all(decided[f"pre-{i}"] == 1 for i in range(3))
        assert not [f"post-{i}" for i in range(3) if decided[f"post-{i}"]]
        # the other partitions go on: the stream is still decided
        count = sum(1 for i in decided if i.startswith("stopped-"))
        _wait(
            lambda: (
                sum(1 for i in _decided(kafka_io, t["decisions"]) if i.startswith("stopped-"))
                > count + 5
            ),
            20,
            "the stream decided while partition 1 stands",
        )
        skipped = service.cli("skip", t["features"], "1", "--by", "ops")
        result = json.loads(skipped.stdout)
        assert result["skipped"]
        assert result["first"] == result["last"]
        post = [f"post-{i}" for i in range(3)]
        _wait(
            lambda: all(_decided(kafka_io, t["decisions"])[i] == 1 for i in post),
            20,
            "the records after the batch decided",
        )
        _wait(lambda: worker.status("/readyz") == 200, 20, "ready again")
        assert worker.metric("abstain_unreadable_partitions", {"topic": t["features"]}) == 0
    finally:
        sent = stream.halt()
    letters = [
        r.json() for r in kafka_io.read(t["dead_letters"]) if r.json()["reason"] == "unreadable"
    ]
    assert len(letters) == 1
    (letter,) = letters
    assert (letter["topic"], letter["partition"]) == (t["features"], 1)
    assert letter["offset"] == result["first"]
    assert letter["last_offset"] == result["last"]
    assert "UnicodeDecodeError" in letter["detail"]
    _wait(lambda: set(sent) <= set(_decided(kafka_io, t["decisions"])), 60, "stream decided")
    decided = _decided(kafka_io, t["decisions"])
    assert "bad-header" not in decided
    assert {i: decided[i] for i in sent} == dict.fromkeys(sent, 1)
    print(f"/readyz went 503 {seconds:.1f} s after the batch was written")
