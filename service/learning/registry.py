"""Build learners by algorithm name, or from any learner's state record.

>>> make_learner("dral", n_features=3, cost=0.25)
DRAL(n_features=3, cost=0.25, eta={'kind': 'inverse-time', 'eta0': 0.375, 'tau': 1000.0}, \
seed=0, rho=1.0, steps=0)
>>> type(learner_from_state(make_learner("dsol", n_features=2, cost=0.1).to_state())).__name__
'DSOL'
>>> ALGORITHM_NAMES
('dral', 'dsal', 'dsol', 'kernel-dral', 'kernel-dsal', 'kernel-dsol')
>>> LINEAR_ALGORITHMS, FULL_LABEL_ALGORITHMS
(('dral', 'dsal', 'dsol'), ('dsol', 'kernel-dsol'))
"""

from __future__ import annotations

from typing import Any, Protocol

from . import state as st
from .base import Decision
from .errors import HyperparameterError, StateError
from .kernel.dral import KernelDRAL
from .kernel.dsal import KernelDSAL, KernelDSOL
from .kernel.learner import KernelLearner
from .linear.dral import DRAL
from .linear.dsal import DSAL, DSOL
from .linear.learner import LinearLearner
from .rules import FullLabelRule

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_NAMES",
    "FULL_LABEL_ALGORITHMS",
    "KERNEL_ALGORITHMS",
    "LEARNERS",
    "LINEAR_ALGORITHMS",
    "Learner",
    "learner_from_state",
    "make_learner",
]


class Learner(Protocol):
    """What stream and replay code may rely on (every learner class here satisfies it)."""

    algorithm: str
    n_features: int
    cost: float

    @property
    def rho(self) -> float: ...

    @property
    def steps(self) -> int: ...

    def decide(self, x: Any, coin: float | None = None) -> Decision: ...

    def decide_many(self, X: Any, coins: Any = None) -> tuple[Any, Any, Any, Any]: ...

    def update(self, x: Any, y: Any) -> bool: ...

    def to_state(self) -> dict[str, Any]: ...

    def weight_norm(self) -> float: ...


#: every learner, in the order the docs, the settings and the chart list them; its
#: ``algorithm`` is its name (in settings, state records, metrics and the chart's schema).
#: A new learner is a module of its family and a line here: the contract suite, the
#: settings, the replay and (through a test) the chart take it from this tuple.
LEARNERS: tuple[type[Any], ...] = (DRAL, DSAL, DSOL, KernelDRAL, KernelDSAL, KernelDSOL)

ALGORITHMS: dict[str, Any] = {cls.algorithm: cls for cls in LEARNERS}
"""Algorithm name (as in state records) -> learner class."""

#: the names: all of them, the linear learners, the kernel learners, and those that ask for
#: every label (no active rule: DSOL and its kernel version)
ALGORITHM_NAMES: tuple[str, ...] = tuple(ALGORITHMS)
LINEAR_ALGORITHMS: tuple[str, ...] = tuple(
    n for n, cls in ALGORITHMS.items() if issubclass(cls, LinearLearner)
)
KERNEL_ALGORITHMS: tuple[str, ...] = tuple(
    n for n, cls in ALGORITHMS.items() if issubclass(cls, KernelLearner)
)
FULL_LABEL_ALGORITHMS: tuple[str, ...] = tuple(
    n for n, cls in ALGORITHMS.items() if issubclass(cls, FullLabelRule)
)


def make_learner(name: str, **kwargs: Any) -> Any:
    """Construct a learner by name with keyword hyperparameters (``n_features``, ``cost``, ...)."""
    key = name.strip().lower().replace("_", "-")
    if key not in ALGORITHMS:
        raise HyperparameterError(
            f"unknown algorithm {name!r}; expected one of {sorted(ALGORITHMS)}"
        )
    try:
        return ALGORITHMS[key](**kwargs)
    except TypeError as exc:
        raise HyperparameterError(f"bad hyperparameters for {key!r}: {exc}") from exc


def learner_from_state(state: Any) -> Any:
    """Rebuild whichever learner a state record holds."""
    record = st.read_record(state, st.LEARNER_FORMAT)
    algorithm = record.get("algorithm")
    if algorithm not in ALGORITHMS:
        raise StateError(
            f"state holds unknown algorithm {algorithm!r} (known: {sorted(ALGORITHMS)}); "
            "upgrade abstain to a release that knows it"
        )
    return ALGORITHMS[str(algorithm)].from_state(record)
