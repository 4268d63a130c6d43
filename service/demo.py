"""``abstain demo``: the whole loop on one machine, in one command.

1. starts a local single-node Kafka (:mod:`service.localkafka`) unless ``--broker`` is given;
2. starts a stream worker as a subprocess (``python -m service worker``) on fresh topics;
3. streams a dataset (default: Phishing, LIBSVM, labels 0 -> -1) as feature events at
   ``--rate`` events/s, ``--events`` of them (0 = until Ctrl-C);
4. runs a simulated labeller, the *oracle*: a stand-in for operations staff that answers each
   label request with the dataset's true label after ``--label-delay`` seconds;
5. prints one line per second: events/s, decisions (predict / reject), labels asked /
   applied, model version, the worker's importance-weighted risk estimate and, because the
   demo knows every true label, the true 0-d-1 risk of the decisions served so far.

Ctrl-C, or the end of a bounded run, stops every process the demo started, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.config import Settings, load_settings
from service.datasets import load_dataset, resolve_dataset_path

__all__ = ["main"]


@dataclass
class Tally:
    """What the demo has seen so far."""

    sent: int = 0
    predict: int = 0
    reject: int = 0
    asked: int = 0
    answered: int = 0
    loss: float = 0.0  # true 0-d-1 loss of served decisions
    started: float = field(default_factory=time.monotonic)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="abstain demo", description=__doc__.splitlines()[0])
    p.add_argument("--broker", help="use this Kafka (host:port) instead of starting one")
    p.add_argument(
        "--dataset",
        default="phishing",
        help="name under the data dir (phishing also ships with the package), or a path",
    )
    p.add_argument("--format", choices=["libsvm", "csv"], default=None)
    p.add_argument("--rate", type=float, default=200.0, help="events per second")
    p.add_argument("--events", type=int, default=3000, help="how many (0 = until Ctrl-C)")
    p.add_argument("--label-delay", type=float, default=1.0, help="oracle answer delay, s")
    p.add_argument("--algorithm", default="dsal", help="dral, dsal, dsol, kernel-...")
    p.add_argument("--cost", type=float, default=0.25, help="reject cost d in (0, 0.5)")
    p.add_argument("--web-port", type=int, default=6066)
    p.add_argument("--seed", type=int, default=0, help="shuffles the dataset")
    p.add_argument("--workdir", type=Path, default=None, help="logs and scratch (default tmp)")
    return p


def main(argv: list[str]) -> int:
    """Run the demo; returns the exit code."""
    args = _parser().parse_args(argv)
    X, y = load_dataset(resolve_dataset_path(args.dataset), format=args.format)
    order = np.random.default_rng(args.seed).permutation(len(y))
    X, y = X[order], y[order]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="abstain-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:6]
    kafka: Any = None
    worker: subprocess.Popen[bytes] | None = None
    try:
        broker = args.broker
        if broker is None:
            from service.localkafka import LocalKafka, find_free_ports  # noqa: PLC0415

            port, controller = find_free_ports(2)
            kafka = LocalKafka(
                port=port, controller_port=controller, data_dir=workdir / "kafka",
                die_with_parent=True,
            )  # fmt: skip
            print(f"starting Kafka on 127.0.0.1:{port} (first run downloads the jars) ...")
            kafka.start()
            broker = kafka.bootstrap
        config = _config(args, run, X.shape[1], workdir)
        settings = load_settings(workdir / "demo.json", broker=broker)
        worker = _start_worker(workdir, broker, args.web_port)
        print(f"worker pid {worker.pid}, http://127.0.0.1:{args.web_port}/labels  "
              f"(logs: {workdir}/worker.log)")  # fmt: skip
        _wait_ready(worker, args.web_port, workdir)
        print(f"model {config['models']['default']['algorithm']} d={args.cost} on "
              f"{args.dataset}: {len(y)} rows x {X.shape[1]} features; oracle answers after "
              f"{args.label_delay:g}s (a stand-in for operations staff)")  # fmt: skip
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_stream(settings, args, X, y, run))
        return 0
    finally:
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
        if kafka is not None:
            kafka.stop()
        print("stopped everything the demo started")


def _config(args: argparse.Namespace, run: str, n_features: int, workdir: Path) -> dict[str, Any]:
    config: dict[str, Any] = {
        "app_id": f"abstain-demo-{run}",
        "datadir": str(workdir / "worker"),
        "topics": {
            k: f"demo-{run}.{k.replace('_', '-')}"
            for k in ("features", "decisions", "label_requests", "labels", "models", "dead_letters")
        },  # fmt: skip
        "partitions": {"features": 4, "decisions": 4, "labels": 1},
        "label_token": "demo",
        "request_ttl_seconds": max(60.0, 10 * args.label_delay),
        "session_timeout_seconds": 10,
        "models": {
            "default": {
                "algorithm": args.algorithm,
                "cost": args.cost,
                "n_features": n_features,
            }
        },  # fmt: skip
        "log_level": "warning",
    }
    (workdir / "demo.json").write_text(json.dumps(config, indent=2))
    return config


def _start_worker(workdir: Path, broker: str, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    cmd = [sys.executable, "-m", "service", "worker", "--config", str(workdir / "demo.json"),
           "--broker", broker, "--web-port", str(port)]  # fmt: skip
    with (workdir / "worker.log").open("wb") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - local URL
        return bytes(resp.read())


def _wait_ready(worker: subprocess.Popen[bytes], port: int, workdir: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise SystemExit(f"worker exited ({worker.returncode}); see {workdir}/worker.log")
        with contextlib.suppress(OSError):
            if json.loads(_get(f"http://127.0.0.1:{port}/readyz")).get("ready"):
                return
        time.sleep(0.3)
    raise SystemExit(f"worker not ready after 120 s; see {workdir}/worker.log")


def _metrics(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in _get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
            if line.startswith("abstain_") and 'model="default"' in line:
                name, _, value = line.rpartition(" ")
                out[name.split("{")[0]] = float(value)
    return out


async def _stream(
    settings: Settings, args: argparse.Namespace, X: np.ndarray, y: np.ndarray, run: str
) -> None:
    from service.stream.client import Client  # noqa: PLC0415 - keeps --help fast

    t = settings.topics
    tally = Tally()
    cost = args.cost
    total = args.events if args.events > 0 else None

    def row(event_id: str) -> int:
        return int(event_id.rsplit("-", 1)[1]) % len(y)

    async with Client(settings) as client:
        ready = [asyncio.Event(), asyncio.Event()]

        async def watch_decisions() -> None:
            async for rec in client.follow([t.decisions], positioned=ready[0]):
                d = json.loads(rec.value)
                truth = int(y[row(d["id"])])
                if d["action"] == "reject":
                    tally.reject += 1
                    tally.loss += cost
                else:
                    tally.predict += 1
                    tally.loss += 0.0 if d["label"] == truth else 1.0

        async def oracle() -> None:
            async for rec in client.follow([t.label_requests], positioned=ready[1]):
                req = json.loads(rec.value)
                tally.asked += 1
                asyncio.get_running_loop().call_later(args.label_delay, schedule, req)

        pending: set[asyncio.Task[None]] = set()

        def schedule(req: dict[str, Any]) -> None:
            task = asyncio.ensure_future(answer(req))
            pending.add(task)
            task.add_done_callback(pending.discard)

        async def answer(req: dict[str, Any]) -> None:
            label = int(y[row(req["event_id"])])
            await client.send(t.labels, req["model"], {
                "request_id": req["request_id"], "model": req["model"], "label": label,
                "labelled_by": "oracle", "ts": time.time(),
            })  # fmt: skip
            tally.answered += 1

        async def feed() -> None:
            await asyncio.gather(*(e.wait() for e in ready))
            interval = 1.0 / args.rate
            next_at = time.monotonic()
            i = 0
            while total is None or i < total:
                event_id = f"{run}-{i}"
                await client.send(t.features, event_id, {
                    "id": event_id, "features": X[i % len(y)].tolist(), "ts": time.time(),
                })  # fmt: skip
                tally.sent += 1
                i += 1
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            await client.flush()

        async def report() -> None:
            last, last_t = 0, time.monotonic()
            while True:
                await asyncio.sleep(1.0)
                now = time.monotonic()
                rate = (tally.sent - last) / (now - last_t)
                last, last_t = tally.sent, now
                m = _metrics(args.web_port)
                decided = tally.predict + tally.reject
                applied = m.get("abstain_labels_applied_total", 0.0)
                est = m.get("abstain_risk_estimate", float("nan")) if applied else float("nan")
                true_risk = tally.loss / decided if decided else float("nan")
                print(
                    f"[{now - tally.started:6.0f}s] {rate:6.0f} ev/s  sent {tally.sent:6d}  "
                    f"decided {tally.predict:6d} predict / {tally.reject:6d} reject  "
                    f"labels asked {tally.asked:5d} applied "
                    f"{applied:5.0f}  "
                    f"model v{m.get('abstain_model_version', 0):.0f}  "
                    f"risk est {est:.3f} "
                    f"(true {true_risk:.3f})",
                    flush=True,
                )

        tasks = [asyncio.create_task(c()) for c in (watch_decisions, oracle, report)]
        try:
            await feed()
            deadline = time.monotonic() + 30 + 2 * args.label_delay
            while tally.predict + tally.reject < tally.sent and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(args.label_delay + 1.5)  # let the last labels land
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    decided = tally.predict + tally.reject
    print(f"done: {tally.sent} events, {decided} decisions "
          f"({tally.reject} rejected), {tally.answered} labels given; true 0-d-1 risk "
          f"{tally.loss / max(1, decided):.3f}")  # fmt: skip
