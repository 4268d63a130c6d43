r"""The normalized update of the linear learners (``update_rule="normalized"``):
importance-weight aware, with per-coordinate adaptive rates, invariant to the scale of the
loss, and $\rho$ moving in the units of the score.

For a label $y$ of $x$ with importance weight $h$, at margin $z = y\,w \cdot x$, the loss
gives $g = \partial L/\partial z$ and $g_\rho = \partial L/\partial\rho$ (the rules of
:mod:`service.learning.rules`). The learner keeps AdaGrad's sums

.. math::

    G_i = G_0 + \sum h\, g^2 x_i^2

(including this label; $G_0 = 4 g_1^2$, four times the first label's squared gradient, so
the first labels do not take AdaGrad's sign-sized steps). Coordinate $i$ moves at AdaGrad's
rate $P_i = G_i^{-1/2}$ relative to its mean over the example,
$p_i = P_i\, \|x\|^2 / \sum_j P_j x_j^2$, and the length of the step is the schedule's
$\eta_t$ in the units of the score (the mean of $p_i$ weighted by $x_i^2$ is 1, so the score
of the example moves as far as the paper's step moves it): the label moves the parameters
along

.. math::

    \frac{d w_i}{d\tau} = -\,\eta_t\, p_i\, g(z, \rho)\, y\, x_i, \qquad
    \frac{d\rho}{d\tau} = -\,\eta_t\, g_\rho(z, \rho), \qquad
    \frac{dz}{d\tau} = -\,\eta_t\, \|x\|^2\, g(z, \rho),

for $\tau$ from 0 to $h$, with $g$ and $g_\rho$ evaluated where the label has brought $z$ and
$\rho$ so far (the importance-weight-aware update of Karampatziakis & Langford, 2011, solved
numerically in sub-steps that each move $z$ and $\rho$ by at most a quarter of the loss's
width): a weight of $h$ acts as $h$ labels of weight 1 taken one after the other, so a heavy
label stops where its loss flattens instead of overshooting, at the cost of a few scalar
sub-steps (not $h$ passes over $x$). Multiplying the loss by a constant changes neither the
rates $p_i$ nor the direction. $\rho$ moves in the units of the score, as the intercept does
(its input is 1). The direction $p_i x_i$ is fixed for the label, so the flow is a walk of
$(z, \rho)$ in two dimensions; the weights follow in one step.

The features are not rescaled here: a served model's inputs are standardised by every event
first (:func:`~service.learning.preprocessing.serving_pipeline`), which makes the served stack
invariant to the scale of each feature; normalising by the labelled rows inside the learner
as well was measured worse at a few labels (``docs/results/learning.md``).

The step bounds of :mod:`service.learning.linear.learner` apply as in the paper's update:
$\rho$'s rate is $\min(\eta_t, \bar\eta_\rho)$ and the last coordinate's
$\max(\eta_t, \underline\eta_b)\, p_n$.

>>> import numpy as np
>>> state = Normalizer.empty(2)
>>> gradient = lambda z, rho: (-0.5, 0.1) if z < 1.0 else (0.0, 0.0)
>>> w, rho, moved = normalized_step(np.zeros(2), 1.0, np.array([1.0, 1.0]), 1.0, 1.0,
...                                 state, gradient, eta=1.0)
>>> moved, round(float(np.array([1.0, 1.0]) @ w), 6), round(rho, 6)  # z stops where g ends
(True, 1.0, 0.9)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from .. import state as st
from ..errors import StateError
from ..losses import FloatArray
from ..sparse import SparseRow

__all__ = ["MAX_SUBSTEPS", "Normalizer", "RowStep", "normalized_step", "normalizer_ok", "row_step"]

#: the most sub-steps one label is integrated in (the flow stops moving long before)
MAX_SUBSTEPS: Final = 256
_REACH: Final = 0.25  # the most z or rho move in one sub-step, in units of the loss's width
_PRIOR: Final = 4.0  # G_0 in squared gradients of the first label


@dataclass(slots=True)
class Normalizer:
    """What the normalized update has gathered: AdaGrad's sums of squared gradients per
    coordinate (``grads``; zero before the first label).

    Every sum starts at the same prior (the first label's), and a label adds only where its
    row is not zero, so in a wide sparse model most sums still hold the prior exactly. A
    record of at least :data:`~service.learning.state.SHARED_FROM` sums then writes the
    least of them (``fill``) and the sums that differ from it (``grads_at``, ``grads_to``),
    bit for bit, when at most half differ; else the list whole (``grads``).

    >>> sums = Normalizer(np.full(300, 4.0)); sums.grads[[3, 7]] = 5.0, 6.5
    >>> record = sums.to_state()
    >>> record["fill"], record["grads_at"], record["grads_to"]
    (4.0, [3, 7], [5.0, 6.5])
    >>> np.array_equal(Normalizer.from_state(record, 300).grads, sums.grads)
    True
    """

    grads: FloatArray

    @classmethod
    def empty(cls, n: int) -> Normalizer:
        return cls(np.zeros(n))

    def to_state(self, listed: st.Listed | None = None) -> dict[str, Any]:
        """The record of the sums (``listed``: the learner's lists of its last state)."""
        grads = self.grads
        if grads.size >= st.SHARED_FROM:
            fill = float(grads.min())
            bits = grads.view(np.uint64)
            at = np.flatnonzero(bits != np.float64(fill).view(np.uint64))  # bit for bit
            if 2 * at.size <= grads.size:
                return {
                    "fill": fill,
                    "grads_at": st.IndexList(at),
                    "grads_to": st.float_list(grads[at]),
                }
        return {"grads": st.float_list(grads) if listed is None else listed("grads", grads)}

    @staticmethod
    def sums_of(record: Any, n: int) -> FloatArray | None:
        """The sums a :meth:`to_state` record of ``n`` holds, either form, as an array
        (None: not such a record)."""
        try:
            return Normalizer.from_state(record, n).grads if isinstance(record, Mapping) else None
        except StateError:
            return None

    @classmethod
    def from_state(cls, record: Any, n: int) -> Normalizer:
        """Read a :meth:`to_state` record (an absent one: nothing gathered yet)."""
        if record is None:
            return cls.empty(n)
        if not isinstance(record, Mapping):
            raise StateError("state field 'normalizer' must be an object; rebuild the model")
        if "fill" in record:
            if "grads" in record:
                raise StateError("state field 'normalizer' holds its sums twice; rebuild the model")
            fill = st.read_float(record, "fill", minimum=0.0)
            out = cls(
                st.changed(record, "grads", np.full(n, fill), n, "the normaliser", copy=False)
            )
        else:
            out = cls(st.read_floats(record, "grads", (n,)))
        if (out.grads < 0.0).any():
            raise StateError("state field 'normalizer' holds negative sums; rebuild the model")
        return out


Gradient = Callable[[float, float], tuple[float, float]]


def normalized_step(
    w: FloatArray,
    rho: float,
    x: FloatArray,
    y: float,
    h: float,
    state: Normalizer,
    gradient: Gradient,
    *,
    eta: float,
    width: float = 1.0,
    rho_eta: float | None = None,
    last_eta: float | None = None,
) -> tuple[FloatArray, float, bool]:
    """One label of the normalized update (module docstring): the new ``(w, rho)`` and
    whether they moved. ``state`` is updated in place (the caller keeps a copy if it may
    refuse the step); ``w`` is not written. ``width`` is the loss's width ($1/\\gamma$),
    ``rho_eta`` and ``last_eta`` the rates of $\\rho$ and of the last coordinate (default
    ``eta``)."""
    f = float(w.dot(x))
    z = y * f
    g, g_rho = gradient(z, rho)
    if g == 0.0 and g_rho == 0.0:
        return w, rho, False
    if g != 0.0 and not state.grads.any():  # the first label that moves w sets the prior
        state.grads = np.full(x.shape, _PRIOR * g * g)
    state.grads, direction, speed = _direction(x, state.grads, h * g * g, eta, last_eta)
    b = eta if rho_eta is None else rho_eta
    pushed, rho_new = _flow(z, rho, h, speed, b, gradient, width)
    w_new = w + (y * pushed) * direction
    return w_new, rho_new, bool(pushed != 0.0 or rho_new != rho)


@dataclass(slots=True, frozen=True)
class RowStep:
    """What :func:`row_step` gives: the new weights and sums of the row's entries (``w``
    None: the score is not finite), the new ``rho``, whether they moved, and the sums of
    every coordinate when this label set their prior (else None)."""

    w: FloatArray | None
    grads: FloatArray | None
    rho: float
    moved: bool
    prior: FloatArray | None = None


def row_step(
    w: FloatArray,
    rho: float,
    row: SparseRow,
    y: float,
    h: float,
    state: Normalizer,
    gradient: Gradient,
    *,
    eta: float,
    width: float = 1.0,
    rho_eta: float | None = None,
    last_eta: float | None = None,
) -> RowStep:
    """:func:`normalized_step` of the entries of ``row`` (a coordinate where the row is
    zero keeps its weight and its sum; the sums over the row run over its entries):
    nothing is written, the caller writes what it gives at ``row.indices``. The last
    coordinate's rate is ``last_eta`` where the row sets it."""
    idx, x = row.indices, row.values
    wi = w[idx]
    f = float(wi.dot(x))
    if not math.isfinite(f):
        return RowStep(None, None, rho, False)
    z = y * f
    g, g_rho = gradient(z, rho)
    sums = state.grads[idx]
    if g == 0.0 and g_rho == 0.0:
        return RowStep(wi, sums, rho, False)
    prior = None
    if g != 0.0 and not sums.any() and not state.grads.any():  # the first label that moves w
        prior = np.full(state.grads.shape, _PRIOR * g * g)
        sums = prior[idx]
    last = idx.size > 0 and int(idx[-1]) == w.shape[0] - 1  # the row sets the last input
    sums, direction, speed = _direction(x, sums, h * g * g, eta, last_eta if last else None)
    b = eta if rho_eta is None else rho_eta
    pushed, rho_new = _flow(z, rho, h, speed, b, gradient, width)
    return RowStep(
        wi + (y * pushed) * direction, sums, rho_new, bool(pushed != 0.0 or rho_new != rho), prior
    )


def _direction(
    x: FloatArray, sums: FloatArray, added: float, eta: float, last_eta: float | None
) -> tuple[FloatArray, FloatArray, float]:
    """The sums with ``added`` times each squared input, the direction the label moves
    the weights along and the speed it moves the score at (dz/dtau per unit of -g); the
    last input at ``last_eta`` (None: at ``eta``)."""
    x2 = x * x
    sums = sums + added * x2
    norm = float(x2.sum())
    positive = sums > 0.0
    precond = np.divide(1.0, np.sqrt(sums), out=np.zeros_like(x), where=positive)
    mean = float(precond.dot(x2))
    if norm == 0.0 or mean == 0.0:
        return sums, np.zeros_like(x), 0.0
    rates = precond * (eta * norm / mean)
    if last_eta is not None and last_eta != eta:
        rates[-1] *= last_eta / eta
    return sums, rates * x, float(rates.dot(x2))


def _flow(
    z: float, rho: float, h: float, a: float, b: float, gradient: Gradient, width: float
) -> tuple[float, float]:
    """Integrate ``dz = -a g``, ``drho = -b g_rho`` over ``[0, h]`` in sub-steps that move
    either by at most a quarter of ``width``; return (the integral of ``-g``, the new
    ``rho``). ``rho`` stays >= 0."""
    left, pushed = h, 0.0
    reach = _REACH * width
    g, g_rho = gradient(z, rho)
    for _ in range(MAX_SUBSTEPS):
        speed = max(a * abs(g), b * abs(g_rho))
        if speed == 0.0:
            break
        dt = min(left, reach / speed)
        ahead = gradient(z - a * g * dt, max(0.0, rho - b * g_rho * dt))
        if ahead == (0.0, 0.0):  # the sub-step ends where the loss is flat: stop at its edge
            dt = left = _flat_edge(z, rho, a * g, b * g_rho, dt, gradient)
        z -= a * g * dt
        pushed -= g * dt
        rho = max(0.0, rho - b * g_rho * dt)
        left -= dt
        if left <= 0.0:
            break
        g, g_rho = ahead  # the gradient where the sub-step ended
    return pushed, rho


def _flat_edge(
    z: float, rho: float, dz: float, drho: float, dt: float, gradient: Gradient
) -> float:
    """The time within ``[0, dt]`` at which a sub-step enters a region where the loss is
    flat (the double ramp beyond its ramps), found by bisection."""
    low, high = 0.0, dt
    for _ in range(40):
        mid = 0.5 * (low + high)
        if gradient(z - dz * mid, max(0.0, rho - drho * mid)) == (0.0, 0.0):
            high = mid
        else:
            low = mid
    return high


def normalizer_ok(state: Normalizer) -> bool:
    """Whether every sum is finite (a refused step leaves the learner as it was)."""
    return bool(np.isfinite(state.grads).all())
