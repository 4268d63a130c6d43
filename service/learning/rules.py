r"""The per-algorithm rules, shared by the linear and the kernel learners.

A rule says how likely a query is for a score $f$ (``_query_probability``), how
informative the label of an example with score $f$ would be (:meth:`query_utility`, in
$[0, 1]$: what a :class:`~service.learning.budget.query.QueryBudget` scales) and which
$(\partial L/\partial z, \partial L/\partial \rho)$ a label gives at margin $z = y f$
(``_gradient``). All accept floats or arrays and delegate to
:mod:`service.learning.losses`, where the formulas live.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .losses import (
    double_ramp_gradient,
    double_ramp_query,
    double_ramp_query_utility,
    double_sigmoid_gradient,
    double_sigmoid_query_probability,
)

__all__ = ["DoubleRampRule", "DoubleSigmoidRule", "FullLabelRule"]


class DoubleRampRule:
    """DRAL: query iff ``rho - 1 <= |f| <= rho + 1``; Algorithm 1's branch update."""

    __slots__ = ()
    cost: float
    _rho: float

    def _query_probability(self, f: Any) -> Any:
        q = double_ramp_query(f, self._rho)
        if isinstance(q, bool):
            return 1.0 if q else 0.0
        return q.astype(float)

    def query_utility(self, f: Any) -> Any:
        """The smooth bump :func:`~service.learning.losses.double_ramp_query_utility`
        (peak 1 at ``|f| = rho``, >= 0.42 inside the query band): DRAL's rule made
        randomisable, for budgets."""
        return double_ramp_query_utility(f, self._rho)

    def _gradient(self, z: Any, rho: float) -> tuple[Any, Any]:
        return double_ramp_gradient(z, rho, self.cost)


class DoubleSigmoidRule:
    """DSAL: query with ``p = 4 s (1 - s)``, ``s = sigma(|f| - rho)``; gradient of L_ds
    (plus ``tail`` times the logistic loss of the margin: 0, the paper's, by default)."""

    __slots__ = ()
    cost: float
    gamma: float
    tail: float
    _rho: float

    def _query_probability(self, f: Any) -> Any:
        return double_sigmoid_query_probability(f, self._rho, self.gamma)

    def query_utility(self, f: Any) -> Any:
        """DSAL's own query probability ``p`` (it already is a smooth utility)."""
        return double_sigmoid_query_probability(f, self._rho, self.gamma)

    def _gradient(self, z: Any, rho: float) -> tuple[Any, Any]:
        return double_sigmoid_gradient(z, rho, self.cost, self.gamma, self.tail)


class FullLabelRule(DoubleSigmoidRule):
    """DSOL: DSAL's gradient, but every label is asked for (``p = 1``)."""

    __slots__ = ()

    def _query_probability(self, f: Any) -> Any:
        return 1.0

    def query_utility(self, f: Any) -> Any:
        """1 for every example: under a budget DSOL samples events uniformly."""
        if isinstance(f, np.ndarray):
            return np.ones(f.shape)
        return 1.0
