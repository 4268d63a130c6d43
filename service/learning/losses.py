r"""The reject-option decision, the losses and their (sub)gradients: the one place the math lives.

Every function here takes either Python floats or numpy arrays (broadcasting as numpy
does) and returns the same kind, so the single-example learners and the batched engine
(:mod:`service.learning.batch`) share these formulas instead of copying them.

Notation (Shah & Manwani, AAAI 2020): score $f = f(x)$, label $y \in \{+1, -1\}$,
margin $z = y f$, rejection width $\rho \ge 0$, rejection cost $d \in (0, \tfrac12)$ and
the paper's sigmoid $\sigma(a) = 1 / (1 + e^{\gamma a})$ (a *decreasing* function, $\gamma > 0$).

The gradient helpers return the pair $(\partial L / \partial z,\ \partial L / \partial \rho)$.
A learner turns it into a step of size $\eta$ as

.. math::

    w \leftarrow w - \eta\, \frac{\partial L}{\partial z}\, y\, x, \qquad
    \rho \leftarrow \max\Bigl(0,\ \rho - \eta\, \frac{\partial L}{\partial \rho}\Bigr),

because $\partial z / \partial w = y x$ for $f(x) = w \cdot x$ (kernel learners store the
coefficient $-\eta\, (\partial L / \partial z)\, y$ of a new support example instead).

Numerical stability: sigmoids are evaluated through $e^{-|\gamma a|}$, which never
overflows, so arguments of any size (e.g. $|a| = 10^6$) give finite values and no warnings.
"""

from __future__ import annotations

import math
from typing import TypeAlias, overload

import numpy as np
import numpy.typing as npt

__all__ = [
    "FloatArray",
    "double_ramp_gradient",
    "double_ramp_loss",
    "double_ramp_query",
    "double_ramp_query_utility",
    "double_sigmoid_gradient",
    "double_sigmoid_loss",
    "double_sigmoid_query_probability",
    "reject_decision",
    "sigmoid",
    "sigmoid_slope",
    "zero_d_one_loss",
]

FloatArray: TypeAlias = npt.NDArray[np.float64]
Real: TypeAlias = float | FloatArray


@overload
def sigmoid(a: float, gamma: float = 1.0) -> float: ...
@overload
def sigmoid(a: FloatArray, gamma: Real = 1.0) -> FloatArray: ...
@overload
def sigmoid(a: Real, gamma: FloatArray) -> FloatArray: ...
def sigmoid(a: Real, gamma: Real = 1.0) -> Real:
    r"""The paper's sigmoid $\sigma(a) = 1 / (1 + e^{\gamma a})$, decreasing in $a$.

    Computed as $t / (1 + t)$ for $\gamma a > 0$ and $1 / (1 + t)$ otherwise, with
    $t = e^{-|\gamma a|} \le 1$: no overflow for any finite argument.

    >>> sigmoid(0.0)
    0.5
    >>> round(sigmoid(1.0, gamma=2.0), 6), sigmoid(1e6), sigmoid(-1e6)
    (0.119203, 0.0, 1.0)
    >>> sigmoid(np.array([-1.0, 0.0, 1.0])).round(4)
    array([0.7311, 0.5   , 0.2689])
    """
    b = gamma * a
    if isinstance(b, np.ndarray):
        t = np.exp(-np.abs(b))
        num = np.where(b > 0.0, t, 1.0)
        t += 1.0
        out: FloatArray = np.divide(num, t, out=num)
        return out
    if b > 0.0:
        t_ = math.exp(-b)
        return t_ / (1.0 + t_)
    return 1.0 / (1.0 + math.exp(b))


@overload
def sigmoid_slope(a: float, gamma: float = 1.0) -> float: ...
@overload
def sigmoid_slope(a: FloatArray, gamma: Real = 1.0) -> FloatArray: ...
@overload
def sigmoid_slope(a: Real, gamma: FloatArray) -> FloatArray: ...
def sigmoid_slope(a: Real, gamma: Real = 1.0) -> Real:
    r"""$\sigma(a)\,(1 - \sigma(a)) = t / (1 + t)^2$ with $t = e^{-|\gamma a|}$.

    This is $-\sigma'(a) / \gamma$; it is symmetric in $a$, peaks at $\tfrac14$ for
    $a = 0$ and vanishes smoothly (without overflow) for large $|a|$.

    >>> sigmoid_slope(0.0), sigmoid_slope(1e6)
    (0.25, 0.0)
    >>> s = sigmoid(0.7, 1.5)
    >>> abs(sigmoid_slope(0.7, 1.5) - s * (1.0 - s)) < 1e-15
    True
    """
    b = gamma * a
    if isinstance(b, np.ndarray):
        t = np.abs(b, out=b)  # b is a fresh temporary: work in place
        np.negative(t, out=t)
        np.exp(t, out=t)
        u = t + 1.0
        np.multiply(u, u, out=u)
        out: FloatArray = np.divide(t, u, out=t)
        return out
    t_ = math.exp(-abs(b))
    u_ = 1.0 + t_
    return t_ / (u_ * u_)


@overload
def reject_decision(f: float, rho: float) -> int: ...
@overload
def reject_decision(f: FloatArray, rho: Real) -> npt.NDArray[np.int8]: ...
def reject_decision(f: Real, rho: Real) -> int | npt.NDArray[np.int8]:
    r"""The reject-option classifier $h_\rho(f)$: $+1$ if $f > \rho$, $-1$ if $f < -\rho$,
    and $0$ (reject) if $|f| \le \rho$.

    Arrays give ``int8`` labels.

    >>> reject_decision(1.5, 1.0), reject_decision(-1.5, 1.0), reject_decision(1.0, 1.0)
    (1, -1, 0)
    >>> reject_decision(np.array([2.0, 0.3, -2.0]), 1.0)
    array([ 1,  0, -1], dtype=int8)
    """
    if isinstance(f, np.ndarray):
        out: npt.NDArray[np.int8] = np.greater(f, rho).view(np.int8) - np.less(f, -rho).view(
            np.int8
        )
        return out
    if f > rho:
        return 1
    if f < -rho:
        return -1
    return 0


@overload
def zero_d_one_loss(z: float, rho: float, cost: float) -> float: ...
@overload
def zero_d_one_loss(z: FloatArray, rho: Real, cost: Real) -> FloatArray: ...
def zero_d_one_loss(z: Real, rho: Real, cost: Real) -> Real:
    r"""The 0-d-1 loss $L_d(z, \rho) = \mathbb{1}[z < -\rho] + d\,\mathbb{1}[|z| \le \rho]$.

    $z = y f$, so $|z| = |f|$: a wrong prediction costs 1, a rejection costs $d$, a right
    prediction costs 0. At the tie $z = -\rho$ the paper's formula counts both terms; here
    the loss follows $h_\rho$, which rejects at $|f| = \rho$, so the tie costs $d$.

    >>> [zero_d_one_loss(z, 1.0, 0.25) for z in (2.0, 0.5, -1.0, -2.0)]
    [0.0, 0.25, 0.25, 1.0]
    """
    if isinstance(z, np.ndarray):
        out: FloatArray = np.less(z, -rho) + cost * np.less_equal(np.abs(z), rho)
        return out
    if z < -rho:
        return 1.0
    return float(cost) if abs(z) <= rho else 0.0


def _positive(a: Real) -> Real:
    if isinstance(a, np.ndarray):
        out: FloatArray = np.maximum(a, 0.0)
        return out
    return a if a > 0.0 else 0.0


@overload
def double_ramp_loss(z: float, rho: float, cost: float) -> float: ...
@overload
def double_ramp_loss(z: FloatArray, rho: Real, cost: Real) -> FloatArray: ...
def double_ramp_loss(z: Real, rho: Real, cost: Real) -> Real:
    r"""Double ramp loss of Manwani et al. (2015), as written in the paper:

    .. math::

        L_{dr}(z, \rho) = d\bigl([1 - z + \rho]_+ - [-1 - z + \rho]_+\bigr)
                       + (1 - d)\bigl([1 - z - \rho]_+ - [-1 - z - \rho]_+\bigr).

    Each bracket is a ramp of height 2, so $L_{dr}$ runs from $2$ (confidently wrong)
    through $2d$ (inside the reject band) to $0$ (confidently right).

    >>> [double_ramp_loss(z, 1.0, 0.25) for z in (3.0, 1.0, 0.0, -1.0, -3.0)]
    [0.0, 0.25, 0.5, 1.25, 2.0]
    """
    first = _positive(1.0 - z + rho) - _positive(-1.0 - z + rho)
    second = _positive(1.0 - z - rho) - _positive(-1.0 - z - rho)
    return cost * first + (1.0 - cost) * second


@overload
def double_ramp_query(f: float, rho: float) -> bool: ...
@overload
def double_ramp_query(f: FloatArray, rho: Real) -> npt.NDArray[np.bool_]: ...
def double_ramp_query(f: Real, rho: Real) -> bool | npt.NDArray[np.bool_]:
    r"""DRAL's query rule $Q = \mathbb{1}[\rho - 1 \le |f| \le \rho + 1]$: ask exactly when
    the margin can fall on a sloped part of $L_{dr}$ (whatever the label turns out to be).

    >>> double_ramp_query(0.0, 1.0), double_ramp_query(2.5, 1.0), double_ramp_query(-1.7, 1.0)
    (True, False, True)
    """
    if isinstance(f, np.ndarray):
        a = np.abs(f)
        out: npt.NDArray[np.bool_] = (a >= rho - 1.0) & (a <= rho + 1.0)
        return out
    return bool(rho - 1.0 <= abs(f) <= rho + 1.0)


DRAL_UTILITY_GAMMA = 2.0
r"""Slope of the smooth stand-in for DRAL's query band (:func:`double_ramp_query_utility`)."""


@overload
def double_ramp_query_utility(f: float, rho: float) -> float: ...
@overload
def double_ramp_query_utility(f: FloatArray, rho: Real) -> FloatArray: ...
def double_ramp_query_utility(f: Real, rho: Real) -> Real:
    r"""A smooth, randomisable version of DRAL's query band, for query budgets:
    $u = 4\,\sigma_2(|f| - \rho)\,(1 - \sigma_2(|f| - \rho))$ with slope $\gamma = 2$.

    DRAL asks iff $\rho - 1 \le |f| \le \rho + 1$ (probability 1 or 0), which a budget
    cannot scale down without losing the order of the events. This bump has its peak
    $u = 1$ at the centre of the band ($|f| = \rho$), stays $\ge 0.42$ inside it and
    falls below $0.071$ beyond distance 2, so scaling it keeps the events inside the ramps
    the most likely to be asked. It is DSAL's query probability with $\gamma = 2$.

    >>> double_ramp_query_utility(1.0, 1.0)
    1.0
    >>> [round(double_ramp_query_utility(f, 1.0), 3) for f in (0.0, 2.0, 3.0, 4.0)]
    [0.42, 0.42, 0.071, 0.01]
    """
    if isinstance(f, np.ndarray) or isinstance(rho, np.ndarray):
        return double_sigmoid_query_probability(
            np.asarray(f, dtype=np.float64), rho, DRAL_UTILITY_GAMMA
        )
    return double_sigmoid_query_probability(f, rho, DRAL_UTILITY_GAMMA)


@overload
def double_ramp_gradient(z: float, rho: float, cost: float) -> tuple[float, float]: ...
@overload
def double_ramp_gradient(z: FloatArray, rho: Real, cost: Real) -> tuple[FloatArray, FloatArray]: ...
def double_ramp_gradient(z: Real, rho: Real, cost: Real) -> tuple[Real, Real]:
    r"""Algorithm 1's branch rule as $(\partial L/\partial z, \partial L/\partial \rho)$:

    .. math::

        (\partial_z, \partial_\rho) =
        \begin{cases}
        (-d,\ d)            & \rho - 1 \le z \le \rho + 1 \quad\text{(first ramp)}\\
        (-(1-d),\ -(1-d))   & -\rho - 1 \le z \le -\rho + 1 \quad\text{(second ramp)}\\
        (0,\ 0)             & \text{otherwise.}
        \end{cases}

    With the update convention of this module this is exactly the paper's
    $w \mathrel{+}= \eta d y x,\ \rho \mathrel{-}= \eta d$ on the first ramp and
    $w \mathrel{+}= \eta (1-d) y x,\ \rho \mathrel{+}= \eta (1-d)$ on the second. When
    $\rho < 1$ the two ramps overlap; like Algorithm 1 (``if``/``else if``) the first wins.

    >>> double_ramp_gradient(1.5, 1.0, 0.25)
    (-0.25, 0.25)
    >>> double_ramp_gradient(-1.5, 1.0, 0.25)
    (-0.75, -0.75)
    >>> double_ramp_gradient(3.0, 1.0, 0.25)
    (0.0, 0.0)
    """
    if isinstance(z, np.ndarray):
        first = (z >= rho - 1.0) & (z <= rho + 1.0)
        second = (z >= -rho - 1.0) & (z <= 1.0 - rho) & ~first
        dz: FloatArray = -(first * cost + second * (1.0 - cost))
        drho: FloatArray = first * cost - second * (1.0 - cost)
        return dz, drho
    if rho - 1.0 <= z <= rho + 1.0:
        return -cost, float(cost)
    if -rho - 1.0 <= z <= 1.0 - rho:
        return cost - 1.0, cost - 1.0
    return 0.0, 0.0


@overload
def double_sigmoid_loss(
    z: float, rho: float, cost: float, gamma: float = 1.0, tail: float = 0.0
) -> float: ...
@overload
def double_sigmoid_loss(
    z: FloatArray, rho: Real, cost: Real, gamma: Real = 1.0, tail: Real = 0.0
) -> FloatArray: ...
def double_sigmoid_loss(
    z: Real, rho: Real, cost: Real, gamma: Real = 1.0, tail: Real = 0.0
) -> Real:
    r"""Double sigmoid loss $L_{ds}(z, \rho) = 2d\,\sigma(z - \rho) + 2(1-d)\,\sigma(z + \rho)$,
    plus ``tail`` $\lambda$ times a logistic loss on the margin:

    .. math::

        L(z, \rho) = L_{ds}(z, \rho) + \frac{\lambda}{\gamma}\,\log(1 + e^{-\gamma z}).

    $L_{ds}$ (the paper's, $\lambda = 0$) is a smooth surrogate of $L_d$: about $2$ when
    confidently wrong, $2d$ deep inside the reject band (for large $\gamma\rho$), $0$ when
    confidently right. It is flat where the model is confidently wrong, so a label there
    moves nothing; the logistic term (convex, free of $\rho$) keeps a slope of about
    $\lambda$ there, which is what lets a model follow a boundary that moves
    (``docs/results/learning.md``).

    >>> round(double_sigmoid_loss(0.0, 1.0, 0.25, 2.0), 4)
    0.6192
    >>> double_sigmoid_loss(1e6, 1.0, 0.25), double_sigmoid_loss(-1e6, 1.0, 0.25)
    (0.0, 2.0)
    >>> paper = double_sigmoid_loss(0.0, 1.0, 0.25)
    >>> round(double_sigmoid_loss(0.0, 1.0, 0.25, 1.0, tail=2.0) - paper, 4)  # 2 log 2
    1.3863
    """
    ds = 2.0 * cost * sigmoid(z - rho, gamma) + 2.0 * (1.0 - cost) * sigmoid(z + rho, gamma)
    if isinstance(tail, np.ndarray) or tail:
        b = gamma * z  # log(1 + e^-b), stable for any b
        if isinstance(b, np.ndarray):
            soft: Real = np.logaddexp(0.0, -b)
        else:
            soft = max(-b, 0.0) + math.log1p(math.exp(-abs(b)))
        return ds + tail / gamma * soft
    return ds


@overload
def double_sigmoid_gradient(
    z: float, rho: float, cost: float, gamma: float = 1.0, tail: float = 0.0
) -> tuple[float, float]: ...
@overload
def double_sigmoid_gradient(
    z: FloatArray, rho: Real, cost: Real, gamma: Real = 1.0, tail: Real = 0.0
) -> tuple[FloatArray, FloatArray]: ...
def double_sigmoid_gradient(
    z: Real, rho: Real, cost: Real, gamma: Real = 1.0, tail: Real = 0.0
) -> tuple[Real, Real]:
    r"""Exact gradient of $L_{ds}$ (plus ``tail`` $\lambda$ times the logistic term of
    :func:`double_sigmoid_loss`) with respect to the margin $z$ and to $\rho$.

    With $\sigma'(a) = -\gamma\,\sigma(a)(1 - \sigma(a))$ and
    $q_\mp = \sigma(z \mp \rho)\,(1 - \sigma(z \mp \rho))$:

    .. math::

        \frac{\partial L_{ds}}{\partial z} = -2\gamma\,\bigl(d\,q_- + (1-d)\,q_+\bigr),
        \qquad
        \frac{\partial L_{ds}}{\partial \rho} = 2\gamma\,\bigl(d\,q_- - (1-d)\,q_+\bigr).

    The step $-\eta\nabla$ therefore moves $w$ toward $y x$ and shrinks $\rho$ when
    $d\,q_- > (1-d)\,q_+$ (a confidently right example) and grows $\rho$ otherwise (a
    confidently wrong one). The paper's printed update equations carry the opposite sign;
    its explanation and this gradient agree. The logistic term adds
    $-\lambda\,\sigma(z)$ to $\partial L/\partial z$ (about $-\lambda$ when confidently
    wrong, where $L_{ds}$'s slope vanishes) and nothing to $\partial L/\partial \rho$.

    >>> dz, drho = double_sigmoid_gradient(0.0, 1.0, 0.25, 1.0)
    >>> round(dz, 6), round(drho, 6)
    (-0.393224, -0.196612)
    >>> round(double_sigmoid_gradient(-20.0, 1.0, 0.25, 1.0, tail=2.0)[0], 6)
    -2.0
    """
    if isinstance(z, np.ndarray) or isinstance(rho, np.ndarray) or isinstance(gamma, np.ndarray):
        q_minus = sigmoid_slope(z - rho, gamma)
        q_plus = sigmoid_slope(z + rho, gamma)
    else:  # the same formula as sigmoid_slope, inlined for the single-example hot path
        t = math.exp(-abs(gamma * (z - rho)))
        u = 1.0 + t
        q_minus = t / (u * u)
        t = math.exp(-abs(gamma * (z + rho)))
        u = 1.0 + t
        q_plus = t / (u * u)
    scale = 2.0 * gamma
    dz = -scale * (cost * q_minus + (1.0 - cost) * q_plus)
    drho = scale * (cost * q_minus - (1.0 - cost) * q_plus)
    if isinstance(tail, np.ndarray) or tail:
        dz = dz - tail * sigmoid(z, gamma)
    return dz, drho


@overload
def double_sigmoid_query_probability(f: float, rho: float, gamma: float = 1.0) -> float: ...
@overload
def double_sigmoid_query_probability(f: FloatArray, rho: Real, gamma: Real = 1.0) -> FloatArray: ...
def double_sigmoid_query_probability(f: Real, rho: Real, gamma: Real = 1.0) -> Real:
    r"""DSAL's query probability $p = 4\,\sigma(|f| - \rho)\,(1 - \sigma(|f| - \rho))$.

    $p \in [0, 1]$, with $p = 1$ exactly on the two transitions $|f| = \rho$ and $p \to 0$
    far from them (confidently right, confidently wrong or deep in the reject band).

    >>> double_sigmoid_query_probability(1.0, 1.0), double_sigmoid_query_probability(-1.0, 1.0)
    (1.0, 1.0)
    >>> round(double_sigmoid_query_probability(0.0, 1.0, 2.0), 4)
    0.42
    """
    if isinstance(f, np.ndarray) or isinstance(rho, np.ndarray) or isinstance(gamma, np.ndarray):
        # same formula as the scalar path, evaluated in place on one temporary
        t = np.abs(np.asarray(f, dtype=np.float64)) - rho
        t *= gamma
        np.abs(t, out=t)
        np.negative(t, out=t)
        np.exp(t, out=t)  # t = exp(-|gamma (|f| - rho)|)
        u = t + 1.0
        np.multiply(u, u, out=u)
        np.divide(t, u, out=t)
        t *= 4.0
        np.minimum(t, 1.0, out=t)  # rounding can exceed 1 by an ulp next to |f| = rho
        return t
    t_ = math.exp(-abs(float(gamma) * (abs(float(f)) - float(rho))))  # sigmoid_slope inlined
    u_ = 1.0 + t_
    return min(4.0 * (t_ / (u_ * u_)), 1.0)
