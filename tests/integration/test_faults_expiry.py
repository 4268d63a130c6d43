"""Label requests that nobody answers expire and are counted, never silently lost:
after their TTL (plus the grace period) every unanswered request is dropped from the
pending table and counted in ``abstain_label_requests_expired_total``; answered ones are
applied once and not counted; a label arriving after its request was dropped is
dead-lettered."""

from __future__ import annotations

import json
import time
from pathlib import Path

from faults.checks import final_entries
from faults.data import EventSource
from faults.kafkaio import produce, read_topic
from faults.oracle import Observer
from faults.scenario import deployment, max_version

TTL = 3.0


def test_unanswered_requests_expire_and_are_counted(kafka_bootstrap: str, tmp_path: Path) -> None:
    with deployment(
        kafka_bootstrap,
        tmp_path,
        request_ttl_seconds=TTL,
        expired_grace_seconds=0,
        sweep_every=1,
        orphan_label_seconds=1,
    ) as dep:
        t = dep.topics
        src = EventSource("exp")
        answered = 10
        observer = Observer(kafka_bootstrap, t, src.truth, budget=answered).begin()
        worker = dep.start()
        worker.wait_ready()
        produce(dep.bootstrap, t["features"], src.make(60))
        observer.wait(lambda o: o.decided(src.truth) == 60, 60, "decisions")
        observer.wait(lambda o: max_version(o, "m") == answered, 60, "the answers applied")
        with observer.lock:
            requests = set(observer.requests)
            applied = set(observer.answered)
        assert len(requests) > answered
        deadline = time.monotonic() + 60

        def counted() -> float:
            return worker.metric("abstain_label_requests_expired_total", {"model": "m"})

        time.sleep(TTL)
        ticks = 0
        while counted() < len(requests) - answered and time.monotonic() < deadline:
            # the learner sweeps on its next message: nudge it with a malformed label
            produce(dep.bootstrap, t["labels"], [(b"m", b"{tick")])
            ticks += 1
            time.sleep(1.0)
        assert counted() == len(requests) - answered
        time.sleep(1.5)  # gauges refresh once a second
        assert worker.metric("abstain_pending_requests", {"model": "m"}) == 0
        table = final_entries(read_topic(dep.bootstrap, dep.changelog("pending")))
        assert all(table.get(r) is None for r in requests), "expired entries still stored"

        # a late answer to a dropped request changes nothing and is dead-lettered
        late = sorted(requests - applied)[0]
        label = {"request_id": late, "model": "m", "label": 1}
        produce(dep.bootstrap, t["labels"], [(b"m", json.dumps(label).encode())])
        while time.monotonic() < deadline:
            with observer.lock:
                if any(late in d.get("raw", "") for d in observer.dead):
                    break
            produce(dep.bootstrap, t["labels"], [(b"m", b"{tick")])
            time.sleep(1.0)
        with observer.lock:
            reasons = {d["reason"] for d in observer.dead if late in d.get("raw", "")}
        assert reasons == {"unknown_request"}
        assert max_version(observer, "m") == answered
        assert worker.metric("abstain_labels_applied_total", {"model": "m"}) == answered
        observer.halt()
