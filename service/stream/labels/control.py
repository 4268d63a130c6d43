"""The records of the labels topic that are not labels: rollback and seed orders, and
corrections. :class:`Control` carries them out for the learner
(:class:`~service.stream.labels.joiner.LabelJoiner` hands it each one, already parsed and
placed), each at its place in the labels log and safe to redo:

- a rollback or seed order serves another state as the member's next version (one write);
  the group's corrections waiting are applied first, then its history is cut, durably (a
  correction never reaches across a state the labels did not make). An order says which
  version of its target it was written against (``base_version``): one written before the
  target's current line began (a copy of an earlier order, or an old snapshot carried by a
  seed order) is refused as ``replayed``, and the version it serves begins a new line
  (``ModelEnvelope.line_from``);
- a correction is noted on its step and applied by the
  :class:`~service.stream.labels.corrector.Corrector`.

With ``snapshot_key`` orders and corrections are taken only signed (:meth:`Control.verify`):
a seed order by its own signature too, not only its state's (a snapshot's signature, which
any snapshot on the models topic carries).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from service.config import Settings
from service.metrics import Metrics
from service.records import BadMessage, Correction, ModelEnvelope, RawMessage, Reason, Signer
from service.records.labels import Rollback, Seed
from service.stream.labels.corrector import Corrector
from service.stream.labels.history import History
from service.stream.labels.protocol import LabelOutcome, Outcome
from service.stream.labels.publish import Publisher
from service.stream.labels.seed import adopt_seed, stale_order
from service.stream.labels.state import HISTORY, ModelStore
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
        history: History,
        corrector: Corrector,
        publisher: Publisher,
        outputs: Outputs,
        metrics: Metrics,
        clock: Callable[[], float],
        signer: Signer | None,
    ) -> None:
        self.settings, self.models, self.history = settings, models, history
        self.corrector, self.publisher, self.outputs = corrector, publisher, outputs
        self.metrics, self.clock, self.signer = metrics, clock, signer

    def verify(self, what: str, message: RawMessage) -> None:
        """With ``snapshot_key``, an order or a correction (``what`` it is, for the dead
        letter) is taken only with the signature of whoever may write one (``abstain
        models rollback`` and ``seed``, the label desk, ``abstain labels correct``: the same
        HMAC as a snapshot's, over the record's key and value): anyone who may write labels
        could otherwise reset any model or undo anyone's answer. ``unsigned`` or
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
        labels did not make. It begins a line of its own (``line_from``)."""
        group = self.settings.learner_key(envelope.model)
        async with self.publisher.lock:
            if self.history.reach_from(group) >= 0:
                self.history.cut(group)
                await self.outputs.durable()
            envelope = envelope.replace(corrections_from=-1, line_from=envelope.version)
            await self.publisher.put(
                LabelOutcome(Outcome.APPLIED, model=envelope, encoded=envelope.to_bytes()),
                learned=False,
            )

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
        stale = stale_order(
            "rollback order", order.base_version, current, keyed=self.signer is not None
        )
        if stale is not None:
            raise stale
        await self.corrector.drain(self.settings.learner_key(target))
        current = self.models.get(target)
        old = self.models.version(target, order.to_version)
        if old is None or order.to_version >= current.version:
            kept = [0, *(v for v in self.models.kept(target) if v < current.version)]
            raise BadMessage(
                "unknown_version",
                f"version {order.to_version} of {target!r} is not kept (now "
                f"{current.version}; kept: {', '.join(map(str, kept))}, of the last "
                f"{HISTORY} written)",
            )
        offset = message.offset
        if message.partition == current.labels_partition:
            offset = max(offset, current.labels_offset)
        restored = old.replace(
            version=current.version + 1,
            labels_offset=offset,
            labels_partition=message.partition,
            updated_at=self.clock(),
        )
        await self._serve_next(restored)
        log.warning(
            "model %s rolled back to version %s as version %s by %s",
            target,
            order.to_version,
            restored.version,
            order.by,
        )

    async def seed(self, order: Seed, message: RawMessage) -> None:
        """Serve the seeded state of ``order.target`` as its next version, at this record's
        place in the labels log: the labels after it are applied on top of it, the learner's
        earlier state is replaced (its last versions stay kept for a rollback). The state is
        checked as a snapshot is (signature with ``snapshot_key``, format, algorithm and
        width). One write, like a rollback: a redelivered order is a no-op.
        :class:`BadMessage` when the state is refused."""
        self.verify(f"seed order of {order.target!r}", message)
        target = order.target
        current = self._order_target(order.model, target, message)
        if current is None:
            return
        adopt_seed(
            self.settings, current, order, (message.partition, message.offset), now=self.clock()
        )  # checked before the queue is drained
        await self.corrector.drain(self.settings.learner_key(target))
        adopted = adopt_seed(
            self.settings,
            self.models.get(target),
            order,
            (message.partition, message.offset),
            now=self.clock(),
        )
        await self._serve_next(adopted)
        log.warning(
            "model %s seeded from %s labelled rows by %s as version %s",
            target,
            order.rows,
            order.by,
            adopted.version,
        )

    async def correct(self, correction: Correction, message: RawMessage) -> None:
        """Make every member of the group what it would be had the corrected label been the
        one given (:class:`~service.stream.labels.corrector.Corrector`: noted here, at this
        record's place in the labels log, applied once derived). :class:`BadMessage` when
        it is refused."""
        self.verify(f"correction of request {correction.request_id}", message)
        await self.corrector.correct(correction, message)
