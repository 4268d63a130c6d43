"""The learner's history read back from its changelog, on a real broker with
``snapshot_key``: records forged on ``<app_id>-history-changelog`` never reach a model.

A model (and a shadow) learned 160 labels; the worker is stopped, a record is forged on the
history changelog, the worker starts again (it reads the changelog back) and a genuine
signed correction reaches back across the forged record:

- a forged checkpoint (the weights of a member's state before a step, chosen): refused and
  dead-lettered; the corrected model is ``abstain rebuild`` of the log, not the forgery;
- a forged step (a label at a made-up offset for a made-up event whose request id is
  derived correctly, in the middle of the history and after its end): the same.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from faults.checks import champion_record
from faults.corrections import Learned, concept, learned
from faults.kafkaio import Out, loads
from faults.workers import wait_until

from service.records import LabelRequest, request_id
from service.records.history import Step

pytestmark = pytest.mark.integration

KEY = "history-trust-key-" + "y" * 30
MODELS = {
    "m": {
        "algorithm": "dsal",
        "cost": 0.25,
        "n_features": 3,
        "audit_rate": 0.05,
        "corrections": {"reach": 120},  # a checkpoint every 30 labels
    },
    "m-dral": {"algorithm": "dral", "cost": 0.25, "n_features": 3, "champion": "m"},
}
LABELS = 160


@pytest.fixture(scope="module")
def run(service_factory: Callable[..., Any], kafka_io: Any) -> Learned:
    return learned(service_factory, kafka_io, models=MODELS, labels=LABELS, key=KEY)


def _restart_with(run: Learned, records: list[Out]) -> list[tuple[int, int]]:
    """Stop the worker, write ``records`` on the history changelog, start it again."""
    assert run.worker.stop() == 0
    where = run.write(run.service.changelog("history"), records)
    run.worker = run.service.start()
    run.worker.wait_ready()
    return where


def _correct_and_wait(run: Learned, index: int) -> dict[str, Any]:
    """A reviewer's signed correction of request ``index``; the learner's new versions."""
    before, shadow = run.version(), run.version("m-dral")
    q = run.requests[index]
    run.correct(q["request_id"], -run.answers[q["request_id"]], "carol")
    wait_until(
        lambda: run.version() == before + 1 and run.version("m-dral") == shadow + 1,
        60,
        "the corrected versions",
    )
    return run.served_equals_rebuild()


def _refused(run: Learned, where: list[tuple[int, int]]) -> list[str]:
    """The reasons the records written at ``where`` on the history changelog were
    dead-lettered with."""
    history = run.service.changelog("history")
    spots = set(where)
    return [
        d["reason"]
        for d in run.dead()
        if d["topic"] == history and (d["partition"], d["offset"]) in spots
    ]


def test_a_forged_checkpoint_is_refused_and_the_corrected_model_is_the_rebuild(
    run: Learned,
) -> None:
    history = run.records(run.service.changelog("history"))
    latest = {r.key: r for r in history if r.value is not None}
    at = sorted(int(k.split(b"#")[1]) for k in latest if k.startswith(b"m#"))[1]
    genuine = latest[f"m#{at}".encode()]
    state = loads(genuine.value)
    learned_ = champion_record(state["learner"])["learned"]
    learned_["w"] = [40.0 * (-1) ** i for i in range(len(learned_["w"]))]
    forged = Out(genuine.key, json.dumps(state).encode(), partition=genuine.partition)
    where = _restart_with(run, [forged])
    served = _correct_and_wait(run, at + 5)  # its base: the checkpoint before step ``at``
    w = champion_record(served["learner"])["learned"]["w"]
    assert float(np.max(np.abs(w))) < 20.0, w
    assert _refused(run, where) in (["unsigned"], ["bad_signature"])


def _forged_step(run: Learned, seq: int, offset: int, event: str) -> Out:
    rid = request_id("m", event)
    features = [30.0, -30.0, 30.0]
    request = LabelRequest(rid, event, "m", features, 0.5, 1.0, 1, 0.01, 1, 1.0, 1e12, 1.0)
    step = Step(
        "m",
        seq,
        0,
        offset,
        request,
        -concept(features),
        -concept(features),
        "mallory",
        1.0,
        applied_at=1.0,
    )
    return Out(f"m@{offset}".encode(), step.to_json(), partition=0)


def test_a_forged_step_is_refused_and_the_corrected_model_is_the_rebuild(run: Learned) -> None:
    history = run.records(run.service.changelog("history"))
    seqs = [
        json.loads(r.value)["seq"]
        for r in history
        if r.value is not None and b"@" in (r.key or b"")
    ]
    where = _restart_with(
        run,
        [
            _forged_step(run, 45, 10**7, "forged-in-the-middle"),
            _forged_step(run, max(seqs) + 1, 10**7 + 1, "forged-after"),
        ],
    )
    served = _correct_and_wait(run, 41)
    assert served["labels_applied"] == run.states()[-2]["labels_applied"]
    assert sorted(_refused(run, where)) in (
        ["unsigned", "unsigned"],
        ["bad_signature", "bad_signature"],
    )


def _forged_checkpoint(run: Learned, index: int) -> tuple[Out, int]:
    """The ``index``-th checkpoint of ``m`` on the history changelog with forged weights
    (the record, and the seq it is before)."""
    history = run.records(run.service.changelog("history"))
    latest = {r.key: r for r in history if r.value is not None}
    at = sorted(int(k.split(b"#")[1]) for k in latest if k.startswith(b"m#"))[index]
    genuine = latest[f"m#{at}".encode()]
    state = loads(genuine.value)
    learned_ = champion_record(state["learner"])["learned"]
    learned_["w"] = [40.0 * (-1) ** i for i in range(len(learned_["w"]))]
    return Out(genuine.key, json.dumps(state).encode(), partition=genuine.partition), at


def test_without_a_key_a_forged_checkpoint_is_re_derived_or_found_out_never_served(
    service_factory: Callable[..., Any], kafka_io: Any
) -> None:
    """No key: nothing on the changelog can be authenticated, so the learner re-derives the
    history it read back from its oldest checkpoint and compares the result with what its
    members hold. A forged later checkpoint is replaced by its re-derivation (and
    dead-lettered): the correction gives the rebuild. A forged oldest one fails the check:
    the correction is refused (``history_untrusted``), the history starts again. Either
    way the forged weights are never served."""
    run = learned(service_factory, kafka_io, models={"m": MODELS["m"]}, labels=70, key=None)
    forged, at = _forged_checkpoint(run, 1)
    where = _restart_with(run, [forged])
    before = run.version()
    q = run.requests[at + 5]
    run.correct(q["request_id"], -run.answers[q["request_id"]], "carol")
    wait_until(lambda: run.version() == before + 1, 60, "the correction applied")
    served = run.served_equals_rebuild()
    assert float(np.max(np.abs(champion_record(served["learner"])["learned"]["w"]))) < 20.0
    assert _refused(run, where) == ["history_untrusted"]

    forged, at = _forged_checkpoint(run, 0)
    _restart_with(run, [forged])
    served = run.states()[-1]
    q = run.requests[at + 5]
    run.correct(q["request_id"], -run.answers[q["request_id"]], "carol")
    labels = run.topics["labels"]
    wait_until(
        lambda: any(
            d["topic"] == labels and d["reason"] == "history_untrusted" for d in run.dead()
        ),
        60,
        "the correction refused",
    )
    time.sleep(1.0)
    assert run.states()[-1]["learner"] == served["learner"]
    assert run.version() == served["version"]
