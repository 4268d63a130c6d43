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
no longer named and the alert resolves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from faults.data import EventSource
from faults.kafkaio import Out, produce_records
from faults.oracle import Observer
from faults.prom import AlertLog, fast_rules
from faults.report import Summary, emit
from faults.scenario import deployment
from faults.workers import WorkerProcess, wait_until

from service.localprom import LocalPrometheus

pytestmark = pytest.mark.integration

PINNED = 5.0  # s, pinned_transaction_seconds
OPEN = 60.0  # s, how long the transaction stays open
SCRAPE = 1.0  # s, scrape and evaluation interval
HOLD = 2.0  # s, every `for:` of the fast rules
FAST = {"AbstainTransactionPinned": {"> 30": f"> {PINNED:g}"}}  # the setting's default
BEHIND = 10.0  # s, longest an event of partition 1 may wait for its decision
ALERT = "AbstainTransactionPinned"


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


def test_a_transaction_left_open_is_named_and_alerted_while_the_other_partition_goes_on(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        dep = stack.enter_context(
            deployment(
                kafka_bootstrap,
                tmp_path / "svc",
                pinned_transaction_seconds=PINNED,
                partitions={"features": 2, "decisions": 1, "labels": 1, "models": 1},
            )
        )
        t = dep.topics
        features = t["features"]
        where = {"topic": features}
        first = {**where, "partition": "0"}
        truth: dict[str, int] = {}
        p0, p1 = EventSource("p0", truth=truth, seed=1), EventSource("p1", truth=truth, seed=2)
        held = EventSource("txn", truth=truth, seed=3)
        observer = Observer(kafka_bootstrap, t, truth)
        stack.callback(lambda: observer.halt() if observer.is_alive() else None)
        observer.begin()
        worker = dep.start()
        worker.wait_ready()
        rules = fast_rules(tmp_path / "alerts-fast.yml", hold=HOLD, replace=FAST)
        prom = LocalPrometheus(
            tmp_path / "prom", scrape_interval=SCRAPE, rule_files=[rules], die_with_parent=True
        )
        prom.set_targets("abstain", {"worker-0": f"127.0.0.1:{worker.port}"})
        stack.callback(prom.stop)
        prom.start()
        alerts = AlertLog(prom)
        _send(kafka_bootstrap, features, 0, p0.make(10))
        _send(kafka_bootstrap, features, 1, p1.make(10))
        observer.wait(lambda o: o.decided(truth) == 20, 60, "the first 20 decisions")
        wait_until(lambda: bool(prom.query('up{job="abstain"} == 1')), 60, "the first scrape")

        txn = OpenTransaction(kafka_bootstrap, features, 0)
        stack.callback(txn.close)
        txn.open(held.make(5))
        opened = time.monotonic()
        waiting: list[str] = []  # partition 0's events written after the transaction opened
        sent_p1: list[tuple[float, list[str]]] = []
        named = metric = fired = None
        checks, longest = 0, 0.0  # rounds of this loop, the longest one (s)
        while time.monotonic() - opened < OPEN:
            round_began = time.monotonic()
            more = p0.make(2)
            _send(kafka_bootstrap, features, 0, more)
            waiting += [k.decode() for k, _ in more]
            more = p1.make(2)
            _send(kafka_bootstrap, features, 1, more)
            sent_p1.append((time.monotonic(), [k.decode() for k, _ in more]))
            now = time.monotonic() - opened
            lines = _pinned(worker)
            if named is None and lines:
                named = now
                (line,) = lines
                assert line.startswith(f"{features}[0] last stable offset 10 ")
                assert f"abort --topic {features} --partition 0 --start-offset 10`" in line
            seconds = worker.metric("abstain_pinned_transaction_seconds", first)
            if metric is None and seconds > PINNED:
                metric = now
            active = alerts.active(ALERT, first)
            if fired is None and any(a["state"] == "firing" for a in active):
                fired = now
            assert not alerts.active(ALERT, {"partition": "1"})
            assert worker.metric("abstain_pinned_transaction_seconds", {"partition": "1"}) == 0
            assert worker.status("/readyz") == 200
            # partition 1 goes on: everything sent to it BEHIND seconds ago is decided
            with observer.lock:
                late = [i for at, ids in sent_p1 if at < time.monotonic() - BEHIND for i in ids]
                assert all(i in observer.decisions for i in late), "partition 1 stopped"
                assert not [i for i in waiting + held.ids if i in observer.decisions]
            checks += 1
            time.sleep(1.0)
            longest = max(longest, time.monotonic() - round_began)

        assert named is not None, "/healthz never named the pinned partition"
        # the setting; the consumer's next fetch saw the transaction, and the pinned time is
        # measured between fetch responses (its long poll, 0.5 s, on each side); the worker's
        # one-second check; one round of this loop
        assert named <= PINNED + 2.0 + longest, (named, longest)
        assert metric is not None
        assert fired is not None, f"{ALERT} never fired"
        past = worker.metric("abstain_records_past_stable_offset", first)
        assert past >= len(held.ids) + len(waiting)  # the transaction's and every one after it
        assert worker.metric("abstain_consumer_lag", first) == 0

        txn.commit()
        committed = time.monotonic()
        observer.wait(lambda o: o.decided(truth) == len(truth), 60, "every event decided")
        drained = time.monotonic() - committed
        wait_until(lambda: not _pinned(worker), 30, "/healthz no longer names partition 0")
        released = time.monotonic() - committed
        resolved = alerts.wait_resolved(ALERT, timeout=60)
        time.sleep(2.0)  # a decision made twice would have come by now
        with observer.lock:
            twice = {i: len(d) for i, d in observer.decisions.items() if len(d) != 1}
        assert not twice
        assert worker.metric("abstain_pinned_transaction_seconds", where) == 0
        assert worker.metric("abstain_records_past_stable_offset", where) == 0
        observer.halt()
        emit(
            Summary(
                "pinned transaction",
                "ci",
                events_sent=len(truth),
                decided=observer.decided(truth),
                decision_records=observer.decision_records,
                faults=1,
                recovery_s=[drained],
                runtime_s=time.monotonic() - began,
                notes={
                    "pinned_transaction_seconds": PINNED,
                    "open for (s)": OPEN,
                    "/healthz named it after (s, from the transaction's records)": round(named, 1),
                    "gauge above the setting after (s)": round(metric, 1),
                    "alert firing after (s, `for:` 2 s, 1 s scrapes)": round(fired, 1),
                    "every event decided after the commit (s)": round(drained, 1),
                    "/healthz clear after the commit (s)": round(released, 1),
                    "alert resolved after (s, from the /healthz clear)": round(resolved, 1),
                    "checks while open": checks,
                    "longest check (s)": round(longest, 1),
                },
            ),
            tmp_path,
            capsys,
        )
