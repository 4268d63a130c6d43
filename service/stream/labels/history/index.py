r"""How far back a correction reaches: the learner's history of a model group, indexed.

A correction (:class:`~service.records.Correction`) supersedes the label a request received.
The learner makes every member of the model's group (the champion and its shadows) what it
would be had the corrected label been the one given: it restores a checkpoint of their
states taken before that label and applies every later label again, in the order it first
applied them, with the corrected one in force (:func:`~.derive.rederive`).

To do so the learner keeps, per group, in its ``history`` table (changelog
``<app_id>-history-changelog``, co-partitioned with the label topics):

- the group's last applied labels as :class:`~service.records.Step`\ s, key
  ``<group>@<labels offset>``, numbered ``seq`` = 0, 1, 2, ... in the order they were applied
  (a label that overtook its request is applied, and numbered, when the request comes);
- a checkpoint of every member's state before every ``every``-th step (and before the first
  step kept), key ``<member>#<seq>``: a :class:`~service.records.ModelEnvelope`.

It keeps at least ``corrections.reach`` steps (at most ``reach + every - 1``, more while a
correction waits to be applied: :meth:`History.pin`): when the steps from the second
checkpoint on number ``reach``, the first checkpoint and the steps before the second are
deleted. Each version of a member says where its reach begins
(``ModelEnvelope.corrections_from``: the labels offset of the oldest step kept). The history
starts again (everything of the group deleted) at a rollback or seed order of any member, and
when the members of the group or its labels partition change: a correction never reaches
across a state the labels did not make.

**What is read back is checked.** The table holds what the learner wrote in this process and
what it read back from the changelog (a topic others may write). The changelog's records
are authenticated when read (:mod:`service.stream.labels.tables`, with ``snapshot_key``);
the index (:meth:`History.refresh`) then takes only a history it can use whole: steps the
learner's checks admit, numbered without a gap or a duplicate from a checkpoint that holds
every member on; what lies before a gap is not used (:meth:`History.untrusted_below` says
from where). Steps and checkpoints read back are trusted by a correction only once
:mod:`~.trust` checked them against the labels topic (and, without a key, re-derived them):
:meth:`History.checked`.

This module is pure (no Kafka, no clock): the learner writes through a changelog table,
``abstain rebuild`` and the replay through a dict, with the same code.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from service.config import Settings
from service.records import BadMessage, ModelEnvelope, parse_model_envelope
from service.records.admission import Admission
from service.records.history import Step, parse_step
from service.stream.labels.state import Table

__all__ = ["History", "Plan", "checkpoint_key", "step_key"]

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
    seqs_at: dict[int, list[int]] = field(default_factory=dict)  # labels offset -> seqs
    asked: dict[int, set[str]] = field(default_factory=dict)  # seq -> request ids given it
    checkpoints: list[int] = field(default_factory=list)  # sorted seqs, every member there
    members: frozenset[str] = frozenset()  # the members the checkpoints hold


@dataclass(slots=True)
class _Read:
    """What :meth:`History.refresh` found of one group before it is indexed."""

    steps: dict[int, list[Step]] = field(default_factory=dict)  # seq -> steps claiming it
    checkpoints: dict[int, set[str]] = field(default_factory=dict)  # seq -> members there


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
        self._pins: dict[str, int] = {}  # group -> seq whose checkpoint must stay
        self._checked: set[str] = set()  # groups whose history read back was checked
        self._untrusted: dict[str, int] = {}  # group -> labels offset the usable part starts
        self._junk: dict[str, set[bytes]] = {}  # group -> keys left out of the index
        self._cuts: dict[str, int] = {}  # group -> times its history started again
        self.refresh()

    @property
    def topic(self) -> str:
        """The changelog the table writes to (for dead letters of what it read back)."""
        return str(getattr(self._table, "topic", "history"))

    def generation(self, group: str) -> int:
        """Changes each time ``group``'s history starts again (or is read again)."""
        return self._cuts.get(group, 0)

    def reach(self, group: str) -> tuple[int, int]:
        """``(reach, every)`` of ``group`` (its champion's ``corrections`` settings)."""
        config = self._settings.models[group].corrections
        return config.reach, config.every

    # -- the index

    def refresh(self) -> None:
        """Rebuild the index from the table (after a recovery or a rebalance): only a
        history that can be used whole is indexed (module docstring); what is left out is
        logged and deleted with the group's next write."""
        self._groups, self._checked, self._untrusted, self._junk = {}, set(), {}, {}
        self._cuts = {g: n + 1 for g, n in self._cuts.items()}
        read: dict[str, _Read] = {}
        for key, raw in list(self._table.items()):
            name = key.decode("utf-8", errors="replace")
            if "@" in name:
                step = self._admitted_step(name, raw)
                if step is not None:
                    read.setdefault(step.group, _Read()).steps.setdefault(step.seq, []).append(step)
                else:
                    self._junk.setdefault(name.partition("@")[0], set()).add(key)
            elif "#" in name:
                member, _, number = name.rpartition("#")
                if member in self._settings.models and number.isdigit():
                    group = self._settings.learner_key(member)
                    read.setdefault(group, _Read()).checkpoints.setdefault(int(number), set()).add(
                        member
                    )
        for group, found in read.items():
            if group in self._settings.models:
                self._index(group, found)
        known = set(self._groups)
        self._checked = {g for g in self._settings.models if g not in known}

    def _admitted_step(self, name: str, raw: bytes) -> Step | None:
        try:
            step = parse_step(raw)
        except BadMessage as bad:
            log.error("skipping history entry %r: %s", name[:80], bad)
            return None
        if step.group not in self._settings.models or name != step_key(step.group, step.offset):
            log.error("skipping history entry %r of a group not configured", name[:80])
            return None
        if self._admission is not None:
            try:
                self._admission.server(self._admission.request(step.request))
            except BadMessage as bad:
                log.error(
                    "skipping history entry %r the learner would not write: %s", name[:80], bad
                )
                return None
            if step.request.model != step.group:
                log.error("skipping history entry %r of another group", name[:80])
                return None
        return step

    def _index(self, group: str, found: _Read) -> None:
        """Index the part of ``group``'s history read back that can be used whole: from the
        newest checkpoint holding every member after the last gap (a seq missing or claimed
        twice), the steps numbered without a gap."""
        configured = set(self._settings.group(group))
        members = frozenset(
            m for held in found.checkpoints.values() for m in held if m in configured
        )
        seqs = sorted(found.steps)
        start = 0
        for i, seq in enumerate(seqs):
            if len(found.steps[seq]) > 1 or (i and seq != seqs[i - 1] + 1):
                start = seq + (len(found.steps[seq]) > 1)  # a duplicate spoils its own seq
        complete = sorted(s for s, m in found.checkpoints.items() if m == members and s >= start)
        first = complete[0] if complete else None
        g = _Group(members=members)
        for seq in seqs:
            if first is not None and seq >= first and len(found.steps[seq]) == 1:
                self._add(g, found.steps[seq][0])
        dropped = [s for s in seqs if first is None or s < first or len(found.steps[s]) > 1]
        g.checkpoints = [c for c in complete if not g.seqs or c <= g.seqs[-1] + 1]
        for seq in dropped:
            for step in found.steps[seq]:
                self._junk.setdefault(group, set()).add(step_key(group, step.offset).encode())
        for seq, held in found.checkpoints.items():
            if seq not in g.checkpoints:
                junk = self._junk.setdefault(group, set())
                junk.update(checkpoint_key(m, seq).encode() for m in held)
        if dropped or len(g.checkpoints) < len(found.checkpoints):
            self._untrusted[group] = g.offsets[g.seqs[0]] if g.seqs else 2**63
            log.error(
                "the history of model %s read back has gaps or incomplete checkpoints: "
                "%d steps and %d checkpoints left out (corrections cannot reach them)",
                group,
                len(dropped),
                len(found.checkpoints) - len(g.checkpoints),
            )
        if g.seqs and g.checkpoints:
            self._groups[group] = g

    @staticmethod
    def _add(g: _Group, step: Step) -> None:
        before = g.offsets.get(step.seq)
        if before is None:
            bisect.insort(g.seqs, step.seq)
        elif before != step.offset:
            _unlist(g.seqs_at, before, step.seq)
        if before != step.offset:
            g.seqs_at.setdefault(step.offset, []).append(step.seq)
        g.offsets[step.seq] = step.offset
        g.requests[step.request_id] = step.seq
        g.asked.setdefault(step.seq, set()).add(step.request_id)
        g.partition = step.partition

    # -- trust

    def checked(self, group: str) -> bool:
        """True if ``group``'s history can be used by a correction: what was read back of
        it was checked (:meth:`mark_checked`), or nothing was."""
        return group in self._checked

    def mark_checked(self, group: str) -> None:
        self._checked.add(group)

    def untrusted_below(self, group: str) -> int:
        """The labels offset below which ``group``'s history read back was left out (-1:
        nothing was): a correction of a label applied there is ``history_untrusted``."""
        return self._untrusted.get(group, -1)

    def distrust(self, group: str, seqs: Collection[int]) -> None:
        """Leave out of the index the steps ``seqs`` (they failed a check) and everything
        before them (a history with a gap cannot be re-derived across it)."""
        g = self._groups.get(group)
        if g is None or not seqs:
            return
        last = max(seqs)
        after = [c for c in g.checkpoints if c > last]
        junk = self._junk.setdefault(group, set())
        for s in [s for s in g.seqs if s <= last or not after or s < after[0]]:
            junk.add(step_key(group, g.offsets[s]).encode())
            self._forget(g, s)
        for c in [c for c in g.checkpoints if not after or c < after[0]]:
            junk.update(checkpoint_key(m, c).encode() for m in g.members)
            g.checkpoints.remove(c)
        self._untrusted[group] = g.offsets[g.seqs[0]] if g.seqs else 2**63
        if not g.seqs:
            del self._groups[group]

    def origin(self, key: bytes) -> tuple[int, int] | None:
        """Where the table read the entry of ``key`` back from (None: written here)."""
        where = getattr(self._table, "origin", None)
        return None if where is None else where(key)

    # -- reading

    def step(self, group: str, request_id: str) -> Step | None:
        """The step of ``request_id`` in ``group``'s history, if a correction can reach it
        (a step kept longer only because a correction waits, :meth:`pin`, cannot)."""
        g = self._groups.get(group)
        seq = None if g is None else g.requests.get(request_id)
        if g is None or seq is None or seq < self._first(group, g):
            return None
        return self._read_step(group, g.offsets[seq])

    def _first(self, group: str, g: _Group) -> int:
        """The first checkpoint of ``group`` a correction can reach from: the one the
        history would keep first without pins (what ``abstain rebuild`` keeps)."""
        reach, _ = self.reach(group)
        checkpoints = list(g.checkpoints)
        last = g.seqs[-1] if g.seqs else -1
        while len(checkpoints) >= 2 and last - checkpoints[1] + 1 >= reach:
            checkpoints.pop(0)
        return checkpoints[0] if checkpoints else 0

    def _read_step(self, group: str, offset: int) -> Step | None:
        raw = self._table.get(step_key(group, offset).encode())
        return None if raw is None else parse_step(raw)

    def steps_from(self, group: str, seq: int) -> list[Step]:
        """The kept steps of ``group`` from ``seq`` on, in the order they were applied."""
        return [parse_step(raw) for raw in self.raw_steps(group, seq)]

    def raw_steps(self, group: str, seq: int) -> list[bytes]:
        """:meth:`steps_from` as the table holds them (what a derivation elsewhere reads)."""
        g = self._groups.get(group)
        if g is None:
            return []
        out = []
        for s in g.seqs[bisect.bisect_left(g.seqs, seq) :]:
            raw = self._table.get(step_key(group, g.offsets[s]).encode())
            if raw is not None:
                out.append(raw)
        return out

    def first_checkpoint(self, group: str) -> int | None:
        """The seq of ``group``'s oldest checkpoint kept (None: none)."""
        g = self._groups.get(group)
        return g.checkpoints[0] if g is not None and g.checkpoints else None

    def last_seq(self, group: str) -> int:
        """The seq of ``group``'s newest step (-1: none)."""
        g = self._groups.get(group)
        return g.seqs[-1] if g is not None and g.seqs else -1

    def base_seq(self, group: str, seq: int) -> int | None:
        """The last checkpoint of ``group`` at or before step ``seq`` (None: none)."""
        g = self._groups.get(group)
        if g is None:
            return None
        i = bisect.bisect_right(g.checkpoints, seq)
        return None if i == 0 else g.checkpoints[i - 1]

    def raw_base(self, group: str, seq: int) -> tuple[int, dict[str, bytes]] | None:
        """The last checkpoint of ``group`` at or before step ``seq``: its seq and every
        member's state there as the table holds it (None if there is none)."""
        at = self.base_seq(group, seq)
        g = self._groups.get(group)
        if at is None or g is None:
            return None
        states = {}
        for member in sorted(g.members):
            raw = self._table.get(checkpoint_key(member, at).encode())
            if raw is None:
                return None
            states[member] = raw
        return at, states

    def raw_checkpoint(self, member: str, seq: int) -> bytes | None:
        """``member``'s state before step ``seq`` as the table holds it (None: none)."""
        return self._table.get(checkpoint_key(member, seq).encode())

    def base(self, group: str, seq: int) -> tuple[int, dict[str, ModelEnvelope]] | None:
        """:meth:`raw_base`, parsed."""
        found = self.raw_base(group, seq)
        if found is None:
            return None
        at, raw = found
        return at, {m: parse_model_envelope(r, model=m) for m, r in raw.items()}

    def checkpoints_after(self, group: str, seq: int) -> list[int]:
        """The checkpoint seqs of ``group`` after step ``seq``."""
        g = self._groups.get(group)
        return [] if g is None else g.checkpoints[bisect.bisect_right(g.checkpoints, seq) :]

    def members(self, group: str) -> frozenset[str]:
        """The members ``group``'s checkpoints hold."""
        g = self._groups.get(group)
        return frozenset() if g is None else g.members

    def partition(self, group: str) -> int:
        """The labels partition of ``group``'s history (-1: none kept)."""
        g = self._groups.get(group)
        return -1 if g is None else g.partition

    def groups(self) -> list[str]:
        """The groups with a history kept."""
        return sorted(self._groups)

    def reach_from(self, group: str) -> int:
        """The labels offset of the oldest step of ``group`` a correction can reach (-1:
        none)."""
        g = self._groups.get(group)
        if g is None or not g.seqs:
            return -1
        first = self._first(group, g)
        return g.offsets[g.seqs[bisect.bisect_left(g.seqs, first)]]

    # -- the label path

    def pin(self, group: str, seq: int) -> None:
        """Keep the checkpoint before step ``seq`` of ``group`` (and what follows) until
        :meth:`unpin`: a correction of it waits to be applied."""
        self._pins[group] = min(seq, self._pins.get(group, seq))

    def unpin(self, group: str, seq: int | None = None) -> None:
        """Let the checkpoints go again (``seq``: keep the one before step ``seq``)."""
        self._pins.pop(group, None)
        if seq is not None:
            self._pins[group] = seq

    def plan(self, group: str, members: Collection[str], *, offset: int, partition: int) -> Plan:
        """What recording a label of ``group`` read at labels (``partition``, ``offset``),
        applied to ``members``, does (nothing is written: :meth:`record` writes). A label
        already recorded (the redo of a label whose writes a crash interrupted) keeps its
        place and writes nothing new."""
        reach, every = self.reach(group)
        g = self._groups.get(group, _Group())
        known = g.seqs_at.get(offset, []) if g.partition == partition else []
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
        pin = None if cut else self._pins.get(group)
        drop, nominal = [], list(checkpoints)
        while len(nominal) >= 2 and seq - nominal[1] + 1 >= reach:
            gone = nominal.pop(0)
            if pin is None or nominal[0] <= pin:  # a pinned checkpoint stays, unreachable
                drop.append(gone)
        first = bisect.bisect_left(seqs, nominal[0])
        reach_from = g.offsets[seqs[first]] if first < len(seqs) else offset
        return Plan(group, seq, offset, cut, checkpoint, tuple(drop), reach_from)

    def record(self, plan: Plan, step: Step, before: Mapping[str, ModelEnvelope]) -> None:
        """Carry out ``plan`` for ``step``: start again if it says so, take the checkpoint
        (the members' states ``before`` the step), write the step, drop what falls out."""
        if plan.cut:
            self.cut(plan.group)
        self._sweep(plan.group)
        reach, _ = self.reach(plan.group)
        if not reach or step.offset in self._groups.get(plan.group, _Group()).seqs_at:
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
            self._delete(checkpoint_key(member, seq))
        g.checkpoints.remove(seq)
        until = g.checkpoints[0] if g.checkpoints else seq + 1
        for s in g.seqs[: bisect.bisect_left(g.seqs, until)]:
            self._delete(step_key(group, g.offsets[s]))
            self._forget(g, s)

    @staticmethod
    def _forget(g: _Group, seq: int) -> None:
        _unlist(g.seqs_at, g.offsets.pop(seq), seq)
        g.seqs.remove(seq)
        for rid in g.asked.pop(seq, ()):
            if g.requests.get(rid) == seq:
                del g.requests[rid]

    def _delete(self, key: str) -> None:
        if key.encode() in self._table:
            del self._table[key.encode()]

    def _sweep(self, group: str) -> None:
        """Delete the entries of ``group`` left out of the index (a write is due anyway)."""
        for key in self._junk.pop(group, set()):
            if key in self._table:
                del self._table[key]

    def put_step(self, step: Step) -> None:
        """Write ``step`` (a new one, or one a correction changed)."""
        self._table[step_key(step.group, step.offset).encode()] = step.to_json()
        self._add(self._groups.setdefault(step.group, _Group()), step)

    def put_checkpoint(self, member: str, seq: int, envelope: ModelEnvelope) -> None:
        """Write ``member``'s state before step ``seq`` (a correction rewrites the
        checkpoints after the step it corrected)."""
        self.put_raw_checkpoint(member, seq, envelope.to_bytes())

    def put_raw_checkpoint(self, member: str, seq: int, raw: bytes) -> None:
        """:meth:`put_checkpoint` of a state already encoded."""
        self._table[checkpoint_key(member, seq).encode()] = raw

    def cut(self, group: str) -> None:
        """Delete ``group``'s whole history: corrections cannot reach before this point."""
        self._sweep(group)
        self._pins.pop(group, None)
        self._checked.add(group)
        self._cuts[group] = self._cuts.get(group, 0) + 1
        g = self._groups.pop(group, None)
        if g is None:
            return
        for seq in g.checkpoints:
            for member in g.members:
                self._delete(checkpoint_key(member, seq))
        for offset in g.offsets.values():
            self._delete(step_key(group, offset))


def step_key(group: str, offset: int) -> str:
    """The table key of ``group``'s step of the label read at labels ``offset``."""
    return f"{group}@{offset}"


def checkpoint_key(member: str, seq: int) -> str:
    """The table key of ``member``'s state before step ``seq``."""
    return f"{member}#{seq}"


def _unlist(index: dict[int, list[int]], key: int, seq: int) -> None:
    """Take ``seq`` out of ``index[key]`` (and the key out once it holds none)."""
    seqs = index[key]
    seqs.remove(seq)
    if not seqs:
        del index[key]
