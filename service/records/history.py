"""The learner's history of applied labels: what a correction reaches back to.

A :class:`Step` is one label as the learner applied it to a model group (the champion and
its shadows, under the champion's name): the request it answered, the label in force (the
label first given, or what later corrections made of it; ``None`` once withdrawn), who gave
it and when it was applied, its place in the labels log (``partition``, ``offset``) and its
place among the group's applied labels (``seq``). The learner keeps the group's last steps
and checkpoints of its members' states in the ``history`` table
(:mod:`service.stream.labels.history`); like every table, its changelog is input and is
checked here as strictly as any record.

>>> from service.records.wire import LabelRequest
>>> req = LabelRequest("r1", "e1", "m", [1.0, 2.0], 0.5, 1.0, 1, 0.25, 3, 10.0, 70.0, 0.4)
>>> step = Step("m", 4, 0, 17, req, -1, -1, "alice", 12.0, 12.5)
>>> parse_step(step.to_json()) == step
True
>>> fixed = step.corrected(Note(20, "bob", "reviewer", 1, 30.0, id="c-20"))
>>> fixed.label, fixed.given, fixed.reviewed, fixed.noted(20), parse_step(fixed.to_json()) == fixed
(1, -1, True, True, True)
>>> fixed.knows("c-20"), fixed.label_at(19), fixed.label_at(20)
(True, -1, 1)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final

from service.records.codec import (
    BadMessage,
    decode_object,
    dumps,
    field,
    ident,
    integer,
    number,
    obj,
    text,
)
from service.records.labels import ROLES, Role
from service.records.wire import LabelRequest, label_request_from_dict

__all__ = ["HISTORY_FORMAT", "MAX_NOTES", "MAX_PAST", "Note", "Step", "parse_step"]

HISTORY_FORMAT: Final = "abstain.history-step"
#: corrections remembered on one step (a record stays bounded however often it is corrected)
MAX_NOTES: Final = 64
#: ids of the corrections forgotten beyond MAX_NOTES that a step still knows (a copy of one
#: of them is a replay); the oldest go first
MAX_PAST: Final = 1024
_MAX_COUNTER: Final = 2**53


@dataclass(frozen=True, slots=True)
class Note:
    """A correction applied to a step: read at labels ``offset``, by ``by`` as ``role``,
    making the label ``label`` (None: withdrawn); ``changed``: False when it left the label
    as it was (a reviewer's confirmation)."""

    offset: int
    by: str
    role: Role
    label: int | None
    ts: float | None
    changed: bool = True
    id: str | None = None  # the correction's id (None: a note written before ids existed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "by": self.by,
            "role": self.role,
            "label": self.label,
            "ts": self.ts,
            "changed": self.changed,
            "id": self.id,
        }


@dataclass(frozen=True, slots=True)
class Step:
    """One applied label of model group ``group`` (module docstring)."""

    group: str
    seq: int
    partition: int
    offset: int
    request: LabelRequest
    label: int | None  # the label in force; None: withdrawn
    given: int  # the label first given
    labelled_by: str
    ts: float | None
    applied_at: float
    notes: tuple[Note, ...] = ()
    past: tuple[str, ...] = ()  # ids of the corrections forgotten beyond MAX_NOTES

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def reviewed(self) -> bool:
        """True once a reviewer corrected (or confirmed) it: its author can no longer."""
        return any(n.role == "reviewer" for n in self.notes)

    def noted(self, offset: int) -> bool:
        """True if the correction read at labels ``offset`` is already applied to it."""
        return any(n.offset == offset for n in self.notes)

    def knows(self, correction_id: str) -> bool:
        """True if a correction of this id was applied to it (at whatever offset)."""
        return correction_id in self.past or any(n.id == correction_id for n in self.notes)

    def label_at(self, through: int) -> int | None:
        """The label in force once the corrections read up to labels offset ``through``
        are applied (what a model that holds those corrections learned)."""
        label: int | None = self.given
        for note in self.notes:
            if note.offset <= through:
                label = note.label
        return label

    def corrected(self, note: Note) -> Step:
        """This step with ``note``'s label in force (the oldest notes beyond
        :data:`MAX_NOTES` are forgotten, their ids kept in ``past``; the newest always
        stays)."""
        notes = (*self.notes, note)
        gone = [n.id for n in notes[:-MAX_NOTES] if n.id is not None]
        past = (*self.past, *gone)[-MAX_PAST:]
        return dataclasses.replace(self, label=note.label, notes=notes[-MAX_NOTES:], past=past)

    def to_json(self) -> bytes:
        return dumps(
            {
                "format": HISTORY_FORMAT,
                "group": self.group,
                "seq": self.seq,
                "partition": self.partition,
                "offset": self.offset,
                "request": self.request.to_dict(),
                "label": self.label,
                "given": self.given,
                "labelled_by": self.labelled_by,
                "ts": self.ts,
                "applied_at": self.applied_at,
                "notes": [n.to_dict() for n in self.notes],
                "past": list(self.past),
            }
        )


def _label(record: dict[str, Any], name: str, *, allow_none: bool) -> int | None:
    value = field(record, name)
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value not in (1, -1):
        raise BadMessage("bad_label", f"{name} must be 1 or -1, got {value!r}")
    return value


def _counter(record: dict[str, Any], name: str) -> int:
    value = integer(record, name)
    if not 0 <= value < _MAX_COUNTER:
        raise BadMessage("schema", f"{name} out of range: {value}")
    return value


def _short(record: dict[str, Any], name: str) -> str:
    value = record.get(name, "")
    if not isinstance(value, str) or len(value) > 256:
        raise BadMessage("schema", f"field {name!r} must be a short string")
    return text(value, f"field {name!r}")


def _note(record: Any) -> Note:
    record = obj(record)
    role = record.get("role")
    if role not in ROLES:
        raise BadMessage("schema", f"a note's role must be one of {ROLES}, got {role!r}")
    ts = number(record, "ts") if record.get("ts") is not None else None
    changed = record.get("changed", True)
    if not isinstance(changed, bool):
        raise BadMessage("schema", "a note's 'changed' must be true or false")
    cid = record.get("id")
    if cid is not None and (not isinstance(cid, str) or not 0 < len(cid) <= 80):
        raise BadMessage("schema", "a note's 'id' must be a short string")
    return Note(
        _counter(record, "offset"),
        _short(record, "by"),
        role,
        _label(record, "label", allow_none=True),
        ts,
        changed,
        cid,
    )


def _past(record: dict[str, Any]) -> tuple[str, ...]:
    past = record.get("past", [])
    if not isinstance(past, list) or len(past) > MAX_PAST:
        raise BadMessage("schema", f"field 'past' must be a list of at most {MAX_PAST}")
    if not all(isinstance(i, str) and 0 < len(i) <= 80 for i in past):
        raise BadMessage("schema", "field 'past' must hold short strings")
    return tuple(past)


def parse_step(raw: bytes) -> Step:
    """Check and decode a step of the ``history`` table."""
    record = decode_object(raw)
    if record.get("format") != HISTORY_FORMAT:
        raise BadMessage("schema", "not a history step (unknown format)")
    notes = record.get("notes", [])
    if not isinstance(notes, list) or len(notes) > MAX_NOTES:
        raise BadMessage("schema", f"field 'notes' must be a list of at most {MAX_NOTES}")
    given = _label(record, "given", allow_none=False)
    assert given is not None  # noqa: S101 - allow_none=False
    ts = number(record, "ts") if record.get("ts") is not None else None
    return Step(
        group=ident(record, "group"),
        seq=_counter(record, "seq"),
        partition=_counter(record, "partition"),
        offset=_counter(record, "offset"),
        request=label_request_from_dict(obj(field(record, "request"))),
        label=_label(record, "label", allow_none=True),
        given=given,
        labelled_by=_short(record, "labelled_by"),
        ts=ts,
        applied_at=number(record, "applied_at"),
        notes=tuple(_note(n) for n in notes),
        past=_past(record),
    )
