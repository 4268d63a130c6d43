"""Label desk load test: one desk replica over 100,000 open label requests (bounded; stops by
itself; everything on 127.0.0.1).

    python loadtest/desk_bench.py [--broker HOST:PORT] [--requests 100000] [--clients 20]
                                  [--seconds 10] [--labels 200]

1. starts a local Kafka (:mod:`service.localkafka`, unless ``--broker``) and one worker;
2. fills the label queue: ``--requests`` well-formed label requests (model ``default``, 68
   features, an hour to live) go to the label-requests topic, and the bench waits until the
   worker holds them (``abstain_pending_requests``; the model's ``max_open_requests`` is
   raised above ``--requests``);
3. only then starts one desk replica (``python -m service desk``) and times how long it takes
   to read the topics from their beginning: ``/readyz`` 200 with every request open;
4. logs ``--clients`` people in through the login page and, for ``--seconds`` each, with no
   pause between calls:

   - ``next``: every person loops ``POST /api/next`` (each call claims, or renews, that
     person's request on the leases topic and waits until the desk has folded the claim);
   - ``team``: every person loops ``GET /team`` (the team view of the desk's last tick);
   - ``answer``: every person loops next + ``POST /api/answer`` (a label with acks=all);

5. label to model: ``--labels`` labels, one at a time on a quiet system: ``POST /api/answer``,
   then the worker's ``/readyz`` is polled every 2 ms until the model's version moved (the
   worker serves what its models-topic follower has read: the version every worker would
   see). p50 / p99 of submit -> "Saved" and of submit -> new version.

Prints a table. Every process it starts (broker, worker, desk) is stopped by its PID at the
end, also on errors; the worker and the desk die with this script.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import random
import re
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

from harness import features, stop, users_file  # noqa: E402

from service.config import Settings, Topics, load_settings  # noqa: E402
from service.records import LabelRequest, request_id  # noqa: E402
from service.stream.kafka.clients import Client  # noqa: E402

MODEL = "default"
N_FEATURES = 68
POLL = 0.002  # seconds between /readyz polls while waiting for a new model version


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _get(port: int, path: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:  # noqa: S310
        return bytes(r.read())


def _metric(port: int, name: str, labels: str = f'model="{MODEL}"') -> float:
    for line in _get(port, "/metrics").decode().splitlines():
        if line.startswith(f"{name}{{{labels}}}"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _lost(port: int) -> float:
    """Claims the desk lost on the leases topic so far (to its own people or others)."""
    return _metric(port, "abstain_desk_claims_total", 'outcome="lost"')


def _wait(check: Any, timeout: float, what: str, proc: subprocess.Popen[bytes]) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"pid {proc.pid} exited ({proc.returncode}) waiting for {what}")
        with contextlib.suppress(OSError, ValueError, KeyError):
            if check():
                return time.monotonic() - began
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


class Usage:
    """CPU seconds and resident memory of one process, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tick = os.sysconf("SC_CLK_TCK")

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


# --------------------------------------------------------------------------- processes


def _config(work: Path, run: str, requests: int) -> Path:
    config = {
        "app_id": f"deskbench-{run}",
        "datadir": str(work / "worker"),
        "topics": Topics.prefixed(f"deskbench-{run}"),
        "partitions": {"features": 1, "decisions": 1, "labels": 1},
        "models": {
            MODEL: {
                "algorithm": "dsal",
                "cost": 0.25,
                "n_features": N_FEATURES,
                "max_open_requests": max(50_000, 2 * requests),
            }
        },
        "request_ttl_seconds": 3600,
        "web": {"host": "127.0.0.1"},
        "desk": {
            "leases_topic": f"deskbench-{run}.desk-leases",
            "session_key": secrets.token_urlsafe(32),
            "min_time_left_seconds": 0,
        },
        "log_level": "warning",
    }
    path = work / "deskbench.json"
    path.write_text(json.dumps(config))
    return path


def _spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    with log.open("wb") as out:
        return subprocess.Popen(  # noqa: S603 - fixed argv
            [sys.executable, "-m", "service", *cmd],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )


def _stop(proc: subprocess.Popen[bytes] | None, grace: float) -> None:
    stop(proc, grace)


# --------------------------------------------------------------------------- filling


def _features() -> np.ndarray:
    return features(N_FEATURES)


async def fill(settings: Settings, n: int, X: np.ndarray) -> None:
    """``n`` label requests of model ``default`` (key = the model, one partition)."""
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
                rng.uniform(-1, 1),
                1.0,
                0,
                rng.uniform(0.05, 1.0),
                0,
                now,
                now + 3600,
                rng.random(),
            )
            await client.send(settings.topics.label_requests, MODEL, req.to_json())
        await client.flush()


# --------------------------------------------------------------------------- people


class Person:
    """One logged-in browser: a session cookie and the page's CSRF token."""

    def __init__(self, session: Any, base: str, csrf: str) -> None:
        self.session, self.base, self.csrf = session, base, csrf

    async def api(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        headers = {"X-CSRF-Token": self.csrf}
        async with self.session.post(self.base + path, json=body, headers=headers) as r:
            return r.status, await r.json(content_type=None)

    async def page(self, path: str) -> int:
        async with self.session.get(self.base + path) as r:
            await r.read()
            return int(r.status)


async def login(base: str, user: str, password: str) -> Person:
    import aiohttp  # noqa: PLC0415

    jar = aiohttp.CookieJar(unsafe=True)  # cookies for 127.0.0.1
    session = aiohttp.ClientSession(cookie_jar=jar, timeout=aiohttp.ClientTimeout(total=60))
    async with session.get(base + "/login") as r:
        form = await r.text()
    token = re.search(r'name="token" value="([^"]+)"', form)
    assert token is not None, form  # noqa: S101 - a bench's sanity check
    data = {"user": user, "password": password, "token": token.group(1)}
    async with session.post(base + "/login", data=data, allow_redirects=False) as r:
        if r.status != 303:
            raise SystemExit(f"login of {user} failed: {r.status}")
    async with session.get(base + "/") as r:
        page = await r.text()
    csrf = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    assert csrf is not None, page  # noqa: S101
    return Person(session, base, csrf.group(1))


async def hammer(people: list[Person], seconds: float, kind: str) -> dict[str, Any]:
    """Every person loops ``kind`` (next / team / answer) for ``seconds``, no pause."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    answered = empty = 0  # labels saved; "next" calls that found no request for the person
    end = time.monotonic() + seconds

    async def one(person: Person) -> None:
        nonlocal answered, empty
        while time.monotonic() < end:
            began = time.perf_counter()
            if kind == "team":
                status = await person.page("/team")
            else:
                status, body = await person.api("/api/next", {})
                request = body.get("request") if status == 200 else None
                empty += status == 200 and request is None
                if kind == "answer" and request is not None:
                    began = time.perf_counter()  # the answer call alone
                    status, _ = await person.api(
                        "/api/answer",
                        {"request_id": request["request_id"], "label": random.choice((1, -1))},  # noqa: S311
                    )
                    answered += status == 200
            latencies.append(time.perf_counter() - began)
            statuses[status] = statuses.get(status, 0) + 1

    await asyncio.gather(*(one(p) for p in people))
    return {"latencies": latencies, "statuses": statuses, "answered": answered, "empty": empty}


async def label_to_model(person: Person, worker_port: int, n: int) -> dict[str, list[float]]:
    """``n`` labels one at a time: submit -> Saved, and submit -> the worker serves the new
    version (its /readyz, polled every ``POLL`` seconds on a kept-alive connection)."""
    import aiohttp  # noqa: PLC0415

    saved: list[float] = []
    seen: list[float] = []
    url = f"http://127.0.0.1:{worker_port}/readyz"
    async with aiohttp.ClientSession() as poller:

        async def version() -> int:
            async with poller.get(url) as r:
                return int((await r.json(content_type=None))["models"][MODEL])

        for _ in range(n):
            status, body = await person.api("/api/next", {})
            if status != 200 or body.get("request") is None:
                raise SystemExit(f"no request to answer ({status} {body})")
            before = await version()
            began = time.perf_counter()
            status, reply = await person.api(
                "/api/answer", {"request_id": body["request"]["request_id"], "label": 1}
            )
            saved.append(time.perf_counter() - began)
            if status != 200:
                raise SystemExit(f"answer refused: {status} {reply}")
            while await version() <= before:
                if time.perf_counter() - began > 30:
                    raise SystemExit("the worker did not serve a new version within 30 s")
                await asyncio.sleep(POLL)
            seen.append(time.perf_counter() - began)
    return {"saved": saved, "seen": seen}


async def measure(
    args: argparse.Namespace,
    base: str,
    worker_port: int,
    desk: Usage,
    users: dict[str, str],
    desk_port: int,
) -> dict[str, Any]:
    began = time.monotonic()
    people = await asyncio.gather(*(login(base, u, p) for u, p in users.items()))
    out: dict[str, Any] = {"login_seconds": time.monotonic() - began}
    try:
        for kind in ("next", "team"):
            cpu, lost = desk.cpu(), _lost(desk_port)
            out[kind] = await hammer(list(people), args.seconds, kind)
            out[kind]["cpu"] = (desk.cpu() - cpu) / args.seconds
            out[kind]["lost"] = _lost(desk_port) - lost
            print(f"  {kind}: {sum(out[kind]['statuses'].values())} calls", flush=True)
        await asyncio.sleep(2.0)  # the claims of the next phase settle
        out["label"] = await label_to_model(people[0], worker_port, args.labels)
        print(f"  label -> model: {args.labels} labels", flush=True)
        cpu, lost = desk.cpu(), _lost(desk_port)
        out["answer"] = await hammer(list(people), args.seconds, "answer")
        out["answer"]["cpu"] = (desk.cpu() - cpu) / args.seconds
        out["answer"]["lost"] = _lost(desk_port) - lost
        print(f"  answer: {out['answer']['answered']} labels", flush=True)
    finally:
        for person in people:
            await person.session.close()
    return out


# --------------------------------------------------------------------------- report


def _report(args: argparse.Namespace, facts: dict[str, Any], out: dict[str, Any]) -> None:
    ms = 1000.0
    print(
        f"\nabstain desk bench: 1 desk replica, 1 worker, {facts['open']} open requests "
        f"(model {MODEL}, {N_FEATURES} features), {args.clients} people, {args.seconds:g} s "
        "per phase"
    )
    print(
        f"desk read the topics from their beginning in {facts['read_seconds']:.1f} s "
        f"(ready with {facts['open']} open); resident memory {facts['rss_ready']:.0f} MiB "
        f"ready, {facts['rss_end']:.0f} MiB at the end"
    )
    print(f"{args.clients} logins (scrypt) in {out['login_seconds']:.2f} s")
    print(f"{'phase':<28}{'calls/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'desk CPU':>10}  statuses")
    print("-" * 90)
    names = {
        "next": "POST /api/next",
        "team": "GET /team",
        "answer": "next + POST /api/answer",
    }
    for kind, name in names.items():
        r = out[kind]
        calls = sum(r["statuses"].values())
        print(
            f"{name:<28}{calls / args.seconds:>10.1f}{_pct(r['latencies'], 50) * ms:>10.1f}"
            f"{_pct(r['latencies'], 99) * ms:>10.1f}{r['cpu'] * 100:>9.0f}%  {r['statuses']}"
        )
    answer = out["answer"]
    rate = answer["answered"] / args.seconds
    print(
        f"answers saved in the answer phase: {answer['answered']} ({rate:.1f}/s; the "
        "latency above is the answer call's)"
    )
    for kind in ("next", "answer"):
        r = out[kind]
        loops = sum(r["statuses"].values())
        print(
            f"{kind} phase: /api/next found no request for the person {r['empty']} times in "
            f"{loops} loops, with {facts['open']} requests open; {r['lost']:.0f} claims "
            "lost"
        )
    lab = out["label"]
    print(
        f"label -> model ({len(lab['seen'])} labels, one at a time): submit -> Saved p50 "
        f"{_pct(lab['saved'], 50) * ms:.1f} ms, p99 {_pct(lab['saved'], 99) * ms:.1f} ms; "
        f"submit -> new version served by the worker p50 {_pct(lab['seen'], 50) * ms:.1f} ms, "
        f"p99 {_pct(lab['seen'], 99) * ms:.1f} ms, max {_pct(lab['seen'], 100) * ms:.1f} ms"
    )


# --------------------------------------------------------------------------- main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", help="use this broker instead of starting one")
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--clients", type=int, default=20, help="people logged in at once")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    p.add_argument("--labels", type=int, default=200, help="labels timed to the model")
    args = p.parse_args()

    from service.localkafka import LocalKafka, find_free_ports  # noqa: PLC0415

    X = _features()
    work = Path(tempfile.mkdtemp(prefix="abstain-deskbench-"))
    kafka: LocalKafka | None = None
    worker: subprocess.Popen[bytes] | None = None
    desk: subprocess.Popen[bytes] | None = None
    try:
        broker = args.broker
        if broker is None:
            port, ctl = find_free_ports(2)
            kafka = LocalKafka(
                port=port, controller_port=ctl, data_dir=work / "kafka", die_with_parent=True
            )
            kafka.start()
            broker = kafka.bootstrap
        run = uuid.uuid4().hex[:6]
        path = _config(work, run, args.requests)
        settings = load_settings(path, broker=broker)
        worker_port, desk_port = find_free_ports(2)
        worker = _spawn(
            ["worker", "--config", str(path), "--broker", broker, "--web-port", str(worker_port)],
            work / "worker.log",
        )
        took = _wait(
            lambda: json.loads(_get(worker_port, "/readyz"))["ready"], 180, "worker", worker
        )
        print(
            f"worker {worker.pid} ready after {took:.1f} s; filling {args.requests} requests",
            flush=True,
        )
        began = time.monotonic()
        asyncio.run(fill(settings, args.requests, X))
        print(f"produced {args.requests} requests in {time.monotonic() - began:.1f} s", flush=True)
        took = _wait(
            lambda: _metric(worker_port, "abstain_pending_requests") >= args.requests,
            900,
            "the worker to hold the requests",
            worker,
        )
        print(f"worker holds them after {took:.1f} s more", flush=True)

        users = {f"bench-{i}": secrets.token_urlsafe(12) for i in range(args.clients)}
        users_path = users_file(work, users)
        desk = _spawn(
            [
                "desk",
                "--config",
                str(path),
                "--broker",
                broker,
                "--port",
                str(desk_port),
                "--users",
                str(users_path),
            ],
            work / "desk.log",
        )
        usage = Usage(desk.pid)

        def read_all() -> bool:
            body = json.loads(_get(desk_port, "/readyz"))
            return bool(body["ready"]) and int(body["open"]) >= args.requests

        took = _wait(read_all, 900, "the desk to read the topics", desk)
        facts: dict[str, Any] = {
            "read_seconds": took,
            "open": json.loads(_get(desk_port, "/readyz"))["open"],
            "rss_ready": usage.rss_mib(),
        }
        print(
            f"desk {desk.pid} ready with {facts['open']} open requests after {took:.1f} s; "
            f"measuring",
            flush=True,
        )
        out = asyncio.run(
            measure(args, f"http://127.0.0.1:{desk_port}", worker_port, usage, users, desk_port)
        )
        facts["rss_end"] = usage.rss_mib()
    finally:
        _stop(desk, 15)
        _stop(worker, 30)
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(work, ignore_errors=True)
    _report(args, facts, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
