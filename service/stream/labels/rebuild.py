"""Rebuild a model from its label log (docs/reference/architecture.md, "Exactly-once effects").

``abstain rebuild --model NAME`` reads the label-requests and labels topics from the
beginning and replays the labels, in the labels topic's order, through the learner's own
pure code path (:func:`service.stream.labels.protocol.apply_label`), starting from the configured
initial model. What the learner skips is skipped here too: labels of other models, labels
without a request (``unknown_request``), labels for an expired request (``expired``), second
labels for an answered request (``already_applied``), and updates that would not be finite
(``non_finite``). A label's "now" is its record's broker timestamp, which is when the learner
could first have seen it. A seed order of the model (``abstain models seed``) is adopted at
its place, as the learner adopts it, and the labels after it are applied on top; one the
learner would refuse (unsigned with a key, a copy of an earlier order: ``replayed``) is
skipped with its reason; a rollback order is skipped (``rollback``: the versions it names
are the learner's, not the log's). A correction is applied as the learner applies it
(:mod:`~service.stream.labels.history.corrections`, with the same history of the labels it
can reach, which starts again at every seed or rollback order of the model's group), and
refused for the same reasons (a copy of one already applied: ``replayed``); a second
opinion teaches nothing.

The result is the model state the learner holds after the same labels (``updated_at``
aside); ``--publish`` writes it to the models topic, where scorers take it if its version
is newer than what they serve.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.config import Settings
from service.learning import Parts, learner_for
from service.records import (
    BadMessage,
    Correction,
    Label,
    ModelEnvelope,
    Opinion,
    PendingEntry,
    parse_label_request,
    parse_model_envelope,
)
from service.records.history import Step
from service.records.labels import LabelsRecord, Rollback, Seed, parse_labels_record
from service.records.moments import moments_trust
from service.records.state import Limits
from service.stream.labels.admission import admission
from service.stream.labels.history import History, finish, job, note, run_job
from service.stream.labels.protocol import Outcome, apply_label
from service.stream.labels.seed import adopt_seed, stale_order
from service.stream.models.book import signer_for
from service.stream.models.served import initial_envelope

__all__ = ["LogRecord", "Rebuilt", "rebuild_model", "summary"]


@dataclass(frozen=True, slots=True)
class LogRecord:
    """A record read back from a topic (its key and signature header, if any)."""

    partition: int
    offset: int
    timestamp_ms: int
    value: bytes
    key: bytes | None = None
    signature: bytes | None = None

    @property
    def now(self) -> float:
        """When the learner could first have seen it: its broker timestamp, in seconds."""
        return self.timestamp_ms / 1000.0


@dataclass(slots=True)
class Rebuilt:
    """The rebuilt model and what was skipped, by reason."""

    model: ModelEnvelope
    skipped: Counter[str] = field(default_factory=Counter)


def _requests(
    settings: Settings, name: str, records: Iterable[LogRecord]
) -> dict[str, PendingEntry]:
    """The first valid request per id of model ``name`` (a re-sent one changes nothing)."""
    admit = admission(settings)  # the learner's checks of a request's content
    pending: dict[str, PendingEntry] = {}
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        try:
            request = parse_label_request(rec.value, max_bytes=settings.max_message_bytes)
            if request.model != name:
                continue
            admit.request(request)
        except BadMessage:
            continue
        pending.setdefault(request.request_id, PendingEntry(request, rec.partition))
    return pending


def rebuild_model(
    settings: Settings,
    name: str,
    requests: Iterable[LogRecord],
    labels: Iterable[LogRecord],
) -> Rebuilt:
    """Replay ``labels`` (sorted by partition, offset) against ``requests`` for model ``name``."""
    replay = _Replay(settings, name, _requests(settings, name, requests))
    for rec in sorted(labels, key=lambda r: (r.partition, r.offset)):
        try:
            record = parse_labels_record(rec.value, max_bytes=settings.max_message_bytes)
            if record.model == name:
                replay.take(record, rec)
        except BadMessage as bad:
            replay.out.skipped[str(bad.reason)] += 1
    replay.settle()
    return replay.out


class _Replay:
    """The learner's label path for one model (its champion's line alone), fed the labels
    log in order: labels, corrections, seed and rollback orders (module docstring)."""

    def __init__(self, settings: Settings, name: str, pending: dict[str, PendingEntry]) -> None:
        self.settings, self.name, self.pending = settings, name, pending
        self.config = settings.models[name]
        self.cap = self.config.weight_cap(settings.max_importance_weight)
        # a version over them is refused, as live
        self.limits = Limits.of(settings)
        self.history = History({}, settings)  # the labels a correction reaches, as kept
        self.signer = signer_for(settings)
        self.out = Rebuilt(initial_envelope(name, self.config))
        # corrections noted and not derived yet (derived together before the next record
        # that needs the model, as the learner applies those queued together): the earliest
        # step they changed, their offsets, the time of the last
        self.since: int | None = None
        self.waiting: list[int] = []
        self.last: LogRecord | None = None

    def take(self, record: LabelsRecord, rec: LogRecord) -> None:
        """Apply one record of the model's key; :class:`BadMessage` when it is skipped."""
        if isinstance(record, Opinion):
            return
        if not isinstance(record, Correction):
            self.settle()
        if isinstance(record, Rollback | Seed):
            self._verify(f"{type(record).__name__.lower()} order", rec)
        if isinstance(record, Rollback):  # the history starts again, as the learner's
            stale = stale_order(
                "rollback order", record.base_version, self.out.model, keyed=self.signer is not None
            )
            if stale is not None and record.target == self.name:
                raise stale
            self.history.cut(self.name)
            self.out.skipped["rollback"] += record.target == self.name
            return
        if isinstance(record, Seed):
            if record.target == self.name:  # a champion's own line
                seeded = adopt_seed(
                    self.settings, self.out.model, record, (rec.partition, rec.offset), now=rec.now
                )
                self.out.model = seeded.replace(corrections_from=-1)
            self.history.cut(self.name)
            return
        if isinstance(record, Correction):
            self._correct(record, rec)
        else:
            self._label(record, rec)

    def _verify(self, what: str, rec: LogRecord) -> None:
        """With a key, the record's own signature (as the learner checks it)."""
        if self.signer is not None:
            reason = self.signer.verify(rec.key or b"", rec.value, rec.signature)
            if reason is not None:
                raise BadMessage(reason, f"{what} is {reason}")

    def _label(self, label: Label, rec: LogRecord) -> None:
        plan = self.history.plan(
            self.name, (self.name,), offset=rec.offset, partition=rec.partition
        )
        before = self.out.model
        pending = self.pending.get(label.request_id)
        outcome = apply_label(
            self.config,
            before,
            pending,
            label,
            rec.offset,
            now=rec.now,
            partition=rec.partition,
            parked=True,  # every label is read exactly once here: no redelivery check
            max_weight=self.cap,
            corrections_from=plan.reach_from,
            trust=None if pending is None else moments_trust(self.signer, pending.request),
            limits=self.limits,
        )
        if outcome.outcome is not Outcome.APPLIED:
            self.out.skipped[str(outcome.reason)] += 1
            return
        assert outcome.model is not None  # noqa: S101 - an applied outcome has both
        assert outcome.pending is not None  # noqa: S101
        step = Step(
            self.name,
            plan.seq,
            rec.partition,
            rec.offset,
            outcome.pending.request,
            label.label,
            label.label,
            label.labelled_by,
            label.ts,
            applied_at=rec.now,
        )
        self.history.record(plan, step, {self.name: before})
        self.out.model = outcome.model
        self.pending[label.request_id] = outcome.pending

    def _correct(self, correction: Correction, rec: LogRecord) -> None:
        self._verify(f"correction of request {correction.request_id}", rec)
        noted = note(
            self.history, correction, self.pending.get(correction.request_id), offset=rec.offset
        )
        self.history.put_step(noted.step)
        if not noted.note.changed:
            return
        self.since = noted.step.seq if self.since is None else min(self.since, noted.step.seq)
        self.waiting.append(rec.offset)
        self.last = rec

    def settle(self) -> None:
        """Derive the corrections noted (one derivation for all of them)."""
        since, rec, waiting = self.since, self.last, self.waiting
        self.since, self.last, self.waiting = None, None, []
        if since is None or rec is None:
            return
        found = job(self.history, self.name, since)
        assert found is not None  # noqa: S101 - note() found a checkpoint before each
        derived = run_job(self.settings, found[1])
        for seq, before in derived.checkpoints.items():
            for member, raw in before.items():
                self.history.put_raw_checkpoint(member, seq, raw)
        after = {m: parse_model_envelope(raw, model=m) for m, raw in derived.states.items()}
        for version in finish(
            after,
            {self.name: self.out.model},
            corrections=waiting,
            partition=rec.partition,
            now=rec.now,
            reach_from=self.history.reach_from(self.name),
        ):
            self.out.model = version


def summary(rebuilt: Rebuilt) -> dict[str, Any]:
    """What ``abstain rebuild`` prints: version, rho, ||w|| and the skipped labels."""
    model = rebuilt.model
    learner = learner_for(dict(model.learner), Parts())  # any record, wrapped or not
    served_w = learner.w
    return {
        "model": model.model,
        "version": model.version,
        "labels_applied": model.labels_applied,
        "labels_offset": model.labels_offset,
        "rho": float(learner.rho),
        "weight_norm": None if served_w is None else float(np.linalg.norm(served_w)),
        "changes_detected": learner.changes_detected,
        "takeovers": learner.takeovers,
        "skipped": dict(sorted(rebuilt.skipped.items())),
    }
