"""Query budgets: ask for labels at a target rate, the most informative events first.

- :mod:`.query`: :class:`~.query.QueryBudget` (one budget) and :class:`~.query.BudgetRows`
  (the rows of a batch held to budgets in lockstep);
- :mod:`.budgeted`: :class:`~.budgeted.Budgeted`, any learner held to a budget. It rebuilds
  its learner from a state record through the registry, so it sits above it (and
  :mod:`service.learning.batch`, which the registry does not know, below neither).
"""

from .budgeted import Budgeted
from .query import BudgetReport, BudgetRows, QueryBudget

__all__ = [
    "Budgeted",
    "BudgetReport",
    "BudgetRows",
    "QueryBudget",
]
