"""Stall detection: a worker whose consumer silently stops making progress while messages
wait (the faust failure mode of consumers that stop without an error) fails its liveness
check within ``stall_seconds``; an idle worker with nothing to do stays live."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from faults.data import EventSource
from faults.kafkaio import produce
from faults.oracle import Observer
from faults.report import Summary, emit
from faults.scenario import deployment
from faults.workers import REPO

STALL = 3.0
FAULT_WORKER = Path(__file__).resolve().parent / "faults" / "faultworker.py"


def test_a_stalled_consumer_fails_liveness_within_stall_seconds(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    with deployment(
        kafka_bootstrap, tmp_path, stall_seconds=STALL, env={"PYTHONPATH": str(REPO)}
    ) as dep:
        t = dep.topics
        src = EventSource("stall")
        observer = Observer(kafka_bootstrap, t, src.truth).begin()
        worker = dep.start(argv=[sys.executable, str(FAULT_WORKER)])
        worker.wait_ready()
        produce(dep.bootstrap, t["features"], src.make(50))
        observer.wait(lambda o: o.decided(src.truth) == 50, 60, "the first decisions")

        # idle with nothing to consume for longer than stall_seconds: still live
        time.sleep(2 * STALL)
        assert worker.status("/healthz") == 200
        assert worker.metric("abstain_live") == 1.0

        # the consumer stops; events keep arriving
        status, body = worker.post("/__faults/pause", b"")
        assert status == 200
        assert json.loads(body)["paused"]
        paused_at = time.monotonic()
        produce(dep.bootstrap, t["features"], src.make(20))
        lag_at = time.monotonic()
        while worker.status("/healthz") == 200 and time.monotonic() - lag_at < 5 * STALL:
            time.sleep(0.1)
        detected = time.monotonic() - lag_at
        status, body = worker.get("/healthz")
        assert status == 503
        health = json.loads(body)
        assert health["live"] is False
        assert any(t["features"] in s for s in health["stalled"]), health
        assert worker.metric("abstain_live") == 0.0
        # within the configured stall time (plus the one-second timer and an HTTP poll)
        assert detected <= STALL + 2.0, detected
        # the stall was real: the paused worker decided none of the new events
        assert observer.decided(src.truth) == 50
        assert worker.alive()
        assert worker.status("/readyz") == 200  # stalled is a liveness matter only

        # what the liveness probe triggers: the worker is restarted, and the successor
        # decides what waited
        restarted_at = time.monotonic()
        assert worker.stop() == 0
        successor = dep.start()
        successor.wait_ready()
        observer.wait(lambda o: o.decided(src.truth) == 70, 60, "decisions after the restart")
        recovery = time.monotonic() - restarted_at
        assert successor.status("/healthz") == 200
        assert successor.metric("abstain_live") == 1.0
        observer.halt()
        emit(
            Summary(
                "stall",
                "ci",
                events_sent=src.count,
                decided=observer.decided(src.truth),
                decision_records=observer.decision_records,
                faults=1,
                recovery_s=[recovery],
                runtime_s=time.monotonic() - began,
                notes={
                    "stall_seconds": STALL,
                    "liveness failed after (s, from the first waiting event)": round(detected, 1),
                    "paused for (s)": round(time.monotonic() - paused_at, 1),
                },
            ),
            tmp_path,
            capsys,
        )
