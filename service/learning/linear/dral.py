r"""DRAL: active learning of a linear reject-option classifier with the double ramp loss
(Shah & Manwani, AAAI 2020, Algorithm 1).

Score $f = w \cdot x$, decision $h_\rho(f)$. Query the label iff
$\rho - 1 \le |f| \le \rho + 1$ (where $L_{dr}$ can have a slope); with the label
$y$ and margin $z = y f$:

.. math::

    (w, \rho) \leftarrow
    \begin{cases}
    (w + \eta\, d\, y x,\ \rho - \eta d)             & \rho - 1 \le z \le \rho + 1 \\
    (w + \eta (1-d)\, y x,\ \rho + \eta (1-d))       & -\rho - 1 \le z \le -\rho + 1 \\
    (w, \rho)                                        & \text{otherwise,}
    \end{cases}

then $\rho \leftarrow \max(0, \rho)$. The rule is
:func:`~service.learning.losses.double_ramp_gradient`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..losses import FloatArray
from ..rules import DoubleRampRule
from ..schedules import Schedule, default_dral_eta
from .learner import LinearLearner

__all__ = ["DRAL"]


class DRAL(DoubleRampRule, LinearLearner):
    r"""Double Ramp loss Active Learning (Algorithm 1): deterministic queries.

    Parameters
    ----------
    n_features:
        Length of ``x`` (add an :class:`~service.learning.preprocessing.Intercept` step
        for a bias term; the learner computes exactly $f(x) = w \cdot x$).
    cost:
        Rejection cost $d \in (0, 0.5)$.
    eta:
        Step size: a number (constant), a schedule or a schedule config. ``None`` (the
        default) takes :func:`~service.learning.schedules.default_dral_eta` of ``n_features``:
        $\eta_t = (1.5 / (n + 1)) / (1 + t/1000)$, meant for standardised features plus an
        intercept ($\|x\|^2 \approx n$; rescale $\eta$ for other inputs). The chosen
        schedule is part of the learner's state.
    rho_eta_max, intercept_eta_min:
        A cap on $\rho$'s step and a floor on the last weight's step (default ``None``:
        both take ``eta``; :mod:`service.learning.linear.learner`).
    update_rule:
        ``"sgd"`` (default): the paper's step; ``"normalized"``: the scale-free, importance
        weight aware step with per-coordinate adaptive rates of
        :mod:`service.learning.linear.normalized` (the same default ``eta``).
    rho, w:
        Initial rejection width (Algorithm 1: 1) and weights (Algorithm 1: zero).
    seed:
        Unused by the deterministic rule; kept so every learner takes the same keywords.

    >>> DRAL(n_features=5, cost=0.25).eta
    InverseTime(eta0=0.25, tau=1000.0)
    >>> learner = DRAL(n_features=2, cost=0.25, eta=1.0)
    >>> d = learner.decide([1.0, 0.0])      # w = 0: f = 0 is inside [rho - 1, rho + 1]
    >>> d.label, d.query, d.query_probability
    (0, True, 1.0)
    >>> learner.update([1.0, 0.0], +1)     # first ramp: w += eta d y x, rho -= eta d
    True
    >>> learner.w.tolist(), learner.rho
    ([0.25, 0.0], 0.75)
    """

    algorithm: ClassVar[str] = "dral"
    __slots__ = ()

    def __init__(
        self,
        n_features: int,
        cost: float,
        *,
        eta: float | Schedule | Mapping[str, Any] | None = None,
        rho_eta_max: float | None = None,
        intercept_eta_min: float | None = None,
        update_rule: str = "sgd",
        rho: float = 1.0,
        w: Sequence[float] | FloatArray | None = None,
        seed: int | None = 0,
    ) -> None:
        super().__init__(
            n_features,
            cost,
            eta=eta,
            rho_eta_max=rho_eta_max,
            intercept_eta_min=intercept_eta_min,
            update_rule=update_rule,
            rho=rho,
            w=w,
            seed=seed,
        )

    def _default_eta(self) -> Schedule:
        return default_dral_eta(self.n_features)
