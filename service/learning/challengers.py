"""Challengers of an :class:`~service.learning.adaptive.Adaptive` champion.

A challenger is a learner of the champion's class and configuration, started at a change:

* ``"fresh"`` — nothing learned yet ($w = 0$, step clock 0, the configured $\rho$);
* ``"mirror"`` — the champion with its score negated ($f \to -f$: linear weights, or a
  kernel learner's coefficients) and a given $\rho$.

Both are built through the learners' state records, so any learner of this package works.
A :class:`Challenger` also keeps its paired record against the champion: the sum and the
sum of squares of the (importance-weighted) gains, the champion's loss minus its own, on
every label since it started.

>>> from service.learning import DSAL
>>> champion = DSAL(n_features=2, cost=0.25, w=[1.0, -2.0])
>>> challenger_for(champion, "mirror", rho=0.5).w.tolist()
[-1.0, 2.0]
>>> challenger_for(champion, "fresh", rho=0.5).w.tolist()
[0.0, 0.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from . import state as st
from .errors import HyperparameterError, StateError
from .registry import learner_from_state

__all__ = ["CHALLENGER_KINDS", "Challenger", "challenger_for"]

CHALLENGER_KINDS: Final = ("fresh", "mirror")


def challenger_for(learner: Any, kind: str, rho: float) -> Any:
    """A challenger of ``kind`` for ``learner``, built through its state record (``rho``
    is the mirror's width; a fresh challenger takes the configured one)."""
    if kind == "fresh":
        return learner_from_state(_fresh_record(learner))
    if kind != "mirror":
        raise HyperparameterError(f"challenger kind must be one of {CHALLENGER_KINDS}: {kind!r}")
    record = learner.to_state()
    learned = dict(record["learned"])
    for key in ("w", "coef"):  # linear weights, or a kernel learner's coefficients
        if key in learned:
            learned[key] = [-float(v) for v in learned[key]]
    learned["rho"] = rho
    return learner_from_state({**record, "learned": learned})


def _fresh_record(learner: Any) -> dict[str, Any]:
    """The state record of ``learner``'s configuration with nothing learned yet."""
    cls = type(learner)
    build = getattr(cls, "_from_params", cls)
    out: dict[str, Any] = build(**learner.get_params()).to_state()
    return out


class Challenger:
    """A challenger and its paired record against the champion since it started."""

    __slots__ = ("kind", "learner", "n", "total", "squares")

    def __init__(self, kind: str, learner: Any) -> None:
        self.kind, self.learner = kind, learner
        self.n, self.total, self.squares = 0, 0.0, 0.0

    def add(self, gain: float) -> None:
        self.n += 1
        self.total += gain
        self.squares += gain * gain

    @property
    def mean(self) -> float:
        """Mean gain (loss of the champion minus the challenger's) per label so far."""
        return self.total / self.n if self.n else 0.0

    def winning(self, min_labels: int, z: float) -> bool:
        """Whether it passes the paired test: enough labels, mean gain above ``z`` s.e."""
        if self.n < min_labels:
            return False
        mean = self.mean
        spread = math.sqrt(max(self.squares / self.n - mean * mean, 0.0) / self.n)
        return mean > 0.0 and mean > z * spread

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "learner": self.learner.to_state(),
            "n": self.n,
            "total": self.total,
            "squares": self.squares,
        }

    @classmethod
    def from_state(cls, record: Any) -> Challenger:
        if not isinstance(record, Mapping) or record.get("kind") not in CHALLENGER_KINDS:
            raise StateError(f"a challenger record needs a kind in {CHALLENGER_KINDS}")
        out = cls(str(record["kind"]), learner_from_state(record.get("learner")))
        out.n = st.read_int(record, "n")
        out.total = st.read_float(record, "total")
        out.squares = st.read_float(record, "squares", minimum=0.0)
        return out
