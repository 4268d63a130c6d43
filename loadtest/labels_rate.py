"""Labels applied per second by one model's learner, end to end through Kafka (bounded; stops
by itself).

    python loadtest/labels_rate.py [--broker HOST:PORT] [--events 3000] [--repeats 3]
                                   [--algorithms dsol,dsal] [--web-port 16199]
                                   [--shape phishing] [--profile DIR]

For each algorithm, ``--repeats`` times, with a fresh worker and fresh topics each time:

1. ``--events`` events of the packaged Phishing data (68 features; ``--shape`` one of
   ``loadtest/wide.py``'s instead, such as ``hashed10-300``: events as producers write them,
   four numbers, categories, a boolean and 300 tokens, under a declaration of 2^10 buckets)
   are produced and decided;
   the test reads every label request the worker writes, and waits until the learner has
   stored all of them (its pending table's changelog);
2. then the true label of every request is produced to the labels topic as fast as the
   producer goes, and the clock runs from the first label sent until the version that
   applied the last one is read on the models topic: the labels topic in, versions out,
   every label applied once (the version counts labels).

Printed per run: labels, seconds, **labels/s**, the worker's CPU seconds per label (its
``/proc`` times over the label phase), the size of the last model version and the worker's
resident memory once every request is stored (``VmRSS``, before the first label) and its
peak after the labels (``VmHWM``); then the median of the runs per algorithm. ``dsol`` asks
every event (every label); ``dsal`` asks what its learner wants (most events early on).

``--profile DIR`` records the worker with py-spy over each label phase alone (collapsed
stacks, ``DIR/<algorithm>-<run>.txt``; py-spy beside the venv's Python, or on ``PATH``).

Starts its own Kafka (service.localkafka) unless ``--broker`` is given, and one worker
subprocess per run; all are stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import local_broker, running_worker  # noqa: E402
from wide import config_of  # noqa: E402
from wide import events as wide_events  # noqa: E402

from service.config import Topics  # noqa: E402
from service.datasets import load_dataset, resolve_dataset_path  # noqa: E402
from service.records.packed import header_of, is_packed  # noqa: E402
from service.stream.kafka.clients import Client, read_topic  # noqa: E402

MODEL = "m"
VERSION = re.compile(rb'"version":(\d+)')
TIMEOUT = 600.0  # s, the bound on every wait


def _py_spy() -> str:
    """py-spy beside this Python (the venv's), else the one on ``PATH``."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else (shutil.which("py-spy") or "py-spy")


def _memory_mib(pid: int, field: str = "VmHWM") -> float:
    """Resident memory of process ``pid`` in MiB: its peak so far (``VmHWM``) or now
    (``VmRSS``); NaN where ``/proc`` does not say."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    found = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) / 1024.0 if found else float("nan")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(
    settings: Any,
    features: list[Any],
    y: list[int],
    events: int,
    pid: int,
    profile: Path | None,
) -> dict[str, float]:
    t = settings.topics
    changelog = f"{settings.app_id}-pending-changelog"
    asked: dict[str, int] = {}  # request id -> true label
    stored = {"n": 0}
    newest = {"version": 0, "target": -1}
    applied = asyncio.Event()
    async with Client(settings) as client:
        positioned = asyncio.Event()

        async def watch() -> None:
            topics = [t.label_requests, changelog, t.models]
            async for rec in client.follow(topics, positioned=positioned, poll_ms=20):
                if rec.topic == t.models:
                    raw = rec.value
                    found = VERSION.search((header_of(raw) if is_packed(raw) else raw)[:200])
                    if rec.key == MODEL.encode() and found is not None:
                        newest["version"] = max(newest["version"], int(found.group(1)))
                        if 0 <= newest["target"] <= newest["version"]:
                            applied.set()
                elif rec.topic == t.label_requests:
                    request = json.loads(rec.value)
                    asked[request["request_id"]] = y[int(request["event_id"][1:]) % len(y)]
                else:
                    stored["n"] += 1

        watcher = asyncio.create_task(watch())
        await positioned.wait()
        for i in range(events):
            await client.send(
                t.features, f"e{i}", {"id": f"e{i}", "features": features[i % len(features)]}
            )
        await client.flush()
        # every request stored by the learner (the changelog may hold more records than
        # requests: one per write), and no new request for a second
        deadline = time.monotonic() + TIMEOUT
        last, quiet_since = -1, time.monotonic()
        while time.monotonic() - quiet_since < 2.0:
            if time.monotonic() > deadline:
                raise SystemExit("the learner did not store the requests in time")
            n = len(asked)
            if n != last or stored["n"] < n:
                last, quiet_since = n, time.monotonic()
            await asyncio.sleep(0.2)
        version0 = newest["version"]
        spy = None
        if profile is not None:
            spy = subprocess.Popen(  # noqa: S603 - py-spy on PATH, our own worker's pid
                [
                    _py_spy(),
                    "record",
                    "--pid",
                    str(pid),
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--output",
                    str(profile),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await asyncio.sleep(1.0)  # attached before the first label
        held = _memory_mib(pid, "VmRSS")  # every request stored, no label yet
        cpu0 = _cpu_seconds(pid)
        start = time.monotonic()
        for rid, label in list(asked.items()):
            await client.send(
                t.labels,
                MODEL,
                {"request_id": rid, "model": MODEL, "label": label, "labelled_by": "bench"},
            )
        await client.flush()
        sent = time.monotonic()
        newest["target"] = version0 + len(asked)
        if newest["version"] >= newest["target"]:
            applied.set()
        try:
            await asyncio.wait_for(applied.wait(), TIMEOUT)
        except TimeoutError:
            raise SystemExit(f"version {newest['version']} after {TIMEOUT:.0f}s") from None
        elapsed = time.monotonic() - start
        cpu = _cpu_seconds(pid) - cpu0
        peak = _memory_mib(pid)
        watcher.cancel()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
    last = [r for r in await read_topic(settings, t.models, timeout=60) if r.key == MODEL.encode()]
    return {
        "labels": float(len(asked)),
        "produce s": sent - start,
        "applied s": elapsed,
        "labels/s": len(asked) / elapsed,
        "worker CPU ms/label": 1000.0 * cpu / len(asked),
        "last version bytes": float(len(last[-1].value)) if last else float("nan"),
        "worker MiB, requests stored": held,
        "worker peak MiB": peak,
    }


def _model(shape: str, algorithm: str) -> dict[str, Any]:
    if shape == "phishing":
        return {"algorithm": algorithm, "cost": 0.25, "n_features": 68}
    model: dict[str, Any] = config_of(shape).model_dump(mode="json", exclude_none=True)
    return {"fields": model["fields"], "algorithm": algorithm, "cost": 0.25}


def _stream(shape: str, events: int) -> tuple[list[Any], list[int]]:
    """Each event's ``features`` as a producer writes them, and its true label."""
    if shape == "phishing":
        X, y = load_dataset(resolve_dataset_path("phishing"))
        return [x.tolist() for x in X], [int(v) for v in y]
    stream = wide_events(shape, events, np.random.default_rng(1))
    return [f for f, _ in stream], [label for _, label in stream]


def _config(work: Path, algorithm: str, shape: str) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]
    return {
        "app_id": f"lr-{run}",
        "datadir": str(work / f"worker-{run}"),
        "topics": Topics.prefixed(f"lr-{run}"),
        "partitions": {"features": 4, "decisions": 4, "labels": 1},
        "request_ttl_seconds": 3600,
        "default_model": MODEL,
        "models": {MODEL: _model(shape, algorithm)},
        "log_level": "warning",
    }


def _measure(
    work: Path,
    broker: str,
    algorithm: str,
    shape: str,
    events: int,
    port: int,
    profile: Path | None,
) -> dict[str, float]:
    features, y = _stream(shape, events)
    config = _config(work, algorithm, shape)
    with running_worker(work, config, broker, port) as (settings, proc):
        return asyncio.run(_run(settings, features, y, events, proc.pid, profile))


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--broker")
    p.add_argument("--events", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--algorithms", default="dsol,dsal")
    p.add_argument("--web-port", type=int, default=16199)
    p.add_argument("--shape", default="phishing", help="phishing, or a loadtest/wide.py shape")
    p.add_argument("--profile", type=Path, help="py-spy the label phases into this directory")
    args = p.parse_args()
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    work = Path(tempfile.mkdtemp(prefix="abstain-labels-rate-"))
    kafka: Any = None
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in algorithms}
    try:
        kafka, broker = local_broker(args.broker, work)
        for r in range(args.repeats):
            for k, algorithm in enumerate(algorithms):  # alternating: drift hits both alike
                spy = None
                if args.profile is not None:
                    args.profile.mkdir(parents=True, exist_ok=True)
                    spy = args.profile / f"{algorithm}-{r + 1}.txt"
                port = args.web_port + k + 10 * r
                result = _measure(work, broker, algorithm, args.shape, args.events, port, spy)
                runs[algorithm].append(result)
                print(
                    f"{algorithm} run {r + 1}: "
                    + ", ".join(f"{n} {v:,.1f}" for n, v in result.items()),
                    flush=True,
                )
    finally:
        if kafka is not None:
            kafka.stop()
    print(f"\nlabels applied per second, one model, {args.shape}, medians of {args.repeats}")
    print(
        f"{'algorithm':<10}{'labels':>8}{'labels/s':>10}{'CPU ms/label':>14}{'version KiB':>13}"
        f"{'stored MiB':>12}{'peak MiB':>10}"
    )
    for algorithm, results in runs.items():
        med = {n: statistics.median(r[n] for r in results) for n in results[0]}
        print(
            f"{algorithm:<10}{med['labels']:>8,.0f}{med['labels/s']:>10,.0f}"
            f"{med['worker CPU ms/label']:>14.2f}{med['last version bytes'] / 1024:>13.1f}"
            f"{med['worker MiB, requests stored']:>12.0f}{med['worker peak MiB']:>10.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
