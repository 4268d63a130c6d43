"""Label -> model as pure functions over typed records (no Kafka, no tables, no clock).

:func:`apply_label` joins a label with its pending request and updates the model at its
CURRENT (w, rho) (a delayed label is a stochastic gradient step at the current iterate).
:func:`park_label` makes the record of a label that overtook its request. The protocol
around them (which table is written first, when a parked label is applied, sweeps) is
:class:`service.stream.labels.joiner.LabelJoiner`; ``abstain rebuild`` replays a label log through
these same functions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from service.config import ModelConfig
from service.learning import (
    Adaptive,
    LearningError,
    Pipeline,
    RiskEstimate,
    learn_from_champion,
    learner_for,
)
from service.learning.linear import LinearLearner
from service.learning.moments import Implausible, Moments
from service.learning.risk.shadow import Weighting
from service.records import Label, LabelRequest, ModelEnvelope, PendingEntry, Reason, RecordError
from service.records.moments import MomentsTrust, Untrusted, untrusted
from service.records.state import ParkedLabel

__all__ = [
    "LabelOutcome",
    "Outcome",
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
    encoded: bytes | None = None  # model.to_json(), checked finite
    pending: PendingEntry | None = None
    iw_loss: float = 0.0
    turnaround: float = 0.0
    clipped: bool = False  # the weight 1/p was capped at max_weight
    changes: int = 0  # changes the model's detector found on this label (adaptive learning)
    takeovers: int = 0  # challengers that took over on this label
    # why the request's moments were not merged (the label was applied without them)
    moments_refused: Implausible | Untrusted | None = None


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
    (:func:`~service.records.moments.moments_trust`; None: no key, judged)."""
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

    learned = _learn(config, model, request, step, trust)
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
        learned[2],
        iw_loss=loss,
        turnaround=max(0.0, now - request.requested_at),
        clipped=p > asked,
        moments_refused=learned[3],
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
) -> LabelOutcome:
    r"""Update the shadow ``model`` with the label its champion's request ``pending``
    received (at labels ``partition``, ``offset``): its own standardiser learns the example,
    its learner takes it with the champion's query probability $p$ as importance weight
    $1/\max(p, 1/h_{\max})$ (:func:`~service.learning.learn_from_champion`; a kernel
    learner takes one plain step), and the shadow's decision on the event, made when it was
    scored (``request.shadow_labels``), is charged its 0-d-1 loss with that $p$. A request
    without the shadow's decision (scored before the shadow existed) teaches it and
    charges nothing. The outcome's ``pending`` is None: the caller marks the entry."""
    request, y, name = pending.request, label.label, model.model

    def step(learner: Any, z: np.ndarray) -> None:
        inner = learner.champion if isinstance(learner, Adaptive) else learner
        weighting: Weighting = "importance" if isinstance(inner, LinearLearner) else "none"
        learn_from_champion(
            learner, z, y, request.query_probability, max_weight=max_weight, weighting=weighting
        )

    learned = _learn(config, model, request, step, trust)
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
        learned[2],
        iw_loss=loss,
        clipped=p > request.query_probability,
        moments_refused=learned[3],
    )


def _applied(
    model: ModelEnvelope,
    adapted: tuple[int, int],
    *,
    iw_loss: float,
    clipped: bool,
    turnaround: float = 0.0,
    moments_refused: Implausible | Untrusted | None = None,
) -> LabelOutcome:
    """The outcome of a label applied to ``model`` (``adapted``: the changes detected and
    takeovers it made), or a refusal when the new state does not encode: the standardiser's
    running sums can overflow without an error, so the whole record is checked."""
    try:
        encoded = model.to_json()
    except RecordError:
        return _unapplied(
            Outcome.REFUSED, Reason.NON_FINITE, "update gave a non-finite model state"
        )
    return LabelOutcome(
        Outcome.APPLIED,
        model=model,
        encoded=encoded,
        iw_loss=iw_loss,
        turnaround=turnaround,
        clipped=clipped,
        changes=adapted[0],
        takeovers=adapted[1],
        moments_refused=moments_refused,
    )


#: what :func:`_learn` gives: pipeline state, learner state, (changes, takeovers), and why
#: the request's moments were refused (None: merged, or it carried none)
_Learned = tuple[dict[str, Any], dict[str, Any], tuple[int, int], Implausible | Untrusted | None]


def _learn(
    config: ModelConfig,
    model: ModelEnvelope,
    request: LabelRequest,
    step: Callable[[Any, np.ndarray], None],
    trust: MomentsTrust | None = None,
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
    have gathered from events like those so far) are not merged; the labelled row is learnt
    all the same. With a key (``trust`` not None) the signature decides instead: trusted
    moments are merged unjudged, unsigned or badly signed ones refused
    (:mod:`service.records.moments`). The verdict depends on the model's state, the
    request and its ``trust`` alone, so a rebuild and a correction's re-derivation refuse
    the same moments."""
    x = np.asarray(request.features, dtype=np.float64)
    pipeline = Pipeline.from_state(dict(model.pipeline))
    learner = learner_for(dict(model.learner), config.adaptive.parts(intercept=config.intercept))
    before = _adaptation(learner)
    refused: Implausible | Untrusted | None = None
    try:
        seen = None
        if request.moments is not None:  # checked when read; judged and bounded when merged
            seen = Moments.from_record(request.moments.to_dict(), x.shape[0])
            refused = untrusted(trust) if trust is not None else pipeline.moments_refusal(seen)
            if refused is not None:
                seen = None
        with np.errstate(all="ignore"):  # overflow is detected below and refused, not warned
            pipeline.learn_label(x, seen, trusted=trust == "trusted")
            step(learner, pipeline.transform(x))
        new_pipeline, new_learner = pipeline.to_state(), learner.to_state()
    except ValueError as exc:
        return _unapplied(Outcome.REFUSED, Reason.NON_FINITE, f"update refused: {exc}")
    w = getattr(learner, "w", None)  # kernel learners keep a support set instead
    if not ((w is None or np.all(np.isfinite(w))) and math.isfinite(float(learner.rho))):
        return _unapplied(Outcome.REFUSED, Reason.NON_FINITE, "update gave non-finite parameters")
    after = _adaptation(learner)
    return new_pipeline, new_learner, (after[0] - before[0], after[1] - before[1]), refused


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
