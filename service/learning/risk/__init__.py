"""How well a model is doing, from the labels it gets and the decisions it makes.

- :mod:`.estimate`: :class:`~.estimate.RiskEstimate`, the importance-weighted 0-d-1 risk with
  a score interval, and :func:`~.estimate.importance_weight`;
- :mod:`.shadow`: a shadow learns from its champion's labels
  (:func:`~.shadow.learn_from_champion`) and is judged by a :class:`~.shadow.Scorecard`;
- :mod:`.collapse`: :class:`~.collapse.CollapseWatch`, a model that rejects (nearly)
  everything while rho keeps growing.
"""

from .collapse import CollapseStatus, CollapseWatch
from .estimate import (
    DEFAULT_LEVEL,
    DEFAULT_MAX_WEIGHT,
    PRIOR_SHARE,
    RiskEstimate,
    RiskInterval,
    importance_weight,
)
from .shadow import (
    ESTIMATORS,
    WEIGHTINGS,
    Comparison,
    Scorecard,
    decision_loss,
    learn_from_champion,
)

__all__ = [
    "CollapseStatus",
    "CollapseWatch",
    "Comparison",
    "DEFAULT_LEVEL",
    "DEFAULT_MAX_WEIGHT",
    "PRIOR_SHARE",
    "ESTIMATORS",
    "RiskEstimate",
    "RiskInterval",
    "Scorecard",
    "WEIGHTINGS",
    "decision_loss",
    "importance_weight",
    "learn_from_champion",
]
