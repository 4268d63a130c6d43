r"""Online active learning of reject-option classifiers (Shah & Manwani, AAAI 2020).

A pure library: it imports numpy and the standard library only, so stream workers,
the replay command and notebooks share one implementation.

* Losses and decisions: :mod:`.losses` ($h_\rho$, $L_d$, $L_{dr}$, $L_{ds}$, gradients).
* Linear learners $f(x) = w \cdot x$: :class:`DRAL`, :class:`DSAL`, :class:`DSOL`.
* Kernel learners with a bounded support set: :class:`KernelDRAL`, :class:`KernelDSAL`,
  :class:`KernelDSOL`.
* Query budgets: :class:`QueryBudget` (ask at a target rate, fraction of events or labels
  per second, the most informative events first; every decision's ``query_probability``
  is the true one) and :class:`Budgeted` (any learner held to a budget);
  :class:`BudgetRows` does the same for the rows of a :class:`BatchLearner`.
* Collapse: :class:`CollapseWatch` tells when a model rejects (nearly) everything while
  $\rho$ keeps growing. The kernel learners' defaults avoid it: a data-scaled RBF width
  (:class:`ScaledRBFKernel`) and a capped $\rho$ (``rho_cap``, :data:`DEFAULT_RHO_CAP`).
* Step sizes: :class:`Constant`, :class:`InverseTime`, :class:`DSALTheory`. Without
  ``eta`` a learner builds its default from its width $n$ = ``n_features`` (intercept
  included; for standardised features $\|x\|^2 \approx n$):
  :func:`default_ds_eta` $= 5/(\gamma^2(n+1)) / (1 + t/1000)$ (DSAL, DSOL),
  :func:`default_dral_eta` $= 1.5/(n+1) / (1 + t/1000)$ (DRAL), and for the kernel
  learners the constants :func:`default_kernel_ds_eta` $= 5/(\gamma^2(\bar K+1))$ and
  :func:`default_kernel_dral_eta` $= 1.5/(\bar K+1)$ with $\bar K = K(x, x)$ at
  $\|x\|^2 = n$ (in :mod:`.schedules` and :mod:`.kernel.defaults`, with the evidence from
  ``docs/results/replay/index.md``);
  :data:`DEFAULT_GAMMA` (1), :data:`DEFAULT_TAU` (1000).
* Preprocessing: :class:`OnlineStandardizer`, :class:`Intercept`, :class:`Pipeline`;
  :func:`serving_pipeline`, what a model serves (a standardiser that takes in the
  :class:`Moments` of every event the scorers see, then one of the labelled rows).
* Update rules of the linear learners (``update_rule``): ``"sgd"``, the papers' step, and
  ``"normalized"`` (:mod:`.linear.normalized`: importance-weight aware, per-coordinate
  adaptive, $\rho$ in the units of the score).
* Many independent linear learners in lockstep (the replay): :class:`BatchLearner`,
  with :class:`BatchStandardizer` for per-run online standardisation.
* Risk and shadows: :class:`RiskEstimate` (importance-weighted 0-d-1 risk with a score
  interval, :func:`importance_weight` capped as the stream caps it); a shadow model learns
  from a champion's labels with :func:`learn_from_champion` and is judged by a
  :class:`Scorecard` (:class:`Comparison`: risk, interval, reject rate, labels).
* Change: :class:`Adaptive` wraps any learner with change detection (:mod:`.drift`),
  challengers and exploration; :func:`serving_learner` and :func:`learner_for` build the
  learner a model serves (the wrapper with the :class:`Parts` its configuration turns on).
* State: versioned JSON-safe records (:mod:`.state`), :func:`learner_from_state`.

Where things live: one folder per family (:mod:`.linear`, :mod:`.kernel`, :mod:`.budget`,
:mod:`.risk`) over the shared modules (:mod:`.base`, :mod:`.losses`, :mod:`.rules`,
:mod:`.schedules`, :mod:`.preprocessing`, :mod:`.state`); :mod:`.registry` names every
learner (what :func:`make_learner`, :func:`learner_from_state`, the contract suite, the
settings and the chart take their algorithms from), and :mod:`.batch` batches the linear
ones it finds there. ``docs/reference/architecture.md`` draws the layers.

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

from .adaptive import Adaptive, Parts, is_adaptive_state, learner_for, serving_learner
from .base import Decision
from .batch import BatchLearner, BatchStandardizer
from .budget.budgeted import Budgeted
from .budget.query import BudgetReport, BudgetRows, QueryBudget
from .errors import (
    DimensionError,
    HyperparameterError,
    InputError,
    LabelError,
    LearningError,
    NonFiniteError,
    StateError,
)
from .kernel.defaults import default_kernel_dral_eta, default_kernel_ds_eta
from .kernel.dral import KernelDRAL
from .kernel.dsal import KernelDSAL, KernelDSOL
from .kernel.kernels import (
    Kernel,
    LinearKernel,
    PolynomialKernel,
    RBFKernel,
    ScaledRBFKernel,
    kernel_from_config,
)
from .kernel.learner import DEFAULT_BUDGET, DEFAULT_RHO_CAP, KernelLearner
from .linear.dral import DRAL
from .linear.dsal import DSAL, DSOL
from .linear.learner import UPDATES, LinearLearner
from .losses import (
    double_ramp_gradient,
    double_ramp_loss,
    double_ramp_query,
    double_ramp_query_utility,
    double_sigmoid_gradient,
    double_sigmoid_loss,
    double_sigmoid_query_probability,
    reject_decision,
    sigmoid,
    sigmoid_slope,
    zero_d_one_loss,
)
from .moments import Moments
from .preprocessing import (
    LABEL_PRIOR,
    Intercept,
    OnlineStandardizer,
    Pipeline,
    default_pipeline,
    preprocessor_from_state,
    serving_pipeline,
)
from .registry import (
    ALGORITHM_NAMES,
    ALGORITHMS,
    FULL_LABEL_ALGORITHMS,
    KERNEL_ALGORITHMS,
    LEARNERS,
    LINEAR_ALGORITHMS,
    Learner,
    learner_from_state,
    make_learner,
)
from .risk.collapse import CollapseStatus, CollapseWatch
from .risk.estimate import (
    DEFAULT_LEVEL,
    DEFAULT_MAX_WEIGHT,
    RiskEstimate,
    RiskInterval,
    importance_weight,
)
from .risk.shadow import (
    ESTIMATORS,
    WEIGHTINGS,
    Comparison,
    Scorecard,
    decision_loss,
    learn_from_champion,
)
from .schedules import (
    DEFAULT_GAMMA,
    DEFAULT_TAU,
    Constant,
    DSALTheory,
    InverseTime,
    Schedule,
    default_dral_eta,
    default_ds_eta,
    schedule_from_config,
)

__all__ = [
    "Adaptive",
    "Parts",
    "is_adaptive_state",
    "learner_for",
    "serving_learner",
    "Comparison",
    "DEFAULT_LEVEL",
    "DEFAULT_MAX_WEIGHT",
    "RiskEstimate",
    "RiskInterval",
    "Scorecard",
    "ESTIMATORS",
    "WEIGHTINGS",
    "decision_loss",
    "importance_weight",
    "learn_from_champion",
    "BudgetReport",
    "BudgetRows",
    "Budgeted",
    "CollapseStatus",
    "CollapseWatch",
    "DEFAULT_RHO_CAP",
    "QueryBudget",
    "ScaledRBFKernel",
    "double_ramp_query_utility",
    "DEFAULT_BUDGET",
    "DEFAULT_GAMMA",
    "DEFAULT_TAU",
    "kernel_from_config",
    "RBFKernel",
    "PolynomialKernel",
    "LinearKernel",
    "KernelLearner",
    "KernelDSOL",
    "KernelDSAL",
    "KernelDRAL",
    "Kernel",
    "BatchLearner",
    "BatchStandardizer",
    "ALGORITHMS",
    "DRAL",
    "DSAL",
    "DSOL",
    "Constant",
    "DSALTheory",
    "Decision",
    "DimensionError",
    "HyperparameterError",
    "InputError",
    "Intercept",
    "InverseTime",
    "LabelError",
    "Learner",
    "ALGORITHM_NAMES",
    "FULL_LABEL_ALGORITHMS",
    "KERNEL_ALGORITHMS",
    "LEARNERS",
    "LINEAR_ALGORITHMS",
    "LearningError",
    "LinearLearner",
    "LABEL_PRIOR",
    "Moments",
    "UPDATES",
    "serving_pipeline",
    "NonFiniteError",
    "OnlineStandardizer",
    "Pipeline",
    "Schedule",
    "StateError",
    "default_dral_eta",
    "default_ds_eta",
    "default_kernel_dral_eta",
    "default_kernel_ds_eta",
    "default_pipeline",
    "double_ramp_gradient",
    "double_ramp_loss",
    "double_ramp_query",
    "double_sigmoid_gradient",
    "double_sigmoid_loss",
    "double_sigmoid_query_probability",
    "learner_from_state",
    "make_learner",
    "preprocessor_from_state",
    "reject_decision",
    "schedule_from_config",
    "sigmoid",
    "sigmoid_slope",
    "zero_d_one_loss",
]
