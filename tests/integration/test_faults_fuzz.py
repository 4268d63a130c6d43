"""Fuzz on a real broker: malformed events, labels and label requests of every kind, mixed
with good ones. Nothing crashes, every bad message is dead-lettered with its reason (and
counted), every good one is processed, and the model is exactly what the good labels alone
make of it (offline replay through service.learning)."""

from __future__ import annotations

import itertools
import json
import random
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from faults.data import (
    Bad,
    EventSource,
    bad_feature_events,
    bad_label_requests,
    bad_labels,
    label_request,
)
from faults.kafkaio import produce
from faults.oracle import Observer
from faults.report import Summary, emit
from faults.scenario import deployment, learning_report
from faults.sizes import SIZES, size_params
from faults.workers import Deployment

from service.records import request_id

MAX_BYTES = 4096
ORPHAN_WAIT = 4.0


def _send_mixed(
    dep: Deployment, topic: str, good: list[tuple[bytes, bytes]], bad: list[Bad], seed: int
) -> tuple[list[tuple[int, int]], dict[tuple[int, int], Bad]]:
    """Produce good and bad messages shuffled together; where each landed."""
    items: list[tuple[bytes | None, bytes, Bad | None]] = [(k, v, None) for k, v in good]
    items += [(b.key, b.value, b) for b in bad]
    random.Random(seed).shuffle(items)
    where = produce(dep.bootstrap, topic, [(k, v) for k, v, _ in items])
    good_at = [w for w, (_, _, b) in zip(where, items, strict=True) if b is None]
    bad_at = {w: b for w, (_, _, b) in zip(where, items, strict=True) if b is not None}
    return good_at, bad_at


@pytest.mark.parametrize("size", size_params())
def test_fuzz_bad_input_is_dead_lettered_and_changes_nothing(
    size: str, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = SIZES["fuzz"][size]
    began = time.monotonic()
    with deployment(
        kafka_bootstrap,
        tmp_path,
        max_message_bytes=MAX_BYTES,
        orphan_label_seconds=ORPHAN_WAIT,
        expired_grace_seconds=3600,
        sweep_every=1,
    ) as dep:
        t = dep.topics
        src = EventSource("good")
        observer = Observer(kafka_bootstrap, t, src.truth, budget=n.labels).begin()
        worker = dep.start()
        worker.wait_ready()

        # bad input by kind: features 55 %, labels 30 %, label requests 5 %, and labels for
        # requests that are unknown / expired / already answered 10 %
        n_feat, n_lab, n_req = int(n.bad * 0.55), int(n.bad * 0.30), int(n.bad * 0.05)
        n_sem = n.bad - n_feat - n_lab - n_req
        bad_f = bad_feature_events(n_feat, prefix="bad", max_bytes=MAX_BYTES)
        bad_l = bad_labels(n_lab, model="m", max_bytes=MAX_BYTES)
        bad_r = bad_label_requests(n_req, model="m", max_bytes=MAX_BYTES)

        # phase 1: half the good events with half the bad events; the oracle labels
        half = n.events // 2
        good_at, bad_at = _send_mixed(dep, t["features"], src.make(half), bad_f[: n_feat // 2], 1)
        req_good, req_bad = _send_mixed(dep, t["label_requests"], [], bad_r, 2)
        observer.wait(lambda o: len(o.answered) >= n.labels, n.timeout, "the oracle's answers")

        def applied() -> float:  # labels the learner applied (the models topic carries the
            # newest version of each of its batches, not one record a label)
            return worker.metric("abstain_labels_applied_total", {"model": "m"})

        observer.wait(
            lambda o: applied() >= n.labels and o.decided(src.truth) == half,
            n.timeout,
            "every answer applied",
        )
        with observer.lock:
            answered = dict(observer.answered)

        # phase 2: the rest, plus labels for unknown, expired and already-applied requests
        now = time.time()
        n_unknown, n_expired = n_sem // 3, n_sem // 3
        n_again = n_sem - n_unknown - n_expired
        expired_events = [f"expired-{uuid.uuid4().hex}" for _ in range(n_expired)]
        expired_ids = [request_id("m", e) for e in expired_events]  # ids the service derives
        produce(
            dep.bootstrap,
            t["label_requests"],
            [
                (
                    b"m",
                    json.dumps(
                        label_request(r, "m", [0.5, 0.5, 0.5], expires_at=now - 5, event_id=e)
                    ).encode(),
                )
                for r, e in zip(expired_ids, expired_events, strict=True)
            ],
        )
        semantic = (
            [
                Bad(
                    json.dumps({"request_id": f"unknown-{i}", "model": "m", "label": 1}).encode(),
                    "labels",
                    "unknown_request",
                    b"m",
                )
                for i in range(n_unknown)
            ]
            + [
                Bad(
                    json.dumps({"request_id": r, "model": "m", "label": -1}).encode(),
                    "labels",
                    "expired",
                    b"m",
                )
                for r in expired_ids
            ]
            + [
                Bad(
                    json.dumps({"request_id": r, "model": "m", "label": y}).encode(),
                    "labels",
                    "already_applied",
                    b"m",
                )
                for r, y in itertools.islice(
                    itertools.cycle(answered.items()), n_again
                )  # some twice
            ]
        )
        _, bad_at_l = _send_mixed(dep, t["labels"], [], bad_l + semantic, 3)
        good_at2, bad_at2 = _send_mixed(
            dep, t["features"], src.make(n.events - half), bad_f[n_feat // 2 :], 4
        )
        bad_at.update(bad_at2)
        expected: dict[tuple[str, int, int], Bad] = {
            (t["features"], p, o): b for (p, o), b in bad_at.items()
        }
        expected.update({(t["labels"], p, o): b for (p, o), b in bad_at_l.items()})
        expected.update({(t["label_requests"], p, o): b for (p, o), b in req_bad.items()})

        # labels of unknown requests wait ORPHAN_WAIT s, then go at the learner's next sweep:
        # nudge it with harmless malformed labels (counted like the others) until they have
        def not_dead() -> list[tuple[str, str, bytes]]:
            with observer.lock:
                seen = {(d["topic"], d["partition"], d["offset"]) for d in observer.dead}
            return [
                (b.source, b.reason, b.value[:60]) for k, b in expected.items() if k not in seen
            ]

        def all_dead() -> bool:
            return not not_dead()

        deadline = time.monotonic() + n.timeout
        ticks: dict[tuple[str, int, int], Bad] = {}
        while not all_dead() and time.monotonic() < deadline:
            time.sleep(1.0)
            tick = Bad(b"{tick", "labels", "not_json", b"m")
            ((p, o),) = produce(dep.bootstrap, t["labels"], [(tick.key, tick.value)])
            ticks[(t["labels"], p, o)] = tick
        expected.update(ticks)
        while not all_dead() and time.monotonic() < deadline:
            time.sleep(0.5)
        observer.wait(lambda o: o.decided(src.truth) == n.events, n.timeout, "every decision")
        missing = not_dead()
        assert not missing, (
            f"{len(missing)} bad messages never dead-lettered: "
            f"{Counter((m[0], m[1]) for m in missing)}, e.g. {missing[:5]}"
        )

        # the worker is alive and both agents still work: a new event and a new label
        observer.budget += 1
        produce(dep.bootstrap, t["features"], src.make(20))
        observer.wait(lambda o: o.decided(src.truth) == n.events + 20, 60, "probe decisions")
        observer.wait(lambda o: applied() >= n.labels + 1, 60, "probe label")
        assert worker.alive()
        logs = dep.logs()
        with observer.lock:
            dead = list(observer.dead)
            decisions = dict(observer.decisions)
        report = learning_report(dep, observer, "m")

        # --- the promise -------------------------------------------------------------
        # every bad message is dead-lettered once, with the reason its defect calls for
        got = {(d["topic"], d["partition"], d["offset"]): d["reason"] for d in dead}
        wrong = {
            k: (b.reason, got.get(k), b.value[:80])
            for k, b in expected.items()
            if got.get(k) != b.reason
        }
        assert not wrong, (
            f"{len(wrong)} bad messages with a wrong or no reason: {list(wrong.values())[:10]}"
        )
        good_where = {(t["features"], p, o) for p, o in good_at + good_at2}
        assert not good_where & set(got), "a good event was dead-lettered"
        assert len(dead) == len(expected), "dead letters beyond the bad messages sent"
        # ... and counted exactly
        sent_by = Counter((b.source, b.reason) for b in expected.values())
        for (source, reason), count in sent_by.items():
            value = worker.metric(
                "abstain_dead_letters_total", {"source": source, "reason": reason}
            )
            assert value == count, (source, reason, value, count)
        assert worker.metric("abstain_dead_letters_total") == len(expected)
        # no agent crashed
        assert "Crashed reason" not in logs, logs[-3000:]
        assert "Traceback" not in logs, logs[-3000:]
        # every good event decided exactly once (no restart here)
        assert set(src.truth) <= set(decisions)
        assert all(len(decisions[e]) == 1 for e in src.truth)
        assert not set(decisions) - set(src.truth)
        # the model is what the good labels alone make of it
        r = report
        assert not r.chain.forks
        assert not r.explained.unexplained
        assert not r.explained.twice
        assert not r.lost
        assert not r.extra
        assert r.chain.version == len(r.answered) == n.labels + 1
        assert r.replay.equal, r.replay.max_abs_diff
        assert worker.metric("abstain_labels_applied_total", {"model": "m"}) == n.labels + 1
        assert worker.metric("abstain_model_version", {"model": "m"}) == n.labels + 1

        observer.halt()
        summary = Summary(
            "fuzz",
            size,
            events_sent=src.count,
            bad_sent=len(expected),
            labels_sent=observer.labels_sent,
            decided=sum(1 for e in src.truth if e in decisions),
            decision_records=sum(len(v) for v in decisions.values()),
            duplicates=sum(len(v) for v in decisions.values()) - len(decisions),
            dead_lettered=len(dead),
            labels_applied=r.chain.version,
            labels_lost=len(r.lost),
            applied_twice=len(r.explained.twice),
            requests=r.requests,
            requests_pending=len(r.pending),
            runtime_s=time.monotonic() - began,
            notes={
                "dead letters by (source, reason)": dict(
                    sorted((f"{s}/{x}", c) for (s, x), c in sent_by.items())
                ),
                "replay": f"bit-identical={r.replay.equal}, max |diff|={r.replay.max_abs_diff:g}",
            },
        )
        emit(summary, tmp_path, capsys)
