"""A transaction left open on one features partition, on a real broker, with a real
Prometheus running the shipped alert rules.

A transactional producer sends to partition 0 of the features topic and then neither commits
nor aborts. Under ``read_committed`` (the worker's default) the partition's last stable
offset stays at the transaction's first record, so every record written after it, by any
producer, waits; the consumer's end offsets are that last stable offset, so its lag reads 0.
While other producers keep writing to both partitions for ``OPEN`` seconds:

- ``/healthz`` names partition 0 under ``pinned`` within ``pinned_transaction_seconds``, with
  both offsets and Kafka's commands that end the transaction; the worker stays live and ready;
- ``abstain_pinned_transaction_seconds{partition="0"}`` passes the setting and
  ``abstain_records_past_stable_offset`` counts what waits; partition 1 reads 0 for both;
- the alert ``AbstainTransactionPinned`` fires for that topic and partition;
- partition 1's events are decided throughout; partition 0's written after the transaction
  opened are not.

Once the test commits the transaction every event is decided exactly once, the partition is
no longer named and the alert resolves. A producer killed (SIGKILL) with its transaction open
holds the partition the same way until the broker aborts the transaction at its timeout;
then every other event is decided exactly once and none of the transaction's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from faults.data import EventSource
from faults.kafkaio import Out, produce_records
from faults.oracle import Observer
from faults.prom import AlertLog, fast_rules
from faults.report import Summary, emit
from faults.scenario import deployment
from faults.workers import Deployment, WorkerProcess, wait_until

from service.localprom import LocalPrometheus

pytestmark = pytest.mark.integration

PINNED = 5.0  # s, pinned_transaction_seconds
OPEN = 60.0  # s, how long the transaction stays open
SCRAPE = 1.0  # s, scrape and evaluation interval
HOLD = 2.0  # s, every `for:` of the fast rules
FAST = {"AbstainTransactionPinned": {"> 30": f"> {PINNED:g}"}}  # the setting's default
BEHIND = 10.0  # s, longest an event of partition 1 may wait for its decision
ALERT = "AbstainTransactionPinned"
KILLED_TIMEOUT = 30.0  # s, transaction.timeout.ms of the producer that is killed
# a producer that opens a transaction, writes to one partition, says so, and waits to be killed
HOLDER = """
import asyncio, json, sys
from aiokafka import AIOKafkaProducer

async def main():
    bootstrap, topic, partition, timeout_ms = sys.argv[1:5]
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id="killed-" + topic,
        transaction_timeout_ms=int(timeout_ms),
    )
    await producer.start()
    await producer.begin_transaction()
    for i in range(5):
        event = {"id": f"killed-{i}", "model": "m", "features": [0.5, -0.5, 1.0]}
        await producer.send_and_wait(
            topic, json.dumps(event).encode(), key=event["id"].encode(), partition=int(partition)
        )
    print("open", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


class OpenTransaction:
    """A transactional producer with one transaction open on one partition, on an event
    loop of its own that runs only while the test asks something of it (the broker keeps
    the transaction open meanwhile: a producer sends nothing to keep it)."""

    def __init__(self, bootstrap: str, topic: str, partition: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.bootstrap, self.topic, self.partition = bootstrap, topic, partition
        self.producer: AIOKafkaProducer | None = None

    def open(self, records: list[tuple[bytes, bytes]]) -> None:
        """Begin the transaction and write ``records`` in it (acknowledged)."""

        async def run() -> None:
            self.producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                transactional_id=f"pinned-{uuid.uuid4().hex[:8]}",
                transaction_timeout_ms=int(4 * OPEN * 1000),  # the broker must not end it first
            )
            await self.producer.start()
            await self.producer.begin_transaction()
            for key, value in records:
                await self.producer.send_and_wait(
                    self.topic, value, key=key, partition=self.partition
                )

        self.loop.run_until_complete(run())

    def commit(self) -> None:
        assert self.producer is not None
        self.loop.run_until_complete(self.producer.commit_transaction())

    def close(self) -> None:
        if self.producer is not None:
            self.loop.run_until_complete(self.producer.stop())
        self.loop.close()


def _send(bootstrap: str, topic: str, partition: int, records: list[tuple[bytes, bytes]]) -> None:
    produce_records(bootstrap, topic, [Out(k, v, partition=partition) for k, v in records])


def _pinned(worker: WorkerProcess) -> list[str]:
    status, body = worker.get("/healthz")
    assert status == 200, body  # a pinned partition does not make the worker not live
    return list(json.loads(body)["pinned"])


@dataclass
class Rig:
    """A worker on a features topic of two partitions, an observer of its decisions, and a
    Prometheus running the fast rules; ``p0`` and ``p1`` write to partitions 0 and 1."""

    dep: Deployment
    worker: WorkerProcess
    observer: Observer
    alerts: AlertLog
    truth: dict[str, int]
    p0: EventSource
    p1: EventSource

    @property
    def features(self) -> str:
        return self.dep.topics["features"]

    def send(self, source: EventSource, partition: int, n: int) -> list[str]:
        records = source.make(n)
        _send(self.dep.bootstrap, self.features, partition, records)
        return [k.decode() for k, _ in records]

    def twice(self) -> dict[str, int]:
        """Events decided more than once."""
        with self.observer.lock:
            return {i: len(d) for i, d in self.observer.decisions.items() if len(d) != 1}


@contextlib.contextmanager
def rig(bootstrap: str, tmp: Path) -> Iterator[Rig]:
    with contextlib.ExitStack() as stack:
        dep = stack.enter_context(
            deployment(
                bootstrap,
                tmp / "svc",
                pinned_transaction_seconds=PINNED,
                partitions={"features": 2, "decisions": 1, "labels": 1, "models": 1},
            )
        )
        truth: dict[str, int] = {}
        observer = Observer(bootstrap, dep.topics, truth)
        stack.callback(lambda: observer.halt() if observer.is_alive() else None)
        observer.begin()
        worker = dep.start()
        worker.wait_ready()
        rules = fast_rules(tmp / "alerts-fast.yml", hold=HOLD, replace=FAST)
        prom = LocalPrometheus(
            tmp / "prom", scrape_interval=SCRAPE, rule_files=[rules], die_with_parent=True
        )
        prom.set_targets("abstain", {"worker-0": f"127.0.0.1:{worker.port}"})
        stack.callback(prom.stop)
        prom.start()
        r = Rig(
            dep,
            worker,
            observer,
            AlertLog(prom),
            truth,
            EventSource("p0", truth=truth, seed=1),
            EventSource("p1", truth=truth, seed=2),
        )
        r.send(r.p0, 0, 10)
        r.send(r.p1, 1, 10)
        observer.wait(lambda o: o.decided(truth) == 20, 60, "the first 20 decisions")
        wait_until(lambda: bool(prom.query('up{job="abstain"} == 1')), 60, "the first scrape")
        yield r


@dataclass
class Held:
    """Rounds of traffic while partition 0 is held from offset ``start``: when (seconds
    from ``opened``) /healthz first named it, its gauge passed the setting and the alert
    fired; partition 0's events written meanwhile (``waiting``), partition 1's with when."""

    rig: Rig
    start: int
    opened: float = field(default_factory=time.monotonic)
    named: float | None = None
    metric: float | None = None
    fired: float | None = None
    waiting: list[str] = field(default_factory=list)
    sent_p1: list[tuple[float, list[str]]] = field(default_factory=list)
    rounds: int = 0
    longest: float = 0.0

    def round(self, *, held: bool = True) -> list[str]:
        """Write to both partitions and check the worker; the partitions /healthz names.
        ``held``: partition 0 is known to be held still (its new events must wait)."""
        r, began = self.rig, time.monotonic()
        self.waiting += r.send(r.p0, 0, 2)
        self.sent_p1.append((time.monotonic(), r.send(r.p1, 1, 2)))
        now = time.monotonic() - self.opened
        first = {"topic": r.features, "partition": "0"}
        lines = _pinned(r.worker)
        if self.named is None and lines:
            self.named = now
            (line,) = lines
            assert line.startswith(f"{r.features}[0] last stable offset {self.start} ")
            assert f"--partition 0 --start-offset {self.start}`" in line
        seconds = r.worker.metric("abstain_pinned_transaction_seconds", first)
        if self.metric is None and seconds > PINNED:
            self.metric = now
        active = r.alerts.active(ALERT, first)
        if self.fired is None and any(a["state"] == "firing" for a in active):
            self.fired = now
        assert not r.alerts.active(ALERT, {"partition": "1"})
        assert r.worker.metric("abstain_pinned_transaction_seconds", {"partition": "1"}) == 0
        assert r.worker.status("/readyz") == 200
        # partition 1 goes on: everything sent to it BEHIND seconds ago is decided
        with r.observer.lock:
            late = [i for at, ids in self.sent_p1 if at < time.monotonic() - BEHIND for i in ids]
            assert all(i in r.observer.decisions for i in late), "partition 1 stopped"
            if held:
                assert not [i for i in self.waiting if i in r.observer.decisions]
        self.rounds += 1
        time.sleep(1.0)
        self.longest = max(self.longest, time.monotonic() - began)
        return lines

    def check_reported(self) -> None:
        assert self.named is not None, "/healthz never named the pinned partition"
        # the setting; the consumer's next fetch saw the transaction, and the pinned time is
        # measured between fetch responses (its long poll, 0.5 s, on each side); the worker's
        # one-second check; one round of this loop
        assert self.named <= PINNED + 2.0 + self.longest, (self.named, self.longest)
        assert self.metric is not None
        assert self.fired is not None, f"{ALERT} never fired"

    def notes(self) -> dict[str, Any]:
        assert self.named is not None
        assert self.metric is not None
        assert self.fired is not None
        return {
            "pinned_transaction_seconds": PINNED,
            "/healthz named it after (s, from the transaction's records)": round(self.named, 1),
            "gauge above the setting after (s)": round(self.metric, 1),
            "alert firing after (s, `for:` 2 s, 1 s scrapes)": round(self.fired, 1),
            "rounds while held": self.rounds,
            "longest round (s)": round(self.longest, 1),
        }


def test_a_transaction_left_open_is_named_and_alerted_while_the_other_partition_goes_on(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    with rig(kafka_bootstrap, tmp_path) as r, contextlib.ExitStack() as stack:
        first = {"topic": r.features, "partition": "0"}
        txn = OpenTransaction(kafka_bootstrap, r.features, 0)
        stack.callback(txn.close)
        in_txn = EventSource("txn", truth=r.truth, seed=3)
        txn.open(in_txn.make(5))
        held = Held(r, start=10)
        while time.monotonic() - held.opened < OPEN:
            held.round()
            with r.observer.lock:
                assert not [i for i in in_txn.ids if i in r.observer.decisions]
        held.check_reported()
        # the transaction's records and every later one; the gauge follows the worker's
        # fetches and its one-second check, so the last round's two may take that long
        want = len(in_txn.ids) + len(held.waiting)
        past = r.worker.metric("abstain_records_past_stable_offset", first)
        deadline = time.monotonic() + 5.0
        while past < want and time.monotonic() < deadline:
            time.sleep(0.2)
            past = r.worker.metric("abstain_records_past_stable_offset", first)
        assert past >= want, (past, want)
        assert r.worker.metric("abstain_consumer_lag", first) == 0

        txn.commit()
        committed = time.monotonic()
        r.observer.wait(lambda o: o.decided(r.truth) == len(r.truth), 60, "every event decided")
        drained = time.monotonic() - committed
        wait_until(lambda: not _pinned(r.worker), 30, "/healthz no longer names partition 0")
        released = time.monotonic() - committed
        resolved = r.alerts.wait_resolved(ALERT, timeout=60)
        time.sleep(2.0)  # a decision made twice would have come by now
        assert not r.twice()
        assert r.worker.metric("abstain_pinned_transaction_seconds", {"topic": r.features}) == 0
        assert r.worker.metric("abstain_records_past_stable_offset", {"topic": r.features}) == 0
        emit(
            Summary(
                "pinned transaction",
                "ci",
                events_sent=len(r.truth),
                decided=r.observer.decided(r.truth),
                decision_records=r.observer.decision_records,
                faults=1,
                recovery_s=[drained],
                runtime_s=time.monotonic() - began,
                notes={
                    **held.notes(),
                    "open for (s)": OPEN,
                    "every event decided after the commit (s)": round(drained, 1),
                    "/healthz clear after the commit (s)": round(released, 1),
                    "alert resolved after (s, from the /healthz clear)": round(resolved, 1),
                },
            ),
            tmp_path,
            capsys,
        )


def test_a_producer_killed_in_its_transaction_holds_the_partition_until_the_broker_aborts_it(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    with rig(kafka_bootstrap, tmp_path) as r:
        timeout_ms = str(int(KILLED_TIMEOUT * 1000))
        argv = [sys.executable, "-c", HOLDER, kafka_bootstrap, r.features, "0", timeout_ms]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as holder:  # noqa: S603
            try:
                assert holder.stdout is not None
                assert holder.stdout.readline().strip() == "open"
                held = Held(r, start=10)
                holder.send_signal(signal.SIGKILL)
                assert holder.wait(10) == -signal.SIGKILL
            finally:
                if holder.poll() is None:
                    holder.kill()
        # the broker aborts it once its timeout has passed (checked every 10 s by default)
        while held.named is None or held.fired is None:
            assert time.monotonic() - held.opened < KILLED_TIMEOUT, "not reported in time"
            held.round()
        held.check_reported()
        while held.round(held=False):
            assert time.monotonic() - held.opened < KILLED_TIMEOUT + 30.0, "never aborted"
        aborted = time.monotonic() - held.opened
        r.observer.wait(lambda o: o.decided(r.truth) == len(r.truth), 60, "every event decided")
        resolved = r.alerts.wait_resolved(ALERT, timeout=60)
        time.sleep(2.0)  # a decision made twice, or one of the aborted events, would be here
        assert not r.twice()
        with r.observer.lock:
            assert not [i for i in r.observer.decisions if i.startswith("killed-")]
        assert r.worker.metric("abstain_pinned_transaction_seconds", {"topic": r.features}) == 0
        emit(
            Summary(
                "pinned transaction, producer killed",
                "ci",
                events_sent=len(r.truth),
                decided=r.observer.decided(r.truth),
                decision_records=r.observer.decision_records,
                faults=1,
                recovery_s=[aborted],
                runtime_s=time.monotonic() - began,
                notes={
                    **held.notes(),
                    "transaction.timeout.ms (s)": KILLED_TIMEOUT,
                    "/healthz clear after (s, the broker's abort)": round(aborted, 1),
                    "alert resolved after (s, from the /healthz clear)": round(resolved, 1),
                },
            ),
            tmp_path,
            capsys,
        )
