"""Broker outage: the broker (this test's own, on free ports, so no other test is
disturbed) stops for 20 s mid-stream and comes back with its data. The worker resumes by
itself within a bounded time, nothing is lost, and /readyz says "not ready" while the
broker is away and "ready" after. (Named to sort last: it is the slowest.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from faults.data import EventSource
from faults.oracle import Observer, answer_fraction
from faults.report import Summary, emit
from faults.scenario import Feeder, assert_promise, deployment, settle
from faults.sizes import SIZES, size_params

from service.localkafka import LocalKafka, find_free_ports

RESUME_BOUND = 60.0  # seconds from the broker's return to the worker deciding again


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    port, controller = find_free_ports(2)
    kafka = LocalKafka(
        port=port, controller_port=controller, data_dir=tmp_path / "kafka", die_with_parent=True
    )
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.mark.parametrize("size", size_params())
def test_broker_outage_the_worker_resumes_and_readiness_follows(
    size: str, own_broker: LocalKafka, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = SIZES["outage"][size]
    began = time.monotonic()
    kafka = own_broker
    with deployment(kafka.bootstrap, tmp_path / "svc", stall_seconds=10) as dep:
        src = EventSource("outage", seed=11)
        observer = Observer(
            kafka.bootstrap,
            dep.topics,
            src.truth,
            budget=n.labels,
            answer=answer_fraction(min(1.0, 2.5 * n.labels / n.events)),
        ).begin()
        worker = dep.start()
        worker.wait_ready()
        feeder = Feeder(dep, [src], n.events, chunk=max(25, n.events // 100), pause=0.2)
        feeder.start()
        observer.wait(lambda o: len(o.decisions) >= 0.3 * n.events, n.timeout, "30 % decided")

        # the outage
        down_at = time.time()
        assert kafka.stop()
        during: list[tuple[float, int, int]] = []  # (s since down, /readyz, /healthz)
        while time.time() - down_at < n.outage_seconds:
            during.append(
                (time.time() - down_at, worker.status("/readyz"), worker.status("/healthz"))
            )
            time.sleep(0.5)
        assert kafka.start()
        up_at = time.time()
        ready_again = None
        while time.time() - up_at < RESUME_BOUND:
            if worker.status("/readyz") == 200:
                ready_again = time.time() - up_at
                break
            time.sleep(0.25)
        feeder.finish(n.timeout)
        settled = settle(dep, observer, list(src.truth), "m", n.timeout)

        summary = Summary("broker outage", size, faults=1)
        try:
            assert_promise(dep, observer, list(src.truth), "m", summary, worker=worker)
        finally:
            with observer.lock:
                stamps = sorted(d.ts for seen in observer.decisions.values() for d in seen)
            first_after = min((s for s in stamps if s > up_at), default=float("nan"))
            summary.recovery_s = [first_after - up_at]
            summary.runtime_s = time.monotonic() - began
            not_ready = [round(s, 1) for s, r, _ in during if r != 200]
            summary.notes.update(
                {
                    "outage (s)": n.outage_seconds,
                    "recovery = first decision after the broker is back (s)": "",
                    "/readyz 200 again after (s)": ready_again,
                    "/readyz not 200 during the outage at (s)": not_ready[:3] + ["..."],
                    "/readyz answers during the outage": sorted({r for _, r, _ in during}),
                    "/healthz answers during the outage": sorted({h for _, _, h in during}),
                    "settled": asdict(settled),
                }
            )
            observer.halt()
            emit(summary, tmp_path, capsys)
        assert worker.alive()
        assert settled, settled
        # resumes by itself, within the bound
        assert summary.recovery_s[0] < RESUME_BOUND
        assert ready_again is not None
        # readiness follows the broker: not ready within a few seconds of losing it...
        late = [r for s, r, _ in during if s > 10.0]
        assert late
        assert all(r != 200 for r in late), during
        # ...and a lost broker is no reason to restart the worker (liveness stays up)
        assert all(h == 200 for _, _, h in during), during
