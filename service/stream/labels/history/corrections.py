"""A correction, from the record to the versions it makes: checked, noted, derived, finished.

The learner (:class:`~service.stream.labels.corrector.Corrector`) and ``abstain rebuild``
(:mod:`~service.stream.labels.rebuild`) take a :class:`~service.records.Correction` through
the same pure steps, so both end with the same model:

1. :func:`note` checks it against the group's history and the request's pending entry
   (:func:`correction_refusal`; :class:`BadMessage` with the reason) and returns the step
   with the correction noted on it: its label in force changed (or confirmed: a reviewer's
   correction equal to the label in force, after which the author can no longer change
   it). A copy of a correction already noted (its ``id`` known, read at another offset) is
   refused as ``replayed``; the same record read again (a redelivery) is ``redelivered``;
2. :func:`job` says what to derive: the checkpoint before the earliest step whose label
   changed and every step from there on (:func:`~.derive.rederive` applies them again);
   corrections noted while a derivation runs are applied by the next one, together;
3. :func:`finish` makes each member's next version of what came out: its version plus one
   per correction it did not hold yet (a model holds the corrections read up to its
   ``corrected_to``), the place of the newest of them in the labels log, the time, where
   the reach begins. A member that already holds them (a redo after a crash between the
   writes) is left out.

The learner writes the noted step first (durable before the correction's offset is
committed), then, once derived, the checkpoints rewritten (durably), then the members'
versions (docs/learn/corrections.md): after a crash, the notes a member does not hold are
derived again, with the same result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from service.records import BadMessage, Correction, ModelEnvelope, PendingEntry, Reason
from service.records.history import Note, Step
from service.stream.labels.history.derive import Job
from service.stream.labels.history.index import History

__all__ = ["Kind", "Noted", "correction_refusal", "finish", "job", "kind_of", "note"]

#: what a correction did (``abstain_corrections_total{outcome}``)
Kind = Literal["changed", "withdrawn", "unchanged"]


def kind_of(note: Note) -> Kind:
    """``changed``, ``withdrawn`` or ``unchanged``."""
    if not note.changed:
        return "unchanged"
    return "withdrawn" if note.label is None else "changed"


@dataclass(frozen=True, slots=True)
class Noted:
    """A correction on its step: ``step`` carries ``note`` (written by the caller unless
    ``redelivered``: the record was read before and its note is there already)."""

    step: Step
    note: Note
    redelivered: bool = False


def correction_refusal(
    correction: Correction,
    step: Step | None,
    pending: PendingEntry | None,
    *,
    reach: int,
    untrusted_below: int = -1,
) -> tuple[Reason, str] | None:
    """Why ``correction`` cannot be applied (None: it can), given the ``step`` of its
    request in the group's history and its ``pending`` entry (either may be gone);
    ``untrusted_below``: the labels offset below which the history read back failed its
    checks (:meth:`~.index.History.untrusted_below`).

    >>> from service.records import LabelRequest
    >>> req = LabelRequest("r1", "e1", "m", [1.0], 0.5, 1.0, 1, 0.25, 3, 10.0, 70.0, 0.4)
    >>> step = Step("m", 0, 0, 7, req, 1, 1, "alice", 11.0, 11.0)
    >>> correction_refusal(Correction("r1", "m", -1, "bob", "author", 12.0), step, None, reach=9)
    (<Reason.NOT_AUTHOR: 'not_author'>, "request r1 of model 'm' was answered by 'alice', not 'bob': only its author or a reviewer can correct it")
    >>> correction_refusal(Correction("r1", "m", -1, "bob", "reviewer", 12.0), step, None, reach=9)
    """  # noqa: E501
    rid, model = correction.request_id, correction.model
    if step is None:
        if not reach:
            return Reason.BEYOND_REACH, f"corrections are off for model {model!r} (reach 0)"
        if pending is None:
            return Reason.UNKNOWN_REQUEST, (
                f"no request {rid} of model {model!r} among its last {reach} labels or its "
                "open requests"
            )
        if not pending.applied:
            return Reason.NOT_ANSWERED, f"request {rid} of model {model!r} has no answer yet"
        applied = pending.applied_offset if pending.applied_offset is not None else -1
        if untrusted_below >= 0 and applied < untrusted_below:
            return Reason.HISTORY_UNTRUSTED, (
                f"the history of model {model!r} before labels offset {untrusted_below} "
                f"failed the learner's checks when read back: the label of request {rid} "
                "cannot be re-derived from a state the learner trusts"
            )
        return Reason.BEYOND_REACH, (
            f"the label of request {rid} is older than the last {reach} labels model "
            f"{model!r} keeps: a correction can no longer reach it"
        )
    if correction.role == "author":
        if correction.by != step.labelled_by:
            return Reason.NOT_AUTHOR, (
                f"request {rid} of model {model!r} was answered by {step.labelled_by!r}, not "
                f"{correction.by!r}: only its author or a reviewer can correct it"
            )
        if step.reviewed:
            return Reason.NOT_AUTHOR, (
                f"a reviewer has decided request {rid} of model {model!r}: only a reviewer "
                "can change it now"
            )
    return None


def note(
    history: History, correction: Correction, pending: PendingEntry | None, *, offset: int
) -> Noted:
    """``correction`` (read at labels ``offset``) noted on its step (module docstring).
    :class:`BadMessage` when it is refused."""
    group = correction.model
    step = history.step(group, correction.request_id)
    if step is not None and step.noted(offset):  # read again: its note is there
        found = next(n for n in step.notes if n.offset == offset)
        return Noted(step, found, redelivered=True)
    if step is not None and step.knows(correction.id):
        raise BadMessage(
            Reason.REPLAYED,
            f"correction {correction.id} of request "
            f"{correction.request_id} of model {group!r} was applied already "
            "(this is a copy of it)",
        )
    reach, _ = history.reach(group)
    refusal = correction_refusal(
        correction, step, pending, reach=reach, untrusted_below=history.untrusted_below(group)
    )
    if refusal is not None:
        raise BadMessage(*refusal)
    assert step is not None  # noqa: S101 - no refusal: the step is kept
    added = Note(
        offset,
        correction.by,
        correction.role,
        correction.label,
        correction.ts,
        changed=correction.label != step.label,
        id=correction.id,
    )
    if added.changed and history.base_seq(group, step.seq) is None:
        raise BadMessage(
            Reason.BEYOND_REACH,
            f"no checkpoint of model {group!r} before the label of request {correction.request_id}",
        )
    return Noted(step.corrected(added), added)


def job(history: History, group: str, since: int) -> tuple[int, Job] | None:
    """What re-derives ``group`` once the labels of its steps from ``since`` on changed:
    the checkpoint before step ``since`` (its seq) and the :class:`~.derive.Job` from it to
    the newest step, returning the states before each later checkpoint. None when no
    checkpoint precedes ``since`` (nothing kept to start from)."""
    base = history.raw_base(group, since)
    if base is None:
        return None
    at, states = base
    keep = tuple(history.checkpoints_after(group, since))
    return at, Job(group, states, history.raw_steps(group, at), keep)


def finish(
    states: Mapping[str, ModelEnvelope],
    current: Mapping[str, ModelEnvelope],
    *,
    corrections: Sequence[int],
    partition: int,
    now: float,
    reach_from: int,
) -> list[ModelEnvelope]:
    """The next version of each member of ``current`` that does not hold every correction
    read at the labels offsets ``corrections`` (of ``partition``) yet: its derived state
    from ``states``, one version further per correction it did not hold, the newest
    correction's place in the log, ``now`` and where the reach begins."""
    if not corrections:
        return []
    newest = max(corrections)
    out = []
    for name, serving in current.items():
        state = states.get(name)
        held = serving.corrected_to if serving.labels_partition == partition else -1
        count = sum(1 for c in corrections if c > held)
        if state is None or not count:
            continue
        labels_offset = newest
        if partition == serving.labels_partition:
            labels_offset = max(newest, serving.labels_offset)
        out.append(
            state.replace(
                version=serving.version + count,
                labels_offset=labels_offset,
                labels_partition=partition,
                updated_at=now,
                corrections_from=reach_from,
                corrected_to=newest,
                line_from=serving.line_from,
            )
        )
    return out
