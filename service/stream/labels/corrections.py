"""A correction, from the record to the versions it makes: checked, prepared, finished.

The learner (:class:`~service.stream.labels.joiner.LabelJoiner`) and ``abstain rebuild``
(:mod:`~service.stream.labels.rebuild`) take a :class:`~service.records.Correction` through
the same three pure steps, so both end with the same model:

1. :func:`prepare` checks it against the group's history and the request's pending entry
   (:func:`~service.stream.labels.history.correction_refusal`; :class:`BadMessage` with the
   reason) and says what is to be done: nothing (a redelivery of a correction that changed
   nothing), only the step's note (a correction equal to the label in force: a reviewer's
   confirmation, after which the author can no longer change the label), or a
   :class:`Work`: the checkpoint before the corrected step and the steps from there on, with
   the correction in force;
2. :func:`~service.stream.labels.history.rederive` applies those steps again (the learner
   does it off the event loop: up to ``reach + every`` labels);
3. :func:`finish` makes each member's next version of what came out: version + 1, the
   correction's place in the labels log, its time, where the reach begins. A member whose
   version already holds the correction (a redelivery after a crash between the writes) is
   left out.

The learner writes the step and the checkpoints rewritten first, durably, then the members'
versions (docs/corrections.md): a redelivered correction whose note is on the step is done
again for the members still without it, with the same result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from service.config import Settings
from service.records import BadMessage, Correction, ModelEnvelope, Note, PendingEntry, Step
from service.stream.labels.history import History, Rederived, correction_refusal

__all__ = ["Kind", "Work", "finish", "kind_of", "prepare"]

#: what a correction did (``abstain_corrections_total{outcome}``)
Kind = Literal["changed", "withdrawn", "unchanged"]


@dataclass(frozen=True, slots=True)
class Work:
    """A correction to carry out: ``step`` is the corrected step (the correction in force,
    its note added), ``base`` the members' states at checkpoint ``base_seq`` (at or before
    it), ``steps`` every kept step from there on with ``step`` in its place, ``keep`` the
    checkpoints after it (rewritten with the states the correction gives them)."""

    group: str
    step: Step
    base_seq: int
    base: dict[str, ModelEnvelope]
    steps: list[Step]
    keep: tuple[int, ...]
    redo: bool = False  # the step already carries this correction (a redelivery)


def kind_of(note: Note) -> Kind:
    """``changed``, ``withdrawn`` or ``unchanged``."""
    if not note.changed:
        return "unchanged"
    return "withdrawn" if note.label is None else "changed"


def prepare(
    history: History,
    correction: Correction,
    pending: PendingEntry | None,
    *,
    offset: int,
) -> Work | Step | None:
    """What ``correction`` (read at labels ``offset``) is to do (module docstring): None
    (already done), a :class:`~service.records.Step` (only its note to write: the label in
    force stays) or a :class:`Work`. :class:`BadMessage` when it is refused."""
    group = correction.model
    reach, _ = history.reach(group)
    step = history.step(group, correction.request_id)
    if step is not None and step.noted(offset):  # redelivered: redo what it changed
        note = next(n for n in step.notes if n.offset == offset)
        return _work(history, step, redo=True) if note.changed else None
    refusal = correction_refusal(correction, step, pending, reach=reach)
    if refusal is not None:
        raise BadMessage(*refusal)
    assert step is not None  # noqa: S101 - no refusal: the step is kept
    note = Note(offset, correction.by, correction.role, correction.label, correction.ts,
                changed=correction.label != step.label)  # fmt: skip
    corrected = step.corrected(note)
    if not note.changed:
        return corrected
    return _work(history, corrected, redo=False)


def _work(history: History, step: Step, *, redo: bool) -> Work:
    group = step.group
    base = history.base(group, step.seq)
    if base is None:  # every kept step has a checkpoint at or before it (History.plan)
        raise BadMessage("beyond_reach", f"no checkpoint of model {group!r} before the label "
                         f"of request {step.request_id}")  # fmt: skip
    base_seq, states = base
    steps = [step if s.seq == step.seq else s for s in history.steps_from(group, base_seq)]
    keep = tuple(history.checkpoints_after(group, step.seq))
    return Work(group, step, base_seq, states, steps, keep, redo)


def finish(
    rederived: Rederived,
    current: Mapping[str, ModelEnvelope],
    *,
    where: tuple[int, int],
    now: float,
    reach_from: int,
) -> list[ModelEnvelope]:
    """The next version of each member of ``current`` whose version does not hold the
    correction read at labels ``where`` yet: the re-derived state, at version + 1, with
    the correction's place in the log, its time and where the reach begins."""
    partition, offset = where
    out = []
    for name, now_serving in current.items():
        state = rederived.states.get(name)
        if state is None or now_serving.applied(partition, offset):
            continue
        labels_offset = offset
        if partition == now_serving.labels_partition:
            labels_offset = max(offset, now_serving.labels_offset)
        out.append(state.replace(version=now_serving.version + 1, labels_offset=labels_offset,
                                 labels_partition=partition, updated_at=now,
                                 corrections_from=reach_from))  # fmt: skip
    return out


def members_of(settings: Settings, group: str, work: Work) -> list[str]:
    """The members a correction of ``group`` writes: those of the checkpoint it starts
    from (the group's members since the history began)."""
    return [m for m in settings.group(group) if m in work.base]
