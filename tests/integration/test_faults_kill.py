"""kill -9 on a real broker: the worker is SIGKILLed at random points of a stream of events
and labels, and restarted each time. Every event gets a decision (repeats agree for one
model version), every label changes the model exactly once, the final model equals an
offline replay of the applied labels, and no label request is lost while pending."""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from faults.data import EventSource
from faults.oracle import Observer, answer_fraction
from faults.report import Summary, emit
from faults.scenario import Feeder, assert_promise, deployment, settle
from faults.sizes import SIZES, size_params


@pytest.mark.parametrize("size", size_params())
def test_kill9_loses_nothing_and_applies_every_label_once(
    size: str, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = SIZES["kill"][size]
    seed = int(os.environ.get("ABSTAIN_FAULTS_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)  # the kill points; ABSTAIN_FAULTS_SEED replays a run
    began = time.monotonic()
    with deployment(
        kafka_bootstrap,
        tmp_path,
        partitions={"features": 4, "decisions": 2, "labels": 1, "models": 1},
    ) as dep:
        src = EventSource("kill", seed=7)
        observer = Observer(
            kafka_bootstrap,
            dep.topics,
            src.truth,
            budget=n.labels,
            duplicate_every=10,  # every tenth answer is sent twice
            answer=answer_fraction(min(1.0, 2.5 * n.labels / n.events)),
        ).begin()
        worker = dep.start()
        worker.wait_ready()

        # events arrive steadily over the whole run; kills at random points of it. The feed
        # lasts longer than the restarts (about 7 s each, up to 15 s on a loaded machine), so
        # every successor has work left (else its recovery cannot be measured: nan)
        chunk = max(100, n.events // 100)
        pause = max(0.3, (n.kills + 1) * 20.0 / (n.events / chunk))
        feeder = Feeder(dep, [src], n.events, chunk=chunk, pause=pause)
        feeder.start()
        points = sorted(rng.uniform(0.1, 0.85) for _ in range(n.kills))
        kills: list[float] = []
        ready_s: list[float] = []
        for point in points:
            target = int(point * n.events)
            deadline = time.monotonic() + n.timeout
            while src.count < target and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 1.5))  # anywhere inside a batch, a commit, a label
            kills.append(worker.kill9())
            assert worker.proc.returncode == -signal.SIGKILL
            worker = dep.start()
            t0 = time.monotonic()
            worker.wait_ready(timeout=120)
            ready_s.append(time.monotonic() - t0)
        feeder.finish(n.timeout)
        settled = settle(dep, observer, list(src.truth), "m", n.timeout)

        summary = Summary("kill -9", size, faults=len(kills))
        try:
            report = assert_promise(dep, observer, list(src.truth), "m", summary, worker=worker)
        finally:
            with observer.lock:
                stamps = sorted(d.ts for seen in observer.decisions.values() for d in seen)
            # recovery: from the kill to the first decision the successor made
            summary.recovery_s = [
                min((s for s in stamps if s > k), default=float("nan")) - k for k in kills
            ]
            summary.runtime_s = time.monotonic() - began
            summary.notes["ready after restart (s)"] = [round(r, 1) for r in ready_s]
            summary.notes["settled"] = asdict(settled)
            summary.notes["killed PIDs"] = [p.pid for p in dep.processes[:-1]]
            summary.notes["seed (ABSTAIN_FAULTS_SEED)"] = seed
            observer.halt()
            emit(summary, tmp_path, capsys)
        assert settled, settled
        assert all(p.proc.returncode == -signal.SIGKILL for p in dep.processes[:-1])
        assert worker.alive()
        assert report.chain.version == n.labels
        assert len(summary.recovery_s) == n.kills
        assert all(r < 60 for r in summary.recovery_s), summary.recovery_s
