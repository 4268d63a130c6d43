"""Corrections for the learner: noted at their place in the labels log, derived elsewhere,
applied together, exactly once.

A correction reaches back up to ``reach + every`` labels: applying them again takes hundreds
of milliseconds of CPU. :class:`Corrector` keeps that work off the worker's process and
off its learn loop:

1. **Noted** (:meth:`Corrector.correct`, in the learn loop, at the correction's place): the
   history it reaches is checked first (:class:`~service.stream.labels.readback.ReadBack`:
   what was read back of it agrees with the labels topic and, without a key, re-derives to
   what the members hold);
   the correction is checked (:func:`~.history.note`: refusals, copies) and its note
   written on its step, with the label in force changed. The note is durable before the
   correction's offset is committed, like any write of the learn loop.
2. **Queued**, per model group: at most one derivation of a group runs at a time, in the
   learner's derivation process (:mod:`~.history.runner`), from the checkpoint before the
   earliest step whose label changed to the newest step, with the corrections noted when it
   starts (up to a labels offset: ``held``). Corrections noted meanwhile wait and are
   derived together by the next one: a storm of corrections costs about one derivation per
   derivation time, not one per correction, and a derivation is never thrown away. The
   checkpoint it starts from stays kept while it waits (:meth:`~.history.History.pin`).
3. **Applied** (:meth:`Corrector.tick`, called by the learn loop between batches): labels
   applied meanwhile are derived on top of the result first (another, short, derivation,
   with the same corrections). Then the checkpoints it rewrote are written and made
   durable, then each member's next version, holding the corrections it covers: one version
   per correction the member did not hold (:func:`~.history.finish`), so the versions count
   as ``abstain rebuild`` counts them.

Labels keep being applied while corrections wait (to the states the members hold); rollback
and seed orders wait for the group's queue (:meth:`Corrector.drain`). A group whose queue
holds :data:`MAX_QUEUED` corrections takes its next one only once the derivation in flight
is applied: back-pressure on the labels topic, not memory.

After a restart (or a rebalance) the queue is rebuilt from what is durable
(:meth:`Corrector.resume`): the notes on the steps that a member does not hold
(``ModelEnvelope.corrected_to``). A crash anywhere therefore applies each correction once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Final

from service.config import Settings
from service.metrics import Metrics
from service.records import (
    BadMessage,
    Correction,
    DeadLetter,
    RawMessage,
    Reason,
    parse_model_envelope,
)
from service.records.history import Note, Step, parse_step
from service.records.reasons import Source
from service.stream.labels.history import (
    Derived,
    History,
    Job,
    finish,
    job,
    kind_of,
    note,
)
from service.stream.labels.history.runner import InlineRunner, Runner, broken
from service.stream.labels.protocol import LabelOutcome, Outcome
from service.stream.labels.publish import Publisher
from service.stream.labels.readback import ReadBack, corrected_to
from service.stream.labels.state import ModelStore, PendingStore
from service.stream.outputs import Outputs

__all__ = ["MAX_QUEUED", "Corrector"]

log = logging.getLogger(__name__)

#: corrections of one group that may wait; the next one waits for the derivation in flight
MAX_QUEUED: Final = 1000
#: seconds between the starts of two derivations of a group: the corrections noted meanwhile
#: are derived together (a storm costs fewer derivations; a lone correction starts at once)
MIN_GAP: Final = 1.0
#: checkpoints a correction rewrote written per produce batch (each batch is compressed and
#: sent at once: in pieces, the event loop scores events between them)
CHECKPOINTS_PER_WRITE: Final = 2
#: seconds a queue rebuilt after a restart waits for the redo of its last label
REDO_WAIT: Final = 30.0

#: states derived before steps: seq -> member -> encoded state
Checkpoints = Mapping[int, Mapping[str, bytes]]


def _nowhere(partition: int) -> AbstractContextManager[None]:
    return contextlib.nullcontext()


@dataclass(slots=True)
class _Waiting:
    """A correction noted and not yet held by the group's members."""

    request_id: str
    note: Note
    seq: int
    queued_at: float
    message: RawMessage | None = None  # the record (None: noted before a restart)


@dataclass(slots=True)
class _Flight:
    """A derivation of a group in flight: its result, from which step it re-derives, the
    corrections it covers (those read up to labels offset ``held``: the ones noted when it
    started; later ones are left out of every step it reads), the seq of the last step it
    reads, the checkpoints earlier legs derived."""

    future: Future[Derived]
    since: int
    held: int
    last_seq: int
    epoch: tuple[int, int]  # the corrector's epoch and the group's history generation
    checkpoints: dict[int, dict[str, bytes]] = field(default_factory=dict)


@dataclass(slots=True)
class _Queue:
    partition: int
    waiting: dict[int, _Waiting] = field(default_factory=dict)  # labels offset -> correction
    since: int | None = None  # earliest seq whose label changed since the last dispatch
    flight: _Flight | None = None
    resumed_at: float | None = None  # rebuilt after a restart: waits for the last label's redo


class Corrector:
    """Corrections noted, queued per group, derived by ``runner``, applied (module
    docstring). Without a runner (or with an :class:`InlineRunner`) each correction is
    applied before :meth:`correct` returns (``abstain rebuild``'s replay, tests)."""

    def __init__(
        self,
        settings: Settings,
        *,
        history: History,
        models: ModelStore,
        pending: PendingStore,
        publisher: Publisher,
        outputs: Outputs,
        metrics: Metrics,
        clock: Callable[[], float],
        keyed: bool,
        runner: Runner | None = None,
    ) -> None:
        self.settings, self.history, self.models, self.pending = settings, history, models, pending
        self.publisher, self.outputs, self.metrics, self.clock = publisher, outputs, metrics, clock
        self.runner: Runner = runner if runner is not None else InlineRunner(settings)
        self.eager = isinstance(self.runner, InlineRunner)
        #: what the history read back must agree with before a correction uses it
        self.readback = ReadBack(
            settings,
            history=history,
            models=models,
            outputs=outputs,
            runner=self.runner,
            keyed=keyed,
        )
        #: the context in which table writes go to changelog partition ``p``
        self.scope: Callable[[int], AbstractContextManager[None]] = _nowhere
        self._queues: dict[str, _Queue] = {}
        self._epoch = 0
        self.monotonic: Callable[[], float] = time.monotonic  # spaces derivations (MIN_GAP)
        self._started: dict[str, float] = {}  # group -> when its last derivation started

    # -- the learn loop's side

    async def correct(self, correction: Correction, message: RawMessage) -> None:
        """Note ``correction`` (read at ``message``'s place) on its step and queue its
        derivation (module docstring). :class:`BadMessage` when it is refused."""
        group, offset = correction.model, message.offset
        queue = self._queues.get(group)
        if queue is not None and len(queue.waiting) >= MAX_QUEUED:
            await self.drain(group)  # back-pressure: the learn loop waits here
        await self.readback.trusted(group)
        noted = note(
            self.history, correction, self.pending.get(correction.request_id), offset=offset
        )
        if noted.redelivered:
            self._redelivered(group, noted.step, noted.note, message)
            if self.eager:
                await self.drain(group)
            return
        self.history.put_step(noted.step)
        if not noted.note.changed:  # a confirmation: the label in force stays
            self.metrics.corrections.labels(model=group, outcome="unchanged").inc()
            return
        self._queue(group, message.partition).waiting[offset] = _Waiting(
            correction.request_id, noted.note, noted.step.seq, time.monotonic(), message
        )
        self._changed(group, noted.step.seq)
        if self.eager:
            await self.drain(group)
        elif self._due(group, self._queues[group]):
            await self._dispatch(group)

    def _redelivered(self, group: str, step: Step, noted: Note, message: RawMessage) -> None:
        """A correction read again (its note is on its step): queued again if a member does
        not hold it yet (a crash before it was applied), else a no-op."""
        queue = self._queues.get(group)
        waiting = queue is not None and message.offset in queue.waiting
        if noted.changed and not waiting and not self._held(group, message.offset):
            self._queue(group, message.partition).waiting[message.offset] = _Waiting(
                step.request_id, noted, step.seq, time.monotonic(), message
            )
            self._changed(group, step.seq)
            return
        self.metrics.labels_ignored.labels(model=group, reason=Reason.REDELIVERED).inc()

    def _held(self, group: str, offset: int) -> bool:
        """True if every member of ``group`` holds the correction read at ``offset``."""
        partition = self.history.partition(group)
        members = self.history.members(group) or frozenset(self.settings.group(group))
        return all(
            self.models.get(m).labels_partition == partition
            and self.models.get(m).corrected_to >= offset
            for m in members
            if m in self.settings.models
        )

    def _queue(self, group: str, partition: int) -> _Queue:
        return self._queues.setdefault(group, _Queue(partition))

    def _changed(self, group: str, seq: int) -> None:
        queue = self._queues[group]
        queue.since = seq if queue.since is None else min(queue.since, seq)
        base = self.history.base_seq(group, queue.since)
        if base is not None:
            self.history.pin(group, base)
        self.metrics.corrections_queued.labels(model=group).set(len(queue.waiting))

    def queued(self, group: str) -> int:
        """Corrections of ``group`` noted and not yet held by its members."""
        queue = self._queues.get(group)
        return 0 if queue is None else len(queue.waiting)

    def busy(self) -> bool:
        """True while a derivation is in flight or waits to start (the learn loop fetches
        with a shorter wait meanwhile)."""
        return any(q.flight is not None or q.since is not None for q in self._queues.values())

    async def tick(self) -> None:
        """Take the derivations that are done and start the ones due (the learn loop calls
        it between batches)."""
        for group in list(self._queues):
            queue = self._queues.get(group)
            if queue is None:
                continue
            if queue.flight is not None and queue.flight.future.done():
                await self._landed(group)
            queue = self._queues.get(group)
            if queue is not None and self._due(group, queue):
                if queue.resumed_at is not None and not await self._ready(group, queue):
                    continue
                await self._dispatch(group)
            elif queue is not None and queue.flight is None and not queue.waiting:
                del self._queues[group]

    async def drain(self, group: str) -> None:
        """Apply every correction of ``group`` noted so far (orders wait for it)."""
        while (queue := self._queues.get(group)) is not None and (
            queue.flight is not None or queue.since is not None
        ):
            if queue.flight is None:
                if queue.resumed_at is not None and not await self._ready(group, queue, wait=True):
                    break
                await self._dispatch(group)
            if group not in self._queues:
                break
            flight = self._queues[group].flight
            if flight is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(flight.future)
                await self._landed(group)
        self._queues.pop(group, None)

    async def settle(self) -> None:
        """:meth:`drain` every group."""
        for group in list(self._queues):
            await self.drain(group)

    # -- derivations

    def _due(self, group: str, queue: _Queue) -> bool:
        """A derivation of ``group`` may start now (:data:`MIN_GAP`)."""
        started = self._started.get(group, -MIN_GAP)
        return (
            queue.flight is None
            and queue.since is not None
            and self.monotonic() - started >= MIN_GAP
        )

    def _epoch_of(self, group: str) -> tuple[int, int]:
        return self._epoch, self.history.generation(group)

    async def _dispatch(self, group: str) -> None:
        """Start the derivation of the corrections noted so far (it covers them; those noted
        while it runs wait for the next one)."""
        queue = self._queues[group]
        since = queue.since
        assert since is not None  # noqa: S101 - dispatched only when a label changed
        found = job(self.history, group, since)
        queue.since = None
        if found is None or not queue.waiting:  # the checkpoint it needs is gone: it is pinned
            await self._give_up(group, "no checkpoint of the history before the corrected label")
            return
        held = max(queue.waiting)
        work = dataclasses.replace(found[1], held=held)
        self._started[group] = self.monotonic()
        queue.flight = _Flight(
            self.runner.submit(work),
            since,
            held,
            self.history.last_seq(group),
            self._epoch_of(group),
        )

    async def _landed(self, group: str) -> None:
        """A derivation of ``group`` is done: taken, done again, continued or applied."""
        queue = self._queues[group]
        flight, queue.flight = queue.flight, None
        assert flight is not None  # noqa: S101 - called for a flight
        if flight.epoch != self._epoch_of(group):
            if flight.epoch[0] == self._epoch:  # the history started again: notes and all
                await self._give_up(group, "the model's history started again meanwhile")
            return  # else it was read again since: resume() queued what is left
        try:
            derived = flight.future.result()
        except Exception as exc:
            if broken(exc):
                log.warning("the derivation of model %s was lost (%r): again", group, exc)
                queue.since = (
                    flight.since if queue.since is None else min(queue.since, flight.since)
                )
                return
            log.exception("the derivation of model %s failed", group)
            await self._give_up(group, f"the derivation failed: {exc!r}")
            return
        checkpoints = {**flight.checkpoints, **derived.checkpoints}
        if self.history.last_seq(group) > derived.last_seq:  # labels came meanwhile
            steps = self.history.raw_steps(group, derived.last_seq + 1)
            keep = tuple(self.history.checkpoints_after(group, derived.last_seq))
            future = self.runner.submit(Job(group, derived.states, steps, keep, held=flight.held))
            queue.flight = _Flight(
                future,
                flight.since,
                flight.held,
                self.history.last_seq(group),
                self._epoch_of(group),
                checkpoints,
            )
            if self.eager:
                await self._landed(group)
            return
        await self._apply(group, derived.states, checkpoints, flight.held)

    async def _apply(
        self, group: str, states: Mapping[str, bytes], checkpoints: Checkpoints, held: int
    ) -> None:
        """Write the checkpoints derived (durably), then each member's next version: they
        hold the corrections read up to labels offset ``held``."""
        queue = self._queues[group]
        applied = {o: w for o, w in queue.waiting.items() if o <= held}
        with self.scope(queue.partition):
            async with self.publisher.lock:
                for i, (seq, members) in enumerate(sorted(checkpoints.items())):
                    for member, raw in members.items():
                        self.history.put_raw_checkpoint(member, seq, raw)
                    if i % CHECKPOINTS_PER_WRITE == CHECKPOINTS_PER_WRITE - 1:
                        await self.outputs.durable()  # in pieces: scoring runs between
                await self.outputs.durable()
                await self.write_versions(group, states, applied, queue.partition)
        queue.waiting = {o: w for o, w in queue.waiting.items() if o > held}
        self.history.unpin(group)
        if queue.since is not None:  # noted meanwhile: its checkpoint stays for the next
            self._changed(group, queue.since)
        self.metrics.corrections_queued.labels(model=group).set(len(queue.waiting))
        self._counted(group, applied)

    async def write_versions(
        self,
        group: str,
        states: Mapping[str, bytes],
        waiting: Mapping[int, _Waiting],
        partition: int,
    ) -> None:
        """Each member's next version holding the corrections ``waiting`` (the caller holds
        the publisher's lock, the checkpoints are durable)."""
        current = {m: self.models.get(m) for m in states if m in self.settings.models}
        parsed = {m: parse_model_envelope(raw, model=m) for m, raw in states.items()}
        reach_from = self.history.reach_from(group)
        for version in finish(
            parsed,
            current,
            corrections=sorted(waiting),
            partition=partition,
            now=self.clock(),
            reach_from=reach_from,
        ):
            outcome = LabelOutcome(Outcome.APPLIED, model=version, encoded=version.to_bytes())
            await self.publisher.put(outcome, learned=False)

    def _counted(self, group: str, applied: Mapping[int, _Waiting]) -> None:
        now = time.monotonic()
        for offset, waiting in sorted(applied.items()):
            kind = kind_of(waiting.note)
            self.metrics.corrections.labels(model=group, outcome=kind).inc()
            self.metrics.correction_seconds.labels(model=group).observe(now - waiting.queued_at)
            log.info(
                "model %s: the label of request %s %s by %s (%s), read at labels offset "
                "%d, applied after %.3f s",
                group,
                waiting.request_id,
                kind,
                waiting.note.by,
                waiting.note.role,
                offset,
                now - waiting.queued_at,
            )

    async def _give_up(self, group: str, why: str) -> None:
        """The queued corrections of ``group`` cannot be applied: the group's history starts
        again (their notes go with it) and each is dead-lettered (``history_untrusted``)."""
        queue = self._queues.pop(group, None)
        with self.scope(self.history.partition(group) if queue is None else queue.partition):
            self.history.cut(group)
        if queue is None:
            return
        self.metrics.corrections_queued.labels(model=group).set(0)
        for offset, waiting in sorted(queue.waiting.items()):
            message = waiting.message or RawMessage(
                b"", self.settings.topics.labels, queue.partition, offset
            )
            detail = f"correction of request {waiting.request_id} not applied: {why}"
            log.error("model %s: %s", group, detail)
            await self.outputs.dead_letter(
                DeadLetter.of(Source.LABELS, message, Reason.HISTORY_UNTRUSTED, detail)
            )

    # -- after a restart

    def resume(self) -> None:
        """The history was read again (a recovery or a rebalance): rebuild the queues from
        what is durable, the notes on the steps that a member does not hold."""
        self._epoch += 1
        self._queues = {}
        for group in self.history.groups():
            partition = self.history.partition(group)
            members = [m for m in self.history.members(group) if m in self.settings.models]
            held = min((self._corrected_to(m, partition) for m in members), default=-1)
            for raw in self.history.raw_steps(group, 0):
                step = parse_step(raw)
                for n in step.notes:
                    if n.changed and n.offset > held:
                        queue = self._queue(group, partition)
                        queue.waiting[n.offset] = _Waiting(
                            step.request_id, n, step.seq, time.monotonic()
                        )
                        queue.resumed_at = time.monotonic()
                        self._changed(group, step.seq)
            if group in self._queues:
                log.warning(
                    "model %s: %d corrections read before the restart are applied again",
                    group,
                    len(self._queues[group].waiting),
                )

    def _corrected_to(self, member: str, partition: int) -> int:
        return corrected_to(self.models.get(member), partition)

    async def _ready(self, group: str, queue: _Queue, *, wait: bool = False) -> bool:
        """A queue rebuilt after a restart may start once the history is trusted and its
        last label's writes, which a crash may have cut short, are redone (or after
        :data:`REDO_WAIT`)."""
        with self.scope(queue.partition):
            try:
                await self.readback.trusted(group)
            except BadMessage as bad:
                await self._give_up(group, bad.detail)
                return False
        if (
            not wait
            and self._unheld(group)
            and (time.monotonic() - (queue.resumed_at or 0.0) < REDO_WAIT)
        ):
            return False
        queue.resumed_at = None
        return True

    def _unheld(self, group: str) -> bool:
        """True if the last step of ``group`` is marked applied and a member's version is
        below its mark (its redelivered label has not redone the model write yet)."""
        last = self.history.raw_steps(group, self.history.last_seq(group))
        if not last:
            return False
        step = parse_step(last[-1])
        entry = self.pending.get(step.request_id)
        if entry is None or not entry.applied or entry.applied_offset != step.offset:
            return False
        marks = {step.request.server: entry.applied_version or 0, **entry.shadow_versions}
        return any(
            m in self.settings.models and self.models.get(m).version < v for m, v in marks.items()
        )
