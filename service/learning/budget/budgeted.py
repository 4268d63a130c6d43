r"""A learner held to a query budget: the learner decides, the budget says whether to ask.

:class:`Budgeted` pairs any learner of this package (linear or kernel; DRAL, DSAL or DSOL)
with a :class:`~service.learning.budget.query.QueryBudget`. A decision keeps the learner's label,
score and $\rho$; its ``query_probability`` is the budget's $p$ for the learner's
:meth:`query_utility` of the score (DSAL: its own $p$; DRAL: a smooth bump over its query
band; DSOL: 1, i.e. uniform sampling), and ``query`` is ``coin < p``: the true probability
the event was asked with, so importance-weighted estimates ($1/p$) stay unbiased.

Deciding moves the budget (it counts events and labels) but never the learner; labels go
to :meth:`Budgeted.update`, unchanged. Coins: a supplied coin decides; otherwise the
budget's generator draws one (the learner's generator is not used). The state is one
record holding both (``"format": "abstain.budgeted"``).

>>> from service.learning import DSAL, QueryBudget
>>> model = Budgeted(DSAL(n_features=2, cost=0.25), QueryBudget(0.05))
>>> d = model.decide([0.0, 1.0], coin=0.01)     # w = 0: DSAL's own p is u = 0.79 here
>>> d.label, d.query, round(d.query_probability, 3)   # first event: 0.05 (0.1 + 0.9 u**4)
(0, True, 0.022)
>>> model.budget.report().asked
1
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from .. import state as st
from ..base import Decision, check_coin
from ..errors import HyperparameterError, StateError
from ..losses import FloatArray
from ..registry import learner_from_state
from .query import QueryBudget

__all__ = ["Budgeted"]


class Budgeted:
    """``learner`` whose label requests are held to ``budget`` (see the module docstring)."""

    __slots__ = ("budget", "learner")

    def __init__(self, learner: Any, budget: QueryBudget) -> None:
        if not callable(getattr(learner, "query_utility", None)):
            raise HyperparameterError(f"not a learner of service.learning: {learner!r}")
        if not isinstance(budget, QueryBudget):
            raise HyperparameterError(f"budget must be a QueryBudget, got {budget!r}")
        self.learner = learner
        self.budget = budget

    # the learner's read-only face (the Learner protocol)
    @property
    def algorithm(self) -> str:
        return str(self.learner.algorithm)

    @property
    def n_features(self) -> int:
        return int(self.learner.n_features)

    @property
    def cost(self) -> float:
        return float(self.learner.cost)

    @property
    def rho(self) -> float:
        return float(self.learner.rho)

    @property
    def steps(self) -> int:
        return int(self.learner.steps)

    def weight_norm(self) -> float:
        return float(self.learner.weight_norm())

    def decide(self, x: Any, coin: float | None = None, ts: float | None = None) -> Decision:
        """The learner's decision on ``x``, asked with the budget's probability.

        ``ts`` (event time in seconds) is needed by budgets per second. Bad input is
        refused before the budget moves.
        """
        if coin is not None:
            coin = check_coin(coin)
        d = self.learner.decide(x, coin=0.0)  # a fixed coin: the learner's generator rests
        p, query = self.budget.ask(self.learner.query_utility(d.score), coin, ts)
        return Decision(d.label, d.score, d.rho, query, p)

    def decide_many(
        self, X: Any, coins: Any = None, ts: Any = None
    ) -> tuple[npt.NDArray[np.int8], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """Decide the rows of ``X`` in order: ``(labels, scores, query_probabilities,
        queries)``, the same as :meth:`decide` row by row."""
        m = np.shape(X)[0] if np.ndim(X) == 2 else -1
        labels, scores, _, _ = self.learner.decide_many(X, coins=np.zeros(max(m, 0)))
        utilities = np.clip(self.learner.query_utility(scores), 0.0, 1.0)
        probs, queries = self.budget.ask_many(utilities, coins, ts)
        return labels, scores, probs, queries

    def update(self, x: Any, y: Any) -> bool:
        """The learner's :meth:`update` (the budget counts questions, not answers)."""
        return bool(self.learner.update(x, y))

    def to_state(self) -> dict[str, Any]:
        """``{"format": "abstain.budgeted", "version": 1, "learner": ..., "budget": ...}``."""
        return {
            "format": st.BUDGETED_FORMAT,
            "version": st.VERSION,
            "learner": self.learner.to_state(),
            "budget": self.budget.to_state(),
        }

    @classmethod
    def from_state(cls, state: Any) -> Budgeted:
        """Rebuild from :meth:`to_state` output (same decisions, same queries)."""
        record = st.read_record(state, st.BUDGETED_FORMAT)
        learner = record.get("learner")
        budget = record.get("budget")
        if learner is None or budget is None:
            raise StateError("a budgeted state needs both 'learner' and 'budget' records")
        return cls(learner_from_state(learner), QueryBudget.from_state(budget))

    def __repr__(self) -> str:
        return f"Budgeted({self.learner!r}, {self.budget!r})"
