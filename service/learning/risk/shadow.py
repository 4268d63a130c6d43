r"""Shadow models: a learner run beside a champion, judged and taught by its labels.

A *champion* decides every event and asks for some labels, event $t$ with probability
$p_t$. A *shadow* decides the same events (its decisions are only counted) and learns from
the labels the champion's questions receive, each with importance weight
$h_t = 1/\max(p_t, 1/h_{\max})$ (:func:`~service.learning.risk.estimate.importance_weight`,
capped as the stream caps it):

* **learning** (:func:`learn_from_champion`): ``weighting="importance"`` (default) updates
  the shadow with weight $h_t$ (:meth:`LinearLearner.update <service.learning.linear.learner.
  LinearLearner.update>`, importance-weight aware), so its expected step over the
  champion's coin is its step on every event: the shadow learns from the whole stream as
  if it had seen every label, not only from the region the champion asks about. For a
  DRAL shadow that is exactly DRAL's own learning (its gradient is zero outside its query
  band). ``weighting="none"`` updates it as the champion updates itself (one plain step per
  label), on the champion's choice of events.
* **judging** (:class:`Scorecard`): the shadow's decision on each asked event is charged
  its 0-d-1 loss with the champion's $p_t$ in a
  :class:`~service.learning.risk.estimate.RiskEstimate`, which stays unbiased however the shadow
  learns, because the shadow decided before the coin was drawn. Reject rate and label count
  come with it; :meth:`Scorecard.report` gives the :class:`Comparison` record, by default
  with the Horvitz-Thompson estimate over the events counted (``estimator="ratio"``: the
  stream envelope's ``iw_loss / iw_weight``, which overstates the risk of a model that is
  sure of many events; :mod:`service.learning.risk.estimate`).

The functions are pure (no clock, no I/O): a stream worker calls
:meth:`Scorecard.decided` where it scores and :func:`learn_from_champion` and
:meth:`Scorecard.labelled` where it joins a label with the champion's request; the replay
(``abstain replay --shadow``) calls the same ones.

>>> from service.learning import DRAL, DSAL
>>> champion, shadow = DSAL(n_features=2, cost=0.25), DRAL(n_features=2, cost=0.25, eta=0.5)
>>> card = Scorecard(cost=0.25)
>>> x, y = [1.0, 0.5], 1
>>> mine, theirs = shadow.decide(x), champion.decide(x, coin=0.1)
>>> card.decided(mine.label)
>>> if theirs.query:
...     _ = card.labelled(mine.label, y, theirs.query_probability)
...     _ = learn_from_champion(shadow, x, y, theirs.query_probability)
>>> r = card.report(); r.events, r.labels, r.reject_rate, round(r.risk, 2)  # d / p
(1, 1, 1.0, 0.32)
>>> round(theirs.query_probability, 3), [round(v, 4) for v in shadow.w.tolist()]  # 2 sub-steps
(0.786, [0.1589, 0.0795])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, Literal

from .. import state as st
from ..base import check_label, check_param
from ..errors import HyperparameterError, InputError, StateError
from ..linear.learner import LinearLearner
from .estimate import DEFAULT_LEVEL, DEFAULT_MAX_WEIGHT, RiskEstimate, importance_weight

__all__ = [
    "ESTIMATORS",
    "WEIGHTINGS",
    "Estimator",
    "Comparison",
    "Scorecard",
    "Weighting",
    "decision_loss",
    "learn_from_champion",
]

Weighting = Literal["importance", "none"]
#: how a shadow learns from a champion's label: with weight 1/p, or as one plain step
WEIGHTINGS: Final[tuple[Weighting, ...]] = ("importance", "none")

Estimator = Literal["horvitz-thompson", "ratio"]
#: the risk estimates of a :class:`Comparison` (:meth:`RiskEstimate.interval`)
ESTIMATORS: Final[tuple[Estimator, ...]] = ("horvitz-thompson", "ratio")


def decision_loss(label: int, y: int, cost: float) -> float:
    """The 0-d-1 loss of a decision ``label`` (+1, -1, 0 = reject) for the true ``y``.

    >>> decision_loss(1, 1, 0.2), decision_loss(-1, 1, 0.2), decision_loss(0, -1, 0.2)
    (0.0, 1.0, 0.2)
    """
    if label not in (-1, 0, 1):
        raise InputError(f"a decision is +1, -1 or 0, got {label!r}")
    if label == 0:
        return float(cost)
    return 0.0 if label == check_label(y) else 1.0


def learn_from_champion(
    learner: Any,
    x: Any,
    y: Any,
    query_probability: float,
    *,
    max_weight: float = DEFAULT_MAX_WEIGHT,
    weighting: Weighting = "importance",
) -> bool:
    """Update a shadow ``learner`` with the label ``y`` of ``x`` that the champion asked for
    with ``query_probability``; return whether the shadow moved.

    ``x`` is the shadow's input (after its own preprocessing); ``max_weight`` the cap of
    the weight (the champion's ``weight_cap``). ``weighting="importance"`` needs a linear
    learner (DRAL, DSAL, DSOL); kernel shadows learn with ``weighting="none"``. A learner
    inside :class:`~service.learning.Adaptive` is given the probability and the cap too
    (its detector and challengers weigh the label by them) and steps with the weight.
    """
    if weighting not in WEIGHTINGS:
        raise HyperparameterError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    weight = importance_weight(query_probability, max_weight)
    inner = getattr(learner, "champion", None)  # a wrapper (Adaptive) weighs labels itself
    if inner is not None and weighting == "importance" and not isinstance(inner, LinearLearner):
        raise HyperparameterError(
            f"{type(inner).__name__} takes no importance weight; use weighting='none'"
        )
    if inner is not None:
        step = weight if weighting == "importance" else 1.0
        return bool(
            learner.update(
                x, y, query_probability=query_probability, max_weight=max_weight, weight=step
            )
        )
    if weighting == "none":
        return bool(learner.update(x, y))
    if not isinstance(learner, LinearLearner):
        raise HyperparameterError(
            f"{type(learner).__name__} takes no importance weight; use weighting='none'"
        )
    return learner.update(x, y, weight=weight)


@dataclass(frozen=True, slots=True)
class Comparison:
    """One model's live comparison record (the champion's or a shadow's).

    ``risk`` in ``[low, high]`` at ``level`` (NaN before the first label), from ``labels``
    labels, by ``estimator``; ``rejected`` of ``events`` decisions were rejections. For the
    Horvitz-Thompson estimate ``events`` must count the decisions whose questions could
    have been answered by now (on a stream with delayed labels: not the newest ones).
    """

    events: int
    rejected: int
    labels: int
    risk: float
    low: float
    high: float
    level: float
    estimator: Estimator = "horvitz-thompson"

    @property
    def reject_rate(self) -> float:
        """``rejected / events`` (NaN before the first event)."""
        return self.rejected / self.events if self.events else math.nan

    @classmethod
    def of(
        cls,
        estimate: RiskEstimate,
        *,
        events: int,
        rejected: int,
        level: float = DEFAULT_LEVEL,
        estimator: Estimator = "horvitz-thompson",
    ) -> Comparison:
        """The record of ``estimate`` (learner side) and the decision counts (scorer side)."""
        if estimator not in ESTIMATORS:
            raise HyperparameterError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        by_events = estimator == "horvitz-thompson"
        r = estimate.interval(level, events=events if by_events else None)
        return cls(events, rejected, r.labels, r.risk, r.low, r.high, r.level, estimator)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (NaN becomes ``None``), with ``reject_rate``."""
        out: dict[str, Any] = {
            "events": self.events,
            "rejected": self.rejected,
            "reject_rate": self.reject_rate,
            "labels": self.labels,
            "risk": self.risk,
            "low": self.low,
            "high": self.high,
            "level": self.level,
            "estimator": self.estimator,
        }
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in out.items()}


class Scorecard:
    """A model's running record on a stream: decisions, rejections and its risk estimate.

    :meth:`decided` counts each of the model's decisions; :meth:`labelled` charges the
    decision on an asked event with the probability the event was asked with (the
    champion's, for a shadow).
    """

    __slots__ = ("cost", "estimate", "events", "rejected")

    def __init__(self, *, cost: float, max_weight: float = DEFAULT_MAX_WEIGHT) -> None:
        self.cost = check_param("cost", cost)
        self.estimate = RiskEstimate(max_weight=max_weight)
        self.events = 0
        self.rejected = 0

    def decided(self, label: int) -> None:
        """Count one decision (+1, -1 or 0 = reject)."""
        if label not in (-1, 0, 1):
            raise InputError(f"a decision is +1, -1 or 0, got {label!r}")
        self.events += 1
        self.rejected += label == 0

    def labelled(self, label: int, y: Any, query_probability: float) -> float:
        """Charge decision ``label`` for the true ``y``; return the weighted loss added."""
        return self.estimate.add(decision_loss(label, y, self.cost), query_probability)

    def report(
        self, level: float = DEFAULT_LEVEL, estimator: Estimator = "horvitz-thompson"
    ) -> Comparison:
        """The :class:`Comparison` record now."""
        return Comparison.of(
            self.estimate,
            events=self.events,
            rejected=self.rejected,
            level=level,
            estimator=estimator,
        )

    def to_state(self) -> dict[str, Any]:
        """A versioned, JSON-safe record (``"format": "abstain.scorecard"``)."""
        return {
            "format": st.SCORECARD_FORMAT,
            "version": st.VERSION,
            "params": {"cost": self.cost},
            "learned": {
                "events": self.events,
                "rejected": self.rejected,
                "estimate": self.estimate.to_state(),
            },
        }

    @classmethod
    def from_state(cls, state: Any) -> Scorecard:
        """Rebuild a scorecard from :meth:`to_state` output."""
        record = st.read_record(state, st.SCORECARD_FORMAT)
        params, learned = st.read_mapping(record, "params"), st.read_mapping(record, "learned")
        try:
            card = cls(**params)
        except (TypeError, ValueError) as exc:
            raise StateError(f"scorecard state params are invalid: {exc}") from exc
        card.events = st.read_int(learned, "events")
        card.rejected = st.read_int(learned, "rejected")
        card.estimate = RiskEstimate.from_state(learned.get("estimate"))
        if card.rejected > card.events:
            raise StateError("scorecard state counts more rejections than decisions")
        return card

    def __repr__(self) -> str:
        return (
            f"Scorecard(cost={self.cost!r}, events={self.events}, rejected={self.rejected}, "
            f"labels={self.estimate.labels})"
        )
