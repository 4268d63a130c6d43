r"""The per-algorithm rules, shared by the linear and the kernel learners.

A rule says how likely a query is for a score $f$ (``_query_probability``) and which
$(\partial L/\partial z, \partial L/\partial \rho)$ a label gives at margin $z = y f$
(``_gradient``). Both accept floats or arrays and delegate to
:mod:`service.learning.losses`, where the formulas live.
"""

from __future__ import annotations

from typing import Any

from .losses import (
    double_ramp_gradient,
    double_ramp_query,
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

    def _gradient(self, z: Any, rho: float) -> tuple[Any, Any]:
        return double_ramp_gradient(z, rho, self.cost)


class DoubleSigmoidRule:
    """DSAL: query with ``p = 4 s (1 - s)``, ``s = sigma(|f| - rho)``; gradient of L_ds."""

    __slots__ = ()
    cost: float
    gamma: float
    _rho: float

    def _query_probability(self, f: Any) -> Any:
        return double_sigmoid_query_probability(f, self._rho, self.gamma)

    def _gradient(self, z: Any, rho: float) -> tuple[Any, Any]:
        return double_sigmoid_gradient(z, rho, self.cost, self.gamma)


class FullLabelRule(DoubleSigmoidRule):
    """DSOL: DSAL's gradient, but every label is asked for (``p = 1``)."""

    __slots__ = ()

    def _query_probability(self, f: Any) -> Any:
        return 1.0
