"""Label -> model: the learner's side of the stream as plain functions, no Kafka.

A label joins its pending request (stored by :func:`store_request` when the request was
consumed) and updates the model at its CURRENT (w, rho) (:func:`apply_label`). A label that
overtakes its request waits in the orphan table (:func:`park_label`); expired requests and
orphans are swept per partition (:func:`sweep_expired`, :func:`sweep_orphans`). The model
state format is described in :mod:`service.stream.handlers`, which re-exports these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.config import ModelConfig
from service.learning import Pipeline, learner_from_state
from service.stream.records import Label, LabelRequest, encode_state

__all__ = [
    "LabelOutcome",
    "apply_label",
    "park_label",
    "store_request",
    "sweep_expired",
    "sweep_orphans",
    "unpark_label",
    "zero_one_d_loss",
]


def zero_one_d_loss(decided: int, label: int, cost: float) -> float:
    """The 0-d-1 loss of a served decision: 0 right, 1 wrong, ``cost`` if rejected.

    >>> zero_one_d_loss(1, 1, 0.2), zero_one_d_loss(-1, 1, 0.2), zero_one_d_loss(0, -1, 0.2)
    (0.0, 1.0, 0.2)
    """
    if decided == 0:
        return cost
    return 0.0 if decided == label else 1.0


def store_request(
    existing: Mapping[str, Any] | None, request: LabelRequest, partition: int
) -> dict[str, Any] | None:
    """The pending-table value for a new label request, or None to keep ``existing``
    (a re-sent request must not reset an answered one)."""
    if existing is not None:
        return None
    entry = request.to_dict()
    entry.update(partition=partition, applied=False)
    return entry


@dataclass(frozen=True, slots=True)
class LabelOutcome:
    """What a label did. ``kind``: "applied", "ignored" (redelivered: no effect, no dead
    letter), "dead" (dead-lettered with ``reason``), "refused" (the update was not finite)."""

    kind: str
    reason: str = ""
    detail: str = ""
    state: dict[str, Any] | None = None  # new model state when applied
    encoded: bytes | None = None  # ... and its wire form (encode_state)
    pending: dict[str, Any] | None = None  # new pending entry when applied
    iw_loss: float = 0.0
    turnaround: float = 0.0


def apply_label(
    config: ModelConfig,
    state: dict[str, Any],
    pending: Mapping[str, Any] | None,
    label: Label,
    offset: int,
    *,
    now: float,
    parked: bool = False,
) -> LabelOutcome:
    """Join a label with its pending request and update the model at its CURRENT (w, rho).

    The standardiser learns from the labelled example first, then the learner updates on the
    transformed example. Returns a new state (the input is never mutated).

    ``parked``: the label was consumed earlier (before its request, see :func:`park_label`)
    and is applied now that the request arrived, so its offset may lie below
    ``labels_offset`` without being a redelivery."""
    if not parked and offset <= int(state["labels_offset"]):
        return LabelOutcome("ignored", "redelivered", f"offset {offset} already applied")
    if pending is None or pending.get("model") != label.model:
        return LabelOutcome("dead", "unknown_request", f"no pending request {label.request_id}")
    redo = False
    if pending.get("applied"):
        mine = pending.get("applied_offset") == offset
        # the applied mark is made durable before the model is written (app._join); after a
        # crash between the two, the mark survives and the model lacks this label: redo it
        redo = mine and int(state["version"]) < int(pending.get("applied_version", 0))
        if mine and not redo:
            return LabelOutcome("ignored", "redelivered", f"offset {offset} already applied")
        if not redo:
            return LabelOutcome("dead", "already_applied", f"request {label.request_id} answered")
    if now > float(pending["expires_at"]) and not redo:  # it was in time when first applied
        return LabelOutcome("dead", "expired", f"request {label.request_id} expired")
    x = np.asarray(pending["features"], dtype=np.float64)
    pipeline = Pipeline.from_state(state["pipeline"])
    learner = learner_from_state(state["learner"])
    try:
        with np.errstate(all="ignore"):  # overflow is detected below and refused, not warned
            pipeline.learn(x)
            z = pipeline.transform(x)
            learner.update(z, label.label)
        new_pipeline = pipeline.to_state()
        new_learner = learner.to_state()
    except ValueError as exc:
        return LabelOutcome("refused", "non_finite", f"update refused: {exc}")
    w = getattr(learner, "w", None)  # kernel learners keep a support set instead
    if not ((w is None or np.all(np.isfinite(w))) and math.isfinite(float(learner.rho))):
        return LabelOutcome("refused", "non_finite", "update gave non-finite parameters")
    p = float(pending["query_probability"])
    loss = zero_one_d_loss(int(pending["decided_label"]), label.label, config.cost) / p
    new_state = {
        **state,
        "version": int(state["version"]) + 1,
        "pipeline": new_pipeline,
        "learner": new_learner,
        "labels_offset": max(offset, int(state["labels_offset"])),
        "labels_applied": int(state["labels_applied"]) + 1,
        "iw_loss": float(state["iw_loss"]) + loss,
        "iw_weight": float(state["iw_weight"]) + 1.0 / p,
        "updated_at": now,
    }
    try:  # the standardiser's running sums can overflow without an error: check it all
        encoded = encode_state(new_state)
    except ValueError:
        return LabelOutcome("refused", "non_finite", "update gave a non-finite model state")
    new_pending = {
        **pending,
        "applied": True,
        "label": label.label,
        "labelled_by": label.labelled_by,
        "applied_at": now,
        "applied_offset": offset,
        "applied_version": new_state["version"],
    }
    return LabelOutcome(
        "applied",
        state=new_state,
        encoded=encoded,
        pending=new_pending,
        iw_loss=loss,
        turnaround=max(0.0, now - float(pending["requested_at"])),
    )


def sweep_expired(
    entries: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    partition: int,
    now: float,
    grace: float = 0.0,
) -> tuple[list[str], list[str]]:
    """Pending entries of ``partition`` more than ``grace`` seconds past their expiry: (keys to
    drop, models of those never answered, for the expired counter). Within the grace period a
    late label is still recognised and dead-lettered as ``expired``."""
    drop: list[str] = []
    unanswered: list[str] = []
    for key, entry in entries:
        if entry.get("partition") != partition:
            continue
        if now > float(entry["expires_at"]) + grace:
            drop.append(key)
            if not entry.get("applied"):
                unanswered.append(str(entry["model"]))
    return drop, unanswered


def park_label(
    existing: Mapping[str, Any] | None, label: Label, offset: int, partition: int, *, now: float
) -> dict[str, Any] | None:
    """An orphan-table entry for a label whose request has not been consumed yet (labels and
    requests travel on two topics, so a fast answer can overtake its request). None when
    ``existing`` already holds this very message (a redelivery)."""
    if existing is not None and int(existing["offset"]) == offset:
        return None
    return {
        "request_id": label.request_id,
        "model": label.model,
        "label": label.label,
        "labelled_by": label.labelled_by,
        "ts": label.ts,
        "offset": offset,
        "partition": partition,
        "parked_at": now,
    }


def unpark_label(entry: Mapping[str, Any]) -> tuple[Label, int]:
    """The label and its offset back from an orphan-table entry."""
    label = Label(
        request_id=str(entry["request_id"]),
        model=str(entry["model"]),
        label=int(entry["label"]),
        labelled_by=str(entry.get("labelled_by", "")),
        ts=entry.get("ts"),
    )
    return label, int(entry["offset"])


def sweep_orphans(
    entries: Sequence[tuple[str, Mapping[str, Any]]], *, partition: int, now: float, wait: float
) -> list[str]:
    """Keys of parked labels of ``partition`` whose request did not arrive within ``wait``
    seconds: they are dead-lettered as ``unknown_request``."""
    return [
        key
        for key, entry in entries
        if entry.get("partition") == partition and now - float(entry["parked_at"]) > wait
    ]
