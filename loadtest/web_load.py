"""Web-port load test: does reading the label queue slow down scoring and health checks?
(bounded; stops by itself; everything on 127.0.0.1)

    python loadtest/web_load.py [--broker HOST:PORT] [--requests 20000] [--rate 200]
                                [--seconds 10] [--clients 20] [--rounds 1]

1. starts a local Kafka (:mod:`service.localkafka`, unless ``--broker``) and one worker;
2. fills the label queue: ``--requests`` well-formed label requests (model ``default``,
   68 features) go to the label-requests topic, and the test waits until the worker holds
   them (``abstain_pending_requests``);
3. unloaded, ``--seconds``: events at ``--rate``/s, each decision matched to its event
   (event -> decision latency), while one poller times ``/healthz`` (and ``/metrics`` once a
   second);
4. loaded: the same while ``--clients`` clients hammer ``GET /labels`` with the token (each
   pages through the queue by its cursor, back to the first page at the end, no pause);
   ``--rounds N`` repeats the pair (unloaded, loaded, unloaded, ...) and pools each kind,
   for a noisy machine.

The hammering clients and the poller run in their own processes (this script started again
with ``--hammer`` / ``--probe``), so the measuring loop is not the one being loaded. Every
process is stopped by its PID at the end. Prints a table; its last lines compare loaded with
unloaded (goal: ``/healthz`` p99 < 100 ms, decision p99 within 1.5x unloaded).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import http.client
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
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

from harness import features, stop, worker_argv  # noqa: E402

from service.config import Settings, Topics, load_settings  # noqa: E402
from service.records import LabelRequest, request_id  # noqa: E402
from service.stream.kafka.clients import Client  # noqa: E402

MODEL = "default"
N_FEATURES = 68
WARM_UP = 2.0  # seconds each phase's helpers get to start before the measurement
SLOW = 0.1  # a decision slower than this is reported with when its event was sent


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


# --------------------------------------------------------------------------- child modes


def probe(base: str, seconds: float, delay: float) -> dict[str, Any]:
    """After ``delay`` seconds, time ``GET /healthz`` back to back (10 ms apart) and
    ``/metrics`` once a second, each on its own kept-alive connection."""
    time.sleep(delay)
    host, port = base.removeprefix("http://").split(":")
    health = http.client.HTTPConnection(host, int(port), timeout=10)
    metrics = http.client.HTTPConnection(host, int(port), timeout=10)
    out: dict[str, list[float]] = {"healthz": [], "metrics": []}
    bad = 0
    end = time.monotonic() + seconds
    next_metrics = time.monotonic()
    while time.monotonic() < end:
        jobs = [("healthz", health, "/healthz")]
        if time.monotonic() >= next_metrics:
            jobs.append(("metrics", metrics, "/metrics"))
            next_metrics += 1.0
        for name, conn, path in jobs:
            began = time.perf_counter()
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            out[name].append(time.perf_counter() - began)
            bad += resp.status != 200
        time.sleep(0.01)
    return {**out, "non_200": bad}


async def hammer(base: str, token: str, seconds: float, clients: int) -> dict[str, Any]:
    """``clients`` loops of ``GET /labels`` (following the cursor), no pause between."""
    import aiohttp  # noqa: PLC0415 - only the hammering child needs it

    statuses: dict[int, int] = {}
    latencies: list[float] = []
    rows = 0
    end = time.monotonic() + seconds
    headers = {"Authorization": f"Bearer {token}"}

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal rows
        cursor = None
        while time.monotonic() < end:
            url = f"{base}/labels" + (f"?cursor={cursor}" if cursor else "")
            began = time.perf_counter()
            async with session.get(url, headers=headers) as resp:
                body = await resp.read()
            latencies.append(time.perf_counter() - began)
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            if resp.status == 200:
                page = json.loads(body)
                rows += page["count"]
                cursor = page["next"]

    timeout = aiohttp.ClientTimeout(total=30)
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return {"statuses": statuses, "latencies": latencies, "rows": rows}


def _child(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 - this script, fixed arguments
        [sys.executable, __file__, *args], stdout=subprocess.PIPE, preexec_fn=_die_with_parent
    )


def _collect(proc: subprocess.Popen[bytes], seconds: float) -> dict[str, Any]:
    try:
        out, _ = proc.communicate(timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        raise SystemExit(f"child {proc.pid} overran; killed") from None
    if proc.returncode != 0:
        raise SystemExit(f"child {proc.pid} failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(out)
    return result


# --------------------------------------------------------------------------- the worker


def _features() -> np.ndarray:
    return features(N_FEATURES)


def _get(port: int, path: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:  # noqa: S310
        return bytes(r.read())


def _wait(check: Any, timeout: float, what: str, proc: subprocess.Popen[bytes]) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"worker exited ({proc.returncode}) while waiting for {what}")
        with contextlib.suppress(OSError, ValueError):
            if check():
                return time.monotonic() - began
        time.sleep(0.5)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def _pending(port: int) -> float:
    for line in _get(port, "/metrics").decode().splitlines():
        if line.startswith(f'abstain_pending_requests{{model="{MODEL}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


# --------------------------------------------------------------------------- measuring


async def fill(settings: Settings, n: int, X: np.ndarray) -> None:
    """``n`` label requests of model ``default``, keyed by the model."""
    rng = random.Random(7)
    now = time.time()
    async with Client(settings) as client:
        for i in range(n):
            event_id = f"fill-{i}"
            req = LabelRequest(
                request_id(MODEL, event_id),
                event_id,
                MODEL,
                X[i % len(X)].tolist(),
                0.1,
                1.0,
                0,
                0.5,
                0,
                now,
                now + 3600,
                rng.random(),
            )
            await client.send(settings.topics.label_requests, MODEL, req.to_json())
        await client.flush()


async def decisions(
    settings: Settings, X: np.ndarray, rate: float, seconds: float, tag: str
) -> list[float]:
    """Events at ``rate``/s for ``seconds``; the event -> decision latency of each."""
    t = settings.topics
    sent: dict[str, float] = {}
    latencies: list[float] = []
    slow: list[float] = []  # when (s into the phase) the events that waited long were sent
    n = int(rate * seconds)
    start = time.monotonic()
    async with Client(settings) as client:
        positioned, done = asyncio.Event(), asyncio.Event()

        async def watch() -> None:
            async for rec in client.follow([t.decisions], positioned=positioned):
                at = time.monotonic()
                event_id = json.loads(rec.value)["id"]
                began = sent.pop(event_id, None)
                if began is not None:
                    latencies.append(at - began)
                    if at - began > SLOW:
                        slow.append(began - start)
                    if len(latencies) >= n:
                        done.set()

        watcher = asyncio.create_task(watch())
        await positioned.wait()
        interval, next_at = 1.0 / rate, time.monotonic()
        start = next_at
        for i in range(n):
            event_id = f"{tag}-{i}-{uuid.uuid4().hex[:6]}"
            sent[event_id] = time.monotonic()
            await client.send(
                t.features, event_id, {"id": event_id, "features": X[i % len(X)].tolist()}
            )
            next_at += interval
            if (delay := next_at - time.monotonic()) > 0:
                await asyncio.sleep(delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=60)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    if sent:
        print(f"  {tag}: {len(sent)} of {n} events got no decision within 60 s", flush=True)
    if slow:
        print(
            f"  {tag}: {len(slow)} decisions took over {SLOW * 1000:.0f} ms; their events were "
            f"sent {min(slow):.1f} to {max(slow):.1f} s into the phase",
            flush=True,
        )
    return latencies


def phase(
    settings: Settings, X: np.ndarray, args: argparse.Namespace, base: str, token: str, loaded: bool
) -> dict[str, Any]:
    tag = "loaded" if loaded else "unloaded"
    print(
        f"{tag}: {args.rate:g} events/s for {args.seconds:g} s"
        + (f", {args.clients} clients on GET /labels" if loaded else ""),
        flush=True,
    )
    # the children start (and the hammering gets going) before anything is measured, and the
    # hammering lasts until after the measurement ends
    poller = _child(["--probe", base, str(args.seconds), str(WARM_UP)])
    hammered = args.seconds + 2 * WARM_UP
    hammering = (
        _child(["--hammer", base, token, str(hammered), str(args.clients)]) if loaded else None
    )
    time.sleep(WARM_UP)
    lat = asyncio.run(decisions(settings, X, args.rate, args.seconds, tag))
    probed = _collect(poller, args.seconds + WARM_UP)
    out = {"decision": lat, **probed, "load": [os.getloadavg()[0]]}
    if hammering is not None:
        out["hammer"] = _collect(hammering, hammered)
        out["hammer"]["seconds"] = hammered
    return out


def _merge(into: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Pool two phases of the same kind (``--rounds``)."""
    for key, value in more.items():
        if key not in into:
            into[key] = value
        elif isinstance(value, dict):
            _merge(into[key], value)
        else:
            into[key] = into[key] + value  # lists extend, counts add up
    return into


# --------------------------------------------------------------------------- main


def _report(args: argparse.Namespace, runs: dict[str, dict[str, Any]]) -> None:
    ms = 1000.0
    print(
        f"\nabstain web load: {args.requests} open label requests, {args.rate:g} events/s, "
        f"{args.rounds} x {args.seconds:g} s per phase, {args.clients} clients on GET /labels "
        "when loaded"
    )
    print(f"{'measure (ms)':<26}{'unloaded':>12}{'loaded':>12}")
    print("-" * 50)
    for key, label in (("decision", "decision"), ("healthz", "/healthz"), ("metrics", "/metrics")):
        for q, name in ((50, "median"), (99, "p99"), (100, "max")):
            a, b = (_pct(runs[r][key], q) * ms for r in ("unloaded", "loaded"))
            print(f"{label + ' ' + name:<26}{a:>12.1f}{b:>12.1f}")
    for r in ("unloaded", "loaded"):
        print(
            f"samples {r}: {len(runs[r]['decision'])} decisions, "
            f"{len(runs[r]['healthz'])} /healthz ({runs[r]['non_200']} not 200)"
        )
    loads = [f"{x:.1f}" for r in ("unloaded", "loaded") for x in runs[r]["load"]]
    print(f"1-minute load average of the machine after each phase: {', '.join(loads)}")
    h = runs["loaded"]["hammer"]
    total = sum(h["statuses"].values())
    seconds = h["seconds"]
    print(
        f"GET /labels: {total} requests in {seconds:g} s ({total / seconds:.1f}/s), "
        f"statuses {h['statuses']}, {h['rows']} rows; latency median "
        f"{_pct(h['latencies'], 50) * ms:.0f} ms, p99 {_pct(h['latencies'], 99) * ms:.0f} ms"
    )
    d = [_pct(runs[r]["decision"], 99) * ms for r in ("unloaded", "loaded")]
    z = [_pct(runs[r]["healthz"], 99) * ms for r in ("unloaded", "loaded")]
    print(
        f"decision p99: unloaded {d[0]:.1f} ms, loaded {d[1]:.1f} ms, "
        f"ratio {d[1] / d[0]:.2f} (goal <= 1.5)"
    )
    print(
        f"/healthz p99: unloaded {z[0]:.1f} ms, loaded {z[1]:.1f} ms, "
        f"ratio {z[1] / z[0]:.2f} (goal: loaded < 100 ms)"
    )


def _start_worker(
    work: Path, broker: str, port: int, token: str
) -> tuple[Settings, subprocess.Popen[bytes]]:
    run = uuid.uuid4().hex[:6]
    config = {
        "app_id": f"webload-{run}",
        "datadir": str(work / "worker"),
        "topics": Topics.prefixed(f"webload-{run}"),
        "partitions": {"features": 4, "decisions": 4, "labels": 1},
        "models": {MODEL: {"algorithm": "dsal", "cost": 0.25, "n_features": N_FEATURES}},
        "label_token": token,
        "request_ttl_seconds": 3600,
        "web": {"host": "127.0.0.1"},
        "log_level": "warning",
    }
    path = work / "webload.json"
    path.write_text(json.dumps(config))
    settings = load_settings(path, broker=broker)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    with (work / "worker.log").open("wb") as out:
        proc = subprocess.Popen(  # noqa: S603 - fixed argv
            worker_argv(path, broker, port),
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
    return settings, proc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", help="use this broker instead of starting one")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--rounds", type=int, default=1, help="unloaded+loaded pairs, pooled")
    p.add_argument("--probe", nargs=3, metavar=("URL", "SECONDS", "DELAY"), help=argparse.SUPPRESS)
    p.add_argument(
        "--hammer", nargs=4, metavar=("URL", "TOKEN", "SECONDS", "CLIENTS"), help=argparse.SUPPRESS
    )
    args = p.parse_args()
    if args.probe:
        url, seconds, delay = args.probe
        print(json.dumps(probe(url, float(seconds), float(delay))))
        return 0
    if args.hammer:
        url, token, seconds, clients = args.hammer
        print(json.dumps(asyncio.run(hammer(url, token, float(seconds), int(clients)))))
        return 0

    from service.localkafka import LocalKafka, find_free_ports  # noqa: PLC0415

    X = _features()
    work = Path(tempfile.mkdtemp(prefix="abstain-webload-"))
    kafka: LocalKafka | None = None
    proc: subprocess.Popen[bytes] | None = None
    token = secrets.token_urlsafe(24)
    try:
        broker = args.broker
        if broker is None:
            port, ctl = find_free_ports(2)
            kafka = LocalKafka(
                port=port, controller_port=ctl, data_dir=work / "kafka", die_with_parent=True
            )
            kafka.start()
            broker = kafka.bootstrap
        web_port = find_free_ports(1)[0]
        settings, proc = _start_worker(work, broker, web_port, token)
        base = f"http://127.0.0.1:{web_port}"
        took = _wait(lambda: json.loads(_get(web_port, "/readyz"))["ready"], 180, "ready", proc)
        print(
            f"worker {proc.pid} ready after {took:.1f} s; filling {args.requests} requests",
            flush=True,
        )
        asyncio.run(fill(settings, args.requests, X))
        took = _wait(lambda: _pending(web_port) >= args.requests, 300, "the requests", proc)
        print(f"worker holds {_pending(web_port):.0f} open requests after {took:.1f} s", flush=True)
        time.sleep(2.0)
        runs: dict[str, dict[str, Any]] = {"unloaded": {}, "loaded": {}}
        for _ in range(args.rounds):  # unloaded, loaded, unloaded, ... (drift hits both)
            for loaded in (False, True):
                done = phase(settings, X, args, base, token, loaded)
                _merge(runs["loaded" if loaded else "unloaded"], done)
                time.sleep(2.0)
    finally:
        stop(proc)
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(work, ignore_errors=True)
    _report(args, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
