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
from typing import Any

import numpy as np

from service.config import ModelConfig
from service.features import encoder_of
from service.records import LabelRequest

__all__ = ["answer_names", "feature_names", "present", "top_features"]

TOP = 5


def feature_names(config: ModelConfig) -> list[str]:
    """The model's ``feature_names``; with ``fields``, its number fields' names, then ``#i``
    for each hashed bucket; else ``x0``, ``x1``, ..."""
    if config.fields is not None:
        return list(encoder_of(config.fields).names)
    if config.feature_names is not None:
        return list(config.feature_names)
    return [f"x{i}" for i in range(config.n_inputs)]


def answer_names(names: tuple[str, str] | None) -> dict[str, str]:
    """Display names of the +1 and -1 answers."""
    pos, neg = names if names is not None else ("+1", "\u22121")
    return {"pos": pos, "neg": neg}


def top_features(served: Any, features: list[float], names: list[str]) -> list[dict[str, Any]]:
    """The ``TOP`` features with the largest :math:`|w_i z_i|` (empty if the learner has no
    explicit weight vector or the sizes do not fit)."""
    w = getattr(served, "learner", None)
    w = getattr(w, "w", None)
    if w is None:
        return []
    try:
        z = served.pipeline.transform(np.asarray(features, dtype=np.float64))
    except (ValueError, TypeError, ArithmeticError):
        return []
    w = np.asarray(w, dtype=np.float64)
    if z.shape != w.shape:
        return []
    labels = [*names, "(intercept)"][: len(w)]
    contrib = w * z
    order = np.argsort(-np.abs(contrib))[:TOP]
    return [
        {"name": labels[i], "contribution": round(float(contrib[i]), 4)}
        for i in order
        if math.isfinite(float(contrib[i])) and contrib[i] != 0.0
    ]


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
    fnames = feature_names(config)
    answers = answer_names(names)
    decided = {1: answers["pos"], -1: answers["neg"], 0: "reject"}[request.decided_label]
    version = None if served is None else int(served.envelope.version)
    return {
        "request_id": request.request_id,
        "event_id": request.event_id,
        "model": request.model,
        # the features that are set first (one-hot data: the values the event has), each
        # group in the model's order
        "features": sorted(
            ({"name": n, "value": v} for n, v in zip(fnames, request.features, strict=False)),
            key=lambda f: f["value"] == 0,
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
        "top": [] if served is None else top_features(served, request.features, fnames),
    }
