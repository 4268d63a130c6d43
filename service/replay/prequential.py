r"""One learner on one stream in time order, event by event, and what drift does to it.

:func:`run_stream` is the loop of :func:`service.replay.sequential.replay_sequential` for a
single run, keeping every event instead of the cumulative counts at a time grid: at event
``t`` the model decides on ``x_t`` (its 0-d-1 loss ``L_t`` is charged from the score and
the width it used), then asks for ``y_t`` or not, and only an asked label updates it. With
a pipeline the model owns a :class:`~service.learning.Pipeline` that learns as a stream
worker's does (:class:`~service.replay.features.LabelScaler`); without one the caller passes
inputs already preprocessed. Any object with
``decide(x, coin)`` and ``update(x, y)`` runs (a learner of :mod:`service.learning`, a
:class:`~service.learning.Budgeted` one, a wrapper); when the learner's ``update`` takes
the keyword ``query_probability`` it receives the probability the label was asked with.

Measures of a :class:`Trace` (``window`` events, 500 by default):

* :func:`window_risk` — the trailing mean of ``L_t`` over the last ``window`` events
  (fewer at the start);
* :func:`recovery` — events after the change until the window risk is back within
  ``tolerance`` (1.1) times the pre-change level, the mean of ``L_t`` over the
  ``2 window`` events before the change. The window still holds pre-change events at
  first, so the count is taken after the window risk peaks in the ``horizon`` events
  after the change (a change that never pushes it above the band counts 0; a model that
  never comes back gets ``None``). A model that adapts at once after a change as bad as
  a label flip scores about ``window`` events: its early mistakes must leave the window.
* :func:`ends_rejecting` — the last window rejected at least 95 % of its events (the
  collapse of :class:`~service.learning.CollapseWatch`).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from service.learning import Adaptive, Budgeted, Pipeline
from service.learning.losses import zero_d_one_loss
from service.replay.errors import ReplayConfigError
from service.replay.features import LabelScaler
from service.replay.sequential import detecting, learn_function

__all__ = [
    "DEFAULT_TOLERANCE",
    "DEFAULT_WINDOW",
    "Trace",
    "ends_rejecting",
    "pre_change_level",
    "recovery",
    "run_stream",
    "window_risk",
]

FloatArray = npt.NDArray[np.float64]
Fit = Literal["events", "labels"]

DEFAULT_WINDOW = 500
DEFAULT_TOLERANCE = 1.1


@dataclass(frozen=True)
class Trace:
    """Per-event record of one run: the loss charged, the decision (+1, -1, 0 = reject),
    whether the label was asked and with which probability; ``changes`` are the events at
    which the model reported a detected change (empty when it reports none)."""

    loss: FloatArray
    decision: npt.NDArray[np.int8]
    asked: npt.NDArray[np.bool_]
    probability: FloatArray
    cost: float
    changes: tuple[int, ...] = field(default=())

    @property
    def risk(self) -> float:
        """Mean 0-d-1 loss over the whole stream."""
        return float(self.loss.mean())

    @property
    def labels(self) -> int:
        """Labels asked (and applied)."""
        return int(self.asked.sum())


def _takes_probability(model: Any) -> bool:
    try:
        params = inspect.signature(model.update).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False
    return "query_probability" in params


def _learner_of(model: Any) -> Any:
    """What learns from a label: a :class:`~service.learning.Budgeted` model passes labels
    to its learner unchanged (its budget counts questions, not answers), so its learner is
    updated directly, with the probability when it takes one (as the stream's label
    handler does)."""
    return model.learner if isinstance(model, Budgeted) else model


def run_stream(
    model: Any,
    X: FloatArray,
    y: npt.NDArray[np.int64],
    coins: Sequence[float] | FloatArray,
    cost: float,
    *,
    pipeline: Pipeline | None = None,
) -> Trace:
    """Decide every row of ``X`` in order, asking with ``coins[t]``, learning asked labels.

    ``pipeline`` given: ``X`` holds raw rows; the pipeline transforms each one with what it
    has learned so far and learns when a label is asked, as a stream worker's does
    (:class:`~service.replay.features.LabelScaler`: a pipeline that takes moments learns
    those of every event, any other the labelled rows). ``pipeline`` omitted: ``X`` holds
    the model's inputs.
    """
    n = X.shape[0]
    if y.shape != (n,) or len(coins) != n:
        raise ReplayConfigError(f"X, y and coins must have {n} rows")
    loss = np.empty(n)
    decision = np.empty(n, dtype=np.int8)
    asked = np.zeros(n, dtype=np.bool_)
    prob = np.empty(n)
    learner = _learner_of(model)
    scaler = None if pipeline is None else LabelScaler(pipeline)
    with_p = _takes_probability(learner)
    adaptive, learn = isinstance(learner, Adaptive), learn_function(model)
    ys = y.tolist()
    cs = np.asarray(coins, dtype=np.float64).tolist()
    changes: list[int] = []
    watched = detecting(model)
    seen = 0 if watched is None else int(watched.changes_detected)
    for t in range(n):
        yt = ys[t]
        x = scaler.seen(X[t]) if scaler is not None else X[t]
        dec = model.decide(x, coin=cs[t])
        loss[t] = zero_d_one_loss(yt * dec.score, dec.rho, cost)
        decision[t] = dec.label
        prob[t] = dec.query_probability
        if dec.query:
            asked[t] = True
            if scaler is not None:
                x = scaler.learn(X[t])
            if adaptive:  # as the replay and the worker's label path give it a label
                learn(x, yt, dec.query_probability)
            elif with_p:
                learner.update(x, yt, query_probability=dec.query_probability)
            else:
                learner.update(x, yt)
            if watched is not None:
                now = int(watched.changes_detected)
                if now > seen:
                    changes.append(t)
                    seen = now
    return Trace(loss, decision, asked, prob, float(cost), tuple(changes))


def window_risk(loss: FloatArray, window: int = DEFAULT_WINDOW) -> FloatArray:
    """Trailing mean of ``loss`` over the last ``window`` events, ending at each event.

    >>> window_risk(np.array([1.0, 0.0, 0.0, 1.0]), window=2).tolist()
    [1.0, 0.5, 0.0, 0.5]
    """
    if window < 1:
        raise ReplayConfigError(f"window must be >= 1, got {window}")
    c = np.concatenate([[0.0], np.cumsum(loss)])
    t = np.arange(1, loss.shape[0] + 1)
    start = np.maximum(t - window, 0)
    out: FloatArray = (c[t] - c[start]) / (t - start)
    return out


def pre_change_level(loss: FloatArray, change: int, window: int = DEFAULT_WINDOW) -> float:
    """Mean loss over the ``2 window`` events before ``change`` (fewer if the stream is
    shorter): the level a model must come back to."""
    if not 0 < change <= loss.shape[0]:
        raise ReplayConfigError(f"change must be in (0, {loss.shape[0]}], got {change}")
    return float(loss[max(change - 2 * window, 0) : change].mean())


def recovery(
    loss: FloatArray,
    change: int,
    *,
    window: int = DEFAULT_WINDOW,
    tolerance: float = DEFAULT_TOLERANCE,
    horizon: int = 2_000,
) -> int | None:
    """Events after ``change`` until the window risk is back within ``tolerance`` times
    :func:`pre_change_level` (see the module docstring): 0 if it never left the band,
    ``None`` if it never came back before the end of the stream.

    >>> loss = np.r_[np.full(1000, 0.1), np.full(50, 1.0), np.full(2000, 0.1)]
    >>> recovery(loss, 1000, window=100)   # back when one bad event is left in the window
    148
    >>> recovery(np.full(3000, 0.1), 1000, window=100)
    0
    """
    level = pre_change_level(loss, change, window)
    bound = tolerance * level
    w = window_risk(loss, window)[change:]
    if w.shape[0] == 0:
        return None
    peak = int(np.argmax(w[:horizon]))
    if w[peak] <= bound:
        return 0
    back = np.flatnonzero(w[peak:] <= bound)
    return None if back.shape[0] == 0 else peak + int(back[0])


def ends_rejecting(trace: Trace, window: int = DEFAULT_WINDOW, fraction: float = 0.95) -> bool:
    """Whether the last ``window`` decisions rejected at least ``fraction`` of the events."""
    last = trace.decision[-window:]
    return bool((last == 0).mean() >= fraction)
