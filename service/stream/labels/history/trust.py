"""What a history read back must agree with before a correction uses it.

The learner's history (:mod:`~.index`) is a changelog: a topic others may write. With
``snapshot_key`` its records are authenticated when read back
(:mod:`service.stream.labels.tables`); whatever the key, a step read back names the labels
record it came from (``partition``, ``offset``) and its notes the corrections applied to
it, so the labels topic, which the learner owns, says whether they happened:
:func:`refuted` compares them. Without a key the checkpoints cannot be authenticated: they
are re-derived instead, from the oldest one, and the result must be the state each member
holds now (:func:`same_state`); the learner then writes the checkpoints it derived.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from service.records import BadMessage, Correction, Label, ModelEnvelope
from service.records.history import Step
from service.records.labels import parse_labels_record

__all__ = ["refuted", "same_state"]


def refuted(steps: Sequence[Step], records: Mapping[int, bytes | None]) -> list[tuple[Step, str]]:
    """The ``steps`` the labels records (``records``: offset -> value, of the steps'
    partition; None: a record the topic no longer holds, its retention passed, which cannot
    be checked) do not bear out, each with what is wrong: its label is not a label of its
    request with the label it was first given, or a note is not a correction of it to its
    label by its author in its role.

    >>> from service.records import LabelRequest
    >>> from service.records.history import Note
    >>> req = LabelRequest("r1", "e1", "m", [1.0], 0.5, 1.0, 1, 0.25, 3, 10.0, 70.0, 0.4)
    >>> step = Step("m", 0, 0, 7, req, 1, 1, "alice", 11.0, 11.0)
    >>> refuted([step], {7: Label("r1", "m", 1, "alice", 11.0).to_json()})
    []
    >>> refuted([step], {7: Label("r2", "m", 1, "alice", 11.0).to_json()})[0][1]
    'labels offset 7 holds no label 1 of request r1 of model m'
    >>> fixed = step.corrected(Note(9, "bob", "reviewer", -1, 12.0, id="c9"))
    >>> refuted([fixed], {7: Label("r1", "m", 1, "alice", 11.0).to_json()})[0][1]
    'labels offset 9 holds no correction c9 of request r1 to -1 by bob (reviewer)'
    >>> refuted([fixed], {7: None, 9: None})  # gone with the topic's retention
    []
    """
    out = []
    for step in steps:
        gone = step.offset in records and records[step.offset] is None
        why = None if gone else _label_refutes(step, records.get(step.offset))
        for note in step.notes:
            if why is not None:
                break
            if note.offset in records and records[note.offset] is None:
                continue  # no longer in the topic
            found = _parsed(records.get(note.offset))
            if not (
                isinstance(found, Correction)
                and (found.request_id, found.model, found.label, found.by, found.role)
                == (step.request_id, step.group, note.label, note.by, note.role)
                and (note.id is None or found.id == note.id)
            ):
                why = (
                    f"labels offset {note.offset} holds no correction {note.id or ''} of "
                    f"request {step.request_id} to {note.label} by {note.by} "
                    f"({note.role})"
                ).replace("  ", " ")
        if why is not None:
            out.append((step, why))
    return out


def _label_refutes(step: Step, raw: bytes | None) -> str | None:
    found = _parsed(raw)
    if isinstance(found, Label) and (found.request_id, found.model, found.label) == (
        step.request_id,
        step.group,
        step.given,
    ):
        return None
    return (
        f"labels offset {step.offset} holds no label {step.given} of request "
        f"{step.request_id} of model {step.group}"
    )


def _parsed(raw: bytes | None) -> object:
    if raw is None:
        return None
    try:
        return parse_labels_record(raw)
    except BadMessage:
        return None


def same_state(a: ModelEnvelope, b: ModelEnvelope) -> bool:
    """True if ``a`` and ``b`` hold the same learned state (what the labels made of them;
    versions, offsets and times aside)."""
    return (a.pipeline, a.learner, a.estimate, a.labels_applied, a.iw_loss, a.iw_weight) == (
        b.pipeline,
        b.learner,
        b.estimate,
        b.labels_applied,
        b.iw_loss,
        b.iw_weight,
    )
