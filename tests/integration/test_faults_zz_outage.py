"""Broker outage: the broker (each test's own, on free ports, so no other test is
disturbed) stops for 20 s and comes back with its data.

- Mid-stream: the worker resumes by itself within a bounded time, nothing is lost, and
  /readyz says "not ready" while the broker is away and "ready" after.
- Every producer the worker and the label desk own writes again within a bounded time:
  the scoring path's (decisions, label requests, dead letters), the learner's (table
  writes, model snapshots, its dead letters), faust's (``POST /labels``, dead letters of
  the models topic) and the desk's (leases, labels, revocations).

(Named to sort last: the slowest.)"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from faults.data import EventSource
from faults.desk import DeskProcess, Person
from faults.kafkaio import Rec, produce, read_topic
from faults.oracle import Observer, answer_fraction
from faults.report import Summary, emit
from faults.scenario import Feeder, assert_promise, deployment, settle
from faults.sizes import SIZES, size_params

from service.desk.auth.passwords import hash_password
from service.localkafka import LocalKafka, find_free_ports

RESUME_BOUND = 60.0  # seconds from the broker's return to the worker deciding again
WRITES_BOUND = 90.0  # seconds from the broker's return to every producer having written
OUTAGE_SECONDS = 20.0  # long enough for every client's connections and requests to fail
PASSWORD = "lead-password-1"  # noqa: S105 - a test account


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    port, controller = find_free_ports(2)
    kafka = LocalKafka(
        port=port, controller_port=controller, data_dir=tmp_path / "kafka", die_with_parent=True
    )
    kafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.mark.parametrize("size", size_params())
def test_broker_outage_the_worker_resumes_and_readiness_follows(
    size: str, own_broker: LocalKafka, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = SIZES["outage"][size]
    began = time.monotonic()
    kafka = own_broker
    with deployment(kafka.bootstrap, tmp_path / "svc", stall_seconds=10) as dep:
        src = EventSource("outage", seed=11)
        observer = Observer(
            kafka.bootstrap,
            dep.topics,
            src.truth,
            budget=n.labels,
            answer=answer_fraction(min(1.0, 2.5 * n.labels / n.events)),
        ).begin()
        worker = dep.start()
        worker.wait_ready()
        feeder = Feeder(dep, [src], n.events, chunk=max(25, n.events // 100), pause=0.2)
        feeder.start()
        observer.wait(lambda o: len(o.decisions) >= 0.3 * n.events, n.timeout, "30 % decided")

        # the outage
        down_at = time.time()
        assert kafka.stop()
        during: list[tuple[float, int, int]] = []  # (s since down, /readyz, /healthz)
        while time.time() - down_at < n.outage_seconds:
            during.append(
                (time.time() - down_at, worker.status("/readyz"), worker.status("/healthz"))
            )
            time.sleep(0.5)
        assert kafka.start()
        up_at = time.time()
        ready_again = None
        while time.time() - up_at < RESUME_BOUND:
            if worker.status("/readyz") == 200:
                ready_again = time.time() - up_at
                break
            time.sleep(0.25)
        feeder.finish(n.timeout)
        settled = settle(dep, observer, list(src.truth), "m", n.timeout)

        summary = Summary("broker outage", size, faults=1)
        try:
            assert_promise(dep, observer, list(src.truth), "m", summary, worker=worker)
        finally:
            with observer.lock:
                stamps = sorted(d.ts for seen in observer.decisions.values() for d in seen)
            first_after = min((s for s in stamps if s > up_at), default=float("nan"))
            summary.recovery_s = [first_after - up_at]
            summary.runtime_s = time.monotonic() - began
            not_ready = [round(s, 1) for s, r, _ in during if r != 200]
            summary.notes.update(
                {
                    "outage (s)": n.outage_seconds,
                    "recovery = first decision after the broker is back (s)": "",
                    "/readyz 200 again after (s)": ready_again,
                    "/readyz not 200 during the outage at (s)": not_ready[:3] + ["..."],
                    "/readyz answers during the outage": sorted({r for _, r, _ in during}),
                    "/healthz answers during the outage": sorted({h for _, _, h in during}),
                    "settled": asdict(settled),
                }
            )
            observer.halt()
            emit(summary, tmp_path, capsys)
        assert worker.alive()
        assert settled, settled
        # resumes by itself, within the bound
        assert summary.recovery_s[0] < RESUME_BOUND
        assert ready_again is not None
        # readiness follows the broker: not ready within a few seconds of losing it...
        late = [r for s, r, _ in during if s > 10.0]
        assert late
        assert all(r != 200 for r in late), during
        # ...and a lost broker is no reason to restart the worker (liveness stays up)
        assert all(h == 200 for _, _, h in during), during


def _event(eid: str, x: float) -> tuple[bytes, bytes]:
    body = {"id": eid, "model": "m", "features": [x, 1.0 - x, 0.5]}
    return eid.encode(), json.dumps(body).encode()


class Written:
    """When each output of the outage test was first seen written after ``since`` (s after
    it), read back from the topics."""

    def __init__(self, bootstrap: str, since: float) -> None:
        self.bootstrap, self.since = bootstrap, since
        self.at: dict[str, float] = {}

    def wait(self, path: str, topic: str, found: Callable[[Rec], bool], bound: float) -> None:
        """Until a record of ``topic`` written after ``since`` passes ``found``."""
        while path not in self.at:
            records = [
                r for r in read_topic(self.bootstrap, topic) if r.timestamp >= self.since * 1000
            ]
            if any(found(r) for r in records):
                self.at[path] = time.time() - self.since
            elif time.time() - self.since > bound:
                raise AssertionError(f"{path}: nothing on {topic} {bound:.0f}s after the outage")
            else:
                time.sleep(0.5)


def _json(rec: Rec) -> dict[str, object]:
    try:
        obj = rec.json()
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def test_broker_outage_every_producer_of_the_worker_and_the_desk_writes_again(
    own_broker: LocalKafka, tmp_path: Path
) -> None:
    kafka = own_broker
    models = {"m": {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.5}}
    desk_settings = {"session_key": "s" * 40, "min_time_left_seconds": 0}
    with deployment(kafka.bootstrap, tmp_path / "svc", models=models, desk=desk_settings) as dep:
        t = dep.topics
        worker = dep.start()
        worker.wait_ready()
        users = tmp_path / "users.json"
        users.write_text(json.dumps({"lead": hash_password(PASSWORD)}))
        desk = DeskProcess(dep, users)
        try:
            desk.wait_ready()
            lead = Person(desk)
            assert lead.login("lead", PASSWORD)[0] == 303
            # every producer has started and the stream runs before the broker goes
            before = Written(dep.bootstrap, time.time())
            produce(
                dep.bootstrap, t["features"], [_event(f"before-{i}", i / 10) for i in range(10)]
            )
            before.wait("decisions", t["decisions"], lambda r: r.key == b"before-9", 60.0)

            assert kafka.stop()
            time.sleep(OUTAGE_SECONDS)
            assert kafka.start()
            up_at = time.time()
            after = Written(dep.bootstrap, up_at)

            # the scoring path's producer: decisions, label requests, dead letters
            events = [_event(f"after-{i}", (i % 7 - 3) / 2) for i in range(40)]
            produce(dep.bootstrap, t["features"], [*events, (b"bad", b"{not an event")])
            ids = {key for key, _ in events}
            after.wait("decisions", t["decisions"], lambda r: r.key in ids, WRITES_BOUND)
            after.wait(
                "label requests",
                t["label_requests"],
                lambda r: str(_json(r).get("event_id", "")).startswith("after-"),
                WRITES_BOUND,
            )
            after.wait(
                "scorer's dead letters",
                t["dead_letters"],
                lambda r: _json(r).get("raw") == "{not an event",
                WRITES_BOUND,
            )
            requests = [
                _json(r)
                for r in read_topic(dep.bootstrap, t["label_requests"])
                if str(_json(r).get("event_id", "")).startswith("after-")
            ]
            assert len(requests) >= 2, requests
            # faust's producer: a label by POST /labels, a refused models record's letter
            rid = str(requests[0]["request_id"])
            body = json.dumps({"request_id": rid, "model": "m", "label": 1}).encode()
            bearer = {"Authorization": f"Bearer {dep.token}"}
            status, text = worker.post("/labels", body, bearer)
            assert status == 202, text
            after.wait(
                "POST /labels",
                t["labels"],
                lambda r: rid.encode() in (r.value or b""),
                WRITES_BOUND,
            )
            produce(dep.bootstrap, t["models"], [(b"m", b"{not a model")])
            after.wait(
                "dead letters of the models topic",
                t["dead_letters"],
                lambda r: _json(r).get("raw") == "{not a model",
                WRITES_BOUND,
            )
            # the learner's producer: table writes, the snapshot, its dead letters
            after.wait("table writes", dep.changelog("models"), lambda r: True, WRITES_BOUND)
            after.wait(
                "model snapshots",
                t["models"],
                lambda r: r.key == b"m" and _json(r).get("version", 0) != 0,
                WRITES_BOUND,
            )
            produce(dep.bootstrap, t["labels"], [(b"m", b"{not a label")])
            after.wait(
                "learner's dead letters",
                t["dead_letters"],
                lambda r: _json(r).get("raw") == "{not a label",
                WRITES_BOUND,
            )
            # the desk's producer: a lease, a label, a revocation
            held = None
            while held is None and time.time() - up_at < WRITES_BOUND:
                held = lead.next("m")
                time.sleep(0.0 if held else 0.5)
            assert held is not None, "the desk offered nothing after the outage"
            after.wait(
                "desk leases",
                "abstain.desk-leases",
                lambda r: held.encode() in (r.value or b""),
                WRITES_BOUND,
            )
            status, answer = lead.api("/api/answer", {"request_id": held, "label": -1})
            assert status == 200, answer
            after.wait(
                "desk labels",
                t["labels"],
                lambda r: held.encode() in (r.value or b"") and b"lead" in (r.value or b""),
                WRITES_BOUND,
            )
            assert lead.logout() == 303
            after.wait("desk revocations", "abstain.desk-revocations", lambda r: True, WRITES_BOUND)
        finally:
            desk.stop()
        assert worker.alive()
        assert max(after.at.values()) < WRITES_BOUND, after.at
