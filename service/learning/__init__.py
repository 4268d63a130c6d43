r"""Online active learning of reject-option classifiers (Shah & Manwani, AAAI 2020).

A pure library: it imports numpy and the standard library only, so stream workers,
the replay command and notebooks share one implementation.

The package exports what a user builds a model from (24 names):

* the learners: :class:`DRAL`, :class:`DSAL`, :class:`DSOL` (linear, $f(x) = w \cdot x$)
  and :class:`KernelDRAL`, :class:`KernelDSAL`, :class:`KernelDSOL` (a bounded support set);
  :func:`make_learner` builds one by name, :func:`learner_from_state` from its record;
* what a worker serves around them: :class:`Adaptive` (change detection, challengers and
  exploration, the :class:`Parts` a configuration turns on), :func:`serving_learner` and
  :func:`learner_for`; :class:`Budgeted` and :class:`QueryBudget` (labels at a target
  rate); :class:`Pipeline`, :func:`default_pipeline` and :func:`serving_pipeline` (the
  standardisers in front);
* :class:`Decision`, what ``decide`` returns; :class:`RiskEstimate`, the importance-weighted
  0-d-1 risk with its interval; :func:`learn_from_champion`, how a shadow learns;
* the errors: :class:`LearningError` and its :class:`HyperparameterError`,
  :class:`InputError`, :class:`StateError`.

Everything else is imported from its family or module:

* :mod:`.linear` (the linear learners, ``UPDATES``: ``"sgd"``, the paper's step, and
  ``"normalized"``, importance-weight aware and per-coordinate adaptive), :mod:`.kernel`
  (kernels, the kernel learners' defaults), :mod:`.budget`, :mod:`.risk` (estimates,
  scorecards, the collapse watch), :mod:`.adaptive`, :mod:`.drift` (ADWIN, Page-Hinkley);
* :mod:`.losses` ($h_\rho$, $L_d$, $L_{dr}$, $L_{ds}$, gradients and query rules),
  :mod:`.schedules` (step sizes and the learners' default steps), :mod:`.preprocessing`
  (standardisers, the intercept), :mod:`.moments` (per-feature moments that merge exactly),
  :mod:`.sparse` and :mod:`.sparse_scoring` (rows as the inputs they set, and their scores),
  :mod:`.batch` (many linear learners in lockstep, for the replay), :mod:`.registry` (every
  learner by name), :mod:`.state` (versioned JSON-safe records), :mod:`.errors`.

``docs/reference/architecture.md`` draws the layers.

Exception tree (every class is a ``ValueError`` and an ``AbstainError``, the root of the
package-wide tree in :mod:`service.errors`, a standard-library-only module)::

    AbstainError, ValueError
     └── LearningError             anything raised on purpose by service.learning
          ├── HyperparameterError  a constructor/config argument outside its declared bounds
          ├── InputError           an example the model cannot take (the model is unchanged)
          │    ├── DimensionError  x (or X, coins) has the wrong shape
          │    ├── NonFiniteError  NaN/inf in x, or an update that would make w/rho non-finite
          │    └── LabelError      y is not +1 or -1
          └── StateError           a state record this release cannot read

>>> from service.learning import DSAL
>>> learner = DSAL(n_features=2, cost=0.25, seed=0)
>>> learner.decide([0.5, -1.0], coin=0.1).label    # w = 0: everything is rejected at first
0
"""

from .adaptive import Adaptive, Parts, learner_for, serving_learner, serving_state
from .base import Decision
from .budget import Budgeted, QueryBudget
from .errors import HyperparameterError, InputError, LearningError, StateError
from .kernel import KernelDRAL, KernelDSAL, KernelDSOL
from .linear import DRAL, DSAL, DSOL
from .preprocessing import Pipeline, default_pipeline, serving_pipeline
from .registry import learner_from_state, make_learner
from .risk import RiskEstimate, learn_from_champion

__all__ = [
    "DRAL",
    "DSAL",
    "DSOL",
    "Adaptive",
    "Budgeted",
    "Decision",
    "HyperparameterError",
    "InputError",
    "KernelDRAL",
    "KernelDSAL",
    "KernelDSOL",
    "LearningError",
    "Parts",
    "Pipeline",
    "QueryBudget",
    "RiskEstimate",
    "StateError",
    "default_pipeline",
    "learn_from_champion",
    "learner_for",
    "learner_from_state",
    "make_learner",
    "serving_learner",
    "serving_state",
    "serving_pipeline",
]
