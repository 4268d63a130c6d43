"""A decompression bomb on a real broker: one zstd record batch of about 58 KB on the wire
that inflates to 1.9 GB of zeros, written to a partition of the features topic while a
worker held to 1 GiB of address space (the chart's memory limit) reads it.

The worker refuses the batch before it is inflated whole (``max_inflated_bytes``): it stays
up, stops that partition loudly (readiness 503 within seconds), decides the events of the
other partitions throughout, and ``abstain skip`` (held to the same limit) finds the batch,
dead-letters it and moves the worker past it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import TopicPartition
from faults.bombs import GIB, write_batch, zstd_bomb
from faults.kafkaio import Out, produce_records
from faults.workers import REPO, _Limited

KafkaIO = Service = Any  # fixtures' types live in conftest.py

pytestmark = pytest.mark.integration

#: the bomb's one record: 1.9 GB of zeros (about 58 KB once compressed)
INFLATED = 1_900_000_000
#: the bad partition; the others (0, 2, 3) carry the steady stream
BAD = 1
#: the chart's memory limit (helm/abstain/values.yaml resources.limits.memory)
LIMIT = GIB


def _event(name: str, partition: int) -> Out:
    body = {"id": name, "model": "m", "features": [1.0, 2.0, 3.0]}
    return Out(name.encode(), json.dumps(body).encode(), partition=partition)


class Stream(threading.Thread):
    """Events on the partitions but the bad one, every 0.2 s, until :meth:`halt` (bounded:
    at most 600)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.sent: list[str] = []
        self.halted = threading.Event()

    def run(self) -> None:
        for i in range(600):
            if self.halted.wait(0.2):
                return
            name = f"steady-{i}"
            produce_records(self.bootstrap, self.topic, [_event(name, (0, 2, 3)[i % 3])])
            self.sent.append(name)

    def halt(self) -> list[str]:
        self.halted.set()
        self.join(10)
        return list(self.sent)


def _decided(kio: KafkaIO, topic: str) -> Counter[str]:
    return Counter(r.json()["id"] for r in kio.read(topic))


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out: {what}")


def _skip(service: Service, topic: str) -> dict[str, Any]:
    """``abstain skip topic BAD``, held to the worker's memory limit."""
    cmd = [sys.executable, "-m", "service", "skip", topic, str(BAD), "--by", "ops"]
    cmd += ["--broker", service.bootstrap, "--config", str(service.write_config())]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    done = subprocess.run(  # noqa: S603 - fixed argv
        cmd,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=_Limited(LIMIT),
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_decompression_bomb_stops_its_partition_and_never_the_worker(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    service = service_factory(
        default_model="m",
        partitions={"features": 4, "decisions": 1, "labels": 1, "models": 1},
    )
    t = service.topics
    bomb = zstd_bomb(INFLATED)
    assert len(bomb) < 100_000
    worker = service.start(memory_bytes=LIMIT)
    worker.wait_ready()
    produce_records(service.bootstrap, t["features"], [_event(f"pre-{i}", BAD) for i in range(3)])
    _wait(
        lambda: all(_decided(kafka_io, t["decisions"])[f"pre-{i}"] for i in range(3)),
        30,
        "the events before the bomb decided",
    )
    rested = worker.memory()
    stream = Stream(service.bootstrap, t["features"])
    stream.start()
    try:
        write_batch(service.bootstrap, TopicPartition(t["features"], BAD), bomb)
        written = time.monotonic()
        post = [f"post-{i}" for i in range(3)]
        produce_records(service.bootstrap, t["features"], [_event(n, BAD) for n in post])
        _wait(lambda: worker.status("/readyz") == 503, 10, "/readyz 503 within 10 s")
        seconds = time.monotonic() - written
        assert worker.alive(), worker.tail()
        status, body = worker.get("/healthz")
        assert status == 503
        (line,) = [s for s in json.loads(body)["stalled"] if "cannot be read" in s]
        assert f"{t['features']}[{BAD}]" in line
        assert "InflateRefused" in line
        # the other partitions go on while this one stands
        count = sum(1 for i in _decided(kafka_io, t["decisions"]) if i.startswith("steady-"))
        _wait(
            lambda: (
                sum(1 for i in _decided(kafka_io, t["decisions"]) if i.startswith("steady-"))
                > count + 10
            ),
            30,
            "the stream decided while the bad partition stands",
        )
        assert not any(_decided(kafka_io, t["decisions"])[n] for n in post)
        assert worker.alive(), worker.tail()

        result = _skip(service, t["features"])
        assert result["skipped"]
        assert "InflateRefused" in result["error"]
        assert result["first"] == result["last"] == 3
        _wait(
            lambda: all(_decided(kafka_io, t["decisions"])[n] == 1 for n in post),
            30,
            "the events after the bomb decided",
        )
        _wait(lambda: worker.status("/readyz") == 200, 30, "ready again")
        assert worker.metric("abstain_unreadable_partitions", {"topic": t["features"]}) == 0
        peak = worker.memory()
    finally:
        sent = stream.halt()
    _wait(lambda: set(sent) <= set(_decided(kafka_io, t["decisions"])), 60, "stream decided")
    decided = _decided(kafka_io, t["decisions"])
    assert {i: decided[i] for i in sent} == dict.fromkeys(sent, 1)
    letters = [
        r.json() for r in kafka_io.read(t["dead_letters"]) if r.json()["reason"] == "unreadable"
    ]
    assert [(x["topic"], x["partition"], x["offset"]) for x in letters] == [(t["features"], BAD, 3)]
    assert "InflateRefused" in letters[0]["detail"]
    assert worker.alive(), worker.tail()
    # refused within the bound (128 MiB): nowhere near the 1.9 GB the batch asks for
    grew = peak["VmHWM"] - rested["VmHWM"]
    assert grew < 384 * 1024 * 1024, (rested, peak)
    print(
        f"/readyz 503 {seconds:.1f} s after the bomb; worker peak resident "
        f"{peak['VmHWM'] / 2**20:.0f} MiB (at rest {rested['VmHWM'] / 2**20:.0f} MiB), "
        f"peak address space {peak['VmPeak'] / 2**20:.0f} MiB; bomb {len(bomb)} bytes"
    )


def test_a_worker_that_never_met_the_bomb_passes_it_on_the_order_written_before_it_started(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    # the worker that met the bomb is gone (killed by it, before the bound); the operator's
    # order is on the models topic before the next worker starts
    service = service_factory(
        default_model="m",
        partitions={"features": 4, "decisions": 1, "labels": 1, "models": 1},
    )
    t = service.topics
    pre = [f"pre-{i}" for i in range(3)]
    post = [f"post-{i}" for i in range(3)]
    first = service.start(memory_bytes=LIMIT)
    first.wait_ready()
    produce_records(service.bootstrap, t["features"], [_event(n, BAD) for n in pre])
    _wait(
        lambda: all(_decided(kafka_io, t["decisions"])[n] == 1 for n in pre),
        30,
        "the events before the bomb decided",
    )
    _wait(
        lambda: first.metric("abstain_consumer_lag", {"topic": t["features"]}) == 0,
        30,
        "their offsets committed",
    )
    assert first.stop() == 0
    write_batch(service.bootstrap, TopicPartition(t["features"], BAD), zstd_bomb(INFLATED))
    produce_records(service.bootstrap, t["features"], [_event(n, BAD) for n in post])
    result = _skip(service, t["features"])
    assert (result["read_from"], result["first"], result["last"]) == (3, 3, 3)
    assert "InflateRefused" in result["error"]

    worker = service.start(memory_bytes=LIMIT)
    worker.wait_ready()
    statuses: list[int] = []

    def decided_all() -> bool:
        statuses.append(worker.status("/readyz"))
        decided = _decided(kafka_io, t["decisions"])
        return all(decided[n] == 1 for n in pre + post)

    _wait(decided_all, 60, "every event after the bomb decided")
    assert worker.alive(), worker.tail()
    skipped = {"topic": t["features"], "outcome": "skipped"}
    stopped = {"topic": t["features"], "outcome": "stopped"}
    assert worker.metric("abstain_unreadable_batches_total", skipped) == 1
    assert worker.metric("abstain_unreadable_batches_total", stopped) == 0  # never stood
    assert set(statuses) == {200}
    _wait(
        lambda: worker.metric("abstain_consumer_lag", {"topic": t["features"]}) == 0,
        30,
        "the offset after the bomb committed",
    )
