"""The records of the labels topic that are not labels: rollback and seed orders, and
corrections. :class:`Control` carries them out for the learner
(:class:`~service.stream.labels.joiner.LabelJoiner` hands it each one, already parsed and
placed), each at its place in the labels log and safe to redo:

- a rollback or seed order serves another state as the member's next version (one write);
  the group's history is cut first, durably (a correction never reaches across a state the
  labels did not make);
- a correction (:mod:`~service.stream.labels.corrections`) writes the corrected step and the
  checkpoints after it first, durably, then each member's next version.

With ``snapshot_key`` orders and corrections are taken only signed (:meth:`Control.verify`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from service.config import Settings
from service.metrics import Metrics
from service.records import (
    BadMessage,
    Correction,
    ModelEnvelope,
    RawMessage,
    Reason,
    Rollback,
    Seed,
    Signer,
    Step,
)
from service.stream.labels.corrections import Work, finish, kind_of, prepare
from service.stream.labels.history import History, rederive
from service.stream.labels.protocol import LabelOutcome, Outcome
from service.stream.labels.publish import Publisher
from service.stream.labels.seed import adopt_seed
from service.stream.labels.state import HISTORY, ModelStore, PendingStore
from service.stream.outputs import Outputs

__all__ = ["Control"]

log = logging.getLogger(__name__)


class Control:
    """Orders and corrections for the learner (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        models: ModelStore,
        pending: PendingStore,
        history: History,
        publisher: Publisher,
        outputs: Outputs,
        metrics: Metrics,
        clock: Callable[[], float],
        signer: Signer | None,
    ) -> None:
        self.settings, self.models, self.pending, self.history = settings, models, pending, history
        self.publisher, self.outputs, self.metrics = publisher, outputs, metrics
        self.clock, self.signer = clock, signer

    def verify(self, what: str, message: RawMessage) -> None:
        """With ``snapshot_key``, a rollback order or a correction (``what`` it is, for the
        dead letter) is taken only with the signature of whoever may write one (``abstain
        models rollback``, the label desk, ``abstain labels correct``: the same HMAC as a
        snapshot's, over the record's key and value): anyone who may write labels could
        otherwise reset any model or undo anyone's answer. ``unsigned`` or
        ``bad_signature`` otherwise."""
        if self.signer is None:
            return
        reason = self.signer.verify(message.key or b"", message.value, message.signature)
        if reason is not None:
            raise BadMessage(reason, f"{what} is {reason}")

    def _order_target(self, model: str, target: str, message: RawMessage) -> ModelEnvelope | None:
        """The model a control order (rollback, seed) read under ``model``'s key acts on, or
        None when this record was already applied (a redelivery: counted, a no-op).
        :class:`BadMessage` when ``target`` is not in ``model``'s group."""
        if target not in self.settings.group(model):
            raise BadMessage("unknown_model", f"{target!r} is not in the group of {model!r}")
        current = self.models.get(target)
        if current.applied(message.partition, message.offset):
            self.metrics.labels_ignored.labels(model=target, reason=Reason.REDELIVERED).inc()
            return None
        return current

    async def _serve_next(self, envelope: ModelEnvelope) -> None:
        """Write ``envelope`` as the model's next version (one write, as a label's), after
        its group's history is cut, durably: no correction reaches across a state the
        labels did not make."""
        group = self.settings.learner_key(envelope.model)
        async with self.publisher.lock:
            if self.history.reach_from(group) >= 0:
                self.history.cut(group)
                await self.outputs.durable()
            envelope = envelope.replace(corrections_from=-1)
            await self.publisher.put(LabelOutcome(Outcome.APPLIED, model=envelope,
                                                  encoded=envelope.to_json()),
                                     learned=False)  # fmt: skip

    async def rollback(self, order: Rollback, message: RawMessage) -> None:
        """Serve version ``order.to_version`` of ``order.target`` again as its next version,
        at this record's place in the labels log (the labels before it taught the line
        rolled back, those after it teach the restored one). One write: a crash before it
        is redone by the redelivered order, one after it leaves an offset that makes the
        redelivery a no-op. :class:`BadMessage` when the version is not kept."""
        self.verify(f"rollback order of {order.target!r} to version {order.to_version}", message)
        target = order.target
        current = self._order_target(order.model, target, message)
        if current is None:
            return
        old = self.models.version(target, order.to_version)
        if old is None or order.to_version >= current.version:
            detail = f"version {order.to_version} of {target!r} is not kept (now {current.version}"
            raise BadMessage("unknown_version", f"{detail}; the last {HISTORY} are)")
        offset = message.offset
        if message.partition == current.labels_partition:
            offset = max(offset, current.labels_offset)
        restored = old.replace(version=current.version + 1, labels_offset=offset,
                               labels_partition=message.partition,
                               updated_at=self.clock())  # fmt: skip
        await self._serve_next(restored)
        log.warning("model %s rolled back to version %s as version %s by %s", target,
                    order.to_version, restored.version, order.by)  # fmt: skip

    async def seed(self, order: Seed, message: RawMessage) -> None:
        """Serve the seeded state of ``order.target`` as its next version, at this record's
        place in the labels log: the labels after it are applied on top of it, the learner's
        earlier state is replaced (its last versions stay kept for a rollback). The state is
        checked as a snapshot is (signature with ``snapshot_key``, format, algorithm and
        width). One write, like a rollback: a redelivered order is a no-op.
        :class:`BadMessage` when the state is refused."""
        target = order.target
        current = self._order_target(order.model, target, message)
        if current is None:
            return
        adopted = adopt_seed(self.settings, current, order, (message.partition, message.offset),
                             now=self.clock())  # fmt: skip
        await self._serve_next(adopted)
        log.warning("model %s seeded from %s labelled rows by %s as version %s", target,
                    order.rows, order.by, adopted.version)  # fmt: skip

    async def correct(self, correction: Correction, message: RawMessage) -> None:
        """Make every member of the group what it would be had the corrected label been the
        one given (:mod:`~service.stream.labels.corrections`): the corrected step and the
        checkpoints after it first, durably, then each member's next version at this
        record's place in the labels log. :class:`BadMessage` when it is refused."""
        self.verify(f"correction of request {correction.request_id}", message)
        group, where = correction.model, (message.partition, message.offset)
        if all(self.models.get(m).applied(*where) for m in self.settings.group(group)):
            self.metrics.labels_ignored.labels(model=group, reason=Reason.REDELIVERED).inc()
            return  # every member holds it already (its step may have left the history)
        prepared = prepare(self.history, correction, self.pending.get(correction.request_id),
                           offset=message.offset)  # fmt: skip
        if prepared is None:  # redelivered, and it changed nothing
            self.metrics.labels_ignored.labels(model=group, reason=Reason.REDELIVERED).inc()
            return
        if isinstance(prepared, Step):  # the label in force stays: the note is all
            async with self.publisher.lock:
                self.history.put_step(prepared)
            self.metrics.corrections.labels(model=group, outcome="unchanged").inc()
            return
        started = time.perf_counter()
        rederived = await asyncio.to_thread(rederive, self.settings, group, prepared.base,
                                            prepared.steps, keep=prepared.keep)  # fmt: skip
        async with self.publisher.lock:
            self.history.put_step(prepared.step)
            for seq, states in rederived.checkpoints.items():
                for member, state in states.items():
                    self.history.put_checkpoint(member, seq, state)
            await self.outputs.durable()
            current = {m: self.models.get(m) for m in prepared.base if m in self.settings.models}
            for version in finish(rederived, current, where=where, now=self.clock(),
                                  reach_from=self.history.reach_from(group)):  # fmt: skip
                outcome = LabelOutcome(Outcome.APPLIED, model=version, encoded=version.to_json())
                await self.publisher.put(outcome, learned=False)
        self._corrected(correction, prepared, time.perf_counter() - started)

    def _corrected(self, correction: Correction, work: Work, seconds: float) -> None:
        group, step = correction.model, work.step
        self.metrics.correction_seconds.labels(model=group).observe(seconds)
        if work.redo:
            return
        kind = kind_of(step.notes[-1])
        self.metrics.corrections.labels(model=group, outcome=kind).inc()
        log.info("model %s: the label of request %s %s by %s (%s): %d labels applied again "
                 "in %.3f s", group, step.request_id, kind, correction.by, correction.role,
                 len(work.steps), seconds)  # fmt: skip
