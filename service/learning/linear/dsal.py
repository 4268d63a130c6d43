r"""DSAL and DSOL: linear reject-option learners trained on the double sigmoid loss
(Shah & Manwani, AAAI 2020, Algorithm 2 and the experiments' full-label baseline).

With $\sigma(a) = 1/(1 + e^{\gamma a})$, score $f = w \cdot x$ and margin $z = y f$:

.. math::

    L_{ds}(z, \rho) = 2d\,\sigma(z - \rho) + 2(1-d)\,\sigma(z + \rho),
    \qquad p = 4\,\sigma(|f| - \rho)\,(1 - \sigma(|f| - \rho)).

DSAL queries with probability $p$ (1 on the transitions $|f| = \rho$). A label moves
the parameters down the *true* gradient (see
:func:`~service.learning.losses.double_sigmoid_gradient`; the paper's printed equations
have the signs flipped): with $q_\mp = \sigma(z \mp \rho)(1 - \sigma(z \mp \rho))$,

.. math::

    w \leftarrow w + 2\eta\gamma\,\bigl(d\,q_- + (1-d)\,q_+\bigr)\, y x, \qquad
    \rho \leftarrow \max\bigl(0,\ \rho - 2\eta\gamma\,(d\,q_- - (1-d)\,q_+)\bigr).

DSOL applies the same update to every example ($p = 1$).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..base import check_param
from ..losses import FloatArray
from ..rules import DoubleSigmoidRule, FullLabelRule
from ..schedules import DEFAULT_GAMMA, Schedule, default_ds_eta
from .learner import LinearLearner

__all__ = ["DSAL", "DSOL"]


class DSAL(DoubleSigmoidRule, LinearLearner):
    r"""Double Sigmoid loss Active Learning (Algorithm 2): Bernoulli($p$) queries.

    Parameters
    ----------
    n_features:
        Length of ``x`` (the learner computes exactly $f(x) = w \cdot x$; add an
        :class:`~service.learning.preprocessing.Intercept` step for a bias).
    cost:
        Rejection cost $d \in (0, 0.5)$.
    gamma:
        Slope $\gamma > 0$ of the sigmoid (default 1). Larger is closer to $L_d$ and asks
        fewer labels (the query band narrows); smaller asks more.
    tail:
        $\lambda \ge 0$, the weight of a logistic loss of the margin added to the loss of
        $w$ (:func:`~service.learning.losses.double_sigmoid_loss`; $\rho$ and the query rule
        are the paper's). Default 0: the paper's loss, exactly. With $\lambda > 0$ a label
        the model is confidently wrong about still moves $w$, which lets it follow a
        boundary that moves; the paper's loss is the more robust to noise.
    eta:
        Step size: a number (constant), a schedule or a schedule config. ``None`` (the
        default) takes :func:`~service.learning.schedules.default_ds_eta` of
        ``n_features`` and ``gamma``: $\eta_t = (5 / (\gamma^2 (n + 1))) / (1 + t/1000)$,
        meant for standardised features plus an intercept ($\|x\|^2 \approx n$; rescale
        $\eta$ for other inputs). Larger steps ask fewer labels at a higher risk. The
        chosen schedule is part of the learner's state.
    rho_eta_max, intercept_eta_min:
        A cap on $\rho$'s step and a floor on the last weight's step (default ``None``:
        both take ``eta``; :mod:`service.learning.linear.learner`).
    update_rule:
        ``"sgd"`` (default): the paper's step; ``"normalized"``: the scale-free, importance
        weight aware step with per-coordinate adaptive rates of
        :mod:`service.learning.linear.normalized` (the same default ``eta``).
    rho, w:
        Initial rejection width (default 1) and weights (default zero).
    seed:
        Seed of the private generator that draws query coins when none is supplied.

    >>> DSAL(n_features=4, cost=0.25, gamma=2.0).eta
    InverseTime(eta0=0.25, tau=1000.0)
    >>> learner = DSAL(n_features=2, cost=0.25, eta=1.0, w=[1.0, 0.0])
    >>> d = learner.decide([1.0, 0.0], coin=0.5)   # f = rho = 1: on a transition, p = 1
    >>> d.label, d.query, d.query_probability
    (0, True, 1.0)
    >>> learner.update([1.0, 0.0], -1)           # wrong side: w moves toward y x, rho grows
    True
    >>> bool(learner.w[0] < 1.0), learner.rho > 1.0
    (True, True)
    """

    algorithm: ClassVar[str] = "dsal"
    param_names: ClassVar[tuple[str, ...]] = (
        "n_features",
        "cost",
        "gamma",
        "tail",
        "eta",
        "rho_eta_max",
        "intercept_eta_min",
        "update_rule",
        "seed",
    )
    __slots__ = ("gamma", "tail")

    gamma: float
    tail: float

    def __init__(
        self,
        n_features: int,
        cost: float,
        *,
        gamma: float = DEFAULT_GAMMA,
        tail: float = 0.0,
        eta: float | Schedule | Mapping[str, Any] | None = None,
        rho_eta_max: float | None = None,
        intercept_eta_min: float | None = None,
        update_rule: str = "sgd",
        rho: float = 1.0,
        w: Sequence[float] | FloatArray | None = None,
        seed: int | None = 0,
    ) -> None:
        self.gamma = check_param("gamma", gamma)  # first: the default step depends on it
        self.tail = check_param("tail", tail)
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
        return default_ds_eta(self.n_features, self.gamma)

    def _width(self) -> float:
        return 1.0 / self.gamma


class DSOL(FullLabelRule, DSAL):
    r"""Double Sigmoid loss Online Learning: DSAL's update on every example ($p = 1$).

    The full-label baseline of the paper's experiments; same parameters as :class:`DSAL`.

    >>> learner = DSOL(n_features=2, cost=0.1)
    >>> d = learner.decide([0.0, 5.0])
    >>> d.query, d.query_probability
    (True, 1.0)
    """

    algorithm: ClassVar[str] = "dsol"
    __slots__ = ()
