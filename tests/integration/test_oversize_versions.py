"""A label whose model version would not fit in a record, on a real broker: a dense model of
40,000 inputs learns versions of about 1.4 MB after its first label or two, past what a
version may take (``version_bytes``: ``max_message_bytes``, 1,000,000) and the broker's 1
MiB. Each such label is refused as
``oversize`` and dead-lettered naming the model and the sizes; the model keeps serving the
version it has; the learner moves on (a model beside it learns every label sent after),
and never retries a write no topic takes (which held every model's labels before, with
only a warning in the log)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.integration

KafkaIO = Service = Any  # fixtures' types live in conftest.py

WIDE = 40_000
N = 6


def test_a_label_whose_version_would_not_fit_is_dead_lettered_and_the_learner_goes_on(
    service_factory: Callable[..., Service], kafka_io: KafkaIO
) -> None:
    service = service_factory(
        models={
            "wide": {"algorithm": "dsol", "n_features": WIDE, "audit_rate": 0.0},
            "small": {"algorithm": "dsol", "n_features": 3, "audit_rate": 0.0},
        },
        default_model="small",
        partitions={"features": 1, "decisions": 1, "labels": 1, "models": 1},
    )
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    rng = np.random.default_rng(1)
    events = [
        {"id": f"w{i}", "model": "wide", "features": rng.normal(size=WIDE).round(3).tolist()}
        for i in range(N)
    ] + [
        {"id": f"s{i}", "model": "small", "features": rng.normal(size=3).round(3).tolist()}
        for i in range(N)
    ]
    kafka_io.produce_json(t["features"], [(e["id"], e) for e in events])
    requests = kafka_io.wait_for(t["label_requests"], lambda rs: len(rs) >= 2 * N, timeout=120)
    asked = {r.json()["event_id"]: r.json() for r in requests}
    assert set(asked) == {e["id"] for e in events}  # DSOL asks about every event

    def answer(prefix: str) -> None:
        kafka_io.produce_json(
            t["labels"],
            [
                (
                    q["model"],
                    {"request_id": q["request_id"], "model": q["model"], "label": 1},
                )
                for eid, q in sorted(asked.items())
                if eid.startswith(prefix)
            ],
        )

    answer("w")  # the wide model's labels first: the small one's wait behind them
    answer("s")
    deadline = time.monotonic() + 120
    while worker.metric("abstain_model_version", {"model": "small"}) < N:
        assert time.monotonic() < deadline, "the learner stopped at the wide model's labels"
        time.sleep(0.5)
    letters = kafka_io.wait_for(
        t["dead_letters"],
        lambda rs: (
            sum(r.json()["reason"] == "oversize" for r in rs)
            + worker.metric("abstain_model_version", {"model": "wide"})
            >= N
        ),
        timeout=60,
    )
    oversize = [r.json() for r in letters if r.json()["reason"] == "oversize"]
    applied = worker.metric("abstain_model_version", {"model": "wide"})
    # the first labels may fit (a version grows with the rows it remembers): each label is
    # applied or refused, once, and most are refused
    assert len(oversize) + applied == N
    assert len(oversize) >= N // 2
    for letter in oversize:
        assert letter["topic"] == t["labels"]
        assert "model 'wide': the learner's state of the version is " in letter["detail"]
        assert "over the 1000000 it may take" in letter["detail"]
        assert "raise max_state_bytes" in letter["detail"]
    refused = {"model": "wide", "reason": "oversize"}
    assert worker.metric("abstain_updates_refused_total", refused) == len(oversize)
    written = [r.value for r in kafka_io.read(t["models"]) if r.key == b"wide"]
    assert all(len(v) <= 1_000_000 for v in written)
    # the wide model still decides, with the version it has
    probe = {"id": "w-probe", "model": "wide", "features": [0.5] * WIDE}
    kafka_io.produce_json(t["features"], [(probe["id"], probe)])
    decided = kafka_io.wait_for(
        t["decisions"], lambda rs: any(r.json()["id"] == "w-probe" for r in rs), timeout=60
    )
    (mine,) = [r.json() for r in decided if r.json()["id"] == "w-probe"]
    assert mine["model_version"] == applied
    log = worker.stderr.read_text(errors="replace")
    assert "MessageSizeTooLarge" not in log
    assert "storing the learner's state failed" not in log
    assert worker.alive()
