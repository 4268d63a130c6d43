"""The worker on a three-broker cluster (one KRaft quorum of three combined nodes on
127.0.0.1, replication factor 3, min.insync.replicas 2), as operators run Kafka:

- topics the worker creates get the cluster's replication (not 1), and a worker that creates
  no topics refuses operator-made topics with too few replicas, writing nothing;
- ``kill -9`` of the broker leading the labels partition, then of the one leading the
  models changelog, mid-stream with two workers, steady events and labels: every event
  decided, every label applied exactly once, the final model equals the offline replay;
  the pause of decisions and of learning is measured;
- a rolling restart of all three brokers, one at a time: the same promise.

The cluster is this module's own (started once, stopped by PID); ``ABSTAIN_TEST_KAFKA=4``
runs it on the Kafka 4 line. The first test runs in ``make test``; the fault tests, minutes
each, in ``make test-long``.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import topicadmin as ka
from aiokafka.admin import AIOKafkaAdminClient
from faults.data import EventSource
from faults.oracle import Observer, answer_fraction
from faults.report import Summary, emit
from faults.scenario import Feeder, assert_promise, max_version, settle
from faults.workers import Deployment, service_config

from service.localkafka import LocalCluster, find_free_ports

KAFKA_LINE_ENV = "ABSTAIN_TEST_KAFKA"
RF, MIN_ISR = 3, 2
PARTITIONS = {"features": 4, "decisions": 2, "labels": 2, "models": 1, "dead_letters": 1}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    ports = find_free_ports(6)
    made = LocalCluster(
        brokers=3,
        ports=list(zip(ports[::2], ports[1::2], strict=True)),
        data_dir=tmp_path_factory.mktemp("cluster"),
        replication_factor=RF,
        min_insync_replicas=MIN_ISR,
        heap="320m",
        kafka=os.environ.get(KAFKA_LINE_ENV, "3"),
        die_with_parent=True,
        ready_timeout=120.0,
    )
    atexit.register(made.stop)  # an interrupted session skips fixture teardown
    try:
        made.start()
        yield made
    finally:
        made.stop(timeout=15.0)
        atexit.unregister(made.stop)


def _describe(bootstrap: str, topics: list[str]) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return list(await admin.describe_topics(topics))
        finally:
            await admin.close()

    return asyncio.run(run())


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    (meta,) = _describe(bootstrap, [topic])
    return next(int(p["leader"]) for p in meta["partitions"] if p["partition"] == partition)


def wait_fully_replicated(bootstrap: str, topics: list[str], timeout: float = 120.0) -> float:
    """Wait until every partition of ``topics`` has all its replicas in sync; seconds."""
    began = time.monotonic()
    while True:
        try:
            metas = _describe(bootstrap, topics)
            if all(
                len(p["isr"]) == len(p["replicas"]) and p["leader"] >= 0
                for m in metas
                for p in m["partitions"]
            ):
                return time.monotonic() - began
        except Exception:  # noqa: BLE001, S110 - a node still starting: ask again
            pass
        if time.monotonic() - began > timeout:
            raise AssertionError(f"{topics} not fully replicated after {timeout:.0f} s")
        time.sleep(0.5)


@contextmanager
def replicated_deployment(bootstrap: str, tmp: Path, **overrides: Any) -> Iterator[Deployment]:
    """A deployment whose six topics an operator made with RF 3 and min ISR 2 (the workers
    make their changelogs with the same policy); workers stopped by PID on the way out."""
    tmp.mkdir(parents=True, exist_ok=True)
    policy = {"replication_factor": RF, "min_insync_replicas": MIN_ISR}
    config = service_config(tmp, partitions=PARTITIONS, topic_policy=policy, **overrides)
    dep = Deployment(bootstrap, tmp, config)
    t, isr = dep.topics, {"min.insync.replicas": str(MIN_ISR)}
    counts = {k: PARTITIONS["labels" if k == "label_requests" else k] for k in t}
    ka.create(
        bootstrap,
        {
            t[k]: ka.Wanted(
                counts[k], RF, {**isr, "cleanup.policy": "compact"} if k == "models" else isr
            )
            for k in t
        },
    )
    try:
        yield dep
    finally:
        dep.close()


def test_worker_topics_take_the_clusters_replication(cluster: LocalCluster, tmp_path: Path) -> None:
    b = cluster.bootstrap
    config = service_config(tmp_path, partitions=PARTITIONS)  # no topic_policy: broker defaults
    dep = Deployment(b, tmp_path, config)
    try:
        dep.start().wait_ready(timeout=120)
    finally:
        dep.close()
    made = [*dep.topics.values(), *(dep.changelog(t) for t in ("pending", "orphans", "models"))]
    facts = ka.facts(b, made)
    assert set(facts) == set(made)
    assert {name: (f.replicas, f.min_insync_replicas) for name, f in facts.items()} == {
        name: (RF, MIN_ISR) for name in made
    }

    # creating nothing, a worker refuses operator-made topics with too few replicas
    policy = {"creation": "check", "replication_factor": 3, "min_insync_replicas": 2}
    (tmp_path / "check").mkdir()
    config = service_config(tmp_path / "check", partitions=PARTITIONS, topic_policy=policy)
    check = Deployment(b, tmp_path / "check", config)
    t = check.topics
    ka.create(b, {t["labels"]: ka.Wanted(2, 1), t["label_requests"]: ka.Wanted(2, 3)})
    worker = check.start()
    try:
        worker.proc.wait(90)
    finally:
        check.close()
    err = worker.stderr.read_text(errors="replace")
    assert worker.proc.returncode != 0, worker.tail()
    assert (
        f"{t['labels']} (topics.labels) has 1 replica, topic_policy.replication_factor "
        "asks for 3" in err
    )
    assert (
        f"{t['label_requests']} (topics.label_requests) has min.insync.replicas=1, "
        "topic_policy.min_insync_replicas asks for 2" not in err
    )  # broker default is 2
    assert ka.topics_of(b, check.app_id, t.values()) == {t["labels"], t["label_requests"]}
    assert set(ka.end_offsets(b, [t["labels"], t["label_requests"]]).values()) == {0}


@dataclass
class Fault:
    """One broker fault and what it did to the stream (wall-clock seconds)."""

    node: int
    what: str  # "kill -9 of labels[0] leader", ...
    at: float  # when it began
    until: float = float("nan")  # when the node was back and every replica in sync
    decisions_gap_s: float = float("nan")  # longest wait for a decision from `at` to `until`
    first_version_s: float = float("nan")  # from `at` to the next model version
    stop_s: float = float("nan")  # how long the node took to stop
    back_s: float = float("nan")  # the node's start until it answered
    in_sync_s: float = float("nan")  # from its start until every replica was in sync

    def measure(self, observer: Observer, versions: VersionClock) -> None:
        """Fill the pauses from what the observer saw (call after the feed ended)."""
        end = self.until + 5.0
        with observer.lock:
            stamps = sorted(
                d.ts for seen in observer.decisions.values() for d in seen if self.at < d.ts < end
            )
        points = [self.at, *stamps]
        self.decisions_gap_s = (
            max(b - a for a, b in zip(points, points[1:], strict=False)) if stamps else float("nan")
        )
        self.first_version_s = versions.first_new_after(self.at)


class VersionClock(threading.Thread):
    """Samples the newest model version the observer has seen, ten times a second."""

    def __init__(self, observer: Observer, model: str = "m") -> None:
        super().__init__(name="version-clock", daemon=True)
        self.observer, self.model = observer, model
        self.samples: list[tuple[float, int]] = []
        self.halted = threading.Event()

    def run(self) -> None:
        while not self.halted.wait(0.1):
            with self.observer.lock:
                version = max_version(self.observer, self.model)
            self.samples.append((time.time(), version))

    def first_new_after(self, at: float) -> float:
        """Seconds from ``at`` to the first version newer than the one seen at ``at``."""
        before = [v for t, v in self.samples if t <= at]
        base = before[-1] if before else 0
        return next((t - at for t, v in self.samples if t > at and v > base), float("nan"))


SIZES = {"ci": (3_000, 300, 240.0), "full": (20_000, 2_000, 900.0)}  # events, labels, timeout


def _run(
    cluster: LocalCluster,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    *,
    scenario: str,
    size: str,
    inject: Any,
    feed_pause: float,
) -> None:
    """Two workers, a steady feed and labeller; ``inject(dep, observer, src)`` does the
    faults and returns them; then the promise is checked and the summary printed."""
    events, labels, timeout = SIZES[size]
    b = cluster.bootstrap
    began = time.monotonic()
    with replicated_deployment(b, tmp_path, session_timeout_seconds=10) as dep:
        src = EventSource(scenario.replace(" ", "-"), seed=11)
        answer = answer_fraction(min(1.0, 2.5 * labels / events))
        observer = Observer(
            b, dep.topics, src.truth, budget=labels, duplicate_every=10, answer=answer
        ).begin()
        workers = [dep.start(), dep.start()]
        for worker in workers:
            worker.wait_ready(timeout=120)
        chunk = max(50, events // 150)
        feeder = Feeder(dep, [src], events, chunk=chunk, pause=feed_pause)
        versions = VersionClock(observer)
        versions.start()
        feeder.start()
        summary = Summary(scenario, size)
        try:
            faults: list[Fault] = inject(dep, observer, src, events)
            feeder.finish(timeout)
            versions.halted.set()
            for fault in faults:
                fault.measure(observer, versions)
            settled = settle(dep, observer, list(src.truth), "m", timeout)
            report = assert_promise(dep, observer, list(src.truth), "m", summary)
        finally:
            done = locals().get("faults", [])
            summary.runtime_s = time.monotonic() - began
            summary.faults = len(done)
            summary.recovery_s = [f.first_version_s for f in done]  # to the next model version
            summary.notes["faults"] = [vars(f) for f in done]
            observer.halt()
            emit(summary, tmp_path, capsys)
        assert settled, settled
        assert all(w.alive() for w in workers), [w.tail() for w in workers]
        assert report.chain.version == labels
        for fault in faults:
            assert fault.decisions_gap_s < 60, fault
            assert fault.first_version_s < 60, fault
        with capsys.disabled():
            gaps = [f.decisions_gap_s for f in faults]
            versions = [f.first_version_s for f in faults]
            print(
                f"{scenario} ({size}): longest decision gap median "
                f"{statistics.median(gaps):.1f} s, first model version after a fault median "
                f"{statistics.median(versions):.1f} s"
            )


def _wait_events(src: EventSource, target: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while src.count < target and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.slow  # ~2 min (ci) / ~6 min (full) on two cores: make test-long
@pytest.mark.parametrize("size", [pytest.param("ci", id="ci"), pytest.param("full", id="full")])
def test_kill9_of_leading_brokers_loses_nothing_and_applies_every_label_once(
    size: str, cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = cluster.bootstrap

    def inject(dep: Deployment, observer: Observer, src: EventSource, n: int) -> list[Fault]:
        faults = []
        for point, (topic, what) in zip(
            (0.25, 0.6),
            (
                (dep.topics["labels"], "labels[0] leader"),
                (dep.changelog("models"), "models changelog[0] leader"),
            ),
            strict=True,
        ):
            _wait_events(src, int(point * n))
            node = leader_of(b, topic, 0)
            fault = Fault(node, f"kill -9 of {what}", time.time())
            assert cluster.node(node).kill()
            fault.stop_s = time.time() - fault.at
            time.sleep(12.0)  # the cluster goes on with two brokers
            fault.back_s = cluster.start_node(node)
            fault.in_sync_s = fault.back_s + wait_fully_replicated(b, [topic])
            fault.until = time.time()
            faults.append(fault)
        return faults

    _run(
        cluster,
        tmp_path,
        capsys,
        scenario="broker kill -9",
        size=size,
        inject=inject,
        feed_pause=1.3,
    )


@pytest.mark.slow
def test_rolling_restart_of_every_broker_loses_nothing_and_applies_every_label_once(
    cluster: LocalCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = cluster.bootstrap

    def inject(dep: Deployment, observer: Observer, src: EventSource, n: int) -> list[Fault]:
        faults = []
        topics = [
            *dep.topics.values(),
            *(dep.changelog(t) for t in ("pending", "orphans", "models")),
        ]
        _wait_events(src, n // 5)
        for node in (1, 2, 3):
            fault = Fault(node, "restart (SIGTERM, controlled shutdown)", time.time())
            assert cluster.node(node).stop(timeout=60.0)
            fault.stop_s = time.time() - fault.at
            fault.back_s = cluster.start_node(node)
            fault.in_sync_s = fault.back_s + wait_fully_replicated(b, topics)
            fault.until = time.time()
            faults.append(fault)
        return faults

    _run(
        cluster,
        tmp_path,
        capsys,
        scenario="rolling restart",
        size="ci",
        inject=inject,
        feed_pause=1.5,
    )  # three restarts of ~15 s inside the feed
