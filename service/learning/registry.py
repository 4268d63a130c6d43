"""Build learners by algorithm name, or from any learner's state record.

>>> make_learner("dral", n_features=3, cost=0.25)
DRAL(n_features=3, cost=0.25, eta={'kind': 'inverse-time', 'eta0': 0.375, 'tau': 1000.0}, \
seed=0, rho=1.0, steps=0)
>>> type(learner_from_state(make_learner("dsol", n_features=2, cost=0.1).to_state())).__name__
'DSOL'
"""

from __future__ import annotations

from typing import Any, Protocol

from . import state as st
from .base import Decision
from .dral import DRAL
from .dsal import DSAL, DSOL
from .errors import HyperparameterError, StateError
from .kernel_learners import KernelDRAL, KernelDSAL, KernelDSOL

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_NAMES",
    "KERNEL_ALGORITHMS",
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


ALGORITHMS: dict[str, Any] = {
    "dral": DRAL,
    "dsal": DSAL,
    "dsol": DSOL,
    "kernel-dral": KernelDRAL,
    "kernel-dsal": KernelDSAL,
    "kernel-dsol": KernelDSOL,
}
"""Algorithm name (as in state records) -> learner class."""

#: the names, in one place: linear learners, their kernelized versions, all of them
LINEAR_ALGORITHMS: tuple[str, ...] = ("dral", "dsal", "dsol")
KERNEL_ALGORITHMS: tuple[str, ...] = tuple(f"kernel-{a}" for a in LINEAR_ALGORITHMS)
ALGORITHM_NAMES: tuple[str, ...] = LINEAR_ALGORITHMS + KERNEL_ALGORITHMS


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
