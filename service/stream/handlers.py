"""Message -> learning -> messages: the stream's logic as plain functions, no Kafka.

Scoring (:func:`score_batch`) and learning (:func:`apply_label`) are pure given their
inputs, a clock value and the model state, so they are tested without a broker and replayed
deterministically:

- ``request_id = blake2b(model, event id)``: re-scoring an event after a crash asks for the
  same label again, never a second one.
- DSAL's query coin ``u`` and the audit coin are uniforms drawn from a hash of
  (model, event id, model version): a replayed event makes the same choice.
- The model state carries ``labels_offset``, the last applied offset of the labels topic;
  a redelivered label (offset not past it) changes nothing.

Model state (one JSON-safe value per model, the ``models`` table value and the snapshot
published on the models topic)::

    {"format": "abstain.model", "format_version": 1, "model": name, "version": int,
     "pipeline": Pipeline.to_state(), "learner": learner.to_state(),
     "labels_offset": int (-1 = none), "labels_applied": int,
     "iw_loss": float, "iw_weight": float, "updated_at": float}

Risk: a label for a served decision carries the effective query probability p. The sums
``iw_loss = sum L_d / p`` and ``iw_weight = sum 1 / p`` estimate the total 0-d-1 loss and the
number of decisions without bias; their ratio is the running risk (self-normalised).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from service.config import ModelConfig
from service.learning import (
    Intercept,
    OnlineStandardizer,
    Pipeline,
    learner_from_state,
    make_learner,
)
from service.stream.records import (
    BadMessage,
    DeadLetter,
    Decision,
    FeatureEvent,
    Label,
    LabelRequest,
    encode_state,
    parse_feature_event,
)

__all__ = [
    "MODEL_FORMAT",
    "LabelOutcome",
    "RawMessage",
    "ScoreResult",
    "ServedModel",
    "apply_label",
    "coin",
    "initial_state",
    "park_label",
    "request_id",
    "risk_estimate",
    "score_batch",
    "store_request",
    "sweep_expired",
    "sweep_orphans",
    "unpark_label",
    "zero_one_d_loss",
]

MODEL_FORMAT: Final = "abstain.model"
MODEL_FORMAT_VERSION: Final = 1


def request_id(model: str, event_id: str) -> str:
    """Deterministic label-request id for (model, event id).

    >>> request_id("m", "e1") == request_id("m", "e1") != request_id("m", "e2")
    True
    >>> len(request_id("m", "e1"))
    32
    """
    return hashlib.blake2b(f"{model}\x1f{event_id}".encode(), digest_size=16).hexdigest()


def coin(model: str, event_id: str, version: int, purpose: str = "query") -> float:
    """A uniform number in [0, 1) drawn from a hash: the same inputs give the same coin.

    >>> 0.0 <= coin("m", "e1", 0) < 1.0
    True
    >>> coin("m", "e1", 0) == coin("m", "e1", 0) != coin("m", "e1", 1)
    True
    """
    digest = hashlib.blake2b(
        f"{purpose}\x1f{model}\x1f{event_id}\x1f{version}".encode(), digest_size=8
    ).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)


def zero_one_d_loss(decided: int, label: int, cost: float) -> float:
    """The 0-d-1 loss of a served decision: 0 right, 1 wrong, ``cost`` if rejected.

    >>> zero_one_d_loss(1, 1, 0.2), zero_one_d_loss(-1, 1, 0.2), zero_one_d_loss(0, -1, 0.2)
    (0.0, 1.0, 0.2)
    """
    if decided == 0:
        return cost
    return 0.0 if decided == label else 1.0


def build_pipeline(config: ModelConfig) -> Pipeline:
    """Preprocessing for a model: optional online standardiser, then optional intercept."""
    steps: list[Any] = []
    if config.standardize:
        steps.append(OnlineStandardizer(config.n_inputs))
    if config.intercept:
        steps.append(Intercept())
    return Pipeline(steps, n_features=config.n_inputs)


def initial_state(name: str, config: ModelConfig) -> dict[str, Any]:
    """Version 0 of a model, identical on every worker (seeded from the configuration)."""
    learner = make_learner(
        config.algorithm,
        n_features=config.n_learner_features,
        cost=config.cost,
        **{"seed": config.seed, **config.hyperparameters},
    )
    return {
        "format": MODEL_FORMAT,
        "format_version": MODEL_FORMAT_VERSION,
        "model": name,
        "version": 0,
        "pipeline": build_pipeline(config).to_state(),
        "learner": learner.to_state(),
        "labels_offset": -1,
        "labels_applied": 0,
        "iw_loss": 0.0,
        "iw_weight": 0.0,
        "updated_at": 0.0,
    }


def check_state(state: Any, name: str) -> dict[str, Any]:
    """Minimal structural check of a model state read from Kafka."""
    if not isinstance(state, dict) or state.get("format") != MODEL_FORMAT:
        raise BadMessage("schema", f"model state for {name!r} has an unknown format")
    if state.get("format_version") != MODEL_FORMAT_VERSION:
        raise BadMessage(
            "schema",
            f"model state for {name!r} has format_version {state.get('format_version')!r}; "
            f"this worker reads {MODEL_FORMAT_VERSION}: upgrade the worker",
        )
    if state.get("model") != name or not isinstance(state.get("version"), int):
        raise BadMessage("schema", f"model state for {name!r} names another model or version")
    return state


def risk_estimate(state: Mapping[str, Any]) -> float:
    """Importance-weighted running 0-d-1 risk (NaN before the first label)."""
    weight = float(state["iw_weight"])
    return float(state["iw_loss"]) / weight if weight > 0 else math.nan


@dataclass(slots=True)
class ServedModel:
    """A model ready to score: configuration, preprocessing and learner at one version."""

    name: str
    config: ModelConfig
    version: int
    pipeline: Pipeline
    learner: Any
    state: dict[str, Any]

    @classmethod
    def from_state(cls, name: str, config: ModelConfig, state: dict[str, Any]) -> ServedModel:
        state = check_state(state, name)
        return cls(
            name=name,
            config=config,
            version=int(state["version"]),
            pipeline=Pipeline.from_state(state["pipeline"]),
            learner=learner_from_state(state["learner"]),
            state=state,
        )

    @classmethod
    def initial(cls, name: str, config: ModelConfig) -> ServedModel:
        return cls.from_state(name, config, initial_state(name, config))

    def raw_vector(self, event: FeatureEvent) -> np.ndarray:
        """The raw feature vector of an event, in the model's feature order."""
        feats = event.features
        names = self.config.feature_names
        if isinstance(feats, dict):
            if names is None:
                raise BadMessage("schema", f"model {self.name!r} has no feature_names; send a list")
            missing = [n for n in names if n not in feats]
            extra = len(feats) - (len(names) - len(missing))
            if missing or extra:
                raise BadMessage(
                    "feature_count",
                    f"model {self.name!r}: missing {missing[:5]}, {extra} unknown features",
                )
            return np.array([feats[n] for n in names], dtype=np.float64)
        if len(feats) != self.config.n_inputs:
            raise BadMessage(
                "feature_count",
                f"model {self.name!r} takes {self.config.n_inputs} features, got {len(feats)}",
            )
        return np.asarray(feats, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class RawMessage:
    """An input message as consumed: bytes plus where it came from."""

    value: bytes
    topic: str
    partition: int
    offset: int
    key: bytes | None = None


@dataclass(slots=True)
class ScoreResult:
    """Outputs of scoring one batch."""

    decisions: list[Decision] = field(default_factory=list)
    label_requests: list[LabelRequest] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    event_ts: list[float | None] = field(default_factory=list)  # aligned with decisions


def _priority(score: float, rho: float) -> float:
    """Closer to either threshold (+-rho) -> higher priority, in (0, 1]."""
    return 1.0 / (1.0 + min(abs(score - rho), abs(score + rho)))


def score_batch(
    models: Mapping[str, ServedModel],
    events: Sequence[RawMessage],
    *,
    default_model: str,
    request_ttl: float,
    now: float,
    max_bytes: int | None = None,
    max_features: int = 100_000,
    source: str = "features",
) -> ScoreResult:
    """Score a batch: one decision per valid event (in input order), a label request for
    each queried one, a dead letter for each refused one. Batched per model through
    ``decide_many``; each event keeps its own coin, so batching never changes a decision."""
    out = ScoreResult()
    parsed: list[tuple[RawMessage, FeatureEvent, ServedModel, np.ndarray]] = []
    for msg in events:
        try:
            event = parse_feature_event(
                msg.value,
                default_model=default_model,
                max_bytes=max_bytes,
                max_features=max_features,
            )
            served = models.get(event.model)
            if served is None:
                raise BadMessage("unknown_model", f"no model named {event.model!r}")
            raw = served.raw_vector(event)
            parsed.append((msg, event, served, raw))
        except BadMessage as bad:
            out.dead_letters.append(
                DeadLetter(
                    source, msg.topic, msg.partition, msg.offset, bad.reason, bad.detail, msg.value
                )
            )
    by_model: dict[str, list[int]] = {}
    for i, (_, event, _, _) in enumerate(parsed):
        by_model.setdefault(event.model, []).append(i)
    results: dict[int, tuple[int, float, float, bool, float]] = {}
    for name, idx in by_model.items():
        served = models[name]
        z = served.pipeline.transform_many(np.stack([parsed[i][3] for i in idx]))
        coins = np.array([coin(name, parsed[i][1].id, served.version) for i in idx])
        labels, scores, probs, queries = served.learner.decide_many(z, coins=coins)
        audit = served.config.audit_rate
        for j, i in enumerate(idx):
            p = float(probs[j])
            audited = coin(name, parsed[i][1].id, served.version, "audit") < audit
            queried = bool(queries[j]) or audited
            p_eff = p + audit - p * audit
            results[i] = (int(labels[j]), float(scores[j]), p, queried, p_eff)
    for i, (_, event, served, raw) in enumerate(parsed):
        label, score, _, queried, p_eff = results[i]
        rho = float(served.learner.rho)
        out.decisions.append(
            Decision(
                id=event.id,
                model=served.name,
                action="reject" if label == 0 else "predict",
                label=None if label == 0 else label,
                score=score,
                rho=rho,
                model_version=served.version,
                queried=queried,
                query_probability=p_eff,
                ts=now,
            )
        )
        out.event_ts.append(event.ts)
        if queried:
            out.label_requests.append(
                LabelRequest(
                    request_id=request_id(served.name, event.id),
                    event_id=event.id,
                    model=served.name,
                    features=[float(v) for v in raw],
                    score=score,
                    rho=rho,
                    decided_label=label,
                    query_probability=p_eff,
                    model_version=served.version,
                    requested_at=now,
                    expires_at=now + request_ttl,
                    priority=_priority(score, rho),
                )
            )
    return out


def store_request(
    existing: Mapping[str, Any] | None, request: LabelRequest, partition: int
) -> dict[str, Any] | None:
    """The pending-table value for a new label request, or None to keep ``existing``
    (a re-sent request must not reset an answered one)."""
    if existing is not None:
        return None
    entry = request.to_dict()
    entry.update(partition=partition, applied=False)
    return entry


@dataclass(frozen=True, slots=True)
class LabelOutcome:
    """What a label did. ``kind``: "applied", "ignored" (redelivered: no effect, no dead
    letter), "dead" (dead-lettered with ``reason``), "refused" (the update was not finite)."""

    kind: str
    reason: str = ""
    detail: str = ""
    state: dict[str, Any] | None = None  # new model state when applied
    pending: dict[str, Any] | None = None  # new pending entry when applied
    iw_loss: float = 0.0
    turnaround: float = 0.0


def apply_label(
    config: ModelConfig,
    state: dict[str, Any],
    pending: Mapping[str, Any] | None,
    label: Label,
    offset: int,
    *,
    now: float,
    parked: bool = False,
) -> LabelOutcome:
    """Join a label with its pending request and update the model at its CURRENT (w, rho).

    The standardiser learns from the labelled example first, then the learner updates on the
    transformed example. Returns a new state (the input is never mutated).

    ``parked``: the label was consumed earlier (before its request, see :func:`park_label`)
    and is applied now that the request arrived, so its offset may lie below
    ``labels_offset`` without being a redelivery."""
    if not parked and offset <= int(state["labels_offset"]):
        return LabelOutcome("ignored", "redelivered", f"offset {offset} already applied")
    if pending is None or pending.get("model") != label.model:
        return LabelOutcome("dead", "unknown_request", f"no pending request {label.request_id}")
    if pending.get("applied"):
        return LabelOutcome("dead", "already_applied", f"request {label.request_id} answered")
    if now > float(pending["expires_at"]):
        return LabelOutcome("dead", "expired", f"request {label.request_id} expired")
    x = np.asarray(pending["features"], dtype=np.float64)
    pipeline = Pipeline.from_state(state["pipeline"])
    learner = learner_from_state(state["learner"])
    try:
        with np.errstate(all="ignore"):  # overflow is detected below and refused, not warned
            pipeline.learn(x)
            z = pipeline.transform(x)
            learner.update(z, label.label)
        new_pipeline = pipeline.to_state()
        new_learner = learner.to_state()
    except ValueError as exc:
        return LabelOutcome("refused", "non_finite", f"update refused: {exc}")
    w = getattr(learner, "w", None)  # kernel learners keep a support set instead
    if not ((w is None or np.all(np.isfinite(w))) and math.isfinite(float(learner.rho))):
        return LabelOutcome("refused", "non_finite", "update gave non-finite parameters")
    p = float(pending["query_probability"])
    loss = zero_one_d_loss(int(pending["decided_label"]), label.label, config.cost) / p
    new_state = {
        **state,
        "version": int(state["version"]) + 1,
        "pipeline": new_pipeline,
        "learner": new_learner,
        "labels_offset": max(offset, int(state["labels_offset"])),
        "labels_applied": int(state["labels_applied"]) + 1,
        "iw_loss": float(state["iw_loss"]) + loss,
        "iw_weight": float(state["iw_weight"]) + 1.0 / p,
        "updated_at": now,
    }
    try:  # the standardiser's running sums can overflow without an error: check it all
        encode_state(new_state)
    except ValueError:
        return LabelOutcome("refused", "non_finite", "update gave a non-finite model state")
    new_pending = {
        **pending,
        "applied": True,
        "label": label.label,
        "labelled_by": label.labelled_by,
        "applied_at": now,
    }
    return LabelOutcome(
        "applied",
        state=new_state,
        pending=new_pending,
        iw_loss=loss,
        turnaround=max(0.0, now - float(pending["requested_at"])),
    )


def sweep_expired(
    entries: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    partition: int,
    now: float,
    grace: float = 0.0,
) -> tuple[list[str], list[str]]:
    """Pending entries of ``partition`` more than ``grace`` seconds past their expiry: (keys to
    drop, models of those never answered, for the expired counter). Within the grace period a
    late label is still recognised and dead-lettered as ``expired``."""
    drop: list[str] = []
    unanswered: list[str] = []
    for key, entry in entries:
        if entry.get("partition") != partition:
            continue
        if now > float(entry["expires_at"]) + grace:
            drop.append(key)
            if not entry.get("applied"):
                unanswered.append(str(entry["model"]))
    return drop, unanswered


def park_label(
    existing: Mapping[str, Any] | None, label: Label, offset: int, partition: int, *, now: float
) -> dict[str, Any] | None:
    """An orphan-table entry for a label whose request has not been consumed yet (labels and
    requests travel on two topics, so a fast answer can overtake its request). None when
    ``existing`` already holds this very message (a redelivery)."""
    if existing is not None and int(existing["offset"]) == offset:
        return None
    return {
        "request_id": label.request_id,
        "model": label.model,
        "label": label.label,
        "labelled_by": label.labelled_by,
        "ts": label.ts,
        "offset": offset,
        "partition": partition,
        "parked_at": now,
    }


def unpark_label(entry: Mapping[str, Any]) -> tuple[Label, int]:
    """The label and its offset back from an orphan-table entry."""
    label = Label(
        request_id=str(entry["request_id"]),
        model=str(entry["model"]),
        label=int(entry["label"]),
        labelled_by=str(entry.get("labelled_by", "")),
        ts=entry.get("ts"),
    )
    return label, int(entry["offset"])


def sweep_orphans(
    entries: Sequence[tuple[str, Mapping[str, Any]]], *, partition: int, now: float, wait: float
) -> list[str]:
    """Keys of parked labels of ``partition`` whose request did not arrive within ``wait``
    seconds: they are dead-lettered as ``unknown_request``."""
    return [
        key
        for key, entry in entries
        if entry.get("partition") == partition and now - float(entry["parked_at"]) > wait
    ]
