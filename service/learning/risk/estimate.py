r"""Importance-weighted 0-d-1 risk of a model from the labels of asked events, with an
interval.

Event $t$ is decided by the model (0-d-1 loss $L_t$: 0 right, 1 wrong, $d$ rejected; it is
known only if the label is) and asked with probability $p_t$, fixed before the coin
$Q_t \sim \text{Bernoulli}(p_t)$ is drawn. The target is the running risk
$R_n = \frac1n \sum_{t \le n} L_t$ of the $n$ events decided so far. Two estimates:

.. math::

    \hat R_{HT} = \frac{1}{n} \sum_t \frac{Q_t L_t}{p_t}, \qquad
    \hat R = \frac{\sum_t Q_t L_t / p_t}{W}, \quad W = \sum_t \frac{Q_t}{p_t}.

* Horvitz-Thompson, $\hat R_{HT}$ (``interval(events=n)``), when the number of events is
  known (a :class:`~service.learning.risk.shadow.Scorecard` counts them). Unbiased for any
  $p_t > 0$. Interval: normal, $\hat R_{HT} \pm z_{(1+\ell)/2} \sqrt{V_{HT}}$ with
  $V_{HT} = \frac{1}{n^2} \sum_t Q_t\, a_t\, L_t^2$, $a_t = (1 - p_t)/p_t^2$.
* The ratio $\hat R$ (``interval()``), the ``iw_loss / iw_weight`` of the stream's model
  envelope (:attr:`service.records.ModelEnvelope.risk`): it needs no event count, only the
  labels. Interval: the score (Wilson-type) interval, the values of $R$ that a normal test
  at level $\ell$ does not reject, $(\hat R - R)^2 \le z^2 V(R)$ with
  $V_\kappa(R) = \frac{1}{W^2} \big(\sum_t Q_t\, a_t\, (L_t - R)^2 + \kappa\, a_{\max}\,
  R(1-R)\big)$ (a quadratic in $R$, so an interval between two roots), with
  $a_{\max} = (w_{\max} - 1)\, w_{\max}$ the $a_t$ of a label asked at the smallest
  probability, $1/w_{\max}$ (``max_weight``), $R(1-R)$ the largest spread a loss in
  $[0, 1]$ with mean $R$ can have, and $\kappa$ = :data:`PRIOR_SHARE` (1/20). The spread of
  the losses seen is all a sample variance knows: 30 labels of one loss (a model that
  rejects all it is asked about, each asked with $p$ near 1) give none, and the interval
  would be that one value while the events not asked, decided otherwise and each standing
  for up to $w_{\max}$ events, hold other losses. The prior stands for those: it is
  $\kappa$ of the variance one such label would add at the widest spread, and fades as
  $1/W^2$ while the labels' own spread grows as $1/W$. Labels all asked with $p_t = 1$ (a
  model that asks every label) leave it out: every event was seen.

Validity: $\sum_t (Q_t/p_t - 1)\,c_t$ is a martingale for any $c_t$ fixed before the coin
($L_t$, or $L_t - R$), with conditional variance $\sum_t \frac{1-p_t}{p_t} c_t^2$, which
the sums over the asked events above estimate without bias; the martingale central limit
theorem makes both estimates normal. That holds for any $p_t$ that depend on the past, so
for a shadow model judged on another model's questions too, and a label asked with
$p_t = 1$ adds no variance (it would have been seen anyway). An empirical-Bernstein bound
would hold at every size but pays for the largest weight (up to ``max_weight``) in every
term: at 100 it is wider than $[0, 1]$ until many thousands of labels.

Which one: the ratio assumes that $W$ comes close to $n$. When a model is sure of many
events, their $p_t$ are tiny (DSAL: $p$ falls like $e^{-\gamma(|f| - \rho)}$), they are
practically never asked, $W$ falls short by their number, and the ratio spreads the losses
of the events that are asked (the uncertain ones, with higher losses) over them: it
overstates the risk, and a floor on $p$ (``max_weight``) makes that worse
(``docs/results/replay/shadow.md`` measures it on Phishing). $\hat R_{HT}$ charges the unasked
sure events their expected loss, nearly 0, and misses only their rare errors. With
everything asked at $p$ between 0.02 and 1 (a simulation with 5 % errors and 10 %
rejections, $p$ twice as high on the errors, 20,000 repetitions), the nominal 95 %
intervals covered the realised risk after 100 / 300 / 1000 events: ratio (score) 89 / 91
/ 92 %, ratio (Wald, $\hat R \pm z\sqrt{V(\hat R)}$) 82 / 87 / 90.5 %, Horvitz-Thompson
77 / 83 / 89 %; with $p \ge 0.2$: 89 / 93 / 94 %, 86 / 91 / 94 %, 84 / 90 / 94 %. The
shortfall comes from skew: with heavy weights an estimate is usually a little low and
sometimes much too high. Served as the demo serves it (DSAL at $d = 0.25$ with a 5 % audit,
so $w_{\max} = 20$; Phishing; labels back 30 events after their request; 50 random
orders), the score interval without the prior held the true risk of the decisions served at
the first line with 30 labels in 28 % of the orders (it was 0.05 wide), with it in all 50
(0.20 wide; 96 % of the lines from 30 to 60 labels, 0.10 wide at 60;
``tests/stream/models/test_risk_coverage.py``). While the labels are too few for the test
to exclude anything the interval is $[0, 1]$. Both assume
$p_t > 0$ for every event (a model that never asks some events cannot be judged on them)
and no flooring (a floored $p$ underweights the label).

The state is five sums and a count, updated in $O(1)$ per label; the sums over $a_t$ are
expanded so that $V(R)$ needs no pass over the past
($\sum a (L - R)^2 = \sum a L^2 - 2 R \sum a L + R^2 \sum a$).

>>> est = RiskEstimate()
>>> for loss, p in [(0.0, 0.5), (1.0, 0.25), (0.25, 1.0), (0.0, 0.5)]:
...     _ = est.add(loss, p)
>>> est.labels, est.loss, est.weight, est.risk
(4, 4.25, 9.0, 0.4722222222222222)
>>> r = est.interval(0.9); round(r.low, 4), round(r.high, 4)
(0.0, 0.9916)
>>> r = est.interval(0.9, events=10); r.risk, round(r.low, 4), round(r.high, 4)
(0.425, 0.0, 0.9948)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Final

import numpy as np

from .. import state as st
from ..errors import HyperparameterError, InputError, StateError

__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_MAX_WEIGHT",
    "PRIOR_SHARE",
    "RiskEstimate",
    "RiskInterval",
    "importance_weight",
]

DEFAULT_LEVEL: Final = 0.95
"""Default confidence level of :meth:`RiskEstimate.interval`."""

PRIOR_SHARE: Final = 0.05
r"""$\kappa$ in $V_\kappa(R)$: the share of a label at the weight cap, of the widest spread
a loss in $[0, 1]$ can have, that the ratio's interval counts beside the labels seen
(:meth:`RiskEstimate.interval`)."""

DEFAULT_MAX_WEIGHT: Final = 100.0
"""Default cap of an importance weight $1/p$ (the stream's ``max_importance_weight``)."""


def importance_weight(p: float, max_weight: float = DEFAULT_MAX_WEIGHT) -> float:
    """``1 / max(p, 1 / max_weight)``: the weight of a label asked with probability ``p``,
    capped as the stream caps it (``service.stream.labels.protocol.apply_label``; ``max_weight`` is
    the model's ``weight_cap``).

    >>> importance_weight(0.25), importance_weight(0.001), importance_weight(0.001, 500.0)
    (4.0, 100.0, 500.0)
    """
    cap = _max_weight(max_weight)
    prob = _number("p", p)
    if not 0.0 <= prob <= 1.0:
        raise InputError(f"a query probability must be in [0, 1], got {p!r}")
    return 1.0 / max(prob, 1.0 / cap)


@dataclass(frozen=True, slots=True)
class RiskInterval:
    """An estimated risk with its interval at ``level`` (NaN before the first label)."""

    risk: float
    low: float
    high: float
    level: float
    labels: int

    def __contains__(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def width(self) -> float:
        return self.high - self.low


class RiskEstimate:
    """Running importance-weighted 0-d-1 risk (see the module docstring).

    ``add(loss, p)`` takes the loss of the model's decision on an asked event and the
    probability ``p`` the event was asked with (floored at ``1 / max_weight``).
    """

    __slots__ = ("labels", "loss", "max_weight", "var_a", "var_al", "var_al2", "weight")

    def __init__(self, *, max_weight: float = DEFAULT_MAX_WEIGHT) -> None:
        self.max_weight = _max_weight(max_weight)
        self.labels = 0
        self.loss = 0.0  # sum L / p: the envelope's iw_loss
        self.weight = 0.0  # sum 1 / p: the envelope's iw_weight
        self.var_a = 0.0  # sum (1 - p) / p^2
        self.var_al = 0.0  # sum (1 - p) / p^2 * L
        self.var_al2 = 0.0  # sum (1 - p) / p^2 * L^2

    def add(self, loss: float, p: float) -> float:
        """Count one label; return its importance-weighted loss ``loss / p`` (``p`` floored)."""
        value = _number("loss", loss)
        if not 0.0 <= value <= 1.0:
            raise InputError(f"a 0-d-1 loss must be in [0, 1], got {loss!r}")
        iw = importance_weight(p, self.max_weight)
        a = (1.0 - 1.0 / iw) * iw * iw
        self.labels += 1
        self.loss += value * iw
        self.weight += iw
        self.var_a += a
        self.var_al += a * value
        self.var_al2 += a * value * value
        return value * iw

    @property
    def risk(self) -> float:
        """``loss / weight`` (NaN before the first label)."""
        return self.loss / self.weight if self.weight > 0.0 else math.nan

    def variance(self, at: float | None = None) -> float:
        r"""$V(R)$ of the module docstring at ``R = at`` (default: the estimate $\hat R$;
        NaN before the first label)."""
        r = self.risk if at is None else _number("at", at)
        if math.isnan(self.risk):
            return math.nan
        spread = self.var_al2 - 2.0 * r * self.var_al + r * r * self.var_a
        return max(spread, 0.0) / (self.weight * self.weight)

    def interval(self, level: float = DEFAULT_LEVEL, *, events: int | None = None) -> RiskInterval:
        """The risk with its interval at ``level`` in (0, 1), within [0, 1]: with ``events``
        (the number of events decided, at least the labels) Horvitz-Thompson and its normal
        interval, else the ratio and its score interval (the module docstring)."""
        lv = _number("level", level)
        if not 0.0 < lv < 1.0:
            raise HyperparameterError(f"level must be in (0, 1), got {level!r}")
        if events is not None:
            return self._horvitz_thompson(lv, events)
        r = self.risk
        if math.isnan(r):
            return RiskInterval(math.nan, math.nan, math.nan, lv, 0)
        z2 = NormalDist().inv_cdf(0.5 + lv / 2.0) ** 2
        # (A - R W)^2 <= z^2 W^2 V_k(R), with A = loss, W = weight and the prior's
        # k a_cap R (1 - R) added to the spread: q2 R^2 - 2 q1 R + q0 <= 0
        w = self.weight
        # a model that asked every label so far (p = 1: every event seen) is exact
        cap = self.max_weight
        prior = PRIOR_SHARE * (cap - 1.0) * cap if self.var_a > 0.0 else 0.0
        q2 = w * w - z2 * (self.var_a - prior)
        q1 = self.loss * w - z2 * (self.var_al - prior / 2.0)
        q0 = self.loss * self.loss - z2 * self.var_al2
        if q2 <= 0.0:  # too few labels for the test to exclude anything: no bound
            return RiskInterval(r, 0.0, 1.0, lv, self.labels)
        root = math.sqrt(max(q1 * q1 - q2 * q0, 0.0))
        low, high = min((q1 - root) / q2, r), max((q1 + root) / q2, r)
        return RiskInterval(r, max(0.0, low), min(1.0, high), lv, self.labels)

    def _horvitz_thompson(self, level: float, events: int) -> RiskInterval:
        if isinstance(events, bool) or not isinstance(events, (int, np.integer)):
            raise InputError(f"events must be an integer, got {events!r}")
        if events < self.labels:
            raise InputError(f"events ({events}) cannot be fewer than the labels ({self.labels})")
        if not self.labels:
            return RiskInterval(math.nan, math.nan, math.nan, level, 0)
        r = self.loss / events
        half = NormalDist().inv_cdf(0.5 + level / 2.0) * math.sqrt(self.var_al2) / events
        return RiskInterval(min(r, 1.0), max(0.0, r - half), min(1.0, r + half), level, self.labels)

    # -- state -------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """A versioned, JSON-safe record (``"format": "abstain.risk-estimate"``)."""
        return {
            "format": st.RISK_FORMAT,
            "version": st.VERSION,
            "params": {"max_weight": self.max_weight},
            "learned": {name: getattr(self, name) for name in _SUMS},
        }

    @classmethod
    def from_state(cls, state: Any) -> RiskEstimate:
        """Rebuild an estimate from :meth:`to_state` output."""
        record = st.read_record(state, st.RISK_FORMAT)
        params, learned = st.read_mapping(record, "params"), st.read_mapping(record, "learned")
        try:
            est = cls(**params)
        except (TypeError, ValueError) as exc:
            raise StateError(f"risk-estimate state params are invalid: {exc}") from exc
        est.labels = st.read_int(learned, "labels")
        for name in _SUMS[1:]:
            setattr(est, name, st.read_float(learned, name, minimum=0.0))
        if est.loss > est.weight or (est.labels == 0) != (est.weight == 0.0):
            raise StateError("risk-estimate state sums do not fit together")
        return est

    def __repr__(self) -> str:
        return f"RiskEstimate(labels={self.labels}, risk={self.risk!r})"


_SUMS: Final = ("labels", "loss", "weight", "var_a", "var_al", "var_al2")


def _max_weight(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise HyperparameterError(f"max_weight must be a number, got {value!r}")
    if not (math.isfinite(value) and value >= 1.0):
        raise HyperparameterError(f"max_weight must be a finite number >= 1, got {value!r}")
    return float(value)


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise InputError(f"{name} must be finite, got {value!r}")
    return v
