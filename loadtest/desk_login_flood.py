"""Label desk login-flood test: do wrong passwords slow the people already signed in, and how
many guesses does a flood get? (bounded; stops by itself; everything on 127.0.0.1)

    python loadtest/desk_login_flood.py [--broker HOST:PORT] [--clients 16] [--seconds 10]
                                        [--runs 3] [--mode mixed|botnet]

1. starts a local Kafka (:mod:`service.localkafka`, unless ``--broker``), creates the
   worker's label topics and writes 200 label requests (no worker is needed: the desk
   reads the topics), then starts one desk replica (``python -m service desk``) whose
   users file holds real scrypt hashes (n = 2^14, r = 8: ~50 ms, 16 MiB each) and which
   trusts 127.0.0.1 as its proxy (so the flood can claim any client address in
   ``X-Forwarded-For``, as clients behind an Ingress would have);
2. a signed-in person (logged in before any flood, from their own address) then loops
   ``POST /api/next`` (the labelling page's call: it renews their claim on the leases
   topic) every 20 ms, and a prober loops ``GET /healthz`` every 20 ms, each in a process
   of its own, for ``--seconds`` unloaded, then ``--seconds`` while ``--clients`` clients
   (one more process) post wrong passwords to ``/login`` with no pause:

   - ``mixed`` (default): half of them guess one account (``ann<run>``) from as many
     addresses as there are clients, the other half guess a fresh account each time from
     one address (``203.0.113.<run>``): what the throttles per account and per address
     let through;
   - ``botnet``: every guess from a fresh address for a fresh account, so no throttle
     applies: what the bounded pool of password checks alone lets through;

3. ``--runs N`` repeats (unloaded, loaded) with other accounts and addresses each time.

Prints, per run and as the median over runs, the person's next-request p50 / p99 and the
``/healthz`` p50 / p99 unloaded and loaded (same run) and their ratio, the flood's requests
per second and how they were answered, and the guesses per second (attempts whose password
was checked: 401) on the flooded account and from the flooding address. Every process it
starts (broker, desk, prober, flooder) is stopped by its PID at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness import stop, users_file  # noqa: E402

MODEL = "m"
N_FEATURES = 3
REQUESTS = 200
PACE = 0.02  # seconds between two calls of the person and of the prober


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# --------------------------------------------------------------------------- the person


def sign_in(base: str, user: str, password: str, address: str) -> tuple[str, str]:
    """Sign ``user`` in through the login form (before any flood); the session cookie and
    the labelling page's CSRF token."""
    import http.cookiejar  # noqa: PLC0415
    import urllib.parse  # noqa: PLC0415

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    headers = {"X-Forwarded-For": address}
    with opener.open(urllib.request.Request(base + "/login", headers=headers)) as r:  # noqa: S310
        token = re.search(r'name="token" value="([^"]+)"', r.read().decode())
    assert token is not None  # noqa: S101 - a load test's sanity check
    form = urllib.parse.urlencode({"user": user, "password": password, "token": token.group(1)})
    login = urllib.request.Request(base + "/login", form.encode(), headers)  # noqa: S310
    with opener.open(login) as r:
        page = r.read().decode()  # (redirected to the labelling page)
    csrf = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    if csrf is None:
        raise SystemExit(f"login of {user} failed")
    cookie = next(c.value for c in jar if c.name == "abstain_desk")
    return cookie, csrf.group(1)


async def probe(base: str, seconds: float, cookie: str, csrf: str) -> dict[str, Any]:
    """The signed-in person's ``POST /api/next`` and ``GET /healthz``, each every ``PACE``."""
    import aiohttp  # noqa: PLC0415

    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), timeout=timeout) as person,
        aiohttp.ClientSession(timeout=timeout) as prober,
    ):
        out: dict[str, Any] = {"next": [], "healthz": [], "next_status": {}}
        end = time.monotonic() + seconds

        async def next_loop() -> None:
            headers = {
                "X-CSRF-Token": csrf,
                "X-Forwarded-For": "192.0.2.10",
                "Cookie": f"abstain_desk={cookie}",
            }
            while time.monotonic() < end:
                began = time.perf_counter()
                async with person.post(base + "/api/next", json={}, headers=headers) as r:
                    await r.read()
                out["next"].append(time.perf_counter() - began)
                out["next_status"][r.status] = out["next_status"].get(r.status, 0) + 1
                await asyncio.sleep(PACE)

        async def health_loop() -> None:
            while time.monotonic() < end:
                began = time.perf_counter()
                async with prober.get(base + "/healthz") as r:
                    await r.read()
                out["healthz"].append(time.perf_counter() - began)
                await asyncio.sleep(PACE)

        await asyncio.gather(next_loop(), health_loop())
    if set(out["next_status"]) != {200}:
        raise SystemExit(f"the person's calls were refused: {out['next_status']}")
    return out


# --------------------------------------------------------------------------- the flood


def _guess(mode: str, run: int, client: int, n: int, clients: int) -> tuple[str, str, str]:
    """(group, user, address) of the ``n``-th guess of flood client ``client``."""
    if mode == "botnet":
        return "botnet", f"x{run}-{client}-{n}", f"10.{run}.{client}.{n % 250 + 1}"
    if client < clients // 2:  # one account, many addresses
        return "account", f"ann{run}", f"198.51.{run}.{client + 1}"
    return "address", f"u{run}-{client}-{n}", f"203.0.113.{run}"  # one address, many accounts


async def flood(base: str, seconds: float, clients: int, mode: str, run: int) -> dict[str, Any]:
    """``clients`` clients post wrong passwords to /login with no pause."""
    import aiohttp  # noqa: PLC0415

    counts: dict[str, dict[int, int]] = {}
    end = time.monotonic() + seconds

    async def one(client: int) -> None:
        # one login form, kept: its pre-login cookie and token, sent with every guess (the
        # desk's answers would hand out new ones; an attacker need not take them)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), timeout=timeout) as s:
            async with s.get(base + "/login") as r:
                token = re.search(r'name="token" value="([^"]+)"', await r.text())
                nonce = r.cookies["abstain_desk_login"].value
            assert token is not None  # noqa: S101
            n = 0
            while time.monotonic() < end:
                group, user, address = _guess(mode, run, client, n, clients)
                data = {"user": user, "password": f"guess-{n}", "token": token.group(1)}
                headers = {"X-Forwarded-For": address, "Cookie": f"abstain_desk_login={nonce}"}
                async with s.post(
                    base + "/login", data=data, allow_redirects=False, headers=headers
                ) as r:
                    await r.read()
                by_status = counts.setdefault(group, {})
                by_status[r.status] = by_status.get(r.status, 0) + 1
                n += 1

    await asyncio.gather(*(one(c) for c in range(clients)))
    return {"counts": counts}


# --------------------------------------------------------------------------- processes


def _spawn(args: list[str], log: Path, *, module: bool = True) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    cmd = [sys.executable, "-m", "service", *args] if module else [sys.executable, *args]
    with log.open("wb") as out:
        return subprocess.Popen(  # noqa: S603 - fixed argv
            cmd,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )


def _child(work: Path, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    """This script again, as the prober or the flooder; it writes its JSON to a file."""
    return _spawn(
        [str(Path(__file__).resolve()), *args, "--out", str(work / f"{name}.json")],
        work / f"{name}.log",
        module=False,
    )


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:  # noqa: S310
        return bytes(r.read())


def _wait(check: Any, timeout: float, what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"pid {proc.pid} exited ({proc.returncode}) waiting for {what}")
        with contextlib.suppress(OSError, ValueError, KeyError):
            if check():
                return
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _config(work: Path, run: str) -> Path:
    from service.config import Topics  # noqa: PLC0415

    config = {
        "app_id": f"loginflood-{run}",
        "topics": Topics.prefixed(f"loginflood-{run}"),
        "partitions": {"features": 1, "decisions": 1, "labels": 1},
        "models": {MODEL: {"algorithm": "dsal", "cost": 0.25, "n_features": N_FEATURES}},
        "default_model": MODEL,
        "request_ttl_seconds": 3600,
        "desk": {
            "leases_topic": f"loginflood-{run}.desk-leases",
            "revocations_topic": f"loginflood-{run}.desk-revocations",
            "session_key": secrets.token_urlsafe(32),
            "min_time_left_seconds": 0,
            "trusted_proxies": ["127.0.0.1"],
        },
        "log_level": "warning",
    }
    path = work / "loginflood.json"
    path.write_text(json.dumps(config))
    return path


async def _topics_and_requests(settings: Any) -> None:
    """The worker's label topics (as a worker would create them) and the requests."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: PLC0415

    from service.records import LabelRequest, request_id  # noqa: PLC0415
    from service.stream.kafka.clients import Client  # noqa: PLC0415

    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    try:
        t = settings.topics
        await admin.create_topics(
            [
                NewTopic(t.label_requests, 1, 1),
                NewTopic(t.labels, 1, 1),
                NewTopic(
                    f"{settings.app_id}-pending-changelog",
                    1,
                    1,
                    topic_configs={"cleanup.policy": "compact"},
                ),
            ]
        )
    finally:
        await admin.close()
    now = time.time()
    async with Client(settings) as client:
        for i in range(REQUESTS):
            event = f"flood-{i}"
            req = LabelRequest(
                request_id(MODEL, event),
                event,
                MODEL,
                [0.1 * i, 1.0, -1.0],
                0.1,
                1.0,
                0,
                0.5,
                0,
                now,
                now + 3600,
                0.5,
            )
            await client.send(t.label_requests, MODEL, req.to_json())
        await client.flush()


def _start(args: argparse.Namespace, work: Path) -> tuple[Any, subprocess.Popen[bytes], int, str]:
    """Broker (unless given), topics, requests, users and the desk; (kafka, desk, port,
    the person's password)."""
    from service.config import load_settings  # noqa: PLC0415
    from service.localkafka import LocalKafka, find_free_ports  # noqa: PLC0415

    kafka = None
    broker = args.broker
    if broker is None:
        port, ctl = find_free_ports(2)
        kafka = LocalKafka(
            port=port, controller_port=ctl, data_dir=work / "kafka", die_with_parent=True
        )
        kafka.start()
        broker = kafka.bootstrap
    path = _config(work, uuid.uuid4().hex[:6])
    asyncio.run(_topics_and_requests(load_settings(path, broker=broker)))
    password = secrets.token_urlsafe(12)
    secret = {"person": password} | {
        f"ann{r}": secrets.token_urlsafe(12) for r in range(1, args.runs + 1)
    }
    users_path = users_file(work, secret)
    desk_port = find_free_ports(1)[0]
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

    def ready() -> bool:
        body = json.loads(_get(desk_port, "/readyz"))
        return bool(body["ready"]) and int(body["open"]) >= REQUESTS

    _wait(ready, 300, "the desk to read the topics", desk)
    return kafka, desk, desk_port, password


def _phase(
    work: Path,
    base: str,
    args: argparse.Namespace,
    run: int,
    loaded: bool,
    person: tuple[str, str],
    desk_pid: int,
) -> dict[str, Any]:
    name = f"run{run}-{'loaded' if loaded else 'unloaded'}"
    cpu = _cpu(desk_pid)
    probe_args = [
        "--probe",
        base,
        "--seconds",
        str(args.seconds),
        "--cookie",
        person[0],
        "--csrf",
        person[1],
    ]
    procs = [_child(work, f"{name}-probe", probe_args)]
    if loaded:
        procs.append(
            _child(
                work,
                f"{name}-flood",
                [
                    "--flood",
                    base,
                    "--seconds",
                    str(args.seconds),
                    "--clients",
                    str(args.clients),
                    "--mode",
                    args.mode,
                    "--run",
                    str(run + 1),
                ],
            )
        )
    for proc, kind in zip(procs, ("probe", "flood"), strict=False):
        if proc.wait(args.seconds + 120) != 0:
            tail = (work / f"{name}-{kind}.log").read_text()[-2000:]
            raise SystemExit(f"{name}: the {kind} (pid {proc.pid}) failed:\n{tail}")
    out: dict[str, Any] = json.loads((work / f"{name}-probe.json").read_text())
    if loaded:
        out["flood"] = json.loads((work / f"{name}-flood.json").read_text())
    out["desk_cpu"] = (_cpu(desk_pid) - cpu) / args.seconds
    return out


# --------------------------------------------------------------------------- report


def _report(args: argparse.Namespace, runs: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    ms = 1000.0
    print(
        f"\nabstain desk login flood: 1 desk replica, {args.clients} flooding clients "
        f"({args.mode}), {args.seconds:g} s unloaded then {args.seconds:g} s loaded per run, "
        f"{len(runs)} run(s); the person and /healthz every {PACE * 1000:.0f} ms"
    )
    head = (
        f"{'run':<5}{'next p50':>10}{'next p99':>10}{'loaded':>10}{'x':>7}"
        f"{'healthz p99':>13}{'loaded':>10}{'x':>7}{'desk CPU':>16}"
    )
    print(head + "\n" + "-" * len(head))
    ratios: dict[str, list[float]] = {"next": [], "healthz": []}
    p99: dict[str, list[float]] = {k: [] for k in ("next", "next_l", "healthz", "healthz_l")}
    for i, (quiet, busy) in enumerate(runs):
        row = {}
        for kind in ("next", "healthz"):
            row[kind], row[kind + "_l"] = _pct(quiet[kind], 99), _pct(busy[kind], 99)
            ratios[kind].append(row[kind + "_l"] / row[kind])
            p99[kind].append(row[kind])
            p99[kind + "_l"].append(row[kind + "_l"])
        print(
            f"{i + 1:<5}{_pct(quiet['next'], 50) * ms:>10.1f}{row['next'] * ms:>10.1f}"
            f"{row['next_l'] * ms:>10.1f}{ratios['next'][-1]:>7.2f}"
            f"{row['healthz'] * ms:>13.1f}{row['healthz_l'] * ms:>10.1f}"
            f"{ratios['healthz'][-1]:>7.2f}"
            f"{quiet['desk_cpu'] * 100:>8.0f}%/{busy['desk_cpu'] * 100:.0f}%"
        )
    med = statistics.median
    print(
        f"median: next p99 {med(p99['next']) * ms:.1f} -> {med(p99['next_l']) * ms:.1f} ms "
        f"({med(ratios['next']):.2f}x), /healthz p99 {med(p99['healthz']) * ms:.1f} -> "
        f"{med(p99['healthz_l']) * ms:.1f} ms ({med(ratios['healthz']):.2f}x); goal: within "
        "1.5x unloaded"
    )
    for i, (_, busy) in enumerate(runs):
        counts = busy["flood"]["counts"]
        total = sum(sum(c.values()) for c in counts.values())
        statuses: dict[int, int] = {}
        for c in counts.values():
            for status, n in c.items():
                statuses[int(status)] = statuses.get(int(status), 0) + n
        guesses = {group: c.get("401", 0) / args.seconds for group, c in counts.items()}
        said = ", ".join(f"{group} {rate:.2f}/s" for group, rate in sorted(guesses.items()))
        print(
            f"run {i + 1}: flood {total / args.seconds:.0f} requests/s, answered "
            f"{dict(sorted(statuses.items()))}; guesses checked: {said} "
            "(account: the one flooded account; address: the one flooding address)"
        )


# --------------------------------------------------------------------------- main


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", help="use this broker instead of starting one")
    p.add_argument("--clients", type=int, default=16, help="flooding clients")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    p.add_argument("--runs", type=int, default=3, help="(unloaded, loaded) pairs")
    p.add_argument("--mode", choices=("mixed", "botnet"), default="mixed")
    p.add_argument("--probe", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--flood", metavar="URL", help=argparse.SUPPRESS)
    p.add_argument("--cookie", help=argparse.SUPPRESS)
    p.add_argument("--csrf", help=argparse.SUPPRESS)
    p.add_argument("--run", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe:
        out = asyncio.run(probe(args.probe, args.seconds, args.cookie, args.csrf))
        args.out.write_text(json.dumps(out))
        return 0
    if args.flood:
        out = asyncio.run(flood(args.flood, args.seconds, args.clients, args.mode, args.run))
        args.out.write_text(json.dumps(out))
        return 0

    work = Path(tempfile.mkdtemp(prefix="abstain-loginflood-"))
    kafka, desk = None, None
    runs = []
    try:
        kafka, desk, port, password = _start(args, work)
        base = f"http://127.0.0.1:{port}"
        person = sign_in(base, "person", password, "192.0.2.10")  # before any flood
        print(f"desk {desk.pid} ready on {base}; measuring", flush=True)
        for run in range(args.runs):
            quiet = _phase(work, base, args, run, False, person, desk.pid)
            busy = _phase(work, base, args, run, True, person, desk.pid)
            runs.append((quiet, busy))
            print(f"  run {run + 1}: done", flush=True)
    finally:
        stop(desk, 15)
        if kafka is not None:
            kafka.stop()
        shutil.rmtree(work, ignore_errors=True)
    _report(args, runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
