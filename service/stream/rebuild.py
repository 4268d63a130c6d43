"""Rebuild a model from its label log (DESIGN section 3).

``abstain rebuild --model NAME`` reads the label-requests and labels topics from the
beginning and replays the labels, in the labels topic's order, through the learner's own
pure code path (:func:`service.stream.handlers.apply_label`), starting from the configured
initial model. What the learner skips is skipped here too: labels of other models, labels
without a request (``unknown_request``), labels for an expired request (``expired``), second
labels for an answered request (``already_applied``), and updates that would not be finite
(``non_finite``). A label's "now" is its record's broker timestamp, which is when the learner
could first have seen it.

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
from service.stream import handlers
from service.stream.records import BadMessage, parse_label, parse_label_request

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
    """The rebuilt state and what was skipped, by reason."""

    state: dict[str, Any]
    skipped: Counter[str] = field(default_factory=Counter)


def rebuild_model(
    settings: Settings,
    name: str,
    requests: Iterable[LogRecord],
    labels: Iterable[LogRecord],
) -> Rebuilt:
    """Replay ``labels`` (sorted by partition, offset) against ``requests`` for model ``name``."""
    config = settings.models[name]
    pending: dict[str, dict[str, Any]] = {}
    for rec in sorted(requests, key=lambda r: (r.partition, r.offset)):
        try:
            request = parse_label_request(rec.value, max_bytes=settings.max_message_bytes)
        except BadMessage:
            continue
        if request.model != name or len(request.features) != config.n_inputs:
            continue
        entry = handlers.store_request(pending.get(request.request_id), request, rec.partition)
        if entry is not None:
            pending[request.request_id] = entry
    out = Rebuilt(handlers.initial_state(name, config))
    for rec in sorted(labels, key=lambda r: (r.partition, r.offset)):
        try:
            label = parse_label(rec.value, max_bytes=settings.max_message_bytes)
        except BadMessage as bad:
            out.skipped[bad.reason] += 1
            continue
        if label.model != name:
            continue
        outcome = handlers.apply_label(
            config,
            out.state,
            pending.get(label.request_id),
            label,
            rec.offset,
            now=rec.timestamp_ms / 1000.0,
            parked=True,  # every label is read exactly once here: no redelivery check
        )
        if outcome.kind == "applied":
            assert outcome.state is not None  # noqa: S101
            assert outcome.pending is not None  # noqa: S101
            out.state = outcome.state
            pending[label.request_id] = outcome.pending
        else:
            out.skipped[outcome.reason] += 1
    return out


def summary(rebuilt: Rebuilt) -> dict[str, Any]:
    """What ``abstain rebuild`` prints: version, rho, ||w|| and the skipped labels."""
    served_w = rebuilt.state["learner"]["learned"].get("w")
    return {
        "model": rebuilt.state["model"],
        "version": rebuilt.state["version"],
        "labels_applied": rebuilt.state["labels_applied"],
        "labels_offset": rebuilt.state["labels_offset"],
        "rho": rebuilt.state["learner"]["learned"]["rho"],
        "weight_norm": None if served_w is None else float(np.linalg.norm(served_w)),
        "skipped": dict(sorted(rebuilt.skipped.items())),
    }
