"""Control records on a real broker: rollback orders and the champions record.

1. **Signed rollback orders.** With ``snapshot_key`` set, a rollback order written straight
   to the labels topic, unsigned or signed with another key, is dead-lettered (``unsigned``,
   ``bad_signature``) and the model keeps its version; ``abstain models rollback`` signs its
   order, and the learner takes it.
2. **Signed champions records.** Unsigned and mis-signed champions records are
   dead-lettered (``source: models``) and the route keeps its server.
3. **Racing promotes.** Two ``abstain models promote`` started at the same moment: never
   both told they won the same serial; the one told it won is what a running worker, a worker
   started afterwards and the last record on the topic (what compaction keeps) all serve.
   A promote raced by a signed record of its own serial (written the moment the promote's
   lands) exits 0 when its record wins the tie-break and 1 when the rival does, and the
   running worker, a worker started later and the last record agree with its exit status.
   With ``--if-serial``, exactly one of two racing promotes writes what is served, the other
   exits 1.
4. **Republished.** The learner publishes the champions record served again every
   ``republish_seconds``, signed: a refused record written after it is not the last one.
5. **A forged serial without a key.** A champions record claiming serial 2**53 - 1 (the
   last one a worker takes) is served until the next ``promote``, which writes serial 1 and
   is served.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from faults.kafkaio import Out, produce_records
from faults.workers import REPO, wait_until

from service.records import SIGNATURE_HEADER, Champions, Signer
from service.records.champions import CHAMPIONS_KEY

pytestmark = pytest.mark.integration

Service = KafkaIO = Worker = Any  # fixtures' types live in conftest.py

KEY = "control-records-key-0123456789abcdef"  # noqa: S105 - >= 32 characters
CHAMPION = {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05}
SHADOW = {"algorithm": "dral", "cost": 0.25, "n_features": 3, "champion": "c", "seed": 1}
PARTITIONS = {"features": 1, "decisions": 1, "labels": 2, "models": 1}
LABELS = 8


def run_cli(service: Service, *args: str) -> subprocess.Popen[str]:
    """Start ``python -m service ARGS`` against ``service`` (not waited for)."""
    path = service.write_config()
    cmd = [
        sys.executable,
        "-m",
        "service",
        *args,
        "--broker",
        service.bootstrap,
        "--config",
        str(path),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    return subprocess.Popen(  # noqa: S603 - fixed argv
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@dataclass
class Done:
    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        return dict(json.loads(self.out.strip().splitlines()[-1]))


def finish(proc: subprocess.Popen[str]) -> Done:
    out, err = proc.communicate(timeout=90)
    return Done(proc.returncode, out, err)


def versions(kio: KafkaIO, service: Service, model: str) -> list[int]:
    return [
        r.json()["version"] for r in kio.read(service.topics["models"]) if r.key == model.encode()
    ]


def dead_letters(kio: KafkaIO, service: Service, topic: str) -> list[tuple[int, str]]:
    rows = [r.json() for r in kio.read(service.topics["dead_letters"])]
    return [(d["offset"], d["reason"]) for d in rows if d["topic"] == topic]


def served_by(worker: Worker) -> str:
    """The member that serves route ``c`` on ``worker`` (its ``GET /models``)."""
    rows = json.loads(worker.get("/models")[1])["models"]
    return next(r["model"] for r in rows if r["route"] == "c" and r["role"] == "champion")


def train(service: Service, kio: KafkaIO) -> None:
    """Decide 40 events of ``c`` and answer ``LABELS`` of its questions."""
    t = service.topics
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40, 3)).round(4).tolist()
    events = [(f"e{i}", {"id": f"e{i}", "model": "c", "features": x[i]}) for i in range(40)]
    kio.produce_json(t["features"], events)
    requests = kio.wait_for(t["label_requests"], lambda rs: len(rs) >= LABELS, timeout=60)
    labels = [
        (
            "c",
            {
                "request_id": q.json()["request_id"],
                "model": "c",
                "label": 1 if q.json()["features"][0] > 0 else -1,
            },
        )
        for q in requests[:LABELS]
    ]
    kio.produce_json(t["labels"], labels)
    kio.wait_for(t["models"], lambda rs: LABELS in versions(kio, service, "c"), timeout=60)


@pytest.fixture(scope="module")
def signed(service_factory: Callable[..., Service], kafka_io: KafkaIO) -> tuple[Service, Worker]:
    service = service_factory(
        models={"c": CHAMPION, "s": SHADOW},
        default_model="c",
        partitions=PARTITIONS,
        snapshot_key=KEY,
    )
    worker = service.start()
    worker.wait_ready()
    train(service, kafka_io)
    return service, worker


def test_an_unsigned_or_mis_signed_rollback_order_is_dead_lettered_and_changes_nothing(
    signed: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = signed
    t = service.topics
    order = json.dumps({"kind": "rollback", "model": "c", "target": "c", "to_version": 0}).encode()
    other = Signer(b"another-key-of-at-least-32-characters").sign(b"c", order)
    where = produce_records(
        service.bootstrap,
        t["labels"],
        [
            Out(b"c", order),
            Out(b"c", order, headers=((SIGNATURE_HEADER, other),)),
        ],
    )
    offsets = {o for _, o in where}
    kio = kafka_io
    kio.wait_for(
        t["dead_letters"],
        lambda rs: offsets <= {o for o, _ in dead_letters(kio, service, t["labels"])},
        timeout=60,
    )
    got = {o: r for o, r in dead_letters(kio, service, t["labels"]) if o in offsets}
    assert sorted(got.values()) == ["bad_signature", "unsigned"]
    time.sleep(2)  # a model write would have followed its order at once
    assert max(versions(kio, service, "c")) == LABELS
    assert json.loads(worker.get("/readyz")[1])["models"]["c"] == LABELS
    assert (
        worker.metric("abstain_dead_letters_total", {"source": "labels", "reason": "unsigned"}) == 1
    )
    # the CLI signs its order: taken. The learner's table keeps the versions it wrote (the
    # newest of each group of labels) under c@<version>: the order names the oldest
    table = {r.key: r for r in kio.read(service.changelog("models")) if r.value is not None}
    kept = sorted(int(k[2:]) for k in table if k.startswith(b"c@"))
    assert kept[-1] == LABELS
    target = kept[0] if len(kept) > 1 else 0  # version 0, the configured one, is always kept
    rollback = run_cli(service, "models", "rollback", "c", "--to-version", str(target))
    assert finish(rollback).code == 0
    kio.wait_for(t["models"], lambda rs: LABELS + 1 in versions(kio, service, "c"), timeout=60)
    history = {
        r.json()["version"]: r.json()
        for r in kio.read(service.changelog("models"))
        if r.key == b"c"
    }
    restored = history[LABELS + 1]
    assert restored["labels_applied"] == target  # what the version it serves had learnt
    if target:
        assert restored["learner"] == history[target]["learner"]
    # what an operator may roll back to: the versions kept, checked as the learner reads
    # them back (a record written to the changelog without the key's signature is not one)
    forged = table[f"c@{LABELS}".encode()].value
    produce_records(
        service.bootstrap,
        service.changelog("models"),
        [Out(b"c@999", forged, partition=table[f"c@{LABELS}".encode()].partition)],
    )
    listed = finish(run_cli(service, "models", "versions", "c"))
    assert listed.code == 0, listed.err
    rows = [json.loads(line) for line in listed.out.splitlines()]
    assert [r["version"] for r in rows] == [0, *kept, LABELS + 1]
    assert [r["version"] for r in rows if r["current"]] == [LABELS + 1]
    assert rows[-1]["labels_applied"] == target
    assert rows[0]["labels_applied"] == 0
    assert rows[-2]["labels_applied"] == LABELS


def test_an_unsigned_or_mis_signed_champions_record_is_dead_lettered_and_changes_nothing(
    signed: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = signed
    t, key = service.topics, CHAMPIONS_KEY.encode()
    forged = Champions(serial=10**6, servers={"c": "s"}, updated_at=time.time()).to_json()
    other = Signer(b"another-key-of-at-least-32-characters").sign(key, forged)
    where = produce_records(
        service.bootstrap,
        t["models"],
        [
            Out(key, forged),
            Out(key, forged, headers=((SIGNATURE_HEADER, other),)),
        ],
    )
    offsets = {o for _, o in where}
    kafka_io.wait_for(
        t["dead_letters"],
        lambda rs: offsets <= {o for o, _ in dead_letters(kafka_io, service, t["models"])},
        timeout=60,
    )
    got = {o: r for o, r in dead_letters(kafka_io, service, t["models"]) if o in offsets}
    assert sorted(got.values()) == ["bad_signature", "unsigned"]
    assert served_by(worker) == "c"


def test_racing_promotes_never_both_win_and_every_reader_serves_the_winner(
    signed: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = signed
    t = service.topics
    rounds = []
    for attempt in range(3):
        # two promotions started at the same moment, to different members
        first, second = ("s", "c") if attempt % 2 == 0 else ("c", "s")
        done = [
            finish(p)
            for p in [
                run_cli(service, "models", "promote", first),
                run_cli(service, "models", "promote", second),
            ]
        ]
        rounds.append(done)
        results = [d.json() for d in done]
        assert all(d.code in (0, 1) for d in done), [d.err for d in done]
        assert all(r.get("won", True) == (d.code == 0) for r, d in zip(results, done, strict=True))
        winners = [r for r, d in zip(results, done, strict=True) if d.code == 0]
        assert winners, "one of two promotes wins"
        serials = [r["serial"] for r in winners]
        assert len(serials) == len(set(serials)), f"two promotes won serial {serials}"
        best = max(winners, key=lambda r: r["serial"])
        want = next(iter(best["servers"].values()), "c")
        for d in done:  # the loser says so and names what is served
            if d.code == 1:
                assert "another promotion" in d.err
                assert d.json()["served"]["serial"] == best["serial"]
        wait_until(lambda w=want: served_by(worker) == w, 30, f"the worker serves {want}")
        # what compaction keeps: the last champions record on the topic is the winner
        last = [r for r in kafka_io.read(t["models"]) if r.key == CHAMPIONS_KEY.encode()][-1]
        assert (last.json()["serial"], last.json()["servers"]) == (best["serial"], best["servers"])
    later = service.start()  # reads every record from the beginning
    later.wait_ready()
    assert served_by(later) == served_by(worker)
    raced = sum(d.code == 1 for done in rounds for d in done)
    print(
        f"\nracing promotes: {raced} of {len(rounds)} rounds raced (one lost); serials "
        f"{[[d.json().get('serial') for d in done] for done in rounds]}"
    )


def champions_records(kio: KafkaIO, service: Service) -> list[Any]:
    return [r for r in kio.read(service.topics["models"]) if r.key == CHAMPIONS_KEY.encode()]


def test_a_promote_that_races_another_of_its_serial_wins_or_says_it_lost_and_all_agree(
    signed: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    """A promote and a record of the same serial written (signed) by the test the moment the
    promote's lands, i.e. while it waits to read back: the promote's exit status says which
    won, and a running worker, one started afterwards and the last record on the topic (what
    compaction keeps) all serve that one."""
    service, worker = signed
    key, signer = CHAMPIONS_KEY.encode(), Signer(KEY.encode())
    outcomes = []
    for round_ in range(4):
        before = len(champions_records(kafka_io, service))
        name = "s" if served_by(worker) == "c" else "c"
        proc = run_cli(service, "models", "promote", name)
        wait_until(
            lambda n=before: len(champions_records(kafka_io, service)) > n,
            30,
            "the promote's record",
            every=0.05,
        )
        serial = champions_records(kafka_io, service)[before].json()["serial"]
        rival = Champions(
            serial=serial,
            servers={} if name == "s" else {"c": "s"},
            updated_at=time.time() + round_,
        ).to_json()
        produce_records(
            service.bootstrap,
            service.topics["models"],
            [Out(key, rival, headers=((SIGNATURE_HEADER, signer.sign(key, rival)),))],
        )
        done = finish(proc)
        assert done.code in (0, 1), done.err
        mine = done.json()
        assert mine["serial"] == serial, "the rival raced: same serial"
        winner = name if done.code == 0 else ("c" if name == "s" else "s")
        wait_until(lambda w=winner: served_by(worker) == w, 30, f"the worker serves {winner}")
        last = champions_records(kafka_io, service)[-1]
        assert last.json()["serial"] == serial
        assert (last.json()["servers"].get("c", "c")) == winner, "compaction would keep a loser"
        assert mine.get("won") == (done.code == 0)
        if done.code == 1:
            assert "another promotion of serial" in done.err
        outcomes.append(done.code)
    later = service.start()  # reads every record from the beginning
    later.wait_ready()
    assert served_by(later) == served_by(worker)
    print(f"\nraced promotes: exit codes {outcomes} (1: the rival won)")


def test_promote_if_serial_is_compare_and_set(
    signed: tuple[Service, Worker], kafka_io: KafkaIO
) -> None:
    service, worker = signed
    records = [
        r for r in kafka_io.read(service.topics["models"]) if r.key == CHAMPIONS_KEY.encode()
    ]
    current = records[-1].json()["serial"] if records else 0
    procs = [
        run_cli(service, "models", "promote", name, "--if-serial", str(current))
        for name in ("s", "c")
    ]
    done = [finish(p) for p in procs]
    assert sorted(d.code for d in done) == [0, 1], [d.err for d in done]
    winner = next(d for d in done if d.code == 0).json()
    assert winner["serial"] == current + 1
    want = next(iter(winner["servers"].values()), "c")
    wait_until(lambda: served_by(worker) == want, 30, f"the worker serves {want}")


def test_without_a_key_a_forged_absurd_serial_is_replaced_by_the_next_promote(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    service = service_factory(
        models={"c": CHAMPION, "s": SHADOW}, default_model="c", partitions=PARTITIONS
    )
    worker = service.start()
    worker.wait_ready()
    forged = Champions(serial=2**53 - 1, servers={"c": "s"}, updated_at=time.time()).to_json()
    produce_records(
        service.bootstrap, service.topics["models"], [Out(CHAMPIONS_KEY.encode(), forged)]
    )
    wait_until(lambda: served_by(worker) == "s", 30, "the forged record served")
    done = finish(run_cli(service, "models", "promote", "c"))
    assert done.code == 0, done.err
    wait_until(lambda: served_by(worker) == "c", 30, "the promotion served")
    assert (done.json()["serial"], done.json().get("won")) == (1, True)


def test_the_champions_record_served_is_republished_after_a_forged_one(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    """A refused champions record written after the genuine one would be all that compaction
    keeps; the learner publishes the record served again every ``republish_seconds``, signed
    with the current key, so the last record is the genuine one again."""
    service = service_factory(
        models={"c": CHAMPION, "s": SHADOW},
        default_model="c",
        partitions=PARTITIONS,
        snapshot_key=KEY,
        republish_seconds=2,
    )
    worker = service.start()
    worker.wait_ready()
    assert finish(run_cli(service, "models", "promote", "s")).code == 0
    wait_until(lambda: served_by(worker) == "s", 30, "the promotion served")
    key = CHAMPIONS_KEY.encode()
    forged = Champions(serial=10**6, servers={}, updated_at=time.time()).to_json()
    [(_, at)] = produce_records(service.bootstrap, service.topics["models"], [Out(key, forged)])

    def last_is_genuine() -> bool:
        last = champions_records(kafka_io, service)[-1]
        signature = dict(last.headers).get(SIGNATURE_HEADER)
        valid = Signer(KEY.encode()).verify(key, last.value, signature) is None
        return last.offset > at and valid and last.json()["servers"] == {"c": "s"}

    wait_until(last_is_genuine, 30, "the served record published again")
    assert served_by(worker) == "s"
    later = service.start()
    later.wait_ready()
    assert served_by(later) == "s"
