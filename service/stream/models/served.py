"""A model ready to serve.

- Version 0 of every model (:func:`initial_envelope`) is built from the configuration alone,
  so it is the same on every worker.
- A declared model's events are scored as the inputs they set (:meth:`ServedModel.entries`,
  :attr:`ServedModel.sparse`: :mod:`service.learning.sparse`) when its learner decides by a
  weight vector (the linear learners, an adaptive wrapper around one).
- The learner a model serves is :func:`served_learner`: its state record conformed to the
  configuration's ``adaptive`` parts (by default inside :class:`service.learning.Adaptive`;
  a record written before the wrapper is wrapped). The label path and ``abstain rebuild``
  take their learner from the same function.

The envelope format is :class:`service.records.ModelEnvelope`; this module turns one into a
:class:`ServedModel` (preprocessing + learner objects from :mod:`service.learning`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.config import ModelConfig
from service.features import FieldError, encoder_of
from service.learning import (
    Adaptive,
    LearningError,
    Pipeline,
    RiskEstimate,
    learner_for,
    serving_learner,
    serving_pipeline,
)
from service.learning.linear.learner import LinearLearner
from service.learning.risk import DEFAULT_LEVEL, RiskInterval
from service.learning.sparse_scoring import SparseScorer
from service.records import BadMessage, FeatureEvent, ModelEnvelope, Reason
from service.records.codec import feature_value

__all__ = ["ServedModel", "build_pipeline", "initial_envelope", "served_learner"]


def build_pipeline(config: ModelConfig) -> Pipeline:
    """Preprocessing for a model (:func:`service.learning.serving_pipeline`): with
    ``standardize`` a standardiser of every event (the moments the scorers send with their
    label requests) and one of the labelled rows, then with ``intercept`` a constant; a
    declared model's hashed buckets are never centred (``hashed_from``)."""
    return serving_pipeline(
        config.n_inputs,
        standardize=config.standardize,
        intercept=config.intercept,
        hashed_from=None if config.fields is None else config.fields.hashed_from,
    )


def served_learner(config: ModelConfig, state: Any, *, serving: bool = True) -> Any:
    """The learner of a model's state record, as the configuration serves it
    (:func:`service.learning.learner_for` with its ``adaptive`` parts), read to decide alone:
    an adaptive learner's challengers and the labels it remembers, which only its learner
    needs, are not read (a scorer reads every version its learner writes). ``serving=False``:
    read whole, to learn on."""
    return learner_for(state, config.adaptive.parts(intercept=config.intercept), serving=serving)


def initial_envelope(name: str, config: ModelConfig) -> ModelEnvelope:
    """Version 0 of a model, identical on every worker (seeded from the configuration)."""
    learner = serving_learner(
        config.algorithm,
        n_features=config.n_learner_features,
        cost=config.cost,
        seed=config.seed,
        hyperparameters=config.learner_hyperparameters,
        parts=config.adaptive.parts(intercept=config.intercept),
    )
    return ModelEnvelope(
        model=name,
        version=0,
        pipeline=build_pipeline(config).to_state(),
        learner=learner.to_state(),
    )


def _since_change(learner: Any) -> tuple[float, int] | None:
    """(risk, labels) of an adaptive learner since its last change; None for another."""
    if not isinstance(learner, Adaptive):
        return None
    estimate = learner.risk_since_change
    return float(estimate.risk), int(estimate.labels)


@dataclass(frozen=True, slots=True)
class ServedModel:
    """A model ready to score: configuration, preprocessing and learner at one version.

    Never replaced in place: a newer version is a new object (scorers swap the reference).
    Scoring changes one thing in it, an adaptive learner's count of the decisions its
    exploration floor raised (:class:`~service.stream.models.book.ModelBook` carries it to
    the next version)."""

    name: str
    config: ModelConfig
    envelope: ModelEnvelope
    pipeline: Pipeline
    learner: Any
    estimate: RiskEstimate | None = None  # the envelope's risk sums (None: not recorded)
    # a declared model's scorer of sparse rows (None: its rows are scored whole)
    sparse: SparseScorer | None = None
    record_bytes: int = 0  # its version's record (0: made, not read)

    @property
    def version(self) -> int:
        return self.envelope.version

    def interval(self) -> RiskInterval:
        """The risk estimate with its 95 % score interval (the ratio ``iw_loss /
        iw_weight``; NaN before the first label or when the envelope has no sums)."""
        if self.estimate is None:
            return RiskInterval(math.nan, math.nan, math.nan, DEFAULT_LEVEL, 0)
        return self.estimate.interval(DEFAULT_LEVEL)

    def gauges(self) -> dict[str, Any]:
        """What the model gauges show: version, rho, ||w|| (None for kernel learners) and
        the running risk estimate (NaN before the first label)."""
        w = getattr(self.learner, "w", None)  # kernel learners have no explicit w
        r = self.interval()
        return {
            "version": self.version,
            "rho": float(self.learner.rho),
            "weight_norm": None if w is None else float(np.linalg.norm(w)),
            "risk": self.envelope.risk,
            "low": r.low,
            "high": r.high,
            "labels": self.envelope.labels_applied,
            "since_change": _since_change(self.learner),
            "record_bytes": self.record_bytes,
        }

    @classmethod
    def from_envelope(
        cls, config: ModelConfig, envelope: ModelEnvelope, *, record_bytes: int = 0
    ) -> ServedModel:
        """Build the objects of ``envelope``; a state that does not fit ``config`` (another
        algorithm, another number of features, a state the learner refuses) is a
        :class:`BadMessage`, so it is never served."""
        name = envelope.model
        try:
            pipeline = Pipeline.from_state(dict(envelope.pipeline))
            learner = served_learner(config, dict(envelope.learner))
            sums = envelope.estimate
            estimate = None if sums is None else RiskEstimate.from_state(dict(sums))
        except (LearningError, KeyError, TypeError) as exc:
            raise BadMessage("schema", f"model state for {name!r}: {exc}") from exc
        if getattr(learner, "algorithm", config.algorithm) != config.algorithm:
            raise BadMessage("schema", f"model state for {name!r} is not {config.algorithm}")
        if (pipeline.n_features_in, pipeline.n_features_out) != (
            config.n_inputs,
            config.n_learner_features,
        ) or learner.n_features != config.n_learner_features:
            raise BadMessage(
                "feature_count",
                f"model state for {name!r} does not take {config.n_inputs} features",
            )
        sparse = _sparse(config, pipeline, learner)
        return cls(name, config, envelope, pipeline, learner, estimate, sparse, record_bytes)

    @classmethod
    def initial(cls, name: str, config: ModelConfig) -> ServedModel:
        """Version 0 (:func:`initial_envelope`)."""
        return cls.from_envelope(config, initial_envelope(name, config))

    def shown(self, event: FeatureEvent) -> dict[str, Any] | None:
        """The fields of ``event`` a person answering its label request is shown (a model
        that declares ``fields``; None for the others, whose features are the numbers)."""
        declared = self.config.fields
        if declared is None or not isinstance(event.features, dict):
            return None
        return encoder_of(declared).shown(event.features)

    def entries(self, event: FeatureEvent) -> tuple[np.ndarray, np.ndarray] | None:
        """The inputs a declared model's ``event`` sets and their values (a column may
        repeat: its values add), when the model scores sparse rows (:attr:`sparse`); None
        for any other model, whose rows are :meth:`raw_vector`. A :class:`BadMessage` as
        :meth:`raw_vector`'s."""
        if self.sparse is None or self.config.fields is None:
            return None
        return self._encoded(event, whole=False)  # type: ignore[no-any-return]

    def _encoded(self, event: FeatureEvent, *, whole: bool) -> Any:
        """A declared model's ``event`` encoded (``whole``: its input vector; else the
        inputs it sets and their values); a :class:`BadMessage` names what does not fit."""
        feats = event.features
        declared = self.config.fields
        assert declared is not None  # noqa: S101 - a declared model's alone
        if not isinstance(feats, dict):
            raise BadMessage(
                "schema", f"model {self.name!r} declares fields; send them as an object"
            )
        encoder = encoder_of(declared)
        try:
            return encoder.dense(feats) if whole else encoder.sparse(feats)
        except FieldError as bad:
            raise BadMessage(Reason.FIELD, f"model {self.name!r}: {bad}") from None

    def raw_vector(self, event: FeatureEvent) -> np.ndarray:
        """The raw feature vector of an event, in the model's feature order (a model that
        declares ``fields``: the event's fields encoded under the declaration)."""
        feats = event.features
        names = self.config.feature_names
        if self.config.fields is not None:
            return self._encoded(event, whole=True)  # type: ignore[no-any-return]
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
            return np.array([feature_value(feats[n], repr(n)) for n in names], dtype=np.float64)
        if len(feats) != self.config.n_inputs:
            raise BadMessage(
                "feature_count",
                f"model {self.name!r} takes {self.config.n_inputs} features, got {len(feats)}",
            )
        return np.asarray(feats, dtype=np.float64)


def _sparse(config: ModelConfig, pipeline: Pipeline, learner: Any) -> SparseScorer | None:
    """The scorer of a declared model's sparse rows: its learner decides by a weight vector
    (a linear learner, or an adaptive wrapper's linear champion)."""
    if config.fields is None:
        return None
    decider = learner.champion if isinstance(learner, Adaptive) else learner
    if not isinstance(decider, LinearLearner):
        return None
    return SparseScorer.of(pipeline, decider.w)
