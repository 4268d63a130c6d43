"""Trust boundaries on a real broker: no setting, record or header takes the model over,
takes a worker down or loses an acknowledged label.

- A label token (or snapshot key) that is empty, blank, short or wrapped in white space (a
  newline read from a file) is refused at start-up: exit 2, a message naming the field and
  not the secret, nothing consumed or produced.
- A label request whose id is not the one the service derives from (model, event id) is
  dead-lettered ``forged_id`` and its label never moves the model; a genuine request
  asked with a tiny query probability weighs at most ``max_importance_weight`` in the risk
  estimate.
- A label on a labels partition its model does not map to is dead-lettered
  ``wrong_partition``; the right labels that follow are applied (not taken for
  redeliveries of the wrong one's offset).
- Tombstones on the features, label-requests, labels and models topics are dead-lettered
  ``not_json``; no agent crashes, liveness stays up, both agents go on working.
- An event id reused with other features: the second request is dead-lettered
  ``duplicate_id`` and counted; the label trains on the first event's features.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaError
from faults.checks import replay
from faults.data import EventSource, Hostile, home_partition, is_hostile, label_request
from faults.kafkaio import group_lag, produce, read_topic
from faults.oracle import Observer
from faults.report import Summary, emit
from faults.scenario import (
    await_dead_letters,
    dead_letters_at,
    deployment,
    max_version,
    tick_labels,
    write_hostile,
)
from faults.workers import Deployment, WorkerProcess

from service.config import ModelConfig
from service.records import request_id

TOKEN = "token-0123456789abcdef"  # a valid one (>= 16 characters)  # noqa: S105


def _ignore(record: Any) -> bool:
    return is_hostile(record.headers)


def _emit(
    scenario: str,
    began: float,
    tmp: Path,
    capsys: pytest.CaptureFixture[str],
    observer: Observer,
    *,
    events: int,
    bad: int,
    labels: int,
    applied: int,
    notes: dict[str, Any],
) -> None:
    """The summary row: good events and labels sent, hostile records, what became of them."""
    with observer.lock:
        decided = len(observer.decisions)
        records = sum(len(v) for v in observer.decisions.values())
        dead = len(observer.dead)
    summary = Summary(
        scenario,
        "ci",
        events_sent=events,
        bad_sent=bad,
        labels_sent=labels,
        decided=decided,
        decision_records=records,
        duplicates=records - decided,
        dead_lettered=dead,
        labels_applied=applied,
        labels_lost=labels - applied,
        runtime_s=time.monotonic() - began,
        notes=notes,
    )
    emit(summary, tmp, capsys)


def _assert_healthy(worker: WorkerProcess, dep: Deployment) -> None:
    assert worker.alive()
    assert worker.status("/healthz") == 200
    assert worker.metric("abstain_live") == 1.0
    logs = dep.logs()
    assert "Crashed reason" not in logs, logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]


def _lag(dep: Deployment, topic: str) -> dict[str, int]:
    """The group's lag on ``topic`` (a fresh broker makes its group coordinator on demand)."""
    for _ in range(30):
        try:
            return group_lag(dep.bootstrap, dep.app_id, [topic])
        except KafkaError:
            time.sleep(0.5)
    return group_lag(dep.bootstrap, dep.app_id, [topic])


def _envelope(dep: Deployment, model: str, version: int) -> dict[str, Any]:
    """The learner's snapshot of ``model`` at ``version`` from the models topic or its
    table's changelog (both hold each model's newest version of a group of labels)."""
    records = [
        *read_topic(dep.bootstrap, dep.topics["models"]),
        *read_topic(dep.bootstrap, dep.changelog("models")),
    ]
    found = [r.json() for r in records if r.key == model.encode() and not is_hostile(r.headers)]
    mine = [e for e in found if e["version"] == version]
    assert mine, f"no snapshot of {model} at version {version}: {[e['version'] for e in found]}"
    return dict(mine[-1])


# --- 1. secrets in the settings ------------------------------------------------------------

KEY = "snapshot-key-0123456789abcdef-0123456789"  # noqa: S105 - a valid one (>= 32)
BAD_SECRETS = [
    pytest.param({"ABSTAIN_LABEL_TOKEN": ""}, {}, "label_token", "is empty", id="token-empty"),
    pytest.param({"ABSTAIN_LABEL_TOKEN": "   "}, {}, "label_token", "is empty", id="token-blank"),
    pytest.param(
        {"ABSTAIN_LABEL_TOKEN": TOKEN + "\n"}, {}, "label_token", "white space", id="token-newline"
    ),
    pytest.param(
        {}, {"label_token": TOKEN + "\n"}, "label_token", "white space", id="token-newline-in-file"
    ),
    pytest.param(
        {"ABSTAIN_LABEL_TOKEN": "fifteen-chars-x"},
        {},
        "label_token",
        "at least 16",
        id="token-short",
    ),
    pytest.param(
        {"ABSTAIN_SNAPSHOT_KEY": KEY[:31]}, {}, "snapshot_key", "at least 32", id="key-short"
    ),
    pytest.param(
        {}, {"snapshot_key": KEY + "\n"}, "snapshot_key", "white space", id="key-newline-in-file"
    ),
]


@pytest.mark.parametrize(("env", "in_file", "name", "why"), BAD_SECRETS)
def test_a_bad_secret_stops_the_worker_at_start_up(
    env: dict[str, str],
    in_file: dict[str, str],
    name: str,
    why: str,
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    settings = {"label_token": TOKEN, **in_file}
    with deployment(kafka_bootstrap, tmp_path, env=env, **settings) as dep:
        t = dep.topics
        src = EventSource("tok")
        produce(dep.bootstrap, t["features"], src.make(10))
        worker = dep.start()
        answered = []
        deadline = time.monotonic() + 60
        while worker.alive() and time.monotonic() < deadline:
            answered.append(worker.status("/healthz"))
            time.sleep(0.1)
        assert not worker.alive(), "the worker runs with a bad secret"
        err = worker.stderr.read_text(errors="replace")
        assert worker.proc.returncode == 2, err
        assert name in err, err
        assert why in err, err
        assert "Traceback" not in err, err
        output = err + worker.stdout.read_text(errors="replace")
        for secret in (*env.values(), *in_file.values()):
            if len(secret.strip()) >= 8:
                assert secret.strip() not in output
        # nothing was accepted: no HTTP answer, no decision, no offset committed
        assert set(answered) <= {0}
        assert read_topic(dep.bootstrap, t["decisions"]) == []
        assert read_topic(dep.bootstrap, t["label_requests"]) == []
        assert sum(_lag(dep, t["features"]).values()) == 10


# --- 3. forged request ids and the importance-weight cap -----------------------------------


def test_a_forged_label_request_changes_nothing_and_weights_are_capped(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    with deployment(
        kafka_bootstrap,
        tmp_path,
        label_token=TOKEN,  # max_importance_weight: the default, 100
        orphan_label_seconds=2,
        sweep_every=1,
    ) as dep:
        t = dep.topics
        observer = Observer(kafka_bootstrap, t, {}, ignore=_ignore).begin()
        worker = dep.start()
        worker.wait_ready()
        far = time.time() + 3600

        # a request whose id the service would not derive: features and query probability of
        # the attacker's choosing (a label for it would weigh 1000 and drag the standardiser)
        forged_id = uuid.uuid4().hex
        forged = label_request(
            forged_id,
            "m",
            [80.0, -80.0, 80.0],
            expires_at=far,
            event_id="forged-event",
            query_probability=0.001,
            decided_label=-1,
        )
        sent = write_hostile(
            dep,
            [
                Hostile(
                    "label_requests", "forged id", "forged_id", b"m", json.dumps(forged).encode()
                ),
            ],
        )
        await_dead_letters(observer, sent, 60)
        label = {"request_id": forged_id, "model": "m", "label": 1}
        sent.update(
            write_hostile(
                dep,
                [
                    Hostile(
                        "labels",
                        "label of a forged request",
                        "unknown_request",
                        b"m",
                        json.dumps(label).encode(),
                    ),
                ],
            )
        )
        await_dead_letters(observer, sent, 60, nudge=lambda: tick_labels(dep, sent))
        await_dead_letters(observer, sent, 30)  # the ticks too
        dead = dead_letters_at(observer)
        for where, h in sent.items():
            assert dead[where] == [h.reason], (h.kind, dead[where])
        assert max_version(observer, "m") == 0
        assert json.loads(worker.get("/readyz")[1])["models"]["m"] == 0
        assert read_topic(dep.bootstrap, dep.changelog("models")) == []
        assert worker.metric("abstain_labels_applied_total", {"model": "m"}) == 0
        assert (
            worker.metric(
                "abstain_dead_letters_total", {"source": "label-requests", "reason": "forged_id"}
            )
            == 1
        )

        # genuine requests (derived ids): p = 0.001 weighs max_importance_weight, not 1000;
        # p = 0.5 weighs 2
        x1, x2 = [0.3, -0.2, 0.1], [-0.5, 0.4, 0.9]
        genuine = [
            label_request(
                request_id("m", "g-1"),
                "m",
                x1,
                expires_at=far,
                event_id="g-1",
                query_probability=0.001,
                decided_label=-1,
            ),
            label_request(
                request_id("m", "g-2"),
                "m",
                x2,
                expires_at=far,
                event_id="g-2",
                query_probability=0.5,
                decided_label=1,
            ),
        ]
        produce(
            dep.bootstrap, t["label_requests"], [(b"m", json.dumps(r).encode()) for r in genuine]
        )
        labels = [{"request_id": r["request_id"], "model": "m", "label": 1} for r in genuine]
        produce(dep.bootstrap, t["labels"], [(b"m", json.dumps(lab).encode()) for lab in labels])
        observer.wait(lambda o: max_version(o, "m") == 2, 60, "both genuine labels applied")

        # (the two labels may be one group: version 2 alone is written, and holds both)
        two = _envelope(dep, "m", 2)
        assert two["iw_weight"] == 102.0  # 1 / max(0.001, 1 / 100), + 1 / 0.5
        assert two["iw_loss"] == 100.0  # decided -1, label +1: loss 1, weighed 100; then none
        assert two["labels_applied"] == 2
        # ... and the model is what the two genuine labels alone make of it
        config = ModelConfig(**dep.config["models"]["m"])
        result = replay("m", config, [(x1, 1), (x2, 1)], two)
        assert result.equal, result
        time.sleep(1.5)  # the risk gauge follows the served model
        assert worker.metric("abstain_risk_estimate", {"model": "m"}) == pytest.approx(
            100.0 / 102.0
        )
        _assert_healthy(worker, dep)
        observer.halt()
        _emit(
            "forged request id",
            began,
            tmp_path,
            capsys,
            observer,
            events=0,
            bad=len(sent),
            labels=2,
            applied=max_version(observer, "m"),
            notes={
                "dead letters": {h.kind: h.reason for h in sent.values()},
                "iw_weight after p = 0.001 and p = 0.5": two["iw_weight"],
            },
        )


# --- 4. the wrong labels partition ---------------------------------------------------------


def test_a_label_on_the_wrong_partition_is_refused_and_the_right_ones_applied(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    with deployment(
        kafka_bootstrap,
        tmp_path,
        label_token=TOKEN,
        partitions={"features": 2, "decisions": 1, "labels": 2, "models": 1},
    ) as dep:
        t = dep.topics
        src = EventSource("part")
        observer = Observer(kafka_bootstrap, t, src.truth, ignore=_ignore).begin()
        worker = dep.start()
        worker.wait_ready()
        produce(dep.bootstrap, t["features"], src.make(40))
        observer.wait(lambda o: len(o.requests) >= 2, 60, "two label requests")
        with observer.lock:
            (ra, a), (rb, b) = list(observer.requests.items())[:2]
        home = home_partition("m", 2)
        away = 1 - home
        ya, yb = src.truth[a["event_id"]], src.truth[b["event_id"]]

        # the other partition first gets 40 records, so the wrong label's offset is above
        # anything the right partition will hold in this test
        pad = [Hostile("labels", "padding", "not_json", b"m", b"{pad", away) for _ in range(40)]
        wrong = json.dumps({"request_id": ra, "model": "m", "label": ya}).encode()
        misplaced = Hostile("labels", "wrong partition", "wrong_partition", b"m", wrong, away)
        sent = write_hostile(dep, [*pad, misplaced])
        await_dead_letters(observer, sent, 60)
        assert max(o for (_, p, o) in sent if p == away) >= 40
        assert max_version(observer, "m") == 0

        right = [
            (b"m", json.dumps({"request_id": r, "model": "m", "label": y}).encode())
            for r, y in ((ra, ya), (rb, yb))
        ]
        landed = produce(dep.bootstrap, t["labels"], right)
        assert {p for p, _ in landed} == {home}
        observer.wait(lambda o: max_version(o, "m") == 2, 60, "the right labels applied")
        dead = dead_letters_at(observer)
        for where, h in sent.items():
            assert dead[where] == [h.reason], (h.kind, dead[where])
        assert not [w for w in dead if w[0] == t["labels"] and w[1] == home]
        two = _envelope(dep, "m", 2)
        assert (two["labels_partition"], two["labels_offset"]) == landed[-1]
        config = ModelConfig(**dep.config["models"]["m"])
        result = replay("m", config, [(a, ya), (b, yb)], two)  # features and moments
        assert result.equal, result
        assert (
            worker.metric(
                "abstain_dead_letters_total", {"source": "labels", "reason": "wrong_partition"}
            )
            == 1
        )
        assert worker.metric("abstain_labels_ignored_total", {"reason": "redelivered"}) == 0
        assert worker.metric("abstain_labels_applied_total", {"model": "m"}) == 2
        _assert_healthy(worker, dep)
        observer.halt()
        _emit(
            "wrong partition",
            began,
            tmp_path,
            capsys,
            observer,
            events=src.count,
            bad=len(sent),
            labels=2,
            applied=max_version(observer, "m"),
            notes={
                "wrong label's offset": max(o for (_, p, o) in sent if p == away),
                "right labels' offsets": [o for _, o in landed],
            },
        )


# --- 5. tombstones --------------------------------------------------------------------------


def test_tombstones_are_dead_lettered_and_crash_no_agent(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    with deployment(kafka_bootstrap, tmp_path, label_token=TOKEN) as dep:
        t = dep.topics
        src = EventSource("tomb")
        observer = Observer(kafka_bootstrap, t, src.truth, budget=0, ignore=_ignore).begin()
        worker = dep.start()
        worker.wait_ready()
        produce(dep.bootstrap, t["features"], src.make(10))
        observer.wait(lambda o: o.decided(src.truth) == 10, 60, "decisions before")

        stones = [
            Hostile("features", "tombstone", "not_json", b"tomb-0", None),
            Hostile("features", "tombstone, empty key", "not_json", b"", None),
            Hostile("label_requests", "tombstone", "not_json", b"m", None),
            Hostile("label_requests", "tombstone, empty key", "not_json", b"", None),
            Hostile("labels", "tombstone", "not_json", b"m", None),
            Hostile("labels", "tombstone, empty key", "not_json", b"", None),
            Hostile("models", "tombstone", "not_json", b"m", None),
        ]
        health = []
        sent = write_hostile(dep, stones)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            health.append(worker.status("/healthz"))
            if all(w in dead_letters_at(observer) for w in sent):
                break
            time.sleep(0.2)
        dead = dead_letters_at(observer)
        for where, h in sent.items():
            assert dead.get(where) == ["not_json"], (h.topic, h.kind, dead.get(where))
        counts = {"features": 2, "label-requests": 2, "labels": 2, "models": 1}
        for source, count in counts.items():
            got = worker.metric(
                "abstain_dead_letters_total", {"source": source, "reason": "not_json"}
            )
            assert got == count, (source, got)

        # both agents still work: new events are decided, a label is applied
        observer.budget = 1
        produce(dep.bootstrap, t["features"], src.make(20))
        observer.wait(lambda o: o.decided(src.truth) == 30, 60, "decisions after")
        observer.top_up()
        observer.wait(lambda o: max_version(o, "m") == 1, 60, "a label applied after")
        for _ in range(10):
            health.append(worker.status("/healthz"))
            time.sleep(0.2)
        assert set(health) == {200}, health
        assert len(dep.processes) == 1
        _assert_healthy(worker, dep)
        assert worker.metric("abstain_ready") == 1.0
        observer.halt()
        _emit(
            "tombstones",
            began,
            tmp_path,
            capsys,
            observer,
            events=src.count,
            bad=len(sent),
            labels=observer.labels_sent,
            applied=max_version(observer, "m"),
            notes={"/healthz answers (all 200)": len(health)},
        )


# --- 6. an event id reused with other features ----------------------------------------------


def test_an_event_id_reused_with_other_features_is_a_duplicate(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    began = time.monotonic()
    full: dict[str, Any] = {"algorithm": "dsol", "cost": 0.25, "n_features": 3}  # asks always
    with deployment(
        kafka_bootstrap, tmp_path, label_token=TOKEN, models={"full": full}, default_model="full"
    ) as dep:
        t = dep.topics
        observer = Observer(kafka_bootstrap, t, {}, ignore=_ignore).begin()
        worker = dep.start()
        worker.wait_ready()
        x1, x2 = [0.7, -0.1, 0.4], [-3.0, 2.5, 9.0]
        rid = request_id("full", "dup-1")

        def requests() -> list[Any]:
            return [
                r
                for r in read_topic(dep.bootstrap, t["label_requests"])
                if rid.encode() in (r.value or b"")
            ]

        produce(
            dep.bootstrap,
            t["features"],
            [(b"dup-1", json.dumps({"id": "dup-1", "features": x1}).encode())],
        )
        observer.wait(lambda o: rid in o.requests, 60, "the first request")
        produce(
            dep.bootstrap,
            t["features"],
            [(b"dup-1", json.dumps({"id": "dup-1", "features": x2}).encode())],
        )
        deadline = time.monotonic() + 60
        while len(requests()) < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        first, second = requests()
        assert first.json()["features"] == x1
        assert second.json()["features"] == x2
        await_dead_letters(observer, [(second.topic, second.partition, second.offset)], 60)
        where = (second.topic, second.partition, second.offset)
        assert dead_letters_at(observer)[where] == ["duplicate_id"]
        assert (
            worker.metric(
                "abstain_dead_letters_total", {"source": "label-requests", "reason": "duplicate_id"}
            )
            == 1
        )
        with observer.lock:
            assert len(observer.decisions["dup-1"]) == 2  # both events were decided

        produce(
            dep.bootstrap,
            t["labels"],
            [(b"full", json.dumps({"request_id": rid, "model": "full", "label": -1}).encode())],
        )
        observer.wait(lambda o: max_version(o, "full") == 1, 60, "the label applied")
        one = _envelope(dep, "full", 1)
        config = ModelConfig(**full)
        assert replay("full", config, [(first.json(), -1)], one).equal
        assert not replay("full", config, [(second.json(), -1)], one).equal
        assert len(dead_letters_at(observer)) == 1
        _assert_healthy(worker, dep)
        observer.halt()
        _emit(
            "duplicate event id",
            began,
            tmp_path,
            capsys,
            observer,
            events=2,
            bad=1,
            labels=1,
            applied=max_version(observer, "full"),
            notes={"trained on": "the first event's features"},
        )
