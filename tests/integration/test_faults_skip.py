"""A record faust's consumer drops cannot be lost: no input of the worker goes through it.

faust-streaming drops records fetched while an assignment is being recovered (after a
restart or a rebalance) and moves on. The worker reads its inputs with its own consumers
(the scoring path: features; the learner: label requests and labels), never through a
faust stream. The fault worker makes faust's consumer drop the next N fetched records of
a topic on demand; for every input topic the order finds nothing to drop: the events are
decided at once, every request stored, every label applied exactly once, and the
committed offsets reach the end.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from faults.data import EventSource
from faults.kafkaio import group_lag, produce
from faults.oracle import Observer, answer_fraction
from faults.report import Summary, emit
from faults.scenario import assert_promise, deployment, settle
from faults.workers import REPO, Deployment

#: seconds within which a record must be handled to count as not dropped (a dropped one
#: would wait for a restart)
PROMPT_SECONDS = 5.0
FAULT_WORKER = Path(__file__).resolve().parent / "faults" / "faultworker.py"


def _lag(dep: Deployment, topic: str, timeout: float) -> int:
    """The group's lag on ``topic`` once it is 0, or when ``timeout`` is up."""
    deadline = time.monotonic() + timeout
    while True:
        lag = sum(group_lag(dep.bootstrap, dep.app_id, [topic]).values())
        if lag == 0 or time.monotonic() > deadline:
            return lag
        time.sleep(0.5)


def test_nothing_faust_drops_can_reach_the_workers_inputs(
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

        def skip(topic: str, count: int) -> dict[str, int]:
            """Order a drop; the drops still owed, by topic."""
            status, body = worker.post(
                "/__faults/skip", json.dumps({"topic": t[topic], "count": count}).encode()
            )
            assert status == 200, body
            owed: dict[str, int] = json.loads(body)["skipping"]
            return owed

        produce(dep.bootstrap, t["features"], src.make(40))
        observer.wait(lambda o: o.decided(src.truth) == 40, 60, "the first decisions")

        # the features topic is read by the scoring path's own consumer, not faust's: a
        # faust-level drop cannot reach it (the 15 are decided at once, none fetched aside)
        skip("features", 15)
        sent = time.monotonic()
        produce(dep.bootstrap, t["features"], src.make(15))
        observer.wait(lambda o: o.decided(src.truth) == 55, 60, "the next events decided")
        tail_s = time.monotonic() - sent
        assert tail_s < PROMPT_SECONDS, "decided only after a while: dropped?"
        assert _lag(dep, t["features"], 20) == 0
        sent = time.monotonic()
        produce(dep.bootstrap, t["features"], src.make(25))
        observer.wait(lambda o: o.decided(src.truth) == 80, 60, "the middle decided")
        gap_s = time.monotonic() - sent
        assert _lag(dep, t["features"], 20) == 0

        # the learner's inputs: read by the learner's own consumer, not faust's either
        skip("label_requests", 8)
        skip("labels", 4)
        produce(dep.bootstrap, t["features"], src.make(80))
        settled = settle(dep, observer, list(src.truth), "m", 120)
        summary = Summary("skipped records", "ci", faults=4, recovery_s=[tail_s, gap_s])
        try:
            assert settled, settled
            assert_promise(dep, observer, list(src.truth), "m", summary, worker=worker)
            owed = skip("labels", 0)  # faust fetched nothing of them: every drop still owed
            assert owed == {t["features"]: 15, t["label_requests"]: 8, t["labels"]: 4}
            assert _lag(dep, t["label_requests"], 20) == 0
            assert _lag(dep, t["labels"], 20) == 0
            assert worker.alive()
        finally:
            observer.halt()
            summary.runtime_s = time.monotonic() - began
            summary.notes["recovery s"] = "features after a faust-level drop: produced -> decided"
            emit(summary, tmp_path, capsys)
