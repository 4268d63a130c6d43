"""Hostile records on the topics the learner and the snapshot follower read, on a real
broker: whoever can write the models, label-requests or labels topic cannot take a model
over, take a worker down or lose an acknowledged label.

- Models topic: tombstones, unknown keys, malformed envelopes (a missing field, NaN, a
  counter >= 2**53, a negative counter, not JSON), a state of the wrong width, a forged
  snapshot of a huge version and -- with ``snapshot_key`` -- unsigned and mis-signed
  snapshots are refused and dead-lettered with their reason, by every worker that reads
  them, also after a restart (the compacted topic keeps them). With a key, only the
  learner's own versions are ever served; without one, a well-formed forged snapshot is
  served until the learner's next publication (``republish_seconds``) replaces it.
- All three topics at once (the fuzz): >= 1,000 hostile records on each, mixed with good
  traffic. No crash, no restart, every good label applied exactly once (the model chain
  and its offline replay), every hostile record dead-lettered once with its reason, the
  served model always one the learner produced.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from faults import HarnessError
from faults.checks import foreign_served
from faults.data import (
    SNAPSHOT_KINDS,
    EventSource,
    Genuine,
    Hostile,
    hostile_labels,
    hostile_requests,
    hostile_snapshots,
    is_hostile,
    label_request,
)
from faults.kafkaio import Rec, group_lag, produce
from faults.oracle import Observer, answer_fraction
from faults.report import Summary, emit
from faults.scenario import (
    assert_learning,
    assert_promise,
    await_dead_letters,
    dead_letters_at,
    deployment,
    learning_report,
    max_version,
    settle,
    tick_labels,
    write_hostile,
)
from faults.sizes import SIZES, size_params
from faults.workers import Deployment, Served, ServedSampler, WorkerProcess, wait_until

from service.config import ModelConfig
from service.records import request_id
from service.stream.health.housekeeping import REPUBLISH_AFTER

KEY = "snapshot-key-for-tests-0123456789abcdef"  # noqa: S105 - >= 32 characters
REPUBLISH = 2.0  # republish_seconds (short): every model is published again this often
ORPHAN_WAIT = 6.0  # orphan_label_seconds in the fuzz: how long a label waits for its request
FLOOD = 30_000  # forged label requests ahead of a genuine one (seconds of the learner's work)
#: well-formed snapshots: not refused (without a key the newest record is served)
SERVED_KINDS = ("huge version", "replay of an older snapshot")
#: snapshots refused for their content, whatever the key
REFUSED_KINDS = [k for k in SNAPSHOT_KINDS if k not in SERVED_KINDS]


#: hostile records by where they landed (topic, partition, offset)
Sent = dict[tuple[str, int, int], Hostile]


def _ignore(record: Any) -> bool:
    return is_hostile(record.headers)


def _keep(rec: Rec) -> bool:
    return not is_hostile(rec.headers)


def _genuine(observer: Observer, config: ModelConfig, partitions: int, key: str | None) -> Genuine:
    """What the observer has seen of model ``m``'s good traffic."""
    with observer.lock:
        return Genuine(
            "m",
            config,
            partitions,
            snapshot_key=None if key is None else key.encode(),
            requests=[dict(r) for r in observer.requests.values()],
            labels=[
                {"request_id": r, "model": "m", "label": y} for r, y in observer.answered.items()
            ],
            snapshots=[dict(s) for k, s in observer.models if k == b"m"],
        )


def _check_reasons(observer: Observer, sent: Sent, copies: int = 1) -> None:
    """Each hostile record has ``copies`` dead letters, all with its reason; one that must
    change nothing (reason None) has none."""
    dead = dead_letters_at(observer)
    wrong = {
        w: (h.topic, h.kind, h.reason, dead.get(w))
        for w, h in sent.items()
        if dead.get(w, []) != ([h.reason] * copies if h.reason else [])
    }
    assert not wrong, (
        f"{len(wrong)} hostile records with a wrong dead letter: {list(wrong.values())[:10]}"
    )


def _check_counted(worker: WorkerProcess, sent: Sent) -> Counter[str]:
    """The worker's dead-letter counters equal the hostile records it refused."""
    want = Counter(f"{h.source}/{h.reason}" for h in sent.values() if h.reason)
    for label, count in want.items():
        source, reason = label.split("/")
        got = worker.metric("abstain_dead_letters_total", {"source": source, "reason": reason})
        assert got == count, (label, got, count)
    return want


def _assert_no_crash(dep: Deployment, worker: WorkerProcess, processes: int) -> None:
    assert worker.alive()
    assert len(dep.processes) == processes, "a worker was restarted"
    logs = dep.logs()
    assert "Crashed reason" not in logs, logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]


def _foreign_window(samples: list[Served], since: float) -> tuple[float, float] | None:
    """(first, last) time a sample after ``since`` served a forged version (None: never)."""
    forged = [s.at for s in samples if s.until >= since and (s.ready_version or 0) >= 10**15]
    return (min(forged), max(forged)) if forged else None


# --- the models topic -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signed", "period"),
    [
        pytest.param(False, REPUBLISH, id="no-key"),
        pytest.param(False, 300.0, id="no-key-default-period"),  # the learner notices
        pytest.param(True, REPUBLISH, id="key"),
    ],
)
def test_bad_snapshots_are_refused_and_only_the_learners_models_served(
    signed: bool,
    period: float,
    kafka_bootstrap: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``period``: ``republish_seconds``. The learner also republishes a model as soon as the
    version served has not been its own for ``REPUBLISH_AFTER`` seconds, so a forged snapshot
    goes within that bound even with the default period."""
    began = time.monotonic()
    key = KEY if signed else None
    extra: dict[str, Any] = {"snapshot_key": KEY} if signed else {}
    bound = min(period, REPUBLISH_AFTER) + 4.0  # plus the one-second check and a read
    with deployment(kafka_bootstrap, tmp_path, republish_seconds=period, **extra) as dep:
        t = dep.topics
        config = ModelConfig(**dep.config["models"]["m"])
        src = EventSource("snap", seed=3)
        observer = Observer(kafka_bootstrap, t, src.truth, budget=5, ignore=_ignore).begin()
        workers = [dep.start()]
        workers[0].wait_ready()
        sampler = ServedSampler(lambda: workers[-1], "m", every=0.1)
        sampler.start()
        produce(dep.bootstrap, t["features"], src.make(100))
        observer.wait(
            lambda o: max_version(o, "m") >= 5 and o.decided(src.truth) == 100,
            60,
            "five labels applied",
        )

        # the bad records: with a key every kind in every signature; without one a forged
        # well-formed snapshot of a huge version, then the kinds refused for their content
        # (once those are dead-lettered, the forged one has been read: one partition)
        g = _genuine(observer, config, 1, key)
        if signed:
            hostile = hostile_snapshots(len(SNAPSHOT_KINDS) * 6, g)
        else:
            hostile = hostile_snapshots(1, g, kinds=["huge version"], start=99)
            hostile += hostile_snapshots(len(REFUSED_KINDS), g, kinds=REFUSED_KINDS)
        written_at = time.time()
        sent = write_hostile(dep, hostile)
        produce(dep.bootstrap, t["features"], src.make(40))  # decided meanwhile
        refused = {w: h for w, h in sent.items() if h.reason}
        await_dead_letters(observer, refused, 60)
        read_at = time.time()  # every record written is read by now (one partition, in order)

        # the served model is the learner's again within republish_seconds (no key: the
        # forged snapshot was the newest record until the learner published again)
        def served_by_learner() -> bool:
            with sampler.lock:
                last = sampler.samples[-1]
            return last.at > read_at and last.ready_version == max_version(observer, "m")

        deadline = time.monotonic() + bound + 15
        while not served_by_learner() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert served_by_learner(), sampler.samples[-5:]
        recovered_at = time.time()
        assert recovered_at - written_at <= bound, recovered_at - written_at

        # learning and deciding go on with the learner's model
        observer.budget += 5
        produce(dep.bootstrap, t["features"], src.make(60))
        observer.wait(
            lambda o: max_version(o, "m") >= 10 and o.decided(src.truth) == 200, 60, "more labels"
        )

        # a restart reads the same topic, bad records included: refused again, no loop
        assert workers[0].stop() == 0
        workers.append(dep.start())
        ready = workers[1].wait_ready()
        assert ready["models"]["m"] == max_version(observer, "m"), ready
        await_dead_letters(observer, refused, 60, copies=2)
        time.sleep(3 * REPUBLISH)  # a few seconds more: the worker stays, serving
        observer.budget += 1
        produce(dep.bootstrap, t["features"], src.make(20))
        observer.wait(
            lambda o: max_version(o, "m") >= 11 and o.decided(src.truth) == 220, 60, "a probe label"
        )
        samples = sampler.halt()
        worker = workers[1]
        _assert_no_crash(dep, worker, processes=2)
        assert all(s.live for s in samples if s.pid == worker.pid), "liveness failed"
        if signed:  # the key is a secret: in no log line, no HTTP answer
            out = dep.logs() + "".join(p.stdout.read_text(errors="replace") for p in dep.processes)
            assert KEY not in out
            for path in ("/metrics", "/readyz", "/healthz"):
                assert KEY.encode() not in worker.get(path)[1]
        _check_reasons(observer, sent, copies=2)
        counted = _check_counted(worker, sent)
        report = learning_report(dep, observer, "m", keep=_keep)
        assert_learning(report)

        # never a model the learner did not produce -- without a key, only while the forged
        # snapshot was the newest record, on the first worker
        foreign = foreign_served(samples, report.chain)
        window = _foreign_window(samples, written_at)
        if signed:
            assert not foreign, foreign[:5]
        else:
            assert all(s.pid == workers[0].pid for s in foreign), foreign[:5]
            assert all(s.until >= written_at and s.at <= recovered_at for s in foreign), [
                s for s in foreign if not (s.until >= written_at and s.at <= recovered_at)
            ][:5]
        with observer.lock:
            decided = [
                (d.model_version, d.ts) for seen in observer.decisions.values() for d in seen
            ]
        strange = [(v, ts) for v, ts in decided if v > report.chain.version]
        if signed:
            assert not strange, strange[:5]
        else:
            assert all(written_at <= ts <= recovered_at + 1 for _, ts in strange), strange[:5]

        observer.halt()
        name = "key" if signed else f"no key, republish_seconds {period:g}"
        summary = Summary(
            f"models topic ({name})",
            "ci",
            events_sent=src.count,
            bad_sent=len(sent),
            labels_sent=observer.labels_sent,
            decided=observer.decided(src.truth),
            dead_lettered=len(observer.dead),
            labels_applied=report.chain.version,
            labels_lost=len(report.lost),
            applied_twice=len(report.explained.twice),
            requests=report.requests,
            requests_pending=len(report.pending),
            faults=1,
            recovery_s=[] if window is None else [recovered_at - written_at],
            runtime_s=time.monotonic() - began,
            notes={
                "dead letters per worker (source/reason)": dict(sorted(counted.items())),
                "not dead-lettered (changes nothing)": sorted(
                    {h.kind for h in sent.values() if not h.reason}
                ),
                "served samples": len(samples),
                "samples serving a forged snapshot": len(foreign),
                "forged snapshot served (s)": None if window is None else window[1] - window[0],
                "decisions by a forged snapshot": len(strange),
            },
        )
        emit(summary, tmp_path, capsys)


def test_a_forged_snapshot_of_an_untrained_model_is_replaced(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    with deployment(kafka_bootstrap, tmp_path, republish_seconds=REPUBLISH) as dep:
        worker = dep.start()
        worker.wait_ready()
        g = Genuine("m", ModelConfig(**dep.config["models"]["m"]), 1)
        write_hostile(dep, hostile_snapshots(1, g, kinds=["huge version"]))

        def served() -> int:
            return int(json.loads(worker.get("/readyz")[1])["models"]["m"])

        wait_until(lambda: served() >= 10**15, 30, "the forged snapshot read")
        # a forged snapshot of a model that has learned is replaced within
        # min(republish_seconds, REPUBLISH_AFTER) (the test above)
        wait = max(REPUBLISH, REPUBLISH_AFTER) + 8
        replaced = True
        try:
            wait_until(lambda: served() == 0, wait, "version 0 served again")
        except HarnessError:
            replaced = False
        assert worker.alive()
        assert replaced, f"version {served()} still served {wait:.0f}s later"


def test_a_flood_of_label_requests_loses_no_label(kafka_bootstrap: str, tmp_path: Path) -> None:
    with deployment(kafka_bootstrap, tmp_path, orphan_label_seconds=2, sweep_every=1) as dep:
        t = dep.topics
        observer = Observer(kafka_bootstrap, t, {}, ignore=_ignore).begin()
        worker = dep.start()
        worker.wait_ready()
        far = time.time() + 3600
        flood = [
            Hostile(
                "label_requests",
                "forged id",
                "forged_id",
                b"m",
                json.dumps(
                    label_request(
                        uuid.uuid4().hex,
                        "m",
                        [1.0, 2.0, 3.0],
                        expires_at=far,
                        event_id=f"flood-{i}",
                    )
                ).encode(),
            )
            for i in range(FLOOD)
        ]
        write_hostile(dep, flood)
        # a genuine request behind the flood, and its answer (the labels topic has no backlog)
        eid = "after-the-flood"
        request = label_request(
            request_id("m", eid), "m", [0.2, 0.1, -0.3], expires_at=far, event_id=eid
        )
        produce(dep.bootstrap, t["label_requests"], [(b"m", json.dumps(request).encode())])
        label = {"request_id": request["request_id"], "model": "m", "label": 1}
        ((p, o),) = produce(dep.bootstrap, t["labels"], [(b"m", json.dumps(label).encode())])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and max_version(observer, "m") < 1:
            if (t["labels"], p, o) in dead_letters_at(observer):
                break
            time.sleep(0.5)
        dead = dead_letters_at(observer).get((t["labels"], p, o))
        observer.halt()
        assert worker.alive()
        assert dead is None, f"the genuine label was dead-lettered: {dead}"
        assert max_version(observer, "m") == 1


# --- all three topics (the fuzz) ------------------------------------------------------------


@pytest.mark.parametrize("size", size_params())
def test_hostile_records_on_the_learning_topics_change_nothing(
    size: str, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = SIZES["hostile"][size]
    rounds = 10 if size == "ci" else 25
    began = time.monotonic()
    with deployment(
        kafka_bootstrap,
        tmp_path,
        partitions={"features": 2, "decisions": 1, "labels": 2, "models": 1},
        snapshot_key=KEY,
        republish_seconds=3.0,
        orphan_label_seconds=ORPHAN_WAIT,
        sweep_every=1,
        expired_grace_seconds=3600,
    ) as dep:
        t = dep.topics
        config = ModelConfig(**dep.config["models"]["m"])
        src = EventSource("hostile", seed=11)
        observer = Observer(
            kafka_bootstrap,
            t,
            src.truth,
            budget=n.labels,
            answer=answer_fraction(min(1.0, 2.5 * n.labels / n.events)),
            ignore=_ignore,
        ).begin()
        worker = dep.start()
        worker.wait_ready()
        sampler = ServedSampler(lambda: worker, "m")
        sampler.start()

        # rounds of good events and hostile records on the three topics; the hostile ones
        # copy, re-key, re-route and alter what the good traffic has shown so far
        sent: Sent = {}
        events, bad = n.events // rounds, n.bad // rounds
        learner_inputs = [t["label_requests"], t["labels"]]
        for r in range(rounds):
            produce(dep.bootstrap, t["features"], src.make(events))
            g = _genuine(observer, config, 2, KEY)
            batch = [
                *hostile_snapshots(bad, g, start=r * bad),
                *hostile_requests(bad, g, start=r * bad),
                *hostile_labels(bad, g, start=r * bad),
            ]
            sent.update(write_hostile(dep, batch))
            # a backlog, never a flood: a label may wait orphan_label_seconds for its request
            # (the flood is test_a_flood_of_label_requests_loses_no_label)
            wait_until(
                lambda: sum(group_lag(dep.bootstrap, dep.app_id, learner_inputs).values()) <= bad,
                n.timeout,
                "the learner to catch up",
                every=0.3,
            )
        settled = settle(dep, observer, list(src.truth), "m", n.timeout)  # asserted at the end

        # labels of forged requests wait orphan_label_seconds, then go at the next sweep
        refused = {w: h for w, h in sent.items() if h.reason}
        await_dead_letters(observer, refused, n.timeout, nudge=lambda: tick_labels(dep, sent))
        await_dead_letters(observer, {w: h for w, h in sent.items() if h.reason}, 30)

        # both agents still work: new events, a new label
        observer.budget += 1
        produce(dep.bootstrap, t["features"], src.make(20))
        observer.wait(lambda o: o.decided(src.truth) == src.count, 60, "probe decisions")
        observer.top_up()
        observer.wait(lambda o: max_version(o, "m") >= n.labels + 1, 60, "probe label")
        samples = sampler.halt()

        summary = Summary("hostile topics", size, bad_sent=len(sent))
        report = assert_promise(
            dep, observer, list(src.truth), "m", summary, worker=worker, keep=_keep
        )
        _assert_no_crash(dep, worker, processes=1)
        assert all(s.live for s in samples), "liveness failed"
        _check_reasons(observer, sent)
        counted = _check_counted(worker, sent)
        assert len(observer.dead) == sum(1 for h in sent.values() if h.reason)
        foreign = foreign_served(samples, report.chain)
        assert not foreign, foreign[:5]
        with observer.lock:
            versions = {d.model_version for seen in observer.decisions.values() for d in seen}
        assert max(versions) <= report.chain.version
        assert report.chain.version == n.labels + 1
        per_topic = Counter(h.topic for h in sent.values())
        assert min(per_topic.values()) >= n.bad, per_topic
        assert settled, settled

        observer.halt()
        summary.runtime_s = time.monotonic() - began
        summary.notes.update(
            {
                "hostile records per topic": dict(per_topic),
                "dead letters (source/reason)": dict(sorted(counted.items())),
                "not dead-lettered (replayed older snapshots)": sum(
                    1 for h in sent.values() if not h.reason
                ),
                "served samples (all the learner's)": len(samples),
            }
        )
        emit(summary, tmp_path, capsys)
