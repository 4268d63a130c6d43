"""One worker against the raw-aiokafka floor, side by side on the same broker and topic.

    python loadtest/throughput.py [--broker HOST:PORT] [--events 40000] [--pairs 3]
                                  [--latency-pairs 3] [--rate 200] [--latency-seconds 10]
                                  [--workers 2] [--learner 20000] [--budget 0.01]
                                  [--same-output] [--profile DIR] [--compression CODEC]
                                  [--worker-setting NAME=JSON ...] [--shapes dense68,...]

1. Pre-loads one 4-partition topic with ``--events`` Phishing events (68 features); with
   ``--shapes`` one topic per shape, each measured in turn as below (``hashed12-300``:
   ``loadtest/wide.py``'s events as producers write them, 300 tokens an event, and its
   model, a ``fields`` declaration of 2^12 buckets; the passthrough takes the first 68
   numbers of an object of fields), and a summary of each shape's medians against the
   first's.
2. Runs ``loadtest/passthrough.py`` and ``python -m service worker`` alternately on it,
   ``--pairs`` times each, every run with its own consumer group and a fresh output topic
   (created with ``message.timestamp.type=LogAppendTime``, so every output carries the
   broker's time). The passthrough's clients take the worker's options (``read_committed``,
   the ``compression`` codec: ``--compression``, default the setting's default, zstd, for
   both). A run is timed from the broker timestamp of its first output to that of
   its last, and checks that every event id arrived. CPU per event is read from
   ``/proc/PID/stat`` (user + system) between the first and the last output. For the
   worker (a fresh DSAL model, which asks for most labels; ``--budget F`` gives it a label
   budget of a fraction F of the events) it also reports how long after the last decision
   the learner had stored the last label request in its pending table.
   With ``--same-output`` every pair is a triple: passthrough, worker and
   ``floor+requests``, the passthrough also writing label requests (the fields of the
   worker's, on a fresh 1-partition topic, key ``default``) for a fraction of the events:
   the fraction the worker asked about in the latest worker run before it (the records on
   its label-requests topic over the events; 0.8 before the first). Timed like the
   passthrough; it separates the cost of the worker's extra output from its machinery.
3. Latency: the same pairs, each on a fresh topic with events at ``--rate`` for
   ``--latency-seconds``; each event carries its send time, read back when its output
   arrives (p50 / p99).
4. With ``--workers 2``: two worker processes in one group on a fresh topic; once both
   are assigned their partitions the events are written (aggregate events/s from the
   outputs' broker timestamps, the CPU each used).
5. With ``--learner N``: the learner alone. ``N`` label requests (as a fresh model asks
   them) are pre-loaded on a fresh deployment's label-requests topic, then a worker stores
   them; requests/s (broker timestamps of the first and last pending-table write) and CPU
   per request. Nothing else runs in that worker.

With ``--profile DIR`` every measured run is sampled by py-spy (``pip install py-spy``) from
its first output until its last (for a worker: until its learner stored the last label
request), into collapsed stacks in ``DIR`` with ``DIR/runs.jsonl`` (each run's CPU per
event over that interval); ``loadtest/flame.py DIR`` turns them into the table of where
the microseconds of one event go and a flame graph per kind of run.

Prints one table with every run, the medians, and as its last line
``worker/passthrough = R`` (median events/s of the worker runs over that of the passthrough
runs); with ``--same-output`` it is preceded by ``worker/floor+requests = R`` (the same
over the floor+requests runs). Starts its own Kafka (service.localkafka) unless ``--broker``
is given; every process it starts is stopped by PID. Bounded: every wait has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from harness import features, stop, worker_argv  # noqa: E402
from wide import SHAPES, config_of, events  # noqa: E402

from service.localkafka import LocalKafka, find_free_ports  # noqa: E402
from service.stream.kafka.clients import topic_partitions  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PARTITIONS = 4
RUN_TIMEOUT = 300.0
#: the worker's model: a fresh DSAL (it asks for about 80 % of the labels); --budget caps it
MODEL: dict[str, Any] = {"algorithm": "dsal", "cost": 0.25, "n_features": 68}
#: each event's features as a producer writes them (a list of numbers, or an object of fields)
Payloads = list[Any]
#: the codec the worker and the passthrough write with (--compression; None: the default)
COMPRESSION: str | None = None
#: the worker's settings besides its model (--worker-setting NAME=VALUE)
WORKER: dict[str, Any] = {}
#: --budget F: the model's label budget, a fraction of its events (None: none)
BUDGET: float | None = None
#: --profile DIR: py-spy samples every measured run into DIR (``loadtest/flame.py`` reads them)
PROFILE: Path | None = None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@dataclass
class Run:
    """What one run measured."""

    kind: str
    events: int = 0
    seconds: float = float("nan")
    cpu_us: list[float] = field(default_factory=list)  # per event, one per process
    learner_behind: float = float("nan")
    asked: float = float("nan")  # label requests written per event (--same-output)
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("nan")


async def create_topics(
    broker: str, names: list[str], *, log_append: bool, partitions: int = PARTITIONS
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        configs = {"message.timestamp.type": "LogAppendTime"} if log_append else {}
        await admin.create_topics(
            [NewTopic(n, partitions, 1, topic_configs=configs) for n in names]
        )
    finally:
        await admin.close()
    await asyncio.sleep(0.5)  # leaders elected before anyone fetches


async def preload(broker: str, topic: str, X: Payloads, n: int, prefix: str) -> None:
    """``n`` feature events (ids ``prefix0``, ``prefix1``...) on ``topic``, keyed by id."""

    def event(i: int) -> tuple[bytes, bytes]:
        event_id = f"{prefix}{i}"
        return event_id.encode(), orjson.dumps({"id": event_id, "features": X[i % len(X)]})

    await write(broker, topic, (event(i) for i in range(n)))


async def write(broker: str, topic: str, records: Iterable[tuple[bytes, bytes]]) -> None:
    """``(key, value)`` records on ``topic``, as fast as the broker takes them (acks=all)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=broker, acks="all", linger_ms=20, max_batch_size=1 << 20
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for key, value in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


class Tail:
    """Follows output topics from their beginning: event ids and broker timestamps."""

    def __init__(self, broker: str, topics: list[str]) -> None:
        self.consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=broker,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            fetch_max_wait_ms=10,
            group_id=None,
        )
        self.seen: dict[str, int] = {}  # id -> broker timestamp (ms) of its first output
        self.counts: dict[str, int] = {}  # records per topic
        self.arrived: dict[str, float] = {}  # id -> local arrival time (s)

    async def __aenter__(self) -> Tail:
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()

    async def poll(self, key_field: str | None = "id") -> None:
        fetched = await self.consumer.getmany(timeout_ms=50, max_records=20000)
        now = time.time()
        for tp, records in fetched.items():
            self.counts[tp.topic] = self.counts.get(tp.topic, 0) + len(records)
            if key_field is None:
                continue
            for r in records:
                try:
                    event_id = orjson.loads(r.value)[key_field]
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue
                if event_id not in self.seen:
                    self.seen[event_id] = r.timestamp
                    self.arrived[event_id] = now


def _start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    with log.open("wb") as out:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def passthrough_cmd(broker: str, topic: str, out: str, work: Path) -> list[list[str]]:
    group = f"pt-{uuid.uuid4().hex[:6]}"
    codec = [] if COMPRESSION is None else ["--compression", COMPRESSION]
    return [
        [
            sys.executable,
            str(HERE / "passthrough.py"),
            "--broker",
            broker,
            "--topic",
            topic,
            "--out",
            out,
            "--group",
            group,
            *codec,
        ]
    ]


async def records_on(broker: str, topic: str) -> int:
    """How many records ``topic`` holds (the sum of its partitions' end offsets)."""
    tps = await topic_partitions([broker], topic, client_kwargs={}, attempts=10)
    probe = AIOKafkaConsumer(bootstrap_servers=broker, group_id=None)
    await probe.start()
    try:
        return sum((await probe.end_offsets(tps)).values())
    finally:
        await probe.stop()


def worker_cmd(broker: str, topic: str, out: str, work: Path, count: int = 1) -> list[list[str]]:
    """``count`` worker processes of one fresh deployment that read ``topic`` and decide
    into ``out``."""
    run = uuid.uuid4().hex[:6]
    config = {
        "app_id": f"tput-{run}",
        "datadir": str(work / f"worker-{run}"),
        "topics": {
            "features": topic,
            "decisions": out,
            **{
                k: f"tput-{run}.{k}" for k in ("label_requests", "labels", "models", "dead_letters")
            },
        },
        "partitions": {"features": PARTITIONS, "decisions": PARTITIONS, "labels": 1},
        "models": {"default": MODEL},
        "log_level": "warning",
        **({} if COMPRESSION is None else {"compression": COMPRESSION}),
        **WORKER,
    }
    path = work / f"tput-{run}.json"
    path.write_text(json.dumps(config))
    ports = find_free_ports(count)
    return [worker_argv(path, broker, port) for port in ports]


async def learner_run(broker: str, X: np.ndarray, n: int, work: Path) -> Run:
    """``n`` label requests stored by a worker that has nothing else to do."""
    from service.records import LabelRequest, request_id

    features_topic = f"learn-{uuid.uuid4().hex[:6]}"
    await create_topics(broker, [features_topic], log_append=False)
    cmd = worker_cmd(broker, features_topic, f"{features_topic}-out", work)[0]
    config = json.loads(Path(cmd[cmd.index("--config") + 1]).read_text())
    requests, app_id = config["topics"]["label_requests"], config["app_id"]
    changelog = f"{app_id}-pending-changelog"
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(requests, 1, 1),
                NewTopic(
                    changelog,
                    1,
                    1,
                    topic_configs={
                        "message.timestamp.type": "LogAppendTime",
                        "cleanup.policy": "compact",
                    },
                ),
            ]
        )
    finally:
        await admin.close()
    await asyncio.sleep(0.5)
    now = time.time()

    def request(i: int) -> bytes:
        event_id = f"r-{i}"
        return LabelRequest(
            request_id=request_id("default", event_id),
            event_id=event_id,
            model="default",
            features=X[i % len(X)].tolist(),
            score=0.0,
            rho=0.5,
            decided_label=0,
            query_probability=0.9,
            model_version=0,
            requested_at=now,
            expires_at=now + 3600,
            priority=0.5,
        ).to_json()

    await write(broker, requests, ((b"default", request(i)) for i in range(n)))
    proc = _start(cmd, work / f"learner-{uuid.uuid4().hex[:6]}.log")
    spy = None
    result = Run(kind="learner alone", events=n)
    try:
        stamps: list[int] = []
        first_cpu = None
        consumer = AIOKafkaConsumer(
            changelog,
            bootstrap_servers=broker,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=10,
        )
        await consumer.start()
        try:
            deadline = time.monotonic() + RUN_TIMEOUT
            while len(stamps) < n and time.monotonic() < deadline:
                fetched = await consumer.getmany(timeout_ms=50, max_records=20000)
                for records in fetched.values():
                    stamps += [r.timestamp for r in records]
                if first_cpu is None and stamps:
                    first_cpu, first_count = cpu_seconds(proc.pid), len(stamps)
                    spy = _spy(proc.pid, "learner alone")
                if proc.poll() is not None:
                    raise SystemExit(f"worker exited; logs in {work}")
        finally:
            await consumer.stop()
        if len(stamps) < n or first_cpu is None:
            raise SystemExit(f"learner stored {len(stamps)} of {n} in {RUN_TIMEOUT} s")
        result.cpu_us = [(cpu_seconds(proc.pid) - first_cpu) / max(1, n - first_count) * 1e6]
        result.seconds = (max(stamps) - min(stamps)) / 1000.0
        _spied(spy, result.cpu_us[0], result.rate)
    finally:
        stop(proc)
        _spied(spy)
    return result


def _app_id(cmd: list[str]) -> str | None:
    if "--config" not in cmd:
        return None
    return str(json.loads(Path(cmd[cmd.index("--config") + 1]).read_text())["app_id"])


async def throughput_run(
    kind: str,
    broker: str,
    topic: str,
    n: int,
    work: Path,
    count: int = 1,
    X: Any = None,
    ask: float | None = None,
) -> Run:
    """One run on ``topic``. With ``count`` > 1 (workers), ``topic`` is fresh: the workers
    start first, and once each is assigned its share of partitions the ``n`` events are
    written (a late joiner would find nothing left to do on a pre-loaded topic).

    ``ask`` (--same-output): kind ``floor+requests`` writes label requests for that fraction
    of the events; a worker run counts the label requests it wrote (``Run.asked``)."""
    out = f"out-{kind.replace('+', '-')}-{uuid.uuid4().hex[:6]}"
    await create_topics(broker, [out], log_append=True)
    requests = None
    if kind == "passthrough":
        cmds = passthrough_cmd(broker, topic, out, work)
    elif kind == "floor+requests":
        requests = f"{out}.label_requests"
        await create_topics(broker, [requests], log_append=False, partitions=1)
        cmds = passthrough_cmd(broker, topic, out, work)
        cmds[0] += ["--requests-topic", requests, "--ask", repr(ask)]
    else:
        cmds = worker_cmd(broker, topic, out, work, count)
    app_id = _app_id(cmds[0])
    extra = (
        []
        if app_id is None
        else [f"tput-{app_id[5:]}.label_requests", f"{app_id}-pending-changelog"]
    )
    procs = [_start(c, work / f"{kind}-{uuid.uuid4().hex[:6]}.log") for c in cmds]
    spies: list[Spy] = []
    result = Run(kind=kind if count == 1 else f"{kind} x{count}", events=n)
    try:
        if count > 1:
            await _balanced([int(c[c.index("--web-port") + 1]) for c in cmds], topic, procs)
            feeding = asyncio.create_task(preload(broker, topic, X, n, "e-"))
        async with Tail(broker, [out]) as tail:
            first: list[float] | None = None  # cpu per process at the first output
            first_count = 0
            deadline = time.monotonic() + RUN_TIMEOUT
            while len(tail.seen) < n and time.monotonic() < deadline:
                await tail.poll()
                if first is None and tail.seen:
                    first, first_count = [cpu_seconds(p.pid) for p in procs], len(tail.seen)
                    spies = [s for s in (_spy(p.pid, kind) for p in procs) if s is not None]
                if any(p.poll() is not None for p in procs):
                    raise SystemExit(f"{kind} exited early; logs in {work}")
            if len(tail.seen) < n:
                raise SystemExit(f"{kind}: {len(tail.seen)} of {n} ids after {RUN_TIMEOUT} s")
            last_cpu = [cpu_seconds(p.pid) for p in procs]
            stamps = list(tail.seen.values())
            result.seconds = (max(stamps) - min(stamps)) / 1000.0
            done = n - first_count
            assert first is not None  # noqa: S101 - set when the first id arrived
            result.cpu_us = [
                (b - a) / max(1, done) * 1e6 for a, b in zip(first, last_cpu, strict=True)
            ]
            last_decision = max(stamps) / 1000.0
        if count > 1:
            await feeding
        if extra:
            result.learner_behind = await learner_behind(broker, extra, last_decision)
        # the profile runs on until every label request is stored: CPU per event up to then
        for spy, p, before in zip(spies, procs, first, strict=False):  # none: not profiled
            _spied(spy, (cpu_seconds(p.pid) - before) / max(1, done) * 1e6, result.rate)
    finally:
        for p in procs:
            stop(p)
        for spy in spies:
            _spied(spy)
    if requests is None and extra and ask is not None:
        requests = extra[0]  # the worker's, complete: it has stopped (outputs flushed)
    if requests is not None:
        result.asked = await records_on(broker, requests) / n
    return result


async def _balanced(ports: list[int], topic: str, procs: list[Any]) -> None:
    """Wait until every worker scores some partitions of ``topic`` and together all of
    them (the lag gauge has a series per partition a worker is assigned)."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        mine = [_assigned(port, topic) for port in ports]
        if all(mine) and len(set().union(*mine)) == PARTITIONS:
            return
        if any(p.poll() is not None for p in procs):
            raise SystemExit("a worker exited while the group formed")
        await asyncio.sleep(0.5)
    raise SystemExit(f"the workers never shared {topic}'s partitions")


def _assigned(port: int, topic: str) -> set[str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            lines = r.read().decode().splitlines()
    except OSError:
        return set()
    return {
        line.split('partition="', 1)[1].split('"', 1)[0]
        for line in lines
        if line.startswith("abstain_consumer_lag{") and f'topic="{topic}"' in line
    }


@dataclass
class Spy:
    """py-spy sampling one process of a run (``--profile``)."""

    proc: subprocess.Popen[bytes]
    out: Path
    kind: str


def _spy(pid: int, kind: str) -> Spy | None:
    """With ``--profile``, py-spy (not a dependency: ``pip install py-spy``) sampling ``pid``
    from now on (only while it runs Python code: a wait for the broker is not sampled) into
    a collapsed-stacks file of the profile directory."""
    if PROFILE is None:
        return None
    out = PROFILE / f"{kind.replace(' ', '-').replace('+', '-')}-{pid}.txt"
    cmd = [
        str(Path(sys.executable).with_name("py-spy")),
        "record",
        "--pid",
        str(pid),
        "--rate",
        "250",
        "--format",
        "raw",
        "--output",
        str(out),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return Spy(proc, out, kind)


def _spied(spy: Spy | None, cpu_us: float | None = None, rate: float | None = None) -> None:
    """Stop ``spy`` (it writes its file on SIGINT) and, given the run's CPU per event over
    the sampled interval, note the run in ``runs.jsonl`` beside the samples."""
    if spy is None or spy.proc.poll() is not None:
        return
    spy.proc.send_signal(signal.SIGINT)
    try:
        spy.proc.wait(60)
    except subprocess.TimeoutExpired:
        spy.proc.kill()
        spy.proc.wait(10)
    if cpu_us is not None and PROFILE is not None:
        line = {"kind": spy.kind, "samples": spy.out.name, "cpu_us": cpu_us, "rate": rate}
        with (PROFILE / "runs.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")


async def learner_behind(broker: str, topics: list[str], last_decision: float) -> float:
    """Seconds from the last decision until the pending table's changelog holds as many
    records as the label-requests topic (every request stored), by broker timestamps."""
    requests, changelog = topics
    deadline = time.monotonic() + RUN_TIMEOUT
    await asyncio.sleep(1.0)  # the last batch's requests are written with its decisions
    tps = await topic_partitions([broker], requests, client_kwargs={}, attempts=10)
    probe = AIOKafkaConsumer(bootstrap_servers=broker, group_id=None)
    await probe.start()
    try:
        want = sum((await probe.end_offsets(tps)).values())
    finally:
        await probe.stop()
    stamps: list[int] = []
    consumer = AIOKafkaConsumer(
        changelog,
        bootstrap_servers=broker,
        group_id=None,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=10,
    )
    await consumer.start()
    try:
        while len(stamps) < want and time.monotonic() < deadline:
            fetched = await consumer.getmany(timeout_ms=200, max_records=20000)
            for records in fetched.values():
                stamps += [r.timestamp for r in records]
    finally:
        await consumer.stop()
    if len(stamps) < want:
        return float("nan")
    if not stamps:
        return 0.0
    return max(0.0, sorted(stamps)[want - 1] / 1000.0 - last_decision)


async def latency_run(
    kind: str, broker: str, X: Payloads, rate: float, seconds: float, work: Path
) -> Run:
    topic = f"lat-{kind}-{uuid.uuid4().hex[:6]}"
    out = f"{topic}-out"
    await create_topics(broker, [topic], log_append=False)
    await create_topics(broker, [out], log_append=True)
    cmd = (passthrough_cmd if kind == "passthrough" else worker_cmd)(broker, topic, out, work)[0]
    proc = _start(cmd, work / f"lat-{kind}-{uuid.uuid4().hex[:6]}.log")
    result = Run(kind=kind)
    producer = AIOKafkaProducer(bootstrap_servers=broker, acks="all", linger_ms=0)
    await producer.start()
    spy: Spy | None = None
    try:
        async with Tail(broker, [out]) as tail:
            deadline = time.monotonic() + 180
            i = 0
            while not tail.seen and time.monotonic() < deadline:  # warm up: until it answers
                await producer.send_and_wait(
                    topic, orjson.dumps({"id": f"warm-{i}", "features": X[i % len(X)]})
                )
                i += 1
                for _ in range(10):
                    await tail.poll()
                if proc.poll() is not None:
                    raise SystemExit(f"{kind} exited; logs in {work}")
            await asyncio.sleep(2.0)
            for _ in range(40):
                await tail.poll()
            sent: dict[str, float] = {}
            total = int(rate * seconds)
            interval, next_at = 1.0 / rate, time.monotonic()
            poller = asyncio.create_task(_poll_forever(tail))
            spy, cpu = _spy(proc.pid, f"latency {kind}"), cpu_seconds(proc.pid)
            for j in range(total):
                event_id = f"lat-{j}"
                sent[event_id] = time.time()
                await producer.send(
                    topic,
                    orjson.dumps({"id": event_id, "features": X[j % len(X)]}),
                    key=event_id.encode(),
                )
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            end = time.monotonic() + 60
            while not all(k in tail.arrived for k in sent) and time.monotonic() < end:
                await asyncio.sleep(0.1)
            poller.cancel()
            result.cpu_us = [(cpu_seconds(proc.pid) - cpu) / total * 1e6]
            _spied(spy, result.cpu_us[0], rate)
            lat = np.array([tail.arrived[k] - sent[k] for k in sent if k in tail.arrived]) * 1e3
            if len(lat) < total:
                raise SystemExit(f"{kind}: {len(lat)} of {total} latency events answered")
            result.events = total
            result.p50_ms = float(np.percentile(lat, 50))
            result.p99_ms = float(np.percentile(lat, 99))
    finally:
        await producer.stop()
        stop(proc)
        _spied(spy)
    return result


async def _poll_forever(tail: Tail) -> None:
    while True:
        await tail.poll()


def _median(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def report(runs: list[Run], latency: list[Run], scale: Run | None) -> None:
    print(
        f"\n{'run':<16}{'events':>8}{'seconds':>9}{'events/s':>10}{'CPU us/event':>14}"
        f"{'learner behind s':>18}"
    )
    print("-" * 75)
    for r in runs + ([scale] if scale else []):
        cpu = " + ".join(f"{c:.0f}" for c in r.cpu_us)
        print(
            f"{r.kind:<16}{r.events:>8}{r.seconds:>9.2f}{r.rate:>10,.0f}{cpu:>14}"
            f"{r.learner_behind:>18.1f}"
        )
    if latency:
        print(f"\n{'latency run':<16}{'events':>8}{'p50 ms':>9}{'p99 ms':>10}{'CPU us/event':>14}")
        print("-" * 57)
        for r in latency:
            cpu = r.cpu_us[0] if r.cpu_us else float("nan")
            print(f"{r.kind:<16}{r.events:>8}{r.p50_ms:>9.1f}{r.p99_ms:>10.1f}{cpu:>14.0f}")
    by = {k: [r for r in runs if r.kind == k] for k in ("passthrough", "worker")}
    pt_rate = _median([r.rate for r in by["passthrough"]])
    wk_rate = _median([r.rate for r in by["worker"]])
    pt_cpu = _median([r.cpu_us[0] for r in by["passthrough"]])
    wk_cpu = _median([r.cpu_us[0] for r in by["worker"]])
    print(
        "\nmedians: passthrough {:,.0f} events/s, {:.0f} us CPU/event; worker {:,.0f} events/s,"
        " {:.0f} us CPU/event; learner behind {:.1f} s".format(
            pt_rate, pt_cpu, wk_rate, wk_cpu, _median([r.learner_behind for r in by["worker"]])
        )
    )
    floor = [r for r in runs if r.kind == "floor+requests"]
    fr_rate = _median([r.rate for r in floor])
    if floor:
        print(
            "medians: floor+requests {:,.0f} events/s, {:.0f} us CPU/event; label requests"
            " per event: floor+requests {}, worker {}".format(
                fr_rate,
                _median([r.cpu_us[0] for r in floor]),
                " ".join(f"{r.asked:.3f}" for r in floor),
                " ".join(f"{r.asked:.3f}" for r in by["worker"]),
            )
        )
    if latency:
        lat = {k: [r for r in latency if r.kind == k] for k in ("passthrough", "worker")}
        pt99 = _median([r.p99_ms for r in lat["passthrough"]])
        wk99 = _median([r.p99_ms for r in lat["worker"]])
        print(
            f"latency at the moderate rate: p99 worker {wk99:.1f} ms / passthrough "
            f"{pt99:.1f} ms = {wk99 / pt99:.2f}x; p50 worker "
            f"{_median([r.p50_ms for r in lat['worker']]):.1f} ms / passthrough "
            f"{_median([r.p50_ms for r in lat['passthrough']]):.1f} ms"
        )
    if scale is not None:
        print(
            f"two workers: {scale.rate:,.0f} events/s together "
            f"({scale.rate / wk_rate:.2f}x one worker), CPU us/event "
            + " + ".join(f"{c:.0f}" for c in scale.cpu_us)
        )
    if floor:
        print(f"worker/floor+requests = {wk_rate / fr_rate:.2f}")
    print(f"worker/passthrough = {wk_rate / pt_rate:.2f}")


def payloads(shape: str) -> tuple[Payloads, dict[str, Any]]:
    """The events of ``shape`` (as a producer writes their features) and the worker's model
    of them: ``dense68`` the Phishing rows and a DSAL of 68 features; a shape of
    ``loadtest/wide.py`` its events and its model (a ``fields`` declaration)."""
    if shape == "dense68":
        return features(68).tolist(), {"algorithm": "dsal", "cost": 0.25, "n_features": 68}
    model = config_of(shape).model_dump(mode="json", exclude_defaults=True)
    return [f for f, _ in events(shape, 5000, np.random.default_rng(3))], model


async def main_async(args: argparse.Namespace, broker: str, work: Path) -> None:
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    summary: list[tuple[str, float, float, float, float]] = []
    for shape in shapes:
        P, model = payloads(shape)
        MODEL.clear()
        MODEL.update(model, **({} if BUDGET is None else {"label_budget": {"fraction": BUDGET}}))
        if len(shapes) > 1:
            print(f"\n== {shape}", flush=True)
        runs, latency, scale = await _shape_runs(args, broker, work, P)
        report(runs, latency, scale)
        by = {k: [r for r in runs if r.kind == k] for k in ("passthrough", "worker")}
        summary.append(
            (
                shape,
                _median([r.rate for r in by["worker"]]),
                _median([r.cpu_us[0] for r in by["worker"]]),
                _median([r.rate for r in by["passthrough"]]),
                _median([r.cpu_us[0] for r in by["passthrough"]]),
            )
        )
    if len(summary) > 1:
        base = summary[0]
        # a worker on small events may not fill a core (its rate follows the broker), so
        # the CPU an event is given against the first shape's too: the steadier of the two
        print(
            f"\nshapes (medians; x = / {base[0]}'s worker events/s; "
            f"cpu x = its worker's CPU/event / {base[0]}'s):"
        )
        for shape, wk, wk_cpu, pt, pt_cpu in summary:
            print(
                f"  {shape:>13}: worker {wk:>8,.0f} events/s ({wk / base[1]:.2f} x) at "
                f"{wk_cpu:.0f} us CPU/event (cpu {wk_cpu / base[2]:.2f} x); "
                f"passthrough {pt:>8,.0f} at {pt_cpu:.0f} us; worker/passthrough {wk / pt:.2f}"
            )


async def _shape_runs(
    args: argparse.Namespace, broker: str, work: Path, P: Payloads
) -> tuple[list[Run], list[Run], Run | None]:
    topic = f"tput-{uuid.uuid4().hex[:6]}"
    await create_topics(broker, [topic], log_append=False)
    await preload(broker, topic, P, args.events, "e-")
    runs: list[Run] = []
    kinds = (
        ("passthrough", "worker", "floor+requests")
        if args.same_output
        else ("passthrough", "worker")
    )
    ask = 0.8 if args.same_output else None  # the latest worker run's fraction (--same-output)
    for i in range(args.pairs):
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            run = await throughput_run(kind, broker, topic, args.events, work, ask=ask)
            note = (
                "" if kind == "passthrough" or ask is None else f"  requests/event {run.asked:.3f}"
            )
            if kind == "floor+requests":
                note += f" (--ask {ask:.3f})"
            print(
                f"  {kind:<12} {run.rate:>8,.0f} events/s  {run.cpu_us[0]:.0f} us CPU/event{note}",
                flush=True,
            )
            if kind == "worker" and ask is not None and run.asked == run.asked:  # not nan
                ask = run.asked
            runs.append(run)
    latency: list[Run] = []
    for i in range(args.latency_pairs):
        for kind in ("passthrough", "worker") if i % 2 == 0 else ("worker", "passthrough"):
            run = await latency_run(kind, broker, P, args.rate, args.latency_seconds, work)
            print(f"  {kind:<12} p50 {run.p50_ms:.1f} ms  p99 {run.p99_ms:.1f} ms", flush=True)
            latency.append(run)
    if args.learner:
        if "n_features" not in MODEL:
            raise SystemExit("--learner takes the dense68 shape alone")
        X = np.asarray(P, dtype=np.float64)
        for _ in range(max(1, args.pairs)):
            run = await learner_run(broker, X, args.learner, work)
            cpu = run.cpu_us[0]
            print(
                f"  learner alone {run.rate:>8,.0f} requests/s  {cpu:.0f} us CPU/request",
                flush=True,
            )
            runs.append(run)
    scale = None
    if args.workers > 1:
        fresh = f"tput-{uuid.uuid4().hex[:6]}"
        await create_topics(broker, [fresh], log_append=False)
        scale = await throughput_run("worker", broker, fresh, args.events, work, args.workers, P)
    return runs, latency, scale


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker")
    p.add_argument("--events", type=int, default=40000)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--latency-pairs", type=int, default=3)
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--latency-seconds", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=1, help="2: also a two-worker run")
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="the model's label budget, a fraction of events (default: none)",
    )
    p.add_argument("--learner", type=int, default=0, help="N: the learner alone on N requests")
    p.add_argument(
        "--same-output",
        action="store_true",
        help="also a floor that writes the label requests the worker wrote (floor+requests)",
    )
    p.add_argument(
        "--shapes",
        default="dense68",
        help=f"events and model, one run after another: dense68 or any of {', '.join(SHAPES[2:])}"
        " (loadtest/wide.py's: events as producers write them, a fields declaration); the"
        " first is the base of the summary",
    )
    p.add_argument("--profile", type=Path, help="DIR: py-spy samples of every run (flame.py)")
    p.add_argument(
        "--compression",
        choices=("none", "gzip", "snappy", "lz4", "zstd"),
        help="the codec worker and passthrough write with (default: the setting's)",
    )
    p.add_argument(
        "--worker-setting",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="a setting of the worker's configuration (e.g. batch_size=1000)",
    )
    args = p.parse_args()
    global COMPRESSION
    COMPRESSION = args.compression
    for setting in args.worker_setting:
        name, _, value = setting.partition("=")
        WORKER[name] = json.loads(value)
    if args.profile is not None:
        global PROFILE
        args.profile.mkdir(parents=True, exist_ok=True)
        PROFILE = args.profile.resolve()
    global BUDGET
    BUDGET = args.budget
    work = Path(tempfile.mkdtemp(prefix="abstain-tput-"))
    kafka: LocalKafka | None = None
    try:
        broker = args.broker
        if broker is None:
            port, ctl = find_free_ports(2)
            kafka = LocalKafka(
                port=port,
                controller_port=ctl,
                data_dir=work / "kafka",
                die_with_parent=True,
                heap="1g",
            )
            kafka.start()
            broker = kafka.bootstrap
        asyncio.run(main_async(args, broker, work))
    finally:
        if kafka is not None:
            kafka.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
