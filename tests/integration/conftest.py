"""Fixtures for service tests against the session's real broker (``kafka_bootstrap``).

``ServiceFactory`` starts ``python -m service worker`` subprocesses, each test run on a
fresh app id and fresh topic names, and stops them by PID. ``KafkaIO`` is a small
synchronous producer/reader for asserting on topics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faults.kafkaio import Rec, produce, read_topic
from faults.workers import REPO, Deployment, WorkerProcess, service_config

Record = Rec


class CliError(subprocess.CalledProcessError):
    """A command that failed, with what it wrote to stderr in its message."""

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr}"


class KafkaIO:
    """Blocking helpers around aiokafka for one broker (``faults.kafkaio`` underneath)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def produce(self, topic: str, items: list[tuple[bytes | None, bytes]]) -> None:
        produce(self.bootstrap, topic, items)

    def produce_json(self, topic: str, items: list[tuple[str | None, Any]]) -> None:
        self.produce(
            topic,
            [(None if k is None else k.encode(), json.dumps(v).encode()) for k, v in items],
        )

    def read(self, topic: str) -> list[Record]:
        """Every record currently in ``topic`` (all partitions, from the beginning)."""
        return read_topic(self.bootstrap, topic, timeout=20)

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


Worker = WorkerProcess


class Service(Deployment):
    """A deployment (fresh app id and topics) whose workers the module fixture stops, and
    the command-line tools run against it."""

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``python -m service ARGS --broker ... --config ...`` and return its output."""
        path = self.write_config()
        cmd = [
            sys.executable,
            "-m",
            "service",
            *args,
            "--broker",
            self.bootstrap,
            "--config",
            str(path),
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
        done = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            raise CliError(done.returncode, cmd, output=done.stdout, stderr=done.stderr)
        return done


def make_config(tmp: Path, **overrides: Any) -> dict[str, Any]:
    """The service tests' configuration: two models (``boom`` overflows on purpose), short
    expiry of parked labels, a sweep per message."""
    defaults: dict[str, Any] = {
        "partitions": {"features": 4, "decisions": 2, "labels": 2, "models": 1},
        "label_token": "test-token-0123456789",
        "request_ttl_seconds": 600,
        "stall_seconds": 30,
        "sweep_every": 1,
        "orphan_label_seconds": 2,
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
    }
    return service_config(tmp, **{**defaults, **overrides})


#: Debian's Chromium, which the desk's browser tests drive with Playwright
CHROMIUM = os.environ.get("ABSTAIN_CHROMIUM", "/usr/bin/chromium")
# as root, headless; without the background-networking flags Chromium keeps trying the
# network, which this machine refuses
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-gpu",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the module's browser tests (Playwright's sync API)."""
    playwright_sync = pytest.importorskip("playwright.sync_api")
    with playwright_sync.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


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
        svc.close()
