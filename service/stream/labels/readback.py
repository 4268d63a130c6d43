"""What the learner reads back of its history, checked before a correction uses it.

The history (:mod:`~service.stream.labels.history`) is a changelog, a topic others may
write; the learner reads it back at every start and rebalance. With ``snapshot_key`` its
records were authenticated as they were read (:mod:`~service.stream.labels.tables`); what
remains to check, once per group and recovery (:meth:`ReadBack.trusted`):

- every step read back, and every correction noted on it, must be borne out by the labels
  topic at the offsets it names (:func:`~service.stream.labels.history.refuted`): one that
  is not is dead-lettered (``history_untrusted``, source ``changelogs``) and left out, with
  everything before it (a correction reaching there is refused, ``history_untrusted``);
- without a key, the checkpoints cannot be authenticated: the history is re-derived from
  its oldest checkpoint, with the labels each member holds, and must give the state each
  member holds; its checkpoints are then written as re-derived (one read back that differs
  is dead-lettered). If it does not, the history starts again and the correction is
  refused: a forged history never reaches a model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping

from service.config import Settings
from service.records import (
    BadMessage,
    DeadLetter,
    ModelEnvelope,
    RawMessage,
    Reason,
    parse_model_envelope,
)
from service.records.history import Step, parse_step
from service.records.reasons import Source
from service.stream.labels.history import (
    History,
    Job,
    checkpoint_key,
    job,
    refuted,
    same_state,
    step_key,
)
from service.stream.labels.history.runner import Runner
from service.stream.labels.state import ModelStore
from service.stream.outputs import Outputs

__all__ = ["LabelsReader", "ReadBack", "corrected_to"]

log = logging.getLogger(__name__)

#: reads records of the labels topic: (partition, offsets) -> offset -> value (None: the
#: topic no longer holds it, its retention passed)
LabelsReader = Callable[[int, Collection[int]], Awaitable[Mapping[int, bytes | None]]]


def corrected_to(model: ModelEnvelope, partition: int) -> int:
    """The labels offset of the newest correction ``model`` holds in ``partition``."""
    return model.corrected_to if model.labels_partition == partition else -1


class ReadBack:
    """The checks of a history read back (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        history: History,
        models: ModelStore,
        outputs: Outputs,
        runner: Runner,
        keyed: bool,
    ) -> None:
        self.settings, self.history, self.models = settings, history, models
        self.outputs, self.runner, self.keyed = outputs, runner, keyed
        #: reads the labels topic (None: nothing was read back, memory tables)
        self.read_labels: LabelsReader | None = None

    async def trusted(self, group: str) -> None:
        """Check what was read back of ``group``'s history before a correction uses it
        (:mod:`~.history.trust`): steps the labels topic does not bear out are dead-lettered
        and left out (with what precedes them); without a key, the checkpoints must
        re-derive to what the members hold, else the history starts again and
        :class:`BadMessage` (``history_untrusted``) is raised."""
        history = self.history
        if history.checked(group):
            return
        steps = [
            s
            for s in history.steps_from(group, 0)
            if history.origin(step_key(group, s.offset).encode()) is not None
        ]
        if steps and self.read_labels is not None:
            offsets = {s.offset for s in steps} | {n.offset for s in steps for n in s.notes}
            records = await self.read_labels(history.partition(group), offsets)
            bad = refuted(steps, records)
            for step, why in bad:
                await self._refused_entry(group, step, why)
            history.distrust(group, [s.seq for s, _ in bad])
        if not self.keyed and steps and not await self._rederives(group):
            history.cut(group)
            raise BadMessage(
                Reason.HISTORY_UNTRUSTED,
                f"the history of model {group!r} read "
                "back does not re-derive to what its members hold: it starts "
                "again",
            )
        history.mark_checked(group)

    async def _refused_entry(self, group: str, step: Step, why: str) -> None:
        key = step_key(group, step.offset).encode()
        partition, offset = self.history.origin(key) or (step.partition, -1)
        message = RawMessage(step.to_json(), self.history.topic, partition, offset, key)
        log.error("history entry %r of model %s refused: %s", key, group, why)
        await self.outputs.dead_letter(
            DeadLetter.of(Source.CHANGELOGS, message, Reason.HISTORY_UNTRUSTED, why)
        )

    async def _rederives(self, group: str) -> bool:
        """Without a key: True if the group's history, from its oldest checkpoint, with the
        labels each member holds (the corrections up to its ``corrected_to``), re-derives to
        the state it holds. The checkpoints derived are written (re-derived rather than read
        back); one read back that differs from its re-derivation, before any correction
        waits, is dead-lettered."""
        history, partition = self.history, self.history.partition(group)
        current = {
            m: self.models.get(m) for m in history.members(group) if m in self.settings.models
        }
        first = history.first_checkpoint(group)
        found = None if first is None else job(history, group, first)
        if found is None or not current:
            return False
        at, start = found
        newest = max(
            (c.labels_offset for c in current.values() if c.labels_partition == partition),
            default=-1,
        )
        parsed = [parse_step(raw) for raw in start.steps]
        steps = [
            raw for raw, step in zip(start.steps, parsed, strict=True) if step.offset <= newest
        ]
        held_by = {m: corrected_to(self.models.get(m), partition) for m in current}
        low = min(held_by.values())  # the checkpoints before a note not held are settled
        settled = min(
            (st.seq for st in parsed for n in st.notes if n.changed and n.offset > low),
            default=2**63,
        )
        keep = tuple(history.checkpoints_after(group, at))
        derived: dict[tuple[str, int], bytes] = {}
        for held in sorted(set(held_by.values())):
            try:
                out = await asyncio.wrap_future(
                    self.runner.submit(Job(group, start.base, steps, keep, held=held))
                )
            except BadMessage:
                return False
            for member in [m for m, h in held_by.items() if h == held]:
                mine = out.states.get(member)
                if mine is None or not same_state(
                    parse_model_envelope(mine, model=member), current[member]
                ):
                    log.error(
                        "the history of model %s read back does not re-derive to the "
                        "state %s holds",
                        group,
                        member,
                    )
                    return False
                derived.update(
                    {(member, seq): states[member] for seq, states in out.checkpoints.items()}
                )
        for (member, seq), raw in sorted(derived.items()):
            if seq <= settled:
                await self._rederived(group, member, seq, raw)
            history.put_raw_checkpoint(member, seq, raw)
        return True

    async def _rederived(self, group: str, member: str, seq: int, raw: bytes) -> None:
        """Dead-letter the checkpoint read back of ``member`` before step ``seq`` if it is
        not what the history re-derives there (``raw``)."""
        key = checkpoint_key(member, seq).encode()
        origin = self.history.origin(key)
        stored = self.history.raw_checkpoint(member, seq)
        if origin is None or stored is None:
            return
        try:
            same = same_state(
                parse_model_envelope(stored, model=member), parse_model_envelope(raw, model=member)
            )
        except BadMessage:
            same = False
        if same:
            return
        why = f"checkpoint {key.decode()!r} of model {group} does not re-derive from the history"
        log.error("%s: replaced by its re-derivation", why)
        message = RawMessage(stored, self.history.topic, origin[0], origin[1], key)
        await self.outputs.dead_letter(
            DeadLetter.of(Source.CHANGELOGS, message, Reason.HISTORY_UNTRUSTED, why)
        )
