"""Rebalance on a real broker: two models, topics with four partitions; a second worker
joins mid-stream, later the first one leaves. The promise holds across both rebalances and
both workers serve the same model (version, rho, |w|) whenever the stream is quiet."""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from faults.checks import champion_record
from faults.data import EventSource
from faults.oracle import Observer, answer_fraction
from faults.report import Summary, emit
from faults.scenario import Feeder, assert_promise, deployment, quiesce, settle
from faults.sizes import SIZES, size_params
from faults.workers import WorkerProcess

MODEL = {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05}
MODELS = {"m": MODEL, "n": MODEL}  # keys "m" and "n" land on label partitions 0 and 1 of 4


def _served(worker: WorkerProcess, model: str) -> tuple[float, float, float]:
    return (
        worker.metric("abstain_model_version", {"model": model}),
        worker.metric("abstain_model_rho", {"model": model}),
        worker.metric("abstain_model_weight_norm", {"model": model}),
    )


def _gaps(stamps: list[float], at: float, window: float = 60.0) -> float:
    """Longest pause between consecutive decisions within ``window`` s after ``at``."""
    near = [s for s in stamps if at - 1.0 <= s <= at + window]
    return max((b - a for a, b in zip(near, near[1:], strict=False)), default=float("nan"))


@pytest.mark.parametrize("size", size_params())
def test_join_and_leave_mid_stream_keep_the_promise(
    size: str, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = SIZES["rebalance"][size]
    began = time.monotonic()
    parts = {"features": 4, "decisions": 4, "labels": 4, "models": 1}
    with deployment(
        kafka_bootstrap, tmp_path, partitions=parts, models=MODELS, default_model="m"
    ) as dep:
        truth: dict[str, int] = {}
        sources = [EventSource(m, model=m, seed=i, truth=truth) for i, m in enumerate(MODELS)]
        total = n.events
        observer = Observer(
            kafka_bootstrap,
            dep.topics,
            truth,
            budget=n.labels,
            duplicate_every=10,
            answer=answer_fraction(min(1.0, 2.5 * n.labels / total)),
        ).begin()
        first = dep.start()
        first.wait_ready()
        feeder = Feeder(dep, sources, total // 2, chunk=max(25, total // 120), pause=0.2)
        feeder.start()

        observer.wait(lambda o: len(o.decisions) >= 0.3 * total, n.timeout, "30 % decided")
        joined_at = time.time()
        second = dep.start()
        second.wait_ready(timeout=120)

        observer.wait(lambda o: len(o.decisions) >= 0.55 * total, n.timeout, "55 % decided")
        feeder.hold()
        quiet = quiesce(dep, observer, n.timeout)
        time.sleep(1.5)  # both followers read the newest snapshot; gauges refresh each second
        both = {m: (_served(first, m), _served(second, m)) for m in MODELS}
        for m, (a, b) in both.items():
            assert a == b, f"model {m}: first worker serves {a}, second {b}"
            assert a[0] > 0, f"model {m} never learned"
        feeder.go()

        observer.wait(lambda o: len(o.decisions) >= 0.75 * total, n.timeout, "75 % decided")
        left_at = time.time()
        assert first.stop() == 0  # a clean leave
        feeder.finish(n.timeout)
        fed_at = time.time()
        settled = settle(dep, observer, list(truth), "m", n.timeout)
        settled = settled and settle(dep, observer, list(truth), "n", n.timeout)
        settled_at = time.time()

        summary = Summary("rebalance", size, faults=2)
        per_model = {m: Summary("rebalance", size) for m in MODELS}
        try:
            reports = {
                m: assert_promise(dep, observer, list(truth), m, per_model[m], worker=second)
                for m in MODELS
            }
        finally:
            summary = per_model["m"]
            summary.faults = 2
            summary.labels_applied = sum(p.labels_applied for p in per_model.values())
            summary.labels_lost = sum(p.labels_lost for p in per_model.values())
            summary.applied_twice = sum(p.applied_twice for p in per_model.values())
            summary.requests = sum(p.requests for p in per_model.values())
            summary.requests_pending = sum(p.requests_pending for p in per_model.values())
            with observer.lock:
                stamps = sorted(d.ts for seen in observer.decisions.values() for d in seen)
            summary.recovery_s = [_gaps(stamps, joined_at), _gaps(stamps, left_at)]
            summary.runtime_s = time.monotonic() - began
            summary.notes.update(
                {
                    "recovery = longest pause in decisions after the join, after the leave": "",
                    "quiet point reached in (s)": round(quiet, 1),
                    "both workers at the quiet point (version, rho, |w|)": both,
                    "settled": asdict(settled),
                    "phases (s from the join): leave, all produced, settled": [
                        round(x - joined_at, 1) for x in (left_at, fed_at, settled_at)
                    ],
                }
            )
            observer.halt()
            emit(summary, tmp_path, capsys)
        assert settled, settled
        for m, report in reports.items():
            final = champion_record(report.chain.final["learner"])["learned"]
            version, rho, norm = _served(second, m)
            assert version == report.chain.version
            assert rho == pytest.approx(final["rho"], rel=1e-12)
            assert norm == pytest.approx(math.hypot(*final["w"]), rel=1e-9)
            assert report.chain.version > 0
