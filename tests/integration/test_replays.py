"""Signed records written again, on a real broker with ``snapshot_key``: a copy of a
record the learner already took changes nothing.

- a reviewer's correction sent again after a later reviewer's correction of the same
  label: refused (``replayed``), the later decision stands, the model is the rebuild;
- an old snapshot (version 1 of the models topic, as JSON with a genuine signature) in a
  signed seed order that names no version it was written against: refused (``replayed``),
  the model unchanged;
- a genuine seed order (``abstain models seed``) written again: refused (``replayed``), the
  model unchanged.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults.corrections import Learned, concept, learned
from faults.kafkaio import Out, Rec
from faults.workers import wait_until

from service.records import SIGNATURE_HEADER, parse_model_envelope

pytestmark = pytest.mark.integration

KEY = "replay-key-" + "z" * 30
MODELS = {
    "m": {
        "algorithm": "dsal",
        "cost": 0.25,
        "n_features": 3,
        "audit_rate": 0.05,
        "corrections": {"reach": 300},
    }
}


@pytest.fixture(scope="module")
def run(service_factory: Callable[..., Any], kafka_io: Any) -> Learned:
    return learned(service_factory, kafka_io, models=MODELS, labels=60, key=KEY)


def _last_labels_record(run: Learned, match: Callable[[dict[str, Any]], bool]) -> Rec:
    found = [r for r in run.records("labels") if r.value and match(json.loads(r.value))]
    assert found
    return found[-1]


def _settled(run: Learned, spot: tuple[int, int]) -> dict[str, Any] | None:
    """Wait until the record written at ``spot`` was dead-lettered or made a version (what
    the learner did with it); the dead letter, if any."""
    labels = run.topics["labels"]

    def letter() -> dict[str, Any] | None:
        return next(
            (
                d
                for d in run.dead()
                if d["topic"] == labels and (d["partition"], d["offset"]) == spot
            ),
            None,
        )

    def made_version() -> bool:
        return any(s["labels_offset"] >= spot[1] for s in run.states())

    wait_until(lambda: letter() is not None or made_version(), 60, "the replay handled")
    time.sleep(1.0)
    return letter()


def test_a_replayed_correction_is_refused_and_the_later_decision_stands(run: Learned) -> None:
    q = run.requests[10]
    rid, y = q["request_id"], concept(q["features"])
    before = run.version()
    run.correct(rid, -y, "bob")
    wait_until(lambda: run.version() == before + 1, 60, "bob's correction")
    bobs = _last_labels_record(run, lambda v: v.get("labelled_by") == "bob")
    run.correct(rid, y, "carol")  # a later reviewer decides otherwise
    wait_until(lambda: run.version() == before + 2, 60, "carol's correction")
    spot = run.write("labels", [Out(b"m", bobs.value, headers=bobs.headers)])[0]
    letter = _settled(run, spot)
    assert run.version() == before + 2
    assert letter is not None, "the copy was applied"
    assert letter["reason"] == "replayed", letter
    run.served_equals_rebuild()


def test_an_old_snapshot_in_a_seed_order_is_refused_and_the_model_unchanged(
    run: Learned,
) -> None:
    old = next(r for r in run.records("models") if r.key == b"m" and r.json()["version"] == 1)
    # a seed order carries a version as JSON (the models topic's is packed): the old version
    # as a seed publishes it, with a genuine signature over those bytes
    envelope = json.dumps(old.json()).encode()
    assert parse_model_envelope(envelope, model="m").version == 1
    signature = dict(run.sign(b"m", envelope))[SIGNATURE_HEADER].decode()
    served = run.states()[-1]
    order = {
        "kind": "seed",
        "model": "m",
        "target": "m",
        "envelope": envelope.decode(),
        "signature": signature,
        "rows": 1,
        "labelled_by": "mallory",
        "ts": time.time(),
    }
    raw = json.dumps(order).encode()  # the order signed too: only its age gives it away
    spot = run.write("labels", [Out(b"m", raw, headers=run.sign(b"m", raw))])[0]
    letter = _settled(run, spot)
    assert letter is not None, "the seed order was adopted"
    assert letter["reason"] == "replayed", letter
    assert run.states()[-1]["learner"] == served["learner"]
    assert run.version() == served["version"]


def test_a_replayed_seed_order_is_refused_and_the_model_unchanged(
    run: Learned, tmp_path: Path
) -> None:
    rng = np.random.default_rng(7)
    rows = ["a,b,c,label"] + [
        f"{x[0]},{x[1]},{x[2]},{concept(x.tolist())}" for x in rng.normal(size=(100, 3)).round(4)
    ]
    data = tmp_path / "seed.csv"
    data.write_text("\n".join(rows) + "\n")
    before = run.version()
    run.service.cli("models", "seed", "--model", "m", str(data))
    wait_until(
        lambda: any(
            s["version"] == before + 1 and s["labels_partition"] >= 0 for s in run.states()
        ),
        60,
        "the seed adopted",
    )
    order = _last_labels_record(run, lambda v: v.get("kind") == "seed")
    served = run.states()[-1]
    spot = run.write("labels", [Out(b"m", order.value, headers=order.headers)])[0]
    letter = _settled(run, spot)
    assert letter is not None, "the copy was applied"
    assert letter["reason"] == "replayed", letter
    assert run.states()[-1]["learner"] == served["learner"]
    assert run.version() == before + 1


def test_without_a_key_a_copy_of_an_older_snapshot_is_never_served(
    service_factory: Callable[..., Any], kafka_io: Any
) -> None:
    """No key: an older version copied onto the models topic is held back and dropped once
    the learner publishes its newest again (at once): no sample of the served version and no
    decision names the older one."""
    run = learned(service_factory, kafka_io, models=MODELS, labels=20, key=None)
    newest = run.version()
    # the oldest version the models topic carries (1: the first label was learned alone)
    old = next(r for r in run.records("models") if r.key == b"m" and r.json()["version"] < newest)
    run.write("models", [Out(b"m", old.value)])
    seen = set()
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline:
        seen.add(int(run.worker.wait_ready()["models"]["m"]))
        time.sleep(0.1)
    assert seen == {newest}
    t = run.topics
    kafka_io.produce_json(
        t["features"],
        [
            (f"after-{i}", {"id": f"after-{i}", "model": "m", "features": [0.1, 0.2, 0.3]})
            for i in range(20)
        ],
    )
    decided = kafka_io.wait_for(
        t["decisions"],
        lambda rs: sum(r.json()["id"].startswith("after-") for r in rs) == 20,
        timeout=60,
    )
    assert {r.json()["model_version"] for r in decided if r.json()["id"].startswith("after-")} == {
        newest
    }
