r"""How far back a correction reaches, and what it makes of the model: the learner's history.

A correction (:class:`~service.records.Correction`) supersedes the label a request received.
The learner makes every member of the model's group (the champion and its shadows) what it
would be had the corrected label been the one given: it restores a checkpoint of their
states taken before that label and applies every later label again, in the order it first
applied them, with the corrected one in force (:func:`rederive`). A withdrawn label is
left out; a correction equal to the label in force changes nothing.

To do so the learner keeps, per group, in its ``history`` table (changelog
``<app_id>-history-changelog``, co-partitioned with the label topics):

- the group's last applied labels as :class:`~service.records.Step`\ s, key
  ``<group>@<labels offset>``, numbered ``seq`` = 0, 1, 2, ... in the order they were applied
  (a label that overtook its request is applied, and numbered, when the request comes);
- a checkpoint of every member's state before every ``every``-th step (and before the first
  step kept), key ``<member>#<seq>``: a :class:`~service.records.ModelEnvelope`.

It keeps at least ``corrections.reach`` steps (at most ``reach + every - 1``): when the steps
from the second checkpoint on number ``reach``, the first checkpoint and the steps before the
second are deleted. Each version of a member says where its reach begins
(``ModelEnvelope.corrections_from``: the labels offset of the oldest step kept). The history
starts again (everything of the group deleted) at a rollback or seed order of any member, and
when the members of the group or its labels partition change: a correction never reaches
across a state the labels did not make.

This module is pure (no Kafka, no clock): the learner (:mod:`~service.stream.labels.joiner`)
writes through a changelog table, ``abstain rebuild`` and the replay through a dict, with the
same code, so a model corrected on the stream equals its offline replay.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from service.config import Settings
from service.records import (
    BadMessage,
    Correction,
    Label,
    ModelEnvelope,
    PendingEntry,
    Reason,
    Step,
    parse_model_envelope,
    parse_step,
)
from service.records.admission import Admission
from service.stream.labels.protocol import Outcome, apply_shadow_label, teach
from service.stream.labels.state import Table

__all__ = ["History", "Plan", "Rederived", "correction_refusal", "rederive"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Plan:
    """What recording the group's next step does (:meth:`History.plan`): the ``seq`` it
    takes, whether the history starts again first (``cut``), whether a checkpoint is taken
    before it, the checkpoints (and the steps before the next one) that fall out, and the
    labels offset where the reach begins afterwards (-1: corrections are off)."""

    group: str
    seq: int
    offset: int
    cut: bool
    checkpoint: bool
    drop: tuple[int, ...]  # checkpoint seqs that fall out (with the steps before the next)
    reach_from: int


@dataclass(slots=True)
class _Group:
    """The index of one group's history (what the table holds, without the features)."""

    partition: int = -1
    seqs: list[int] = field(default_factory=list)  # sorted
    offsets: dict[int, int] = field(default_factory=dict)  # seq -> labels offset
    requests: dict[str, int] = field(default_factory=dict)  # request id -> seq
    checkpoints: list[int] = field(default_factory=list)  # sorted seqs
    members: frozenset[str] = frozenset()  # the members the checkpoints hold


class History:
    """A group's steps and checkpoints over a :class:`~service.stream.labels.state.Table`
    (module docstring), with an index in memory (rebuilt by :meth:`refresh`)."""

    def __init__(
        self, table: Table, settings: Settings, admission: Admission | None = None
    ) -> None:
        self._table = table
        self._settings = settings
        # the learner's checks of a request: a step whose request they refuse (forged on the
        # changelog) is not part of the history
        self._admission = admission
        self._groups: dict[str, _Group] = {}
        self.refresh()

    def reach(self, group: str) -> tuple[int, int]:
        """``(reach, every)`` of ``group`` (its champion's ``corrections`` settings)."""
        config = self._settings.models[group].corrections
        return config.reach, config.every

    def refresh(self) -> None:
        """Rebuild the index from the table (after a recovery or a rebalance). An entry that
        does not parse, or names a group or member not configured, is skipped (logged)."""
        self._groups = {}
        checkpoints: list[tuple[str, int]] = []
        for key, raw in list(self._table.items()):
            name = key.decode("utf-8", errors="replace")
            if "@" in name:
                self._index_step(name, raw)
            elif "#" in name:
                member, _, number = name.rpartition("#")
                if member in self._settings.models and number.isdigit():
                    checkpoints.append((member, int(number)))
        for member, at in checkpoints:
            g = self._groups.setdefault(self._settings.learner_key(member), _Group())
            if at not in g.checkpoints:
                bisect.insort(g.checkpoints, at)
            g.members = g.members | {member}

    def _index_step(self, name: str, raw: bytes) -> None:
        try:
            step = parse_step(raw)
        except BadMessage as bad:
            log.error("skipping history entry %r: %s", name[:80], bad)
            return
        if step.group not in self._settings.models or name != _step_key(step.group, step.offset):
            log.error("skipping history entry %r of a group not configured", name[:80])
            return
        if self._admission is not None:
            try:
                self._admission.server(self._admission.request(step.request))
            except BadMessage as bad:
                log.error("skipping history entry %r the learner would not write: %s",
                          name[:80], bad)  # fmt: skip
                return
            if step.request.model != step.group:
                log.error("skipping history entry %r of another group", name[:80])
                return
        g = self._groups.setdefault(step.group, _Group())
        self._add(g, step)

    @staticmethod
    def _add(g: _Group, step: Step) -> None:
        if step.seq not in g.offsets:
            bisect.insort(g.seqs, step.seq)
        g.offsets[step.seq] = step.offset
        g.requests[step.request_id] = step.seq
        g.partition = step.partition

    # -- reading

    def step(self, group: str, request_id: str) -> Step | None:
        """The step of ``request_id`` in ``group``'s history, if it is kept."""
        g = self._groups.get(group)
        seq = None if g is None else g.requests.get(request_id)
        if g is None or seq is None:
            return None
        return self._read_step(group, g.offsets[seq])

    def _read_step(self, group: str, offset: int) -> Step | None:
        raw = self._table.get(_step_key(group, offset).encode())
        return None if raw is None else parse_step(raw)

    def steps_from(self, group: str, seq: int) -> list[Step]:
        """The kept steps of ``group`` from ``seq`` on, in the order they were applied."""
        g = self._groups.get(group)
        if g is None:
            return []
        out = []
        for s in g.seqs[bisect.bisect_left(g.seqs, seq) :]:
            step = self._read_step(group, g.offsets[s])
            if step is not None:
                out.append(step)
        return out

    def base(self, group: str, seq: int) -> tuple[int, dict[str, ModelEnvelope]] | None:
        """The last checkpoint of ``group`` at or before step ``seq``: its seq and every
        member's state there (None if there is none)."""
        g = self._groups.get(group)
        if g is None:
            return None
        i = bisect.bisect_right(g.checkpoints, seq)
        if i == 0:
            return None
        at = g.checkpoints[i - 1]
        states = {}
        for member in sorted(g.members):
            raw = self._table.get(_checkpoint_key(member, at).encode())
            if raw is None:
                return None
            states[member] = parse_model_envelope(raw, model=member)
        return at, states

    def checkpoints_after(self, group: str, seq: int) -> list[int]:
        """The checkpoint seqs of ``group`` after step ``seq``."""
        g = self._groups.get(group)
        return [] if g is None else g.checkpoints[bisect.bisect_right(g.checkpoints, seq) :]

    def reach_from(self, group: str) -> int:
        """The labels offset of the oldest step of ``group`` kept (-1: none)."""
        g = self._groups.get(group)
        return -1 if g is None or not g.seqs else g.offsets[g.seqs[0]]

    # -- the label path

    def plan(self, group: str, members: Collection[str], *, offset: int, partition: int) -> Plan:
        """What recording a label of ``group`` read at labels (``partition``, ``offset``),
        applied to ``members``, does (nothing is written: :meth:`record` writes). A label
        already recorded (the redo of a label whose writes a crash interrupted) keeps its
        place and writes nothing new."""
        reach, every = self.reach(group)
        g = self._groups.get(group, _Group())
        known = [s for s, o in g.offsets.items() if o == offset and g.partition == partition]
        if not reach:
            return Plan(group, 0, offset, bool(g.seqs or g.checkpoints), False, (), -1)
        if known:
            return Plan(group, known[0], offset, False, False, (), self.reach_from(group))
        cut = bool(g.seqs or g.checkpoints) and (
            g.members != frozenset(members) or g.partition != partition or not g.checkpoints
        )
        seqs = [] if cut else g.seqs
        checkpoints = [] if cut else list(g.checkpoints)
        seq = seqs[-1] + 1 if seqs else 0
        checkpoint = not checkpoints or seq % every == 0
        if checkpoint:
            checkpoints.append(seq)
        drop = []
        while len(checkpoints) >= 2 and seq - checkpoints[1] + 1 >= reach:
            drop.append(checkpoints.pop(0))
        first = [s for s in seqs if s >= checkpoints[0]]
        reach_from = g.offsets[first[0]] if first else offset
        return Plan(group, seq, offset, cut, checkpoint, tuple(drop), reach_from)

    def record(self, plan: Plan, step: Step, before: Mapping[str, ModelEnvelope]) -> None:
        """Carry out ``plan`` for ``step``: start again if it says so, take the checkpoint
        (the members' states ``before`` the step), write the step, drop what falls out."""
        if plan.cut:
            self.cut(plan.group)
        reach, _ = self.reach(plan.group)
        if not reach or step.offset in self._groups.get(plan.group, _Group()).offsets.values():
            return
        g = self._groups.setdefault(plan.group, _Group())
        if plan.checkpoint:
            for member, envelope in before.items():
                self.put_checkpoint(member, step.seq, envelope)
            bisect.insort(g.checkpoints, step.seq)
            g.members = frozenset(before)
        self.put_step(step)
        for seq in plan.drop:
            self._drop(plan.group, g, seq)

    def _drop(self, group: str, g: _Group, seq: int) -> None:
        """Delete checkpoint ``seq`` and every step before the next checkpoint."""
        for member in g.members:
            self._delete(_checkpoint_key(member, seq))
        g.checkpoints.remove(seq)
        until = g.checkpoints[0] if g.checkpoints else seq + 1
        for s in [s for s in g.seqs if s < until]:
            self._forget_step(group, g, s)

    def _forget_step(self, group: str, g: _Group, seq: int) -> None:
        offset = g.offsets.pop(seq)
        g.seqs.remove(seq)
        for rid in [r for r, s in g.requests.items() if s == seq]:
            del g.requests[rid]
        self._delete(_step_key(group, offset))

    def _delete(self, key: str) -> None:
        if key.encode() in self._table:
            del self._table[key.encode()]

    def put_step(self, step: Step) -> None:
        """Write ``step`` (a new one, or one a correction changed)."""
        self._table[_step_key(step.group, step.offset).encode()] = step.to_json()
        self._add(self._groups.setdefault(step.group, _Group()), step)

    def put_checkpoint(self, member: str, seq: int, envelope: ModelEnvelope) -> None:
        """Write ``member``'s state before step ``seq`` (a correction rewrites the
        checkpoints after the step it corrected)."""
        self._table[_checkpoint_key(member, seq).encode()] = envelope.to_json()

    def cut(self, group: str) -> None:
        """Delete ``group``'s whole history: corrections cannot reach before this point."""
        g = self._groups.pop(group, None)
        if g is None:
            return
        for seq in g.checkpoints:
            for member in g.members:
                self._delete(_checkpoint_key(member, seq))
        for offset in g.offsets.values():
            self._delete(_step_key(group, offset))


def _step_key(group: str, offset: int) -> str:
    return f"{group}@{offset}"


def _checkpoint_key(member: str, seq: int) -> str:
    return f"{member}#{seq}"


def correction_refusal(
    correction: Correction, step: Step | None, pending: PendingEntry | None, *, reach: int
) -> tuple[Reason, str] | None:
    """Why ``correction`` cannot be applied (None: it can), given the ``step`` of its
    request in the group's history and its ``pending`` entry (either may be gone).

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


@dataclass(frozen=True, slots=True)
class Rederived:
    """The members' states after the steps (``states``), and their states before each
    step whose seq was asked for (``checkpoints``: seq -> member -> state)."""

    states: dict[str, ModelEnvelope]
    checkpoints: dict[int, dict[str, ModelEnvelope]]


def rederive(
    settings: Settings,
    group: str,
    base: Mapping[str, ModelEnvelope],
    steps: Sequence[Step],
    *,
    keep: Iterable[int] = (),
) -> Rederived:
    """Apply ``steps`` (in order) to the members' ``base`` states exactly as the learner
    applied them: the label in force of each (a withdrawn one is left out) teaches the member
    that decided its request as the champion (:func:`~service.stream.labels.protocol.teach`)
    and every other member as a shadow; an update the champion would refuse (not finite)
    leaves the step out for all, one a shadow would refuse leaves that shadow as it is.
    ``keep``: the seqs before which the states are returned too (the checkpoints a
    correction rewrites)."""
    states = dict(base)
    wanted = set(keep)
    checkpoints: dict[int, dict[str, ModelEnvelope]] = {}
    cap = settings.models[group].weight_cap(settings.max_importance_weight)
    for step in steps:
        if step.seq in wanted:
            checkpoints[step.seq] = dict(states)
        server = step.request.server
        if step.label is None or server not in states:
            continue
        where = (step.partition, step.offset)
        outcome = teach(settings.models[server], states[server], step.request, step.label,
                        where=where, now=step.applied_at, max_weight=cap)  # fmt: skip
        if outcome.outcome is not Outcome.APPLIED or outcome.model is None:
            continue
        states[server] = outcome.model
        pending = PendingEntry(step.request, step.partition)
        label = Label(step.request_id, group, step.label, step.labelled_by, step.ts)
        for name in states:
            if name == server:
                continue
            shadow = apply_shadow_label(settings.models[name], states[name], pending, label,
                                        step.offset, now=step.applied_at,
                                        partition=step.partition, max_weight=cap)  # fmt: skip
            if shadow.outcome is Outcome.APPLIED and shadow.model is not None:
                states[name] = shadow.model
    return Rederived(states, checkpoints)
