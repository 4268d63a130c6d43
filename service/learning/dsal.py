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

from .base import check_param
from .linear import LinearLearner
from .losses import FloatArray
from .rules import DoubleSigmoidRule, FullLabelRule
from .schedules import InverseTime, Schedule

__all__ = ["DEFAULT_DS_ETA", "DEFAULT_GAMMA", "DSAL", "DSOL"]

DEFAULT_GAMMA = 1.0
r"""Default sigmoid slope $\gamma$."""

DEFAULT_DS_ETA = InverseTime(eta0=0.1, tau=1000.0)
r"""Default DSAL/DSOL step: $\eta_t = 0.1/(1 + t/1000)$ (reasons in :class:`DSAL`)."""


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
    eta:
        Step size (number or schedule). Default $\eta_t = 0.1/(1 + t/1000)$, meant for
        standardised features plus an intercept at a few dozen features: close to the
        paper's theory value $5/(\gamma^2 (R^2 + 1)) \approx 0.07$ for $R^2 \approx 69$
        (Phishing; see :class:`~service.learning.schedules.DSALTheory`), decaying as in
        the paper's experiments. Larger steps ask fewer labels at a higher risk.
    rho, w:
        Initial rejection width (default 1) and weights (default zero).
    seed:
        Seed of the private generator that draws query coins when none is supplied.

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
    param_names: ClassVar[tuple[str, ...]] = ("n_features", "cost", "gamma", "eta", "seed")
    __slots__ = ("gamma",)

    gamma: float

    def __init__(
        self,
        n_features: int,
        cost: float,
        *,
        gamma: float = DEFAULT_GAMMA,
        eta: float | Schedule | Mapping[str, Any] = DEFAULT_DS_ETA,
        rho: float = 1.0,
        w: Sequence[float] | FloatArray | None = None,
        seed: int | None = 0,
    ) -> None:
        super().__init__(n_features, cost, eta=eta, rho=rho, w=w, seed=seed)
        self.gamma = check_param("gamma", gamma)


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
