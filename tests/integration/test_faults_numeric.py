"""Numerical guard on a real broker: events whose features are finite but overflow once
scaled, and labels whose update would overflow (w, rho) or the standardiser, are refused
and counted; nothing non-finite is ever written to any topic; the model goes on learning
exactly as an offline replay says it should (refused updates left out)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults.checks import (
    champion_record,
    expect_decision,
    expect_update,
    model_chain,
    non_finite_floats,
)
from faults.data import EventSource, label_request
from faults.kafkaio import group_lag, produce, read_topic
from faults.oracle import Observer
from faults.report import Summary, emit
from faults.scenario import (
    assert_learning,
    assert_promise,
    deployment,
    learning_report,
    max_version,
    settle,
)
from faults.sizes import SIZES, size_params
from faults.workers import Deployment

from service.config import ModelConfig
from service.records import coin, request_id

MODELS = {
    "m": {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05},
    "boom": {  # no scaling and a huge step: most updates overflow
        "algorithm": "dsal",
        "cost": 0.25,
        "n_features": 3,
        "standardize": False,
        "hyperparameters": {"eta": 1e300},
    },
}
HOSTILE = [  # finite features (they pass validation) that can overflow downstream
    [1e300, -1e300, 1e300],
    [1.7e308, 1.7e308, 1.7e308],
    [-1.7e308, -1.7e308, -1.7e308],
    [1e200, 1e200, 1e200],
    [1e154, -1e154, 1e154],
    [1e-320, 0.0, 0.0],
    [5e307, 5e307, -5e307],
]


def _state(dep: Deployment, model: str) -> dict[str, Any]:
    b, t = dep.bootstrap, dep.topics
    chain = model_chain(
        model,
        ModelConfig(**MODELS[model]),
        read_topic(b, t["models"]),
        read_topic(b, dep.changelog("models")),
    )
    return chain.final


def _drained(dep: Deployment) -> bool:
    t = dep.topics
    lag = group_lag(dep.bootstrap, dep.app_id, [t["features"], t["label_requests"], t["labels"]])
    return not any(lag.values())


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.parametrize("size", size_params())
def test_updates_that_would_overflow_are_refused_and_nothing_non_finite_is_written(
    size: str, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    n = SIZES["numeric"][size]
    began = time.monotonic()
    with deployment(kafka_bootstrap, tmp_path, models=MODELS, default_model="m") as dep:
        t = dep.topics
        src = EventSource("num", model="m", seed=3)
        observer = Observer(kafka_bootstrap, t, src.truth, budget=n.labels).begin()
        worker = dep.start()
        worker.wait_ready()

        # 1. the model learns from good labels
        produce(dep.bootstrap, t["features"], src.make(n.events))
        assert settle(dep, observer, list(src.truth), "m", n.timeout)
        v1 = _state(dep, "m")
        assert v1["version"] == n.labels
        # a batch of good events decided by v1 first: the scorer then knows v1 scores, so a
        #    batch of hostile events cannot be blamed on v1 instead (a snapshot that overflows
        #    where the version before it did not is refused: the scorer's fallback)
        warm = src.make(6)
        produce(dep.bootstrap, t["features"], warm)
        _wait(
            lambda: all(
                any(
                    d.model_version == v1["version"] for d in observer.decisions.get(k.decode(), [])
                )
                for k, _ in warm
            ),
            n.timeout,
            "good events decided by the settled version",
        )

        # 2. hostile events, scored at that version: a finite decision or a refusal, never
        #    a crash; which one is computed offline from the same state
        hostile = [
            (f"hostile-{i}", HOSTILE[i % len(HOSTILE)]) for i in range(max(n.bad, len(HOSTILE)))
        ]
        w = np.asarray(champion_record(v1["learner"])["learned"]["w"][:3])
        hostile.append(("hostile-aligned", (np.sign(w) * 1.7e308).tolist()))
        where = produce(
            dep.bootstrap,
            t["features"],
            [(e.encode(), json.dumps({"id": e, "features": x}).encode()) for e, x in hostile],
        )
        expected_events = {
            e: expect_decision(v1, x, coin("m", e, v1["version"])) for e, x in hostile
        }
        refused_events = {
            (t["features"], p, o)
            for (e, _), (p, o) in zip(hostile, where, strict=True)
            if expected_events[e] is None
        }
        _wait(
            lambda: (
                all(e in observer.decisions or expected_events[e] is None for e, _ in hostile)
                and _drained(dep)
            ),
            n.timeout,
            "the hostile events",
        )

        # 3. label requests whose update overflows (and benign ones between them), for both
        #    models; every outcome computed offline, in order, from the current states
        far = time.time() + 3600
        plan: list[tuple[str, str, list[float], int]] = []
        rng = np.random.default_rng(5)
        for i in range(max(n.bad, 10)):
            model = "m" if i % 2 == 0 else "boom"
            x = HOSTILE[i % len(HOSTILE)] if i % 3 else rng.normal(size=3).round(3).tolist()
            plan.append((request_id(model, f"guard-{i}"), model, x, 1 if i % 4 < 2 else -1))
        produce(
            dep.bootstrap,
            t["label_requests"],
            [
                (
                    m.encode(),
                    json.dumps(
                        label_request(r, m, x, expires_at=far, event_id=f"guard-{i}")
                    ).encode(),
                )
                for i, (r, m, x, _) in enumerate(plan)
            ],
        )
        _wait(lambda: _drained(dep), n.timeout, "the requests to be stored")
        states = {"m": v1, "boom": _state(dep, "boom")}
        refused_labels: dict[str, list[str]] = {"m": [], "boom": []}
        applied_labels: dict[str, list[str]] = {"m": [], "boom": []}
        for r, m, x, y in plan:
            after = expect_update(states[m], x, y)
            if after is None:
                refused_labels[m].append(r)
            else:
                states[m] = after
                applied_labels[m].append(r)
        where = produce(
            dep.bootstrap,
            t["labels"],
            [
                (m.encode(), json.dumps({"request_id": r, "model": m, "label": y}).encode())
                for r, m, _, y in plan
            ],
        )
        refused_at = {
            (t["labels"], p, o)
            for (r, m, _, _), (p, o) in zip(plan, where, strict=True)
            if r in refused_labels[m]
        }
        _wait(lambda: _drained(dep), n.timeout, "the labels")

        # 4. the learner still learns: a few more good labels
        observer.budget += 5
        final = n.labels + len(applied_labels["m"]) + 5
        assert settle(dep, observer, list(src.truth), "m", n.timeout, version=final)

        # --- the promise -------------------------------------------------------------
        logs = dep.logs()
        assert worker.alive()
        assert "Crashed reason" not in logs, logs[-3000:]
        with observer.lock:
            dead = [d for d in observer.dead if d["reason"] == "non_finite"]
            decisions = {e: list(v) for e, v in observer.decisions.items()}
        got = {(d["topic"], d["partition"], d["offset"]) for d in dead}
        assert got == refused_events | refused_at
        for e, _ in hostile:
            want = expected_events[e]
            if want is None:
                assert e not in decisions
                continue
            (seen,) = decisions[e]
            assert seen.label == (None if want.label == 0 else want.label)
        for m in ("m", "boom"):
            value = worker.metric(
                "abstain_updates_refused_total", {"model": m, "reason": "non_finite"}
            )
            assert value == len(refused_labels[m]), (m, value, refused_labels[m])
        assert refused_labels["m"]
        assert refused_labels["boom"]
        with observer.lock:
            answered = set(observer.answered)
        summary = Summary("numeric guard", size, bad_sent=len(hostile) + len(plan))
        decided_hostile = [e for e, _ in hostile if expected_events[e] is not None]
        report = assert_promise(
            dep,
            observer,
            [*src.truth, *decided_hostile],
            "m",
            summary,
            answered=answered | set(applied_labels["m"]),
            worker=worker,
        )
        boom = learning_report(dep, observer, "boom", answered=set(applied_labels["boom"]))
        assert_learning(boom)
        assert boom.chain.version == len(applied_labels["boom"])
        # nothing non-finite anywhere: every float of every record of every topic
        bad_floats: dict[str, list[str]] = {}
        for name in [*t.values(), dep.changelog("models"), dep.changelog("pending")]:
            for rec in read_topic(dep.bootstrap, name):
                if name in (t["features"], t["labels"], t["label_requests"]):
                    continue  # inputs: what producers wrote
                value = rec.json()
                paths = non_finite_floats(value)
                if name == t["decisions"]:  # orjson writes NaN / inf as null: look for it
                    paths += [
                        k
                        for k in ("score", "rho", "query_probability")
                        if not isinstance(value[k], float | int)
                    ]
                if paths:
                    bad_floats.setdefault(name, []).extend(paths[:3])
        assert not bad_floats, bad_floats
        observer.halt()
        summary.faults = len(refused_labels["m"]) + len(refused_labels["boom"])
        summary.runtime_s = time.monotonic() - began
        summary.notes.update(
            {
                "hostile events refused / decided": (
                    f"{len(refused_events)} / {len(hostile) - len(refused_events)}"
                ),
                "updates refused (m, boom)": (
                    len(refused_labels["m"]),
                    len(refused_labels["boom"]),
                ),
                "boom versions": boom.chain.version,
                "m versions": report.chain.version,
            }
        )
        emit(summary, tmp_path, capsys)
        assert max_version(observer, "m") == report.chain.version
