"""Label -> model as pure functions over typed records (no Kafka, no tables, no clock).

:func:`apply_label` joins a label with its pending request and updates the model at its
CURRENT (w, rho) (a delayed label is a stochastic gradient step at the current iterate).
:func:`park_label` makes the record of a label that overtook its request. The protocol
around them (which table is written first, when a parked label is applied, sweeps) is
:class:`service.stream.labels.joiner.LabelJoiner`; ``abstain rebuild`` replays a label log through
these same functions.

Reading a model's states into objects (:meth:`~service.learning.Pipeline.from_state`,
:func:`~service.learning.learner_for`) costs most of a label: an adaptive learner rebuilds
its champion, challengers, detectors and remembered labels. The objects that wrote a
version are that version read back (every state record round-trips exactly: floats as the
shortest repr that reads back to the same double, the generator's words as decimal
strings), so :data:`LIVE` (:class:`LiveModels`) keeps them, per model, with the
:class:`~service.records.ModelEnvelope` they wrote, and the next label takes them only for
that same envelope object (not an equal one: another process's version, a rollback, a
rebuild or a correction's re-derivation brings another object) and the same adaptive parts.
Taking an entry removes it: a label that is refused, raises, or whose version is not kept
leaves nothing behind (its objects may have moved), and the next label reads the states.

Inside a group (the learn loop's group commit: only each model's newest version of a group is
written) a label may be applied with ``defer``: its version's states are
:class:`~service.records.state.Deferred`, made and checked only if read (the joiner reads
the newest as it writes it, and a history checkpoint's before its label), never for the
versions between, which no one reads. Their objects then hold the only copy of the state:
when the next label takes them, the version before can no longer be read back. So a label
that is refused after it took such objects cannot leave the model as it was: it raises
:class:`StrictRedo`, and the learner applies the group again from what is durable, one
label at a time with every version checked (the way it applies a label outside a group),
which refuses that label alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import numpy as np

from service.config import ModelConfig
from service.learning import (
    Adaptive,
    LearningError,
    Parts,
    Pipeline,
    RiskEstimate,
    learn_from_champion,
    learner_for,
)
from service.learning.linear import LinearLearner
from service.learning.moments import Implausible, Moments
from service.learning.risk.shadow import Weighting
from service.learning.sparse import SparseRow
from service.records import (
    BadMessage,
    Label,
    LabelRequest,
    ModelEnvelope,
    PendingEntry,
    Reason,
    RecordError,
)
from service.records.moments import MomentsTrust, Untrusted, untrusted
from service.records.state import Deferred, Limits, ParkedLabel, TooLarge
from service.stream.labels.admission import inputs_of

__all__ = [
    "LIVE",
    "LabelOutcome",
    "LiveModels",
    "Outcome",
    "StrictRedo",
    "apply_label",
    "apply_shadow_label",
    "park_label",
    "teach",
    "zero_one_d_loss",
]


def zero_one_d_loss(decided: int, label: int, cost: float) -> float:
    """The 0-d-1 loss of a served decision: 0 right, 1 wrong, ``cost`` if rejected.

    >>> zero_one_d_loss(1, 1, 0.2), zero_one_d_loss(-1, 1, 0.2), zero_one_d_loss(0, -1, 0.2)
    (0.0, 1.0, 0.2)
    """
    if decided == 0:
        return cost
    return 0.0 if decided == label else 1.0


class StrictRedo(Exception):  # noqa: N818 - what the learner must do
    """A label applied inside a group cannot be refused there, or the group's newest version
    of ``model`` fails the checks its versions between were spared (module docstring): the
    group must be applied again from what is durable, one label at a time, each version
    checked."""

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model!r}: {detail}")
        self.model = model


class Outcome(StrEnum):
    """What a label did."""

    APPLIED = "applied"  # the model moved to a new version
    IGNORED = "ignored"  # a redelivery: no effect, no dead letter
    DEAD = "dead"  # cannot be joined: dead-lettered with the reason
    REFUSED = "refused"  # the update would not be finite: dead-lettered, counted


@dataclass(frozen=True, slots=True)
class LabelOutcome:
    """The result of :func:`apply_label`. When applied: the new model and pending entry,
    the importance-weighted loss added and the request's turnaround."""

    outcome: Outcome
    reason: Reason | None = None
    detail: str = ""
    model: ModelEnvelope | None = None
    # model.to_bytes() when already made; a label's version is only checked (what it
    # would write is finite and bounded) and encoded if it is written (:meth:`encode`)
    encoded: bytes | None = None
    # model.served().to_bytes() when already made (what the models topic carries)
    served: bytes | None = None
    pending: PendingEntry | None = None
    iw_loss: float = 0.0
    turnaround: float = 0.0
    clipped: bool = False  # the weight 1/p was capped at max_weight
    changes: int = 0  # changes the model's detector found on this label (adaptive learning)
    takeovers: int = 0  # challengers that took over on this label
    # why the request's moments were not merged (the label was applied without them)
    moments_refused: Implausible | Untrusted | None = None

    def encode(self) -> bytes:
        """The record of the applied version, as a learner writes it (its checks passed
        when it was made: :meth:`~service.records.ModelEnvelope.check`)."""
        assert self.model is not None  # noqa: S101 - an applied outcome carries it
        return self.encoded if self.encoded is not None else self.model.to_bytes()

    def serve(self) -> bytes:
        """The record a scorer reads of the applied version (the models topic's)."""
        assert self.model is not None  # noqa: S101 - an applied outcome carries it
        return self.served if self.served is not None else self.model.served().to_bytes()


@dataclass(frozen=True, slots=True)
class _Entry:
    model: ModelEnvelope  # the version these objects wrote
    parts: Parts | None  # the adaptive parts the learner was read with
    pipeline: Pipeline
    learner: Any


class LiveModels:
    """The objects of at most ``size`` models (the least recently kept go first)."""

    __slots__ = ("_entries", "_size")

    def __init__(self, size: int = 64) -> None:
        self._entries: dict[str, _Entry] = {}
        self._size = size

    def take(self, model: ModelEnvelope, parts: Parts | None) -> tuple[Pipeline, Any] | None:
        """The (pipeline, learner) that wrote ``model`` itself, read with ``parts``, now
        the caller's alone; None when none is kept for it (the caller reads the state)."""
        entry = self._entries.pop(model.model, None)
        if entry is None:
            return None
        if entry.model is not model or entry.parts != parts:
            entry.model.make_states()  # its objects are as it left them: the last chance
            return None
        for state in model.deferred:  # the objects move on: what was not made never will be
            state.spend()
        return entry.pipeline, entry.learner

    def keep(
        self, model: ModelEnvelope, parts: Parts | None, pipeline: Pipeline, learner: Any
    ) -> None:
        """Keep ``pipeline`` and ``learner``, whose ``to_state()`` are ``model``'s
        records, for the next label of ``model``."""
        old = self._entries.pop(model.model, None)
        if old is not None and old.learner is not learner:
            old.model.make_states()
        self._entries[model.model] = _Entry(model, parts, pipeline, learner)
        while len(self._entries) > self._size:
            self._entries.pop(next(iter(self._entries))).model.make_states()

    def clear(self) -> None:
        """Forget every entry (the next label of each model reads its state; a deferred
        state is made first, while its objects still hold it)."""
        for entry in self._entries.values():
            entry.model.make_states()
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


#: the process's live models (module docstring)
LIVE: Final = LiveModels()


def _unapplied(outcome: Outcome, reason: Reason, detail: str) -> LabelOutcome:
    return LabelOutcome(outcome, reason, detail)


def _check_join(
    model: ModelEnvelope,
    pending: PendingEntry | None,
    label: Label,
    where: tuple[int, int],
    *,
    now: float,
    parked: bool,
) -> LabelOutcome | None:
    """Why ``label`` (at labels ``where`` = (partition, offset)) cannot be applied (None:
    it can)."""
    partition, offset = where
    if not parked and model.applied(partition, offset):
        return _unapplied(Outcome.IGNORED, Reason.REDELIVERED, f"offset {offset} already applied")
    if pending is None or pending.model != label.model:
        return _unapplied(
            Outcome.DEAD, Reason.UNKNOWN_REQUEST, f"no pending request {label.request_id}"
        )
    redo = False
    if pending.applied:
        mine = pending.applied_offset == offset
        # the applied mark is made durable before the model is written (LabelJoiner); after
        # a crash between the two, the mark survives and the model lacks this label: redo it
        redo = mine and model.version < (pending.applied_version or 0)
        if mine and not redo:
            return _unapplied(
                Outcome.IGNORED, Reason.REDELIVERED, f"offset {offset} already applied"
            )
        if not redo:
            return _unapplied(
                Outcome.DEAD, Reason.ALREADY_APPLIED, f"request {label.request_id} answered"
            )
    if now > pending.request.expires_at and not redo:  # it was in time when first applied
        return _unapplied(Outcome.DEAD, Reason.EXPIRED, f"request {label.request_id} expired")
    return None


def apply_label(
    config: ModelConfig,
    model: ModelEnvelope,
    pending: PendingEntry | None,
    label: Label,
    offset: int,
    *,
    now: float,
    partition: int = 0,
    parked: bool = False,
    max_weight: float = 100.0,
    corrections_from: int = -1,
    trust: MomentsTrust | None = None,
    limits: Limits | None = None,
    defer: bool = False,
) -> LabelOutcome:
    """Join a label with its pending request and update the model at its CURRENT (w, rho).

    The standardisers learn first (the moments the request carries and the labelled
    example), then the learner updates on the transformed example. Inputs are never changed
    (records are frozen).

    ``partition``, ``offset``: where the label was read on the labels topic.
    ``parked``: the label was consumed earlier (before its request, see :func:`park_label`)
    and is applied now that the request arrived, so its offset may lie below
    ``labels_offset`` without being a redelivery. ``max_weight`` caps the importance weight
    1/p of the label in the risk estimate (p is floored at ``1 / max_weight``).
    ``corrections_from``: what the new version says of how far back corrections reach.
    ``trust``: the verdict on the request's moments
    (:func:`~service.records.moments.moments_trust`; None: no key, judged).
    ``limits``: the most bytes the new version's records may take (its state in the
    learner's tables, what a scorer reads of it on the models topic); a label whose version
    would take more is REFUSED as ``oversize`` (the model stays as it is), never left for the
    writer to fail on (None: not checked). ``defer``: the new
    version's states are made and checked only if read (module docstring)."""
    refusal = _check_join(model, pending, label, (partition, offset), now=now, parked=parked)
    if refusal is not None:
        return refusal
    assert pending is not None  # noqa: S101 - _check_join refuses a missing request
    outcome = teach(
        config,
        model,
        pending.request,
        label.label,
        where=(partition, offset),
        now=now,
        max_weight=max_weight,
        corrections_from=corrections_from,
        trust=trust,
        limits=limits,
        defer=defer,
    )
    if outcome.model is None:
        return outcome
    return dataclasses.replace(
        outcome,
        pending=pending.answered(label, offset=offset, version=outcome.model.version, now=now),
    )


def teach(
    config: ModelConfig,
    model: ModelEnvelope,
    request: LabelRequest,
    y: int,
    *,
    where: tuple[int, int],
    now: float,
    max_weight: float,
    corrections_from: int = -1,
    trust: MomentsTrust | None = None,
    limits: Limits | None = None,
    defer: bool = False,
) -> LabelOutcome:
    """The next version of the model that decided ``request`` after learning its label
    ``y`` (read at labels ``where`` = (partition, offset)), with no check of the join: the
    update :func:`apply_label` makes once the label is admitted, and the one a correction
    makes again for every later label (:mod:`service.stream.labels.history`). APPLIED with
    the model (``pending`` None), or REFUSED when the update would not be finite."""
    asked = request.query_probability

    def step(learner: Any, z: np.ndarray) -> None:
        if isinstance(learner, Adaptive):  # its detector and challengers weigh by 1/p
            learner.update(z, y, query_probability=asked, max_weight=max_weight)
        else:
            learner.update(z, y)

    learned = _learn(config, model, request, step, trust, defer=defer)
    if isinstance(learned, LabelOutcome):
        return learned
    p = max(asked, 1.0 / max_weight)
    loss = zero_one_d_loss(request.decided_label, y, config.cost) / p
    new_model = _next(
        model,
        learned,
        where=where,
        now=now,
        loss=loss,
        p=p,
        estimate=_charged(model, max_weight, request.decided_label, y, config.cost, asked),
        corrections_from=corrections_from,
    )
    return _applied(
        new_model,
        learned,
        iw_loss=loss,
        turnaround=max(0.0, now - request.requested_at),
        clipped=p > asked,
        limits=limits,
        defer=defer,
    )


def apply_shadow_label(
    config: ModelConfig,
    model: ModelEnvelope,
    pending: PendingEntry,
    label: Label,
    offset: int,
    *,
    now: float,
    partition: int,
    max_weight: float,
    corrections_from: int = -1,
    trust: MomentsTrust | None = None,
    limits: Limits | None = None,
    defer: bool = False,
) -> LabelOutcome:
    r"""Update the shadow ``model`` with the label its champion's request ``pending``
    received (at labels ``partition``, ``offset``): its own standardiser learns the example,
    its learner takes it with the champion's query probability $p$ as importance weight
    $1/\max(p, 1/h_{\max})$ (:func:`~service.learning.learn_from_champion`; a kernel
    learner takes one plain step), and the shadow's decision on the event, made when it was
    scored (``request.shadow_labels``), is charged its 0-d-1 loss with that $p$. A request
    without the shadow's decision (scored before the shadow existed) teaches it and
    charges nothing. The outcome's ``pending`` is None: the caller marks the entry.
    ``defer`` as for :func:`apply_label`."""
    request, y, name = pending.request, label.label, model.model

    def step(learner: Any, z: np.ndarray) -> None:
        inner = learner.champion if isinstance(learner, Adaptive) else learner
        weighting: Weighting = "importance" if isinstance(inner, LinearLearner) else "none"
        learn_from_champion(
            learner, z, y, request.query_probability, max_weight=max_weight, weighting=weighting
        )

    learned = _learn(config, model, request, step, trust, defer=defer)
    if isinstance(learned, LabelOutcome):
        return learned
    p = max(request.query_probability, 1.0 / max_weight)
    decided = request.shadow_labels.get(name)
    loss = 0.0 if decided is None else zero_one_d_loss(decided, y, config.cost) / p
    estimate = (
        _estimate(model, max_weight).to_state()
        if decided is None
        else _charged(model, max_weight, decided, y, config.cost, request.query_probability)
    )
    new_model = _next(
        model,
        learned,
        where=(partition, offset),
        now=now,
        loss=loss,
        p=p if decided is not None else math.inf,
        estimate=estimate,
        corrections_from=corrections_from,
    )
    return _applied(
        new_model,
        learned,
        iw_loss=loss,
        clipped=p > request.query_probability,
        limits=limits,
        defer=defer,
    )


def _applied(
    model: ModelEnvelope,
    learned: _Learned,
    *,
    iw_loss: float,
    clipped: bool,
    turnaround: float = 0.0,
    limits: Limits | None = None,
    defer: bool = False,
) -> LabelOutcome:
    """The outcome of a label applied to ``model`` (the version ``learned`` made), or a
    refusal when the new state would not encode: the standardiser's running sums can
    overflow without an error, so the whole record is checked
    (:meth:`~service.records.ModelEnvelope.check`; it is encoded only if it is written:
    :meth:`LabelOutcome.encode`). The objects that wrote an applied version are kept for
    the next label of that version (:data:`LIVE`). A version whose record would take more
    than its ``limits`` is refused as ``oversize``: the model stays where it was (a record
    no topic takes would stop the learner at every retry). A version made with
    ``defer`` is checked only when it is written (:class:`StrictRedo` if it fails then)."""
    try:
        encoded, served = (None, None) if defer else model.check(limits=limits)
    except TooLarge as exc:
        return _unapplied(
            Outcome.REFUSED,
            Reason.OVERSIZE,
            f"model {model.model!r}: {exc}; the label is not applied ({exc.remedy})",
        )
    except RecordError:
        return _unapplied(
            Outcome.REFUSED, Reason.NON_FINITE, "update gave a non-finite model state"
        )
    _, _, adapted, moments_refused, (parts, pipeline, learner) = learned
    LIVE.keep(model, parts, pipeline, learner)
    return LabelOutcome(
        Outcome.APPLIED,
        model=model,
        encoded=encoded,
        served=served,
        iw_loss=iw_loss,
        turnaround=turnaround,
        clipped=clipped,
        changes=adapted[0],
        takeovers=adapted[1],
        moments_refused=moments_refused,
    )


#: what :func:`_learn` gives: pipeline state, learner state, (changes, takeovers), why the
#: request's moments were refused (None: merged, or it carried none), and the objects that
#: wrote the states with the adaptive parts the learner was read with
_Learned = tuple[
    dict[str, Any],
    dict[str, Any],
    tuple[int, int],
    Implausible | Untrusted | None,
    tuple[Parts | None, Pipeline, Any],
]


def _learn(
    config: ModelConfig,
    model: ModelEnvelope,
    request: LabelRequest,
    step: Callable[[Any, np.ndarray], None],
    trust: MomentsTrust | None = None,
    *,
    defer: bool = False,
) -> _Learned | LabelOutcome:
    """(pipeline state, learner state) after the standardisers learn what the request
    brings (the moments of the events scored since the scorer's last request, when it
    carries them, and the labelled row: :meth:`~service.learning.Pipeline.learn_label`)
    and ``step(learner, transformed x)`` updates the learner (the learner the configuration
    serves: :func:`service.learning.learner_for` with its ``adaptive`` parts, as the
    scorer's), the changes and takeovers the step made, and why the moments were refused
    (None: merged, or none); a refusal when not finite.

    Moments implausible against the model's statistics
    (:meth:`~service.learning.Pipeline.moments_refusal`: a mean or variance no scorer could
    have gathered from events like those so far) are not merged, nor moments of other
    features than the model gathers (``width``: checked whatever the signature says); the
    labelled row is learnt all the same. With a key (``trust`` not None) the signature
    decides instead of the judgement: trusted
    moments are merged unjudged, unsigned or badly signed ones refused
    (:mod:`service.records.moments`). The verdict depends on the model's state, the
    request and its ``trust`` alone, so a rebuild and a correction's re-derivation refuse
    the same moments.

    When ``model`` is the version the previous label wrote, with the same parts, the
    objects that wrote it are taken as they are instead of reading its states
    (:data:`LIVE`: they are those states read back). ``defer``: the states given are
    :class:`~service.records.state.Deferred`, made from these objects only if read before the
    next label takes them. A label refused after it took the objects of a version whose
    states were never made raises :class:`StrictRedo` (the version before it is gone)."""
    try:
        x = inputs_of(request, config, rows=config.fields is not None)
    except BadMessage as bad:  # fields another declaration admitted (a rebuild, a redo)
        return _unapplied(Outcome.DEAD, bad.reason, f"request {request.request_id}: {bad.detail}")
    parts = config.adaptive.parts(intercept=config.intercept)
    unmade = bool(model.deferred)  # taking its objects spends them: no way back
    live = LIVE.take(model, parts)
    if live is None:
        pipeline = Pipeline.from_state(dict(model.pipeline))
        learner = learner_for(dict(model.learner), parts)
    else:
        pipeline, learner = live
    before = _adaptation(learner)
    refused: Implausible | Untrusted | None = None
    try:
        seen = None
        if request.moments is not None:  # checked when read; judged and bounded when merged
            seen = Moments.from_record(request.moments.to_dict(), len(request.moments.mean))
            refused = pipeline.moments_refusal(seen, judge=trust is None)
            if refused is None and trust is not None:
                refused = untrusted(trust)
            if refused is not None:
                seen = None
        with np.errstate(all="ignore"):  # overflow is detected below and refused, not warned
            pipeline.learn_label(x, seen, trusted=trust == "trusted")
            z = pipeline.transform(x)
            if type(z) is SparseRow and not getattr(learner, "takes_rows", False):
                z = z.toarray()
            step(learner, z)
        if defer:
            new_pipeline: Any = Deferred(pipeline.to_state)
            new_learner: Any = Deferred(learner.to_state)
        else:
            new_pipeline, new_learner = pipeline.to_state(), learner.to_state()
    except ValueError as exc:
        return _refused(model, unmade and live is not None, f"update refused: {exc}")
    if not (_finite(learner) and math.isfinite(float(learner.rho))):
        return _refused(model, unmade and live is not None, "update gave non-finite parameters")
    after = _adaptation(learner)
    adapted = (after[0] - before[0], after[1] - before[1])
    return new_pipeline, new_learner, adapted, refused, (parts, pipeline, learner)


def _finite(learner: Any) -> bool:
    """Whether ``learner``'s weights are finite (kernel learners keep a support set)."""
    check = getattr(learner, "finite", None)
    if check is not None:
        return bool(check())
    w = getattr(learner, "w", None)
    return w is None or bool(np.all(np.isfinite(w)))


def _refused(model: ModelEnvelope, lost: bool, detail: str) -> LabelOutcome:
    """A label's update refused as not finite; :class:`StrictRedo` when the ``model`` it
    was applied to is ``lost`` (its objects moved on, its states never made)."""
    if lost:
        raise StrictRedo(model.model, f"a label of a group was refused ({detail})")
    return _unapplied(Outcome.REFUSED, Reason.NON_FINITE, detail)


def _adaptation(learner: Any) -> tuple[int, int]:
    """(changes detected, takeovers) of an adaptive learner; (0, 0) for any other."""
    if isinstance(learner, Adaptive):
        return learner.changes_detected, learner.takeovers
    return 0, 0


def _next(
    model: ModelEnvelope,
    learned: _Learned,
    *,
    where: tuple[int, int],
    now: float,
    loss: float,
    p: float,
    estimate: dict[str, Any],
    corrections_from: int = -1,
) -> ModelEnvelope:
    """The next version of ``model``: ``learned`` states, the label at labels ``where``
    counted, ``loss`` (already divided by ``p``) and the weight ``1 / p`` added."""
    partition, offset = where
    return model.replace(
        version=model.version + 1,
        pipeline=learned[0],
        learner=learned[1],
        labels_offset=max(offset, model.labels_offset)
        if partition == model.labels_partition
        else offset,
        labels_partition=partition,
        labels_applied=model.labels_applied + 1,
        iw_loss=model.iw_loss + loss,
        iw_weight=model.iw_weight + 1.0 / p,
        updated_at=now,
        estimate=estimate,
        corrections_from=corrections_from,
    )


def _estimate(model: ModelEnvelope, max_weight: float) -> RiskEstimate:
    """The envelope's risk estimate (a new one when it has none or it does not parse:
    records written before it existed)."""
    if model.estimate is not None:
        try:
            return RiskEstimate.from_state(dict(model.estimate))
        except LearningError:
            pass
    return RiskEstimate(max_weight=max_weight)


def _charged(
    model: ModelEnvelope, max_weight: float, decided: int, y: int, cost: float, p: float
) -> dict[str, Any]:
    """The envelope's estimate state with the loss of ``decided`` for ``y`` added."""
    estimate = _estimate(model, max_weight)
    estimate.add(zero_one_d_loss(decided, y, cost), p)
    return estimate.to_state()


def park_label(
    existing: ParkedLabel | None,
    label: Label,
    *,
    offset: int,
    partition: int,
    now: float,
    raw: bytes = b"",
    label_ts: float | None = None,
) -> ParkedLabel | None:
    """The parked record of a label whose request has not been consumed yet; None when
    ``existing`` already holds this very message (a redelivery)."""
    if existing is not None and existing.offset == offset:
        return None
    return ParkedLabel(
        label, offset=offset, partition=partition, parked_at=now, raw=raw, label_ts=label_ts
    )
