"""A storm of corrections while events stream, and what scoring saw meanwhile.

:class:`Storm` runs in a thread with one producer of its own: events at a steady rate
(each with its send time as its record timestamp), and, once :meth:`Storm.rage` is called,
signed reviewer corrections of labels about ``back`` labels before the newest, each one
flipping the label in force of its request, and answers to a few new requests. A second
thread times ``GET /healthz``. Afterwards, :func:`latencies` reads each event's decision
back: event -> decision latency from the two records' timestamps.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from service.records import SIGNATURE_HEADER, Signer

from . import HarnessError
from .corrections import Learned, concept
from .kafkaio import partitions_of
from .workers import http

__all__ = ["HealthProbe", "Storm", "cpu_seconds", "latencies", "percentile"]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` (nearest rank, as a strict bound)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, int(np.ceil(q / 100.0 * len(ordered))) - 1))
    return ordered[rank]


@dataclass
class Phase:
    """Events sent in one phase: id -> send time (ms)."""

    name: str
    sent: dict[str, int] = field(default_factory=dict)


class Storm(threading.Thread):
    """Events at ``rate`` per second into ``run``'s worker; corrections while raging."""

    def __init__(
        self,
        run: Learned,
        *,
        rate: float = 10.0,
        corrections: int = 300,
        seconds: float = 60.0,
        back: int = 150,
        labels_per_second: float = 1.0,
        n_features: int = 3,
    ) -> None:
        super().__init__(name="storm", daemon=True)
        self.run_ = run
        self.rate, self.corrections, self.seconds = rate, corrections, seconds
        self.back, self.labels_per_second, self.n_features = back, labels_per_second, n_features
        self.phases: list[Phase] = [Phase("quiet")]
        self.written: list[dict[str, Any]] = []  # corrections written, in order
        self.answered: list[str] = []  # request ids answered during the storm
        self.raging = threading.Event()
        self.calm = threading.Event()  # every correction written
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self._rng = np.random.default_rng(11)
        self._fresh: list[dict[str, Any]] = []  # requests read since the storm began
        self._signer = None if run.key is None else Signer(run.key.encode())

    def rage(self) -> None:
        """Start the corrections (a new phase of events)."""
        self.phases.append(Phase("storm"))
        self.raging.set()

    def stop(self, timeout: float = 30.0) -> None:
        self.stopping.set()
        self.join(timeout)
        if self.error is not None:
            raise HarnessError(f"the storm failed: {self.error!r}") from self.error

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - handed to the test by stop()
            self.error = exc

    async def _main(self) -> None:
        bootstrap = self.run_.service.bootstrap
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
        # the requests made from now on, followed (not read again from the start: the test's
        # own CPU is not to weigh on the worker's latency during the storm only)
        follower = AIOKafkaConsumer(
            bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
        )
        await producer.start()
        await follower.start()
        try:
            tps = await partitions_of(bootstrap, self.run_.topics["label_requests"])
            follower.assign(tps)
            await follower.seek_to_end(*tps)
            await asyncio.gather(
                self._events(producer), self._corrections(producer), self._follow(follower)
            )
        finally:
            await follower.stop()
            await producer.stop()

    async def _follow(self, follower: AIOKafkaConsumer) -> None:
        while not self.stopping.is_set():
            batch = await follower.getmany(timeout_ms=200)
            for records in batch.values():
                self._fresh += [orjson.loads(r.value) for r in records if r.value]

    async def _events(self, producer: AIOKafkaProducer) -> None:
        topic = self.run_.topics["features"]
        n = 0
        start = time.monotonic()
        while not self.stopping.is_set():
            n += 1
            phase = self.phases[-1]
            eid = f"{phase.name}-{n}"
            x = self._rng.normal(size=self.n_features).round(4).tolist()
            now = int(time.time() * 1000)
            value = orjson.dumps({"id": eid, "model": "m", "features": x})
            await producer.send(topic, value, key=eid.encode(), timestamp_ms=now)
            phase.sent[eid] = now
            await asyncio.sleep(max(0.0, start + n / self.rate - time.monotonic()))

    def _sign(self, value: bytes) -> list[tuple[str, bytes]]:
        return [] if self._signer is None else [(SIGNATURE_HEADER, self._signer.sign(b"m", value))]

    async def _corrections(self, producer: AIOKafkaProducer) -> None:
        while not self.raging.is_set():
            if self.stopping.is_set():
                return
            await asyncio.sleep(0.05)
        run, labels = self.run_, self.run_.topics["labels"]
        every = self.seconds / self.corrections
        start = time.monotonic()
        answered = 0
        for i in range(self.corrections):
            if self.stopping.is_set():
                return
            while answered < (time.monotonic() - start) * self.labels_per_second:
                await self._answer(producer)
                answered += 1
            order = [q["request_id"] for q in run.requests]
            rid = order[len(order) - self.back + (i % 9) - 4]
            label = -run.answers[rid]
            value = orjson.dumps(
                {
                    "kind": "correction",
                    "id": uuid.uuid4().hex,
                    "request_id": rid,
                    "model": "m",
                    "label": label,
                    "labelled_by": f"reviewer-{i % 3}",
                    "role": "reviewer",
                    "ts": time.time(),
                }
            )
            await (await producer.send(labels, value, key=b"m", headers=self._sign(value)))
            run.answers[rid] = label
            self.written.append(orjson.loads(value))
            await asyncio.sleep(max(0.0, start + (i + 1) * every - time.monotonic()))
        self.calm.set()

    async def _answer(self, producer: AIOKafkaProducer) -> None:
        """Answer one request made during the storm (if one is there yet)."""
        run = self.run_
        fresh = [q for q in self._fresh if q["request_id"] not in run.answers]
        if not fresh:
            return
        q = fresh[0]
        y = concept(q["features"])
        value = orjson.dumps(
            {"request_id": q["request_id"], "model": "m", "label": y, "labelled_by": "alice"}
        )
        await (await producer.send(run.topics["labels"], value, key=b"m"))
        run.requests.append(q)
        run.answers[q["request_id"]] = y
        self.answered.append(q["request_id"])


class HealthProbe(threading.Thread):
    """``GET /healthz`` of ``url()`` every ``every`` s: its round trips, in seconds."""

    def __init__(self, url: Callable[[], str], every: float = 0.1) -> None:
        super().__init__(name="healthz", daemon=True)
        self.url, self.every = url, every
        self.times: list[float] = []
        self.failed = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                status, _ = http(self.url() + "/healthz", timeout=5.0)
                if status == 200:
                    self.times.append(time.monotonic() - began)
                else:
                    self.failed += 1
            except OSError:
                self.failed += 1
            time.sleep(max(0.0, self.every - (time.monotonic() - began)))

    def stop(self) -> list[float]:
        self.stopping.set()
        self.join(10)
        return self.times


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) process ``pid`` and its children have used so far: its
    own, and its live children's (the worker's derivation process)."""

    def used(p: int) -> float:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return used(pid), sum(used(c) for c in children)


def latencies(run: Learned, phase: Phase) -> list[float]:
    """Event -> decision latency (ms) of each event of ``phase`` decided (its decision
    record's timestamp minus the event's send time)."""
    out = []
    for rec in run.kio.read(run.topics["decisions"]):
        eid = (rec.key or b"").decode()
        sent = phase.sent.get(eid)
        if sent is not None:
            out.append(float(rec.timestamp - sent))
    return out
