"""What the labelling view shows of a request: named features, the model's numbers, its
decision, the answers' display names and, for a linear model whose snapshot the desk has
read, the features that weigh most in its score (:math:`|w_i z_i|`, with :math:`z` the
preprocessed features).

>>> from service.config import ModelConfig
>>> from service.records import LabelRequest
>>> req = LabelRequest("r", "e", "m", [0.5, -2.0], 0.3, 1.0, 0, 0.4, 7, 10.0, 70.0, 0.6)
>>> view = present(req, ModelConfig(n_features=2), None, now=40.0, lease_expires_at=160.0)
>>> [f["name"] for f in view["features"]], view["decision"], view["time_left"]
(['x0', 'x1'], 'reject', 30.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from service.config import ModelConfig
from service.features import FieldError, encoder_of
from service.records import BadMessage, LabelRequest
from service.records.codec import array_of
from service.stream.labels.admission import inputs_of

__all__ = [
    "answer_names",
    "feature_names",
    "feature_rows",
    "input_names",
    "present",
    "shown_value",
    "top_features",
]

TOP = 5


def feature_names(config: ModelConfig) -> list[str]:
    """The model's ``feature_names``; with ``fields``, its number fields' names, then ``#i``
    for each hashed bucket; else ``x0``, ``x1``, ..."""
    if config.fields is not None:
        return list(encoder_of(config.fields).names)
    if config.feature_names is not None:
        return list(config.feature_names)
    return [f"x{i}" for i in range(config.n_inputs)]


def shown_value(value: Any) -> float | str:
    """A field's value as the desk shows it: a number as it is, text as it is, tokens
    joined by spaces, a missing value as ``(missing)``, a boolean as ``true`` / ``false``.

    >>> [shown_value(v) for v in (1.5, "SE", ["refund", "urgent"], None, True)]
    [1.5, 'SE', 'refund urgent', '(missing)', 'true']
    """
    if value is None:
        return "(missing)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def feature_rows(request: LabelRequest, config: ModelConfig) -> list[tuple[str, float | str]]:
    """What the desk shows of a request's event, name and value: the fields as its producer
    sent them (a model that declares ``fields``), else each named feature's number."""
    if request.fields is not None:
        return [(name, shown_value(v)) for name, v in request.fields.items()]
    return list(zip(feature_names(config), request.features or (), strict=False))


def input_names(request: LabelRequest, config: ModelConfig) -> tuple[list[str], set[int] | None]:
    """A name per input of the model for this request: :func:`feature_names`, with the
    keys of the request's fields where its hashed inputs are set (``country=SE``); and for
    a model that declares ``fields``, the inputs the event sets (with the intercept: what
    a person can read in the fields shown), else None."""
    names = feature_names(config)
    if config.fields is None or request.fields is None:
        return names, None
    try:
        keys = encoder_of(config.fields).keys(request.fields)
    except FieldError:  # a request another declaration wrote: the plain names
        return names, None
    for i, key in keys.items():
        if i < len(names):
            names[i] = key
    return names, {*keys, len(names)}


def answer_names(names: tuple[str, str] | None) -> dict[str, str]:
    """Display names of the +1 and -1 answers."""
    pos, neg = names if names is not None else ("+1", "\u22121")
    return {"pos": pos, "neg": neg}


def top_features(
    served: Any,
    features: Sequence[float] | np.ndarray,
    names: list[str],
    only: set[int] | None = None,
) -> list[dict[str, Any]]:
    """The ``TOP`` features with the largest :math:`|w_i z_i|` (empty if the learner has no
    explicit weight vector or the sizes do not fit); ``only``: among these inputs alone."""
    w = getattr(served, "learner", None)
    w = getattr(w, "w", None)
    if w is None:
        return []
    try:
        z = served.pipeline.transform(
            features if isinstance(features, np.ndarray) else array_of(features)
        )
    except (ValueError, TypeError, ArithmeticError):
        return []
    w = np.asarray(w, dtype=np.float64)
    if z.shape != w.shape:
        return []
    labels = [*names, "(intercept)"][: len(w)]
    contrib = w * z
    if only is not None:
        mask = np.zeros(len(contrib), dtype=bool)
        mask[[i for i in only if 0 <= i < len(contrib)]] = True
        contrib = np.where(mask, contrib, 0.0)
    order = np.argsort(-np.abs(contrib))[:TOP]
    return [
        {"name": labels[i], "contribution": round(float(contrib[i]), 4)}
        for i in order
        if math.isfinite(float(contrib[i])) and contrib[i] != 0.0
    ]


def _inputs(request: LabelRequest, config: ModelConfig) -> np.ndarray:
    """The inputs ``request`` teaches (its fields encoded, when it carries no features);
    none when they do not fit the model now (the desk shows no weights then)."""
    try:
        out: np.ndarray = inputs_of(request, config)
        return out
    except BadMessage:
        return np.zeros(0)


def present(
    request: LabelRequest,
    config: ModelConfig,
    served: Any,
    *,
    now: float,
    lease_expires_at: float,
    names: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """The JSON the labelling view renders."""
    fnames, among = input_names(request, config)
    answers = answer_names(names)
    decided = {1: answers["pos"], -1: answers["neg"], 0: "reject"}[request.decided_label]
    version = None if served is None else int(served.envelope.version)
    return {
        "request_id": request.request_id,
        "event_id": request.event_id,
        "model": request.model,
        # the features that are set first (one-hot data: the values the event has), each
        # group in the model's order
        "features": (
            [{"name": n, "value": v} for n, v in feature_rows(request, config)]
            if request.fields is not None
            else sorted(
                (
                    {"name": n, "value": v}
                    for n, v in zip(fnames, request.features or (), strict=False)
                ),
                key=lambda f: f["value"] == 0,
            )
        ),
        "score": request.score,
        "rho": request.rho,
        "decision": decided,
        "query_probability": request.query_probability,
        "priority": request.priority,
        "model_version": request.model_version,
        "served_version": version,
        "requested_at": request.requested_at,
        "expires_at": request.expires_at,
        "time_left": round(request.expires_at - now, 1),
        "lease_expires_at": lease_expires_at,
        "answers": answers,
        "top": []
        if served is None
        else top_features(served, _inputs(request, config), fnames, among),
    }
