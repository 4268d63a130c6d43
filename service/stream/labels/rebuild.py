"""Rebuild a model from its label log (docs/architecture.md, "Exactly-once effects").

``abstain rebuild --model NAME`` reads the label-requests and labels topics from the
beginning and replays the labels, in the labels topic's order, through the learner's own
pure code path (:func:`service.stream.labels.protocol.apply_label`), starting from the configured
initial model. What the learner skips is skipped here too: labels of other models, labels
without a request (``unknown_request``), labels for an expired request (``expired``), second
labels for an answered request (``already_applied``), and updates that would not be finite
(``non_finite``). A label's "now" is its record's broker timestamp, which is when the learner
could first have seen it. A seed order of the model (``abstain models seed``) is adopted at
its place, as the learner adopts it, and the labels after it are applied on top; one the
learner would refuse is skipped with its reason; a rollback order is skipped
(``rollback``: the versions it names are the learner's, not the log's).

The result is the model state the learner holds after the same labels (``updated_at``
aside); ``--publish`` writes it to the models topic, where scorers take it if its version
is newer than what they serve.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.config import Settings
from service.learning import Parts, learner_for
from service.records import (
    BadMessage,
    Correction,
    ModelEnvelope,
    Opinion,
    PendingEntry,
    Rollback,
    Seed,
    parse_label_request,
    parse_labels_record,
)
from service.stream.labels.protocol import Outcome, apply_label
from service.stream.labels.seed import adopt_seed
from service.stream.models.served import initial_envelope

__all__ = ["LogRecord", "Rebuilt", "rebuild_model", "summary"]


@dataclass(frozen=True, slots=True)
class LogRecord:
    """A record read back from a topic."""

    partition: int
    offset: int
    timestamp_ms: int
    value: bytes


@dataclass(slots=True)
class Rebuilt:
    """The rebuilt model and what was skipped, by reason."""

    model: ModelEnvelope
    skipped: Counter[str] = field(default_factory=Counter)


def _requests(
    settings: Settings, name: str, records: Iterable[LogRecord]
) -> dict[str, PendingEntry]:
    """The first valid request per id of model ``name`` (a re-sent one changes nothing)."""
    config = settings.models[name]
    pending: dict[str, PendingEntry] = {}
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        try:
            request = parse_label_request(rec.value, max_bytes=settings.max_message_bytes)
        except BadMessage:
            continue
        if request.model != name or len(request.features) != config.n_inputs:
            continue
        pending.setdefault(request.request_id, PendingEntry(request, rec.partition))
    return pending


def rebuild_model(
    settings: Settings,
    name: str,
    requests: Iterable[LogRecord],
    labels: Iterable[LogRecord],
) -> Rebuilt:
    """Replay ``labels`` (sorted by partition, offset) against ``requests`` for model ``name``."""
    config = settings.models[name]
    pending = _requests(settings, name, requests)
    out = Rebuilt(initial_envelope(name, config))
    for rec in sorted(labels, key=lambda r: (r.partition, r.offset)):
        try:
            label = parse_labels_record(rec.value, max_bytes=settings.max_message_bytes)
            if isinstance(label, Seed):
                if label.target == name == label.model:  # a champion's own line
                    out.model = adopt_seed(
                        settings,
                        out.model,
                        label,
                        (rec.partition, rec.offset),
                        now=rec.timestamp_ms / 1000.0,
                    )
                continue
        except BadMessage as bad:
            out.skipped[bad.reason] += 1
            continue
        if isinstance(label, Rollback):
            out.skipped["rollback"] += label.target == name
            continue
        if isinstance(label, Opinion | Correction):  # corrections: not applied yet
            continue
        if label.model != name:
            continue
        outcome = apply_label(
            config,
            out.model,
            pending.get(label.request_id),
            label,
            rec.offset,
            now=rec.timestamp_ms / 1000.0,
            partition=rec.partition,
            parked=True,  # every label is read exactly once here: no redelivery check
            max_weight=config.weight_cap(settings.max_importance_weight),
        )
        if outcome.outcome is Outcome.APPLIED:
            assert outcome.model is not None  # noqa: S101 - an applied outcome has both
            assert outcome.pending is not None  # noqa: S101
            out.model = outcome.model
            pending[label.request_id] = outcome.pending
        else:
            out.skipped[str(outcome.reason)] += 1
    return out


def summary(rebuilt: Rebuilt) -> dict[str, Any]:
    """What ``abstain rebuild`` prints: version, rho, ||w|| and the skipped labels."""
    model = rebuilt.model
    learner = learner_for(dict(model.learner), Parts())  # any record, wrapped or not
    served_w = learner.w
    return {
        "model": model.model,
        "version": model.version,
        "labels_applied": model.labels_applied,
        "labels_offset": model.labels_offset,
        "rho": float(learner.rho),
        "weight_norm": None if served_w is None else float(np.linalg.norm(served_w)),
        "changes_detected": learner.changes_detected,
        "takeovers": learner.takeovers,
        "skipped": dict(sorted(rebuilt.skipped.items())),
    }
