"""Fixtures for service tests against the session's real broker (``kafka_bootstrap``).

``ServiceFactory`` starts ``python -m service worker`` subprocesses, each test run on a
fresh app id and fresh topic names, and stops them by PID. ``KafkaIO`` is a small
synchronous producer/reader for asserting on topics.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from service.localkafka import find_free_ports

REPO = Path(__file__).resolve().parents[2]
TOPIC_KEYS = ("features", "decisions", "label_requests", "labels", "models", "dead_letters")


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes

    def json(self) -> Any:
        return json.loads(self.value)


class KafkaIO:
    """Blocking helpers around aiokafka (each call runs its own short event loop)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def produce(self, topic: str, items: list[tuple[bytes | None, bytes]]) -> None:
        async def run() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
            await producer.start()
            try:
                for key, value in items:
                    await producer.send(topic, value, key=key)
                await producer.flush()
            finally:
                await producer.stop()

        asyncio.run(run())

    def produce_json(self, topic: str, items: list[tuple[str | None, Any]]) -> None:
        self.produce(
            topic,
            [(None if k is None else k.encode(), json.dumps(v).encode()) for k, v in items],
        )

    def read(self, topic: str) -> list[Record]:
        """Every record currently in ``topic`` (all partitions, from the beginning)."""

        async def run() -> list[Record]:
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
            await admin.start()
            try:
                (meta,) = await admin.describe_topics([topic])
            finally:
                await admin.close()
            if meta["error_code"] != 0:
                return []
            tps = [TopicPartition(topic, p["partition"]) for p in meta["partitions"]]
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False
            )
            await consumer.start()
            out: list[Record] = []
            try:
                consumer.assign(tps)
                await consumer.seek_to_beginning(*tps)
                end = await consumer.end_offsets(tps)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    positions = [await consumer.position(tp) for tp in tps]
                    if all(p >= end[tp] for p, tp in zip(positions, tps, strict=True)):
                        break
                    for recs in (await consumer.getmany(timeout_ms=200)).values():
                        out += [
                            Record(r.topic, r.partition, r.offset, r.key, r.value) for r in recs
                        ]
            finally:
                await consumer.stop()
            return sorted(out, key=lambda r: (r.partition, r.offset))

        return asyncio.run(run())

    def wait_for(
        self, topic: str, done: Callable[[list[Record]], bool], timeout: float = 30.0
    ) -> list[Record]:
        """Poll ``topic`` until ``done(records)``; fail with what was seen otherwise."""
        deadline = time.monotonic() + timeout
        records: list[Record] = []
        while time.monotonic() < deadline:
            records = self.read(topic)
            if done(records):
                return records
            time.sleep(0.3)
        raise AssertionError(f"timed out on {topic}: {len(records)} records, last {records[-3:]}")


@dataclass
class Worker:
    """One ``abstain worker`` subprocess."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        return http(self.url + path, headers=headers)

    def post(
        self, path: str, data: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        return http(self.url + path, data=data, headers=headers)

    def wait_ready(self, timeout: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited {self.proc.returncode}:\n{self.tail()}")
            try:
                status, body = self.get("/readyz")
            except OSError:
                status, body = 0, b""
            if status == 200:
                return dict(json.loads(body))
            time.sleep(0.3)
        raise AssertionError(f"worker not ready after {timeout}s:\n{self.tail()}")

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        from prometheus_client.parser import text_string_to_metric_families

        _, body = self.get("/metrics")
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == name and (labels or {}) == {
                    k: v for k, v in sample.labels.items() if k in (labels or {})
                }:
                    return float(sample.value)
        return None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def http(
    url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=data, headers=headers or {})  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


@dataclass
class Service:
    """A configuration (fresh app id and topics) and the workers started for it."""

    bootstrap: str
    tmp: Path
    config: dict[str, Any]
    workers: list[Worker] = field(default_factory=list)

    @property
    def topics(self) -> dict[str, str]:
        return dict(self.config["topics"])

    def start(self) -> Worker:
        port = find_free_ports(1)[0]
        path = self.tmp / "config.json"
        path.write_text(json.dumps(self.config))
        log = self.tmp / f"worker-{len(self.workers)}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
        cmd = [
            sys.executable, "-m", "service", "worker", "--config", str(path),
            "--broker", self.bootstrap, "--web-port", str(port),
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        worker = Worker(proc, port, log)
        self.workers.append(worker)
        return worker

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``python -m service ARGS --broker ... --config ...`` and return its output."""
        path = self.tmp / "config.json"
        path.write_text(json.dumps(self.config))
        cmd = [sys.executable, "-m", "service", *args, "--broker", self.bootstrap,
               "--config", str(path)]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
        return subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True
        )

    def stop_all(self) -> None:
        for worker in self.workers:
            worker.stop()


def make_config(tmp: Path, **overrides: Any) -> dict[str, Any]:
    suffix = uuid.uuid4().hex[:8]
    config: dict[str, Any] = {
        "app_id": f"t-{suffix}",
        "datadir": str(tmp / "data"),
        "topics": {k: f"t{suffix}.{k.replace('_', '-')}" for k in TOPIC_KEYS},
        "partitions": {"features": 4, "decisions": 2, "labels": 2, "models": 1},
        "label_token": "test-token",
        "request_ttl_seconds": 600,
        "stall_seconds": 30,
        "sweep_every": 1,
        "orphan_label_seconds": 2,
        "session_timeout_seconds": 6,
        "models": {
            "m": {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05},
            "boom": {
                "algorithm": "dsal",
                "cost": 0.25,
                "n_features": 3,
                "standardize": False,
                "hyperparameters": {"eta": 1e300},
            },
        },
        "default_model": "m",
        "log_level": "warning",
    }
    config.update(overrides)
    return config


@pytest.fixture(scope="session")
def kafka_io(kafka_bootstrap: str) -> KafkaIO:
    return KafkaIO(kafka_bootstrap)


@pytest.fixture(scope="module")
def service_factory(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Service]]:
    """Make services (fresh app id and topics); their workers stop after the module."""
    made: list[Service] = []

    def make(**overrides: Any) -> Service:
        tmp = tmp_path_factory.mktemp("svc")
        svc = Service(kafka_bootstrap, tmp, make_config(tmp, **overrides))
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.stop_all()
