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
    NonFiniteError,
    OnlineStandardizer,
    Pipeline,
    learner_from_state,
    make_learner,
)
from service.stream.joins import (
    LabelOutcome,
    apply_label,
    park_label,
    store_request,
    sweep_expired,
    sweep_orphans,
    unpark_label,
    zero_one_d_loss,
)
from service.stream.records import (
    BadMessage,
    DeadLetter,
    Decision,
    FeatureEvent,
    LabelRequest,
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
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused below
            z = served.pipeline.transform_many(np.stack([parsed[i][3] for i in idx]))
        coins = np.array([coin(name, parsed[i][1].id, served.version) for i in idx])
        try:
            labels, scores, probs, queries = served.learner.decide_many(z, coins=coins)
        except NonFiniteError:  # a finite event overflows once scaled: refuse those rows
            labels, scores, probs, queries, keep = _decide_rows(served, z, coins)
            for j, i in enumerate(idx):
                if not keep[j]:
                    msg = parsed[i][0]
                    out.dead_letters.append(
                        DeadLetter(
                            source, msg.topic, msg.partition, msg.offset, "non_finite",
                            f"model {name!r}: the scaled features or the score overflow",
                            msg.value,
                        )
                    )  # fmt: skip
            idx = [i for j, i in enumerate(idx) if keep[j]]
        audit = served.config.audit_rate
        for j, i in enumerate(idx):
            p = float(probs[j])
            audited = coin(name, parsed[i][1].id, served.version, "audit") < audit
            queried = bool(queries[j]) or audited
            p_eff = p + audit - p * audit
            results[i] = (int(labels[j]), float(scores[j]), p, queried, p_eff)
    for i, (_, event, served, raw) in enumerate(parsed):
        if i not in results:  # refused above
            continue
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


def _decide_rows(
    served: ServedModel, z: np.ndarray, coins: np.ndarray
) -> tuple[list[int], list[float], list[float], list[bool], list[bool]]:
    """Row-by-row decisions of the rows that stay finite; ``keep[j]`` False for the others."""
    labels: list[int] = []
    scores: list[float] = []
    probs: list[float] = []
    queries: list[bool] = []
    keep: list[bool] = []
    for j in range(z.shape[0]):
        try:
            d = served.learner.decide(z[j], coin=float(coins[j]))
        except NonFiniteError:
            keep.append(False)
            continue
        keep.append(True)
        labels.append(d.label)
        scores.append(d.score)
        probs.append(d.query_probability)
        queries.append(d.query)
    return labels, scores, probs, queries, keep
