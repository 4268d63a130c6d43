"""End-to-end benchmark of one worker on a local broker (bounded; stops by itself).

    python loadtest/e2e.py [--broker HOST:PORT] [--events 20000] [--rate 200] [--seconds 15]
                           [--budget-fraction 0.01]

1. throughput: ``--events`` feature events are produced as fast as possible; events/s is
   the count divided by the time from the first send to the last decision read back. The
   learner stores every label request of that burst in its pending table: "learner caught
   up s" is when the last of them reached the table's changelog (from the first send),
   "learner behind s" how long after the last decision that was;
2. latency: events at a moderate ``--rate`` for ``--seconds``; each event carries its send
   time, and the event -> decision latency is read when the decision arrives (p50 / p99).

Both are run twice in one invocation, each time with a fresh worker and fresh topics: the
model without a label budget (it asks whenever its learner wants a label), then with
``label_budget: {fraction: --budget-fraction}`` (1 % of the events; 0 skips that run). A
table per run and a comparison line are printed.

Starts its own Kafka (service.localkafka) unless ``--broker`` is given, and one worker
subprocess per run; all are stopped by PID at the end.

The numbers below were measured before the scoring path left faust's per-record stream;
``loadtest/throughput.py`` measures the current one against a raw-aiokafka floor (README,
"Performance"). Measured on a shared 2-core machine, defaults (68 features, batch 256,
window 5 ms), median of 3 runs: 4,280 events/s decided (all label requests stored after
10.2 s for 20,000 events); at 200 events/s p50 11.4 ms, p99 21.6 ms. Before the scoring
path was first reworked (batch 64, window 20 ms, one awaited send per record, per-event
metric lookups): 1,150 events/s, 22.7 s, p50 22.9 ms, p99 69.4 ms.

With a label budget (2026-11, same machine shared with other test runs, so slower than the
numbers above; median of 3 invocations). Nobody answers in this benchmark, so the model
stays at version 0 and, unbudgeted, asks about 79 % of the events (15,800 requests for
20,000), all of which the learner stores: 1,379 events/s decided (746-1,545), learner caught
up 30.4 s after the first send, 15.5 s after the last decision; at 200 events/s p99
1,623 ms (67-2,135: the worker also stores about 160 requests a second). With
``fraction: 0.01``: 196-198 requests, 2,391 events/s (2,348-2,894), caught up 10.1 s after
the first send, 1.6 s after the last decision; p99 65.8 ms (65.5-139.9).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import features, local_broker, running_worker  # noqa: E402

from service.config import Topics  # noqa: E402
from service.stream.kafka.clients import Client  # noqa: E402


def _features(n_features: int) -> np.ndarray:
    return features(n_features)


def _total_lag(port: int) -> float:
    total = 0.0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("abstain_consumer_lag{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


async def _run(settings: Any, X: np.ndarray, args: argparse.Namespace) -> dict[str, float]:
    t = settings.topics
    results: dict[str, float] = {}
    async with Client(settings) as client:
        positioned = asyncio.Event()
        seen: dict[str, float] = {}
        latencies: list[float] = []
        done = asyncio.Event()
        want = {"n": 0}
        # arrival times of label requests and of the learner's pending-table writes
        learner_positioned = asyncio.Event()
        asked: list[float] = []
        stored: list[float] = []
        changelog = f"{settings.app_id}-pending-changelog"

        async def watch() -> None:
            async for rec in client.follow([t.decisions], positioned=positioned):
                now = time.time()
                d = json.loads(rec.value)
                if d["id"] not in seen:
                    seen[d["id"]] = now
                    if d["id"].startswith("lat-"):
                        latencies.append(now - float(d["id"].split("-", 2)[2]))
                if len(seen) >= want["n"]:
                    done.set()

        async def watch_learner() -> None:
            follow = client.follow([t.label_requests, changelog], positioned=learner_positioned)
            async for rec in follow:
                (asked if rec.topic == t.label_requests else stored).append(time.monotonic())

        watcher = asyncio.create_task(watch())
        learner = asyncio.create_task(watch_learner())
        await positioned.wait()
        await learner_positioned.wait()
        # 1. throughput
        want["n"] = args.events
        start = time.monotonic()
        for i in range(args.events):
            await client.send(
                t.features, f"tp-{i}", {"id": f"tp-{i}", "features": X[i % len(X)].tolist()}
            )
        await client.flush()
        sent = time.monotonic()
        await asyncio.wait_for(done.wait(), timeout=300)
        elapsed = time.monotonic() - start
        results["throughput events"] = args.events
        results["produce s"] = sent - start
        results["end-to-end s"] = elapsed
        results["events/s (decided)"] = args.events / elapsed
        # the learner still stores the label requests of that burst: wait until all lag is 0
        # and every request is in the pending table
        drain_start = time.monotonic()
        while (
            _total_lag(args.web_port) > 0 or len(stored) < len(asked)
        ) and time.monotonic() - drain_start < 300:
            await asyncio.sleep(0.5)
        results["all work done s"] = time.monotonic() - start
        n_asked = len(asked)
        results["label requests"] = n_asked
        if len(stored) < n_asked:  # the wait above ran out
            caught = math.nan
        else:
            caught = (stored[n_asked - 1] - start) if n_asked else elapsed
        results["learner caught up s"] = caught
        results["learner behind s"] = math.nan if math.isnan(caught) else max(0.0, caught - elapsed)
        learner.cancel()
        # 2. latency at a moderate rate
        done.clear()
        n = int(args.rate * args.seconds)
        want["n"] = args.events + n
        interval, next_at = 1.0 / args.rate, time.monotonic()
        for i in range(n):
            event_id = f"lat-{i}-{time.time():.6f}"
            await client.send(
                t.features, event_id, {"id": event_id, "features": X[i % len(X)].tolist()}
            )
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await client.flush()
        await asyncio.wait_for(done.wait(), timeout=120)
        watcher.cancel()
        lat = np.array(latencies) * 1000
        results["latency rate ev/s"] = args.rate
        results["latency events"] = len(lat)
        results["p50 ms"] = float(np.percentile(lat, 50))
        results["p99 ms"] = float(np.percentile(lat, 99))
        results["max ms"] = float(lat.max())
    return results


def _config(work: Path, X: np.ndarray, args: argparse.Namespace, budget: Any) -> dict[str, Any]:
    """A fresh app id and topics; the model with ``budget`` as its ``label_budget``."""
    run = uuid.uuid4().hex[:6]
    model: dict[str, Any] = {"algorithm": "dsal", "cost": 0.25, "n_features": int(X.shape[1])}
    if budget is not None:
        model["label_budget"] = budget
    return {
        "app_id": f"e2e-{run}",
        "datadir": str(work / f"worker-{run}"),
        "topics": Topics.prefixed(f"e2e-{run}"),
        "partitions": {"features": 4, "decisions": 4, "labels": 1},
        **({} if args.batch_size is None else {"batch_size": args.batch_size}),
        "models": {"default": model},
        "log_level": "warning",
    }


def _measure(
    work: Path, broker: str, X: np.ndarray, args: argparse.Namespace, budget: Any, port: int
) -> tuple[dict[str, float], Any]:
    """One worker subprocess for a fresh configuration; the benchmark against it. The worker
    is stopped by PID before this returns."""
    with running_worker(work, _config(work, X, args, budget), broker, port) as (settings, _):
        run_args = argparse.Namespace(**{**vars(args), "web_port": port})
        return asyncio.run(_run(settings, X, run_args)), settings


def _table(title: str, results: dict[str, float]) -> None:
    print(f"\n{title}")
    print(f"{'measure':<22}{'value':>12}")
    print("-" * 34)
    for key, value in results.items():
        print(f"{key:<22}{value:>12.1f}")


def _comparison(free: dict[str, float], capped: dict[str, float], fraction: float) -> str:
    """One line: the budgeted run against the unbudgeted one."""
    rate = capped["events/s (decided)"] / free["events/s (decided)"] - 1.0
    return (
        f"budget {fraction:.0%} of events vs none: {capped['events/s (decided)']:,.0f} vs "
        f"{free['events/s (decided)']:,.0f} events/s decided ({rate:+.0%}); "
        f"{capped['label requests']:,.0f} vs {free['label requests']:,.0f} label requests; "
        f"learner caught up {capped['learner caught up s']:.1f} s vs "
        f"{free['learner caught up s']:.1f} s after the first send "
        f"({capped['learner behind s']:.1f} s vs {free['learner behind s']:.1f} s after the "
        f"last decision); p99 {capped['p99 ms']:.1f} vs {free['p99 ms']:.1f} ms"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker")
    p.add_argument("--events", type=int, default=20000)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--batch-size", type=int, default=None, help="default: the service's")
    p.add_argument("--web-port", type=int, default=16099)
    p.add_argument(
        "--budget-fraction",
        type=float,
        default=0.01,
        help="label budget of the second run, a fraction of events (0: no second run)",
    )
    args = p.parse_args()
    X = _features(68)
    work = Path(tempfile.mkdtemp(prefix="abstain-e2e-"))
    kafka: Any = None
    runs: list[tuple[str, dict[str, float], Any]] = []
    try:
        kafka, broker = local_broker(args.broker, work)
        results, settings = _measure(work, broker, X, args, None, args.web_port)
        runs.append(("no label budget", results, settings))
        if args.budget_fraction > 0:
            budget = {"fraction": args.budget_fraction}
            results, settings = _measure(work, broker, X, args, budget, args.web_port + 1)
            runs.append((f"label budget {args.budget_fraction:.0%} of events", results, settings))
    finally:
        if kafka is not None:
            kafka.stop()
    for i, (name, results, settings) in enumerate(runs):
        batch = args.batch_size or settings.batch_size
        title = f"abstain end-to-end, one worker, {X.shape[1]} features, batch {batch}"
        _table(title if i == 0 else f"{title}, {name}", results)
    if len(runs) == 2:
        print("\n" + _comparison(runs[0][1], runs[1][1], args.budget_fraction))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
