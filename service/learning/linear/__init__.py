r"""Linear reject-option learners, $f(x) = w \cdot x$.

- :mod:`.learner`: :class:`~.learner.LinearLearner`, what every linear learner shares (input
  checks, the update step, read-only parameters, batched decisions, the state record);
- :mod:`.dral`: :class:`~.dral.DRAL` (Algorithm 1: deterministic queries);
- :mod:`.dsal`: :class:`~.dsal.DSAL` (Algorithm 2: Bernoulli queries) and
  :class:`~.dsal.DSOL` (the full-label baseline).

Many of them in lockstep (the replay): :class:`service.learning.batch.BatchLearner`.
"""

from .dral import DRAL
from .dsal import DSAL, DSOL
from .learner import UPDATES, LinearLearner

__all__ = [
    "DRAL",
    "DSAL",
    "DSOL",
    "LinearLearner",
    "UPDATES",
]
