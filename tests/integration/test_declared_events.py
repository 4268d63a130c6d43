"""Events as producers write them, on a real broker: a model that declares its fields scores
events with strings, booleans, nulls and 300 tokens with no service in front; every worker,
a second one and a restarted one, encodes an event to the same inputs as this process does;
each kind of bad field is dead-lettered naming it; the model is seeded from, and the replay
reads, the same events as JSON lines."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults.desk import DeskProcess

from service.config import ModelConfig
from service.datasets import load_events
from service.desk.auth.passwords import hash_password
from service.features import Encoder, FieldsConfig
from service.records import parse_label_request, parse_model_envelope, request_id
from service.records.packed import MAGIC, ZMAGIC
from service.stream.labels.admission import inputs_of

KafkaIO = Record = Service = Worker = Any  # fixtures' types live in conftest.py

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "docs" / "desk"
FIELDS: dict[str, Any] = {
    "hash_bits": 10,
    "seed": 11,
    "fields": {
        "amount": "number",
        "country": "category",
        "merchant": {"kind": "category", "missing": "indicator"},
        "new_device": "boolean",
        "tokens": "tokens",
        "ref": {"kind": "category", "missing": "refuse"},
        "debug": "ignore",
    },
    "cross": [["country", "new_device"]],
}
MODELS = {"fraud": {"algorithm": "dsal", "cost": 0.2, "fields": FIELDS, "audit_rate": 0.0}}
DESK = {
    "session_key": "s" * 40,
    "lease_seconds": 30,
    "min_time_left_seconds": 0,
    "second_opinions": {"enabled": False},
}
PASSWORD = "ann-password-1"  # noqa: S105 - a test account
WORDS = [f"w{i}" for i in range(200)]
RISKY = {"refund", "urgent", "gift"}


def _event(rng: np.random.Generator, i: int, prefix: str) -> tuple[dict[str, Any], int]:
    """One event as a producer writes it, and its truth."""
    country = str(rng.choice(["SE", "NO", "DE", "FR", "US"]))
    device = bool(rng.random() < 0.4)
    tokens = [str(t) for t in rng.choice(WORDS, size=297)]
    risky = [str(t) for t in rng.choice(sorted(RISKY), size=3)] if rng.random() < 0.5 else []
    tokens = (tokens + risky + ["w0"] * (3 - len(risky)))[:300]
    fields = {
        "amount": round(float(rng.lognormal(3, 1)), 2),
        "country": country,
        "merchant": None if rng.random() < 0.3 else f"m{int(rng.integers(0, 30))}",
        "new_device": device,
        "tokens": tokens,
        "ref": int(rng.integers(0, 5)),
        "debug": {"trace": i},
    }
    truth = 1 if risky or (country == "US" and device) else -1
    return {"id": f"{prefix}-{i}", "model": "fraud", "features": fields}, truth


def _events(n: int, seed: int, prefix: str) -> list[tuple[dict[str, Any], int]]:
    rng = np.random.default_rng(seed)
    return [_event(rng, i, prefix) for i in range(n)]


def _jsonl(path: Path, events: list[tuple[dict[str, Any], int]]) -> Path:
    path.write_text(
        "".join(json.dumps({**e, "label": y}) + "\n" for e, y in events), encoding="utf-8"
    )
    return path


def _decisions(kio: KafkaIO, topic: str, prefix: str, n: int) -> dict[str, dict[str, Any]]:
    recs = kio.wait_for(
        topic,
        lambda rs: sum(r.json()["id"].startswith(prefix + "-") for r in rs) >= n,
        timeout=90,
    )
    return {r.json()["id"]: r.json() for r in recs if r.json()["id"].startswith(prefix + "-")}


@pytest.fixture(scope="module")
def seeded(
    service_factory: Callable[..., Service],
    kafka_io: KafkaIO,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Service, Worker, Path]:
    """A worker serving ``fraud``, seeded from 600 labelled events (JSON lines)."""
    service = service_factory(models=MODELS, default_model="fraud", desk=DESK)
    worker = service.start()
    worker.wait_ready()
    history = _jsonl(tmp_path_factory.mktemp("events") / "history.jsonl", _events(600, 1, "h"))
    out = json.loads(service.cli("models", "seed", "--model", "fraud", str(history)).stdout)
    assert (out["rows"], out["published"]) == (600, True)
    deadline = time.monotonic() + 60
    t = service.topics
    probe = 0
    while True:  # until the worker decides with the seeded version
        event, _ = _events(1, 99, f"probe{probe}")[0]
        kafka_io.produce_json(t["features"], [(event["id"], event)])
        (d,) = _decisions(kafka_io, t["decisions"], f"probe{probe}", 1).values()
        if d["model_version"] >= 1:
            break
        assert time.monotonic() < deadline, "the worker never served the seeded version"
        probe += 1

    # the seeded version of 2^10 buckets and 300 tokens an event crossed the broker packed
    # once the learner adopted the order (the command's own copy, which a worker may serve
    # first, is the order's JSON), and the worker serves that version
    def learners(rs: list[Record]) -> list[bytes]:
        return [r.value for r in rs if r.key == b"fraud" and r.value[:4] in (MAGIC, ZMAGIC)]

    models = kafka_io.wait_for(t["models"], lambda rs: bool(learners(rs)), timeout=60)
    (seeded_version,) = learners(models)[-1:]
    assert parse_model_envelope(seeded_version, model="fraud").version == d["model_version"]
    return service, worker, history


def test_events_with_strings_booleans_nulls_and_tokens_are_scored_as_declared(
    seeded: tuple[Service, Worker, Path], kafka_io: KafkaIO
) -> None:
    service, worker, _ = seeded
    t = service.topics
    events = _events(200, 2, "real")
    kafka_io.produce_json(t["features"], [(e["id"], e) for e, _ in events])
    decided = _decisions(kafka_io, t["decisions"], "real", 200)
    assert set(decided) == {e["id"] for e, _ in events}
    assert {d["model_version"] for d in decided.values()} == {1}
    # the seeded model tells the events apart by their strings, booleans and tokens
    truth = {e["id"]: y for e, y in events}
    predicted = [(d["label"], truth[i]) for i, d in decided.items() if d["action"] == "predict"]
    assert len(predicted) >= 100, len(predicted)
    accuracy = np.mean([p == y for p, y in predicted])
    assert accuracy >= 0.85, accuracy
    # every request carries the event's fields as the producer sent them (those the model
    # reads) and no features: the learner encodes them to exactly this process's inputs
    enc = Encoder(FieldsConfig.model_validate(FIELDS))
    config = ModelConfig.model_validate(MODELS["fraud"])
    by_id = {e["id"]: e for e, _ in events}
    records = [
        r for r in kafka_io.read(t["label_requests"]) if r.json()["event_id"].startswith("real-")
    ]
    assert records, "the model asks about some events"
    for r in records:
        q = parse_label_request(r.value)
        sent = by_id[q.event_id]["features"]
        assert q.features is None
        assert q.fields == enc.shown(sent)
        np.testing.assert_array_equal(inputs_of(q, config), enc.dense(sent))
        # 300 tokens a request: the words a person reads, well under 4 KiB
        assert len(r.value) < 4096, len(r.value)
        if q.moments is not None:  # those of the one number field
            assert len(q.moments.mean) == len(q.moments.m2) == 1
    assert any(parse_label_request(r.value).moments is not None for r in records)
    # answered, each request's fields teach the learner: one version a label
    applied = worker.metric("abstain_labels_applied_total", {"model": "fraud"})
    kafka_io.produce_json(
        t["labels"],
        [
            (
                "fraud",
                {
                    "request_id": r.json()["request_id"],
                    "model": "fraud",
                    "label": truth[r.json()["event_id"]],
                    "labelled_by": "test",
                },
            )
            for r in records
        ],
    )
    deadline = time.monotonic() + 60
    while worker.metric("abstain_labels_applied_total", {"model": "fraud"}) < (
        applied + len(records)
    ):
        assert time.monotonic() < deadline, "the labels of declared requests were not applied"
        time.sleep(0.2)
    dead = [r.json() for r in kafka_io.read(t["dead_letters"])]
    assert not [d for d in dead if d["topic"] in (t["labels"], t["label_requests"])], dead[:3]


def test_a_second_worker_and_a_restarted_one_encode_every_event_alike(
    seeded: tuple[Service, Worker, Path], kafka_io: KafkaIO
) -> None:
    service, first, _ = seeded
    t = service.topics
    second = service.start()
    second.wait_ready()
    events = _events(120, 3, "two")
    # until both workers have scored some (the group rebalances once the second joins)
    before = {w.pid: w.metric("abstain_events_total", {"model": "fraud"}) for w in (first, second)}
    sent: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 90
    rnd = 0
    while True:
        batch = [({**e, "id": f"{e['id']}-{rnd}"}, y) for e, y in events]
        kafka_io.produce_json(t["features"], [(e["id"], e) for e, _ in batch])
        sent.update({e["id"]: e for e, _ in batch})
        _decisions(kafka_io, t["decisions"], "two", len(sent))
        scored = [
            w.metric("abstain_events_total", {"model": "fraud"}) - before[w.pid]
            for w in (first, second)
        ]
        if min(scored) > 0:
            break
        assert time.monotonic() < deadline, f"one worker scored nothing: {scored}"
        rnd += 1
    two = _decisions(kafka_io, t["decisions"], "two", len(sent))
    # a worker started afresh, with the first one stopped: the same fields, new ids
    assert first.stop() == 0
    third = service.start()
    third.wait_ready()
    # the same events again under new ids, round after round until the new worker has
    # scored some (it is ready before the group has given it partitions)
    again: list[tuple[dict[str, Any], int]] = []
    deadline = time.monotonic() + 90
    rounds = 0
    while True:
        batch = [({**sent[i], "id": f"again-{rounds}{i[3:]}"}, 0) for i in sent]
        kafka_io.produce_json(t["features"], [(e["id"], e) for e, _ in batch])
        again += batch
        restarted = _decisions(kafka_io, t["decisions"], "again", len(again))
        rounds += 1
        if third.metric("abstain_events_total", {"model": "fraud"}) > 0:
            break
        assert time.monotonic() < deadline, "the restarted worker scored nothing"
    # the same inputs, so the same decisions (a score to the rounding of the batch it was
    # computed in: a matrix product of other rows beside it may differ in the last bit)
    for i, d in two.items():
        for r in range(rounds):
            twin = restarted[f"again-{r}{i[3:]}"]
            assert (twin["model_version"], twin["action"]) == (d["model_version"], d["action"])
            assert twin["score"] == pytest.approx(d["score"], rel=1e-12, abs=1e-12), (d, twin)
    # and every request, of whichever worker, carries exactly this process's encoding
    enc = Encoder(FieldsConfig.model_validate(FIELDS))
    fields = {e["id"]: e["features"] for e, _ in again} | {
        i: e["features"] for i, e in sent.items()
    }
    asked = [
        parse_label_request(r.value)
        for r in kafka_io.read(t["label_requests"])
        if r.json()["event_id"].startswith(("two-", "again-"))
    ]
    assert any(q.event_id.startswith("again-") for q in asked)
    config = ModelConfig.model_validate(MODELS["fraud"])
    for q in asked:
        assert q.features is None
        np.testing.assert_array_equal(inputs_of(q, config), enc.dense(fields[q.event_id]))


BAD: list[tuple[str, dict[str, Any]]] = [
    ("amount", {"amount": "12.5"}),
    ("amount", {"amount": True}),
    ("country", {"country": 5.5}),
    ("country", {"country": ["SE"]}),
    ("new_device", {"new_device": "yes"}),
    ("tokens", {"tokens": [1, 2]}),
    ("tokens", {"tokens": {"a": 1}}),
    ("ref", {"ref": None}),
    ("surprise", {"surprise": 1}),
]


def test_each_kind_of_bad_field_is_dead_lettered_naming_it_and_changes_nothing(
    seeded: tuple[Service, Worker, Path], kafka_io: KafkaIO
) -> None:
    service, _, _ = seeded
    t = service.topics
    good, _ = _events(1, 4, "bad")[0]
    bad = [
        {"id": f"badfield-{k}", "model": "fraud", "features": {**good["features"], **patch}}
        for k, (_, patch) in enumerate(BAD)
    ]
    versions = [r.json()["version"] for r in kafka_io.read(t["models"]) if r.key == b"fraud"]
    kafka_io.produce_json(t["features"], [(e["id"], e) for e in bad])
    recs = kafka_io.wait_for(
        t["dead_letters"],
        lambda rs: sum("badfield-" in r.json().get("raw", "") for r in rs) >= len(bad),
        timeout=60,
    )
    dead = {
        json.loads(r.json()["raw"])["id"]: r.json()
        for r in recs
        if "badfield-" in r.json().get("raw", "")
    }
    for k, (name, _) in enumerate(BAD):
        letter = dead[f"badfield-{k}"]
        assert letter["reason"] == "field", letter
        assert f"field {name!r}" in letter["detail"], letter
    decided = [r for r in kafka_io.read(t["decisions"]) if "badfield-" in r.json()["id"]]
    assert not decided
    assert [r.json()["version"] for r in kafka_io.read(t["models"]) if r.key == b"fraud"] == (
        versions
    )


def test_the_replay_reads_the_same_events_as_the_worker_encodes_them(
    seeded: tuple[Service, Worker, Path], kafka_io: KafkaIO, tmp_path: Path
) -> None:
    service, _, history = seeded
    t = service.topics
    events = _events(200, 2, "real")  # the events the first test sent
    path = _jsonl(tmp_path / "real.jsonl", events)
    settings = service.write_config()
    X, y = load_events(path, Encoder(FieldsConfig.model_validate(FIELDS)))
    rows = {e["id"]: X[k] for k, (e, _) in enumerate(events)}
    requests = [
        parse_label_request(r.value)
        for r in kafka_io.read(t["label_requests"])
        if r.json()["event_id"].startswith("real-")
    ]
    assert requests
    config = ModelConfig.model_validate(MODELS["fraud"])
    for q in requests:
        np.testing.assert_array_equal(inputs_of(q, config), rows[q.event_id])
    out = tmp_path / "replay"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "service",
            "replay",
            str(history),
            "--config",
            str(settings),
            "--model",
            "fraud",
            "--algorithms",
            "dsal",
            "--costs",
            "0.2",
            "--runs",
            "2",
            "--sampling",
            "sequential",
            "--out",
            str(out),
            "--no-plot",
            "--no-progress",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "600 trials" in done.stderr, done.stderr


def test_a_request_whose_fields_do_not_fit_is_dead_lettered_naming_the_field(
    seeded: tuple[Service, Worker, Path], kafka_io: KafkaIO
) -> None:
    # the label-requests topic is input: a request carrying fields no scorer of this
    # declaration writes (the right key, partition and id) is refused, naming the field,
    # and its label teaches nothing
    service, worker, _ = seeded
    t = service.topics
    good, _ = _events(1, 5, "misfit")[0]
    genuine = [r for r in kafka_io.read(t["label_requests"]) if r.key == b"fraud"][-1].json()
    forged = {
        **genuine,
        "request_id": request_id("fraud", "misfit-x"),
        "event_id": "misfit-x",
        "features": None,
        "fields": {**good["features"], "amount": "12.5"},
    }
    kafka_io.produce_json(t["label_requests"], [("fraud", forged)])
    recs = kafka_io.wait_for(
        t["dead_letters"],
        lambda rs: any("misfit-x" in r.json().get("raw", "") for r in rs),
        timeout=60,
    )
    (letter,) = [r.json() for r in recs if "misfit-x" in r.json().get("raw", "")]
    assert (letter["topic"], letter["reason"]) == (t["label_requests"], "field"), letter
    assert "field 'amount'" in letter["detail"], letter
    # its label finds no request to teach: it waits orphan_label_seconds, then is refused
    rid = forged["request_id"]
    label = {"request_id": rid, "model": "fraud", "label": 1, "labelled_by": "t"}
    kafka_io.produce_json(t["labels"], [("fraud", label)])
    deadline = time.monotonic() + 60
    while True:  # the learner sweeps a partition as it reads: nudge it with a probe
        probe = {"request_id": f"probe-{time.monotonic()}", "model": "fraud", "label": 1}
        kafka_io.produce_json(t["labels"], [("fraud", probe)])
        dead = [
            r.json() for r in kafka_io.read(t["dead_letters"]) if rid in r.json().get("raw", "")
        ]
        if any(d["topic"] == t["labels"] for d in dead):
            break
        assert time.monotonic() < deadline, dead
        time.sleep(1.0)
    assert [d["reason"] for d in dead if d["topic"] == t["labels"]] == ["unknown_request"]


def test_a_model_of_2_18_buckets_learns_every_label_under_kafkas_default_record(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    # the default width (2^18 buckets) with the default settings: events of 300 tokens from
    # 60,000 words, every one asked (DSOL) and answered, the stream turning halfway so
    # challengers learn beside the champion. The models topic carries what a scorer reads,
    # under Kafka's default record; the learner's table takes its whole state (beyond that
    # record while the challengers run): every label applied, none refused, and a worker
    # killed mid-stream reads that state back and goes on from it
    words = [f"v{i}" for i in range(60_000)]
    decl = {"fields": {"amount": "number", "tokens": "tokens"}}  # hash_bits: the default
    service = service_factory(
        models={"wide": {"algorithm": "dsol", "cost": 0.2, "fields": decl}},
        default_model="wide",
        partitions={"features": 1, "decisions": 1, "labels": 1, "models": 1},
    )
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    rng = np.random.default_rng(5)
    n, chunk = 300, 25
    events, truth = [], {}
    for i in range(n + chunk):
        tokens = [str(w) for w in rng.choice(words, size=300)]
        amount = round(float(rng.lognormal(3, 1)), 2)
        events.append((f"w{i}", {"id": f"w{i}", "features": {"amount": amount, "tokens": tokens}}))
        truth[f"w{i}"] = (1 if amount > 20 else -1) * (1 if i < n // 2 else -1)
    kafka_io.produce_json(t["features"], events)
    asked = kafka_io.wait_for(
        t["label_requests"],
        lambda rs: len({r.json()["event_id"] for r in rs}) >= n + chunk,
        timeout=120,
    )
    requests = {r.json()["event_id"]: r.json()["request_id"] for r in asked}
    assert all(len(r.value) < 4096 for r in asked)  # its fields, not 2^18 inputs
    order = sorted(requests, key=lambda e: int(e[1:]))

    def answer(first: int, last: int, applied: Worker) -> None:
        kafka_io.produce_json(
            t["labels"],
            [
                ("wide", {"request_id": requests[e], "model": "wide", "label": truth[e]})
                for e in order[first:last]
            ],
        )
        deadline = time.monotonic() + 120
        while applied.metric("abstain_model_version", {"model": "wide"}) < last:
            assert time.monotonic() < deadline, f"labels up to {last} were not applied"
            time.sleep(0.2)

    for first in range(0, n, chunk):  # a version written per chunk at least
        answer(first, first + chunk, worker)
    versions = [r for r in kafka_io.read(t["models"]) if r.key == b"wide"]
    states = [r for r in kafka_io.read(service.changelog("models")) if r.key == b"wide"]
    newest = parse_model_envelope(versions[-1].value, model="wide")
    assert newest.version == n
    assert newest.serving
    assert len(versions) >= n // chunk
    assert max(len(r.value) for r in versions) <= 900 * 1024
    assert max(len(r.value) for r in states) > 1_000_000  # the contest's, in the table
    champion = newest.learner["champion"]["learned"]
    assert "w" not in champion  # the weights of the buckets the stream touched
    assert 30_000 < len(champion["w_at"]) < 2**18
    # killed while it holds a state beyond a default record: read back, and learning goes on
    worker.kill9()
    again = service.start()
    again.wait_ready()
    answer(n, n + chunk, again)
    after = parse_model_envelope(
        [r for r in kafka_io.read(t["models"]) if r.key == b"wide"][-1].value, model="wide"
    )
    assert (after.version, after.labels_applied) == (n + chunk, n + chunk)
    # nothing refused (a request's moments may be: its label is applied without them)
    dead = [r.json() for r in kafka_io.read(t["dead_letters"])]
    refused = [d for d in dead if d["topic"] in (t["labels"], t["label_requests"])]
    assert not [d for d in refused if d["reason"] != "moments"], refused[:3]
    assert again.stop() == 0


def test_the_desk_shows_a_person_the_fields_as_the_producer_sent_them(
    seeded: tuple[Service, Worker, Path],
    kafka_io: KafkaIO,
    browser: Any,
    tmp_path: Path,
) -> None:
    service, _, _ = seeded
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"ann": hash_password(PASSWORD)}))
    desk = DeskProcess(service, users)
    try:
        desk.wait_ready()
        desk.wait(lambda: desk.open_requests() > 0, "an open request", timeout=60)
        page = browser.new_context(viewport={"width": 1280, "height": 1100}).new_page()
        page.goto(desk.url + "/")
        page.get_by_label("User name").fill("ann")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_selector("#card:not([hidden])", timeout=20_000)
        rows = page.locator("#features tbody tr").all_inner_texts()
        names = [r.split("\t")[0] for r in rows]
        # the fields the model reads, in declared order; the ignored one is not shown
        assert names == [n for n in FIELDS["fields"] if n != "debug"], rows
        shown = dict(r.split("\t", 1) for r in rows)
        assert shown["country"] in ("SE", "NO", "DE", "FR", "US")
        assert shown["new_device"] in ("true", "false")
        assert len(shown["tokens"].split()) == 300  # the text, as a person reads it
        assert shown["merchant"] == "(missing)" or shown["merchant"].startswith("m")
        # what weighs most is named by the keys of the event's fields, not by buckets
        top = [r.split("\t")[0] for r in page.locator("#top tbody tr").all_inner_texts()]
        assert top, "a seeded linear model has weights to show"
        assert all(not t.startswith("#") for t in top), top
        page.screenshot(path=str(SHOTS / "declared-fields.png"), full_page=True)
    finally:
        desk.stop()
