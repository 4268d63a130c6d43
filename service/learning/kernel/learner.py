r"""Kernel versions of DRAL, DSAL and DSOL (the paper's appendix), with a bounded support set.

The score is $f(x) = \sum_{s} a_s K(x_s, x)$ over stored support examples. A label on
$x_t$ with margin $z = y f(x_t)$ adds the support example $x_t$ with coefficient

.. math::

    a_t = -\eta\, \frac{\partial L}{\partial z}\, y
    \qquad\bigl(\text{DRAL: } \eta d y \text{ or } \eta (1-d) y;\quad
    \text{DSAL/DSOL: } 2\eta\gamma\,(d\,q_- + (1-d)\,q_+)\, y\bigr)

and moves $\rho \leftarrow \max(0, \rho - \eta\, \partial L / \partial \rho)$, exactly as
the linear learners (with a linear kernel they coincide, up to rounding). A label that
moves nothing (DRAL outside both ramps) adds no support example.

Budget and removal rule: at most ``budget`` support examples are kept. When a new one
arrives and the set is full, the **oldest** is dropped (a ring buffer, as in the
Forgetron/"forget the oldest" budget perceptrons). Why oldest rather than the smallest
$|a_s|$: with a decaying step size the newest coefficients are the smallest, so
"smallest $|a_s|$" would throw away exactly what was just learned and freeze the model;
dropping the oldest keeps memory and the per-event cost ($O(\text{budget} \cdot d)$)
bounded, always admits new information and lets the model follow a drifting stream.
``budget=None`` keeps every support example (the appendix algorithm; unbounded growth).

Defaults that learn on non-linear data without tuning:

* kernel: :class:`~service.learning.kernel.kernels.ScaledRBFKernel`, an RBF kernel of width
  $\gamma_k = 1 / \sum_j \widehat{\operatorname{Var}}(x_j)$, the variances running over the
  examples learnt from (a typical pair of examples has $K \approx e^{-2}$ at any scale of
  the features; for standardised features this is the former fixed default $1/n$);
* ``rho_cap`` (default 2): after each update
  $\rho \leftarrow \min(\rho,\ 1 + c\,\bar m)$, with $\bar m$ the running mean of $|f|$ over
  the last ~100 labelled examples. The paper's step, then a projection onto
  $[0, 1 + c\,\bar m]$ instead of $[0, \infty)$. Without it, while $f$ is still near 0
  every example sits in the reject band and the gradient keeps growing $\rho$; the
  gradients (and DSAL's query probability) shrink like $e^{-\rho}$ long before $f$ can
  catch up, and the model ends up rejecting everything and asking almost nothing.
  With the cap, $\rho$ stays near 1 until $|f|$ grows, then follows it; a model that should
  reject everything still can ($\rho$ may exceed the typical $|f|$ by $1 + (c - 1)\bar m$).
  ``rho_cap=None`` is the appendix algorithm.

Default step: the linear learners' rule with $\|x\|^2$ replaced by $K(x, x)$, held
constant (:func:`~service.learning.kernel.defaults.default_kernel_ds_eta`,
:func:`~service.learning.kernel.defaults.default_kernel_dral_eta`). A constant
step because of the budget: under a decaying step the oldest support examples carry the
largest coefficients, and "drop the oldest" removes exactly those.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from .. import state as st
from ..base import (
    Decision,
    check_int,
    check_label,
    check_param,
    check_seed,
    draw_queries,
    draw_query,
    features,
    features_matrix,
    quiet,
    raise_non_finite,
)
from ..errors import NonFiniteError, StateError
from ..losses import FloatArray, reject_decision
from ..preprocessing import OnlineStandardizer
from ..schedules import Schedule, as_schedule
from .kernels import Kernel, ScaledRBFKernel, kernel_from_config

__all__ = ["DEFAULT_BUDGET", "DEFAULT_RHO_CAP", "KernelLearner"]

DEFAULT_BUDGET = 1000
"""Default maximum number of support examples (1000 x 68 features: ~0.5 MB, tens of us)."""


DEFAULT_RHO_CAP = 2.0
r"""Default ``rho_cap`` $c$ of the kernel learners: $\rho \le 1 + c\,\bar m$."""

_SCORE_WINDOW = 100  # labelled examples in the running mean of |f| (the rho cap)
_CHUNK = 1024
_K = TypeVar("_K", bound="KernelLearner")


def _sq_norms(rows: FloatArray) -> FloatArray:
    """Squared norm of each row by ``dot`` (as for a single example, so bits agree)."""
    return np.array([float(r.dot(r)) for r in rows])


class KernelLearner:
    """Base class of the kernel learners (see the module docstring for the math and budget)."""

    algorithm: ClassVar[str] = ""
    param_names: ClassVar[tuple[str, ...]] = (
        "n_features",
        "cost",
        "kernel",
        "budget",
        "eta",
        "rho_cap",
        "seed",
    )
    __slots__ = (
        "budget",
        "cost",
        "eta",
        "kernel",
        "n_features",
        "rho_cap",
        "seed",
        "_a",
        "_abs_score",
        "_head",
        "_n",
        "_rho",
        "_rng",
        "_S",
        "_sq",
        "_steps",
        "_variance",
        "_width",
    )

    n_features: int
    cost: float
    kernel: Kernel
    budget: int | None
    eta: Schedule
    rho_cap: float | None
    seed: int | None

    def __init__(
        self,
        n_features: int,
        cost: float,
        *,
        eta: float | Schedule | Mapping[str, Any] | None = None,
        kernel: Kernel | Mapping[str, Any] | str | None = None,
        budget: int | None = DEFAULT_BUDGET,
        rho: float = 1.0,
        rho_cap: float | None = DEFAULT_RHO_CAP,
        seed: int | None = 0,
    ) -> None:
        self.n_features = check_int("n_features", n_features, 1)
        self.cost = check_param("cost", cost)
        self.kernel = ScaledRBFKernel() if kernel is None else kernel_from_config(kernel)
        self.eta = self._default_eta() if eta is None else as_schedule(eta)
        self.budget = None if budget is None else check_int("budget", budget, 1)
        self.rho_cap = None if rho_cap is None else check_param("rho_cap", rho_cap)
        self.seed = check_seed(seed)
        scaled = isinstance(self.kernel, ScaledRBFKernel)
        self._width = OnlineStandardizer(self.n_features) if scaled else None
        self._variance = float(self.n_features)
        self._abs_score = 0.0
        self._rho = check_param("rho", rho)
        capacity = self.budget if self.budget is not None else 64
        self._S: FloatArray = np.zeros((capacity, self.n_features))
        self._a: FloatArray = np.zeros(capacity)
        self._sq: FloatArray = np.zeros(capacity)
        self._n = 0
        self._head = 0
        self._steps = 0
        self._rng = np.random.default_rng(self.seed)

    # -- parameters --------------------------------------------------------------------
    @property
    def rho(self) -> float:
        """Current rejection width (always ``>= 0``)."""
        return self._rho

    @property
    def steps(self) -> int:
        """Number of labels absorbed by :meth:`update`."""
        return self._steps

    @property
    def n_support(self) -> int:
        """Number of stored support examples (``<= budget``)."""
        return self._n

    @property
    def support(self) -> tuple[FloatArray, FloatArray]:
        """``(examples, coefficients)`` from oldest to newest (copies)."""
        order = self._age_order()
        return self._S[order].copy(), self._a[order].copy()

    @property
    def kernel_width(self) -> float | None:
        r"""$\gamma_k$ in use with a :class:`~service.learning.kernel.kernels.ScaledRBFKernel`
        (``None`` for the other kernels, whose width is fixed)."""
        if isinstance(self.kernel, ScaledRBFKernel):
            return self.kernel.gamma_at(self._variance)
        return None

    def _age_order(self) -> npt.NDArray[np.intp]:
        return (np.arange(self._n) + self._head) % max(self._n, 1)

    # -- algorithm hooks (from the rule mixins and subclasses) --------------------------
    def _default_eta(self) -> Schedule:  # pragma: no cover - abstract
        raise NotImplementedError

    def _query_probability(self, f: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _gradient(self, z: Any, rho: float) -> tuple[Any, Any]:  # pragma: no cover
        raise NotImplementedError

    # -- scoring -----------------------------------------------------------------------
    def _kernel_values(
        self, S: FloatArray, x: FloatArray, s_sq: FloatArray, x_sq: float | FloatArray
    ) -> FloatArray:
        if isinstance(self.kernel, ScaledRBFKernel):
            return self.kernel.values_at(self._variance, S, x, s_sq, x_sq)
        return self.kernel.values(S, x, s_sq, x_sq)

    def _checked(self, x: Any) -> FloatArray:
        arr = features(x, self.n_features)
        if not np.isfinite(arr).all():
            raise_non_finite(arr)
        return arr

    def _score(self, x: FloatArray) -> float:
        n = self._n
        if n == 0:
            return 0.0
        x_sq = float(x.dot(x))
        k = self._kernel_values(self._S[:n], x, self._sq[:n], x_sq)
        f = float(self._a[:n] @ k)
        if not math.isfinite(f):
            raise NonFiniteError("the kernel score overflowed; rescale the features")
        return f

    @quiet
    def decide(self, x: Any, coin: float | None = None) -> Decision:
        """Label ``x`` and say whether to query it (same contract as the linear learners)."""
        x = self._checked(x)
        f = self._score(x)
        p = self._query_probability(f)
        query = draw_query(p, coin, self._rng)
        return Decision(reject_decision(f, self._rho), f, self._rho, query, p)

    @quiet
    def decide_many(
        self, X: Any, coins: Any = None
    ) -> tuple[npt.NDArray[np.int8], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """Decide the rows of ``X``; same returns and coin rule as the linear learners."""
        X = features_matrix(X, self.n_features)
        if not np.isfinite(X).all():
            raise_non_finite(X, "X")
        m, n = X.shape[0], self._n
        scores = np.zeros(m)
        if n:
            S, a, sq = self._S[:n], self._a[:n], self._sq[:n]
            for lo in range(0, m, _CHUNK):
                block = X[lo : lo + _CHUNK]
                block_sq = np.einsum("ij,ij->i", block, block)
                kmat = self._kernel_values(S, block.T, sq, block_sq)
                scores[lo : lo + _CHUNK] = a @ kmat
            if not np.isfinite(scores).all():
                raise NonFiniteError("the kernel score overflowed; rescale the features")
        labels = reject_decision(scores, self._rho)
        probs = self._query_probability(scores)
        if not isinstance(probs, np.ndarray):
            probs = np.full(m, probs)
        queries = draw_queries(probs, coins, self._rng)
        return labels, scores, probs, queries

    # -- learning ----------------------------------------------------------------------
    @quiet
    def update(self, x: Any, y: Any) -> bool:
        """Absorb the label ``y`` of ``x``; return whether the model moved.

        Bad input, or a step that would be non-finite, raises an
        :class:`~service.learning.errors.InputError` and changes nothing.
        """
        x = self._checked(x)
        yv = check_label(y)
        f = self._score(x)
        rho = self._rho
        dz, drho = self._gradient(yv * f, rho)
        steps = self._steps
        abs_score = self._abs_score + (abs(f) - self._abs_score) / min(steps + 1, _SCORE_WINDOW)
        eta = self.eta(steps)
        coef = -(eta * dz * yv)
        rho_new = max(rho - eta * drho, 0.0)
        if self.rho_cap is not None:
            rho_new = min(rho_new, 1.0 + self.rho_cap * abs_score)
        if not (math.isfinite(coef) and math.isfinite(rho_new)):
            raise NonFiniteError(f"update refused: non-finite step (step {steps}, eta {eta})")
        if coef != 0.0:
            self._add(x, coef)
        moved = bool(coef != 0.0 or rho_new != rho)
        self._rho = rho_new
        self._steps = steps + 1
        self._abs_score = abs_score
        self._learn_width(x)
        return moved

    def _learn_width(self, x: FloatArray) -> None:
        """Running variances of the labelled examples -> the scaled RBF width."""
        if self._width is None:
            return
        self._width.learn(x)
        self._refresh_width()

    def _refresh_width(self) -> None:
        """$V$ = the sum of the variances; while it is 0 (one example, or all equal) the
        squared norm of their mean, which scales like $V$; else ``n_features``."""
        width = self._width
        if width is None or not width.count:
            self._variance = float(self.n_features)
            return
        mean = width.mean
        for candidate in (float((width.std**2).sum()), float(mean.dot(mean))):
            if candidate > 0.0:
                self._variance = candidate
                return
        self._variance = float(self.n_features)

    def _add(self, x: FloatArray, coef: float) -> None:
        n = self._n
        if self.budget is None or n < self.budget:
            if n == self._S.shape[0]:
                self._grow(2 * n)
            pos = n
            self._n = n + 1
        else:
            pos = self._head
            self._head = (pos + 1) % self.budget
        self._S[pos] = x
        self._a[pos] = coef
        self._sq[pos] = float(x.dot(x))

    def _grow(self, capacity: int) -> None:
        n = self._n
        S = np.zeros((capacity, self.n_features))
        S[:n] = self._S[:n]
        a = np.zeros(capacity)
        a[:n] = self._a[:n]
        sq = np.zeros(capacity)
        sq[:n] = self._sq[:n]
        self._S, self._a, self._sq = S, a, sq

    @quiet
    def weight_norm(self) -> float:
        r"""RKHS norm $\sqrt{a^\top K a}$ of $f$ ($O(n^2 d)$; for metrics, not the hot path)."""
        n = self._n
        if n == 0:
            return 0.0
        S, a = self._S[:n], self._a[:n]
        gram = self._kernel_values(S, S.T, self._sq[:n], self._sq[:n])
        return math.sqrt(max(float(a @ gram @ a), 0.0))

    # -- state -------------------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """Hyperparameters as JSON-safe values (the constructor's keywords; a ``tail`` of 0,
        the paper's loss, is left out, so the record is what it was before it existed)."""
        params: dict[str, Any] = {}
        for name in self.param_names:
            value = getattr(self, name)
            if name == "tail" and value == 0.0:
                continue
            if name in ("eta", "kernel"):
                value = value.to_config()
            params[name] = value
        return params

    @classmethod
    def _from_params(cls: type[_K], **params: Any) -> _K:
        """Rebuild from stored hyperparameters; a state written before ``rho_cap`` existed
        was learnt without a cap and keeps learning without one."""
        params.setdefault("rho_cap", None)
        return cls(**params)

    def to_state(self) -> dict[str, Any]:
        """Versioned JSON-safe record; support examples are stored as lists, in buffer order."""
        n = self._n
        learned = {
            "support": st.float_list(self._S[:n]),
            "coef": st.float_list(self._a[:n]),
            "head": self._head,
            "rho": self._rho,
            "steps": self._steps,
            "abs_score": self._abs_score,
            "width": None if self._width is None else self._width.to_state(),
            "rng": st.rng_state(self._rng),
        }
        return st.learner_record(self.algorithm, self.get_params(), learned)

    @classmethod
    def from_state(cls: type[_K], state: Any) -> _K:
        """Rebuild a learner from :meth:`to_state` output (same decisions, same updates)."""
        learner, learned = st.open_learner_record(
            state, cls.algorithm, cls.param_names, cls._from_params
        )
        coef = learned.get("coef")
        n = len(coef) if isinstance(coef, list) else -1
        if n < 0 or (learner.budget is not None and n > learner.budget):
            raise StateError("state field 'coef' must be a list no longer than the budget")
        a = st.read_floats(learned, "coef", (n,))
        S = st.read_floats(learned, "support", (n, learner.n_features)) if n else None
        head = st.read_int(learned, "head")
        if head >= max(n, 1):
            raise StateError(f"state field 'head' ({head}) must index a support example")
        if learner.budget is None and n > learner._S.shape[0]:
            learner._grow(n)
        if S is not None:
            learner._S[:n] = S
            learner._a[:n] = a
            learner._sq[:n] = _sq_norms(learner._S[:n])
        learner._n = n
        learner._head = head
        learner._rho = st.read_float(learned, "rho", minimum=0.0)
        learner._steps = st.read_int(learned, "steps")
        learner._abs_score = st.read_optional_float(learned, "abs_score", minimum=0.0) or 0.0
        width = learned.get("width")
        if learner._width is not None and width is not None:
            learner._width = OnlineStandardizer.from_state(width)
            if learner._width.n_features_in != learner.n_features:
                raise StateError("state field 'width' does not match n_features")
            learner._refresh_width()
        learner._rng = st.rng_from_state(learned.get("rng"))
        return learner

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return (
            f"{type(self).__name__}({params}, rho={self._rho!r}, steps={self._steps}, "
            f"n_support={self._n})"
        )
