"""Records the Kafka consumer fetches but never hands to an agent are still processed.

faust-streaming drops records fetched while an assignment is being recovered (after a
restart or a rebalance) and moves on; the worker notices and processes them itself. The
fault worker makes faust's consumer drop the next N fetched records of a topic on demand:

- features: read by the scoring path's own consumer, never by faust's, so nothing is
  dropped (and nothing needs recovering);
- label requests and labels: the learner still stores every request and applies every
  label exactly once (a later record shows the gap: it is fetched and processed first; at
  the tail the quiet partition is sought back).

After each, every event has a decision and the group's committed offsets reach the end.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from faults.data import EventSource
from faults.kafkaio import group_lag, produce, read_topic
from faults.oracle import Observer, answer_fraction
from faults.report import Summary, emit
from faults.scenario import assert_promise, deployment, settle
from faults.workers import REPO, Deployment

from service.stream.continuity import QUIET_SECONDS

FAULT_WORKER = Path(__file__).resolve().parent / "faults" / "faultworker.py"
RECOVERED = "abstain_skipped_records_recovered_total"


def _lag(dep: Deployment, topic: str, timeout: float) -> int:
    """The group's lag on ``topic`` once it is 0, or when ``timeout`` is up."""
    deadline = time.monotonic() + timeout
    while True:
        lag = sum(group_lag(dep.bootstrap, dep.app_id, [topic]).values())
        if lag == 0 or time.monotonic() > deadline:
            return lag
        time.sleep(0.5)


def test_records_the_consumer_drops_are_processed_once_and_committed(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    with deployment(
        kafka_bootstrap,
        tmp_path,
        partitions={"features": 1, "decisions": 1, "labels": 1, "models": 1},
        env={"PYTHONPATH": str(REPO)},
    ) as dep:
        t = dep.topics
        src = EventSource("skip", seed=11)
        observer = Observer(
            kafka_bootstrap, t, src.truth, budget=30, answer=answer_fraction(0.5)
        ).begin()
        worker = dep.start(argv=[sys.executable, str(FAULT_WORKER)])
        worker.wait_ready()

        def skip(topic: str, count: int) -> None:
            status, body = worker.post("/__faults/skip", json.dumps(
                {"topic": t[topic], "count": count}).encode())  # fmt: skip
            assert status == 200, body

        def recovered(topic: str) -> float:
            return worker.metric(RECOVERED, {"topic": t[topic]})

        produce(dep.bootstrap, t["features"], src.make(40))
        observer.wait(lambda o: o.decided(src.truth) == 40, 60, "the first decisions")
        assert recovered("features") == 0.0  # nothing skipped, nothing fetched aside

        # the features topic is read by the scoring path's own consumer, not faust's: a
        # faust-level drop cannot reach it (the 15 are decided at once, none fetched aside)
        skip("features", 15)
        sent = time.monotonic()
        produce(dep.bootstrap, t["features"], src.make(15))
        observer.wait(lambda o: o.decided(src.truth) == 55, 60, "the next events decided")
        tail_s = time.monotonic() - sent
        assert tail_s < QUIET_SECONDS, "decided only after the quiet time: dropped?"
        assert recovered("features") == 0.0
        assert _lag(dep, t["features"], 20) == 0
        before = recovered("features")
        sent = time.monotonic()
        produce(dep.bootstrap, t["features"], src.make(25))
        observer.wait(lambda o: o.decided(src.truth) == 80, 60, "the middle decided")
        gap_s = time.monotonic() - sent
        assert recovered("features") == before
        assert _lag(dep, t["features"], 20) == 0

        # the learner's inputs: dropped label requests and labels
        skip("label_requests", 8)
        skip("labels", 4)
        produce(dep.bootstrap, t["features"], src.make(80))
        settled = settle(dep, observer, list(src.truth), "m", 120)
        summary = Summary("skipped records", "ci", faults=4, recovery_s=[tail_s, gap_s])
        try:
            assert settled, settled
            assert_promise(dep, observer, list(src.truth), "m", summary, worker=worker)
            assert recovered("label_requests") >= 8
            assert recovered("labels") >= 4
            assert "records fetched and processed" in dep.logs()  # the gap

            # the tail: the last two labels dropped, nothing after them (two answers sent
            # again): the quiet partition is sought back, and both are refused as repeats
            before = recovered("labels")
            repeats = [(r.key, r.value or b"") for r in read_topic(dep.bootstrap, t["labels"])][-2:]
            skip("labels", 2)
            sent = time.monotonic()
            produce(dep.bootstrap, t["labels"], repeats)
            while recovered("labels") < before + 2 and time.monotonic() - sent < 60:
                time.sleep(0.3)
            assert recovered("labels") >= before + 2
            assert time.monotonic() - sent >= QUIET_SECONDS - 1.0, "not dropped?"
            assert "fetched but never processed; reading them again" in dep.logs()
            assert _lag(dep, t["labels"], 20) == 0
            assert_promise(dep, observer, list(src.truth), "m", summary, worker=worker)
            assert worker.alive()
        finally:
            observer.halt()
            summary.runtime_s = time.monotonic() - began
            summary.notes["recovered (features, label-requests, labels)"] = [
                recovered(k) for k in ("features", "label_requests", "labels")
            ]
            summary.notes["recovery s"] = "features after a faust-level drop: produced -> decided"
            emit(summary, tmp_path, capsys)
