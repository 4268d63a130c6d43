r"""Many independent linear learners in lockstep: the engine of the paper-protocol replay.

:class:`BatchStandardizer` does the same for the online standardisation of the features
(one standardiser per replay run).

Row $b$ of a :class:`BatchLearner` is one learner (DRAL, DSAL or DSOL, each row with its
own cost $d_b$, $\gamma_b$ and step size) with weights ``W[b]``, width ``rho[b]`` and
label count ``steps[b]``. :meth:`BatchLearner.step` takes one example per row and does
for every row exactly what the single learner does with ``decide(x, coin=u)`` followed,
when queried, by ``update(x, y)``: same formulas (the functions of
:mod:`service.learning.losses`), same order of floating-point operations. Only the score
$w \cdot x$ is summed in a different order (``einsum`` instead of ``dot``), so rows agree
with the single learners to rounding (about $10^{-15}$ relative), not bit for bit.
A row's step size is exactly the single learner's: without ``eta`` each row takes its
algorithm's default for ``n_features`` (and the row's $\gamma$), the same schedule
:class:`~service.learning.linear.dral.DRAL` / :class:`~service.learning.linear.dsal.DSAL` build.

The algorithms it batches are the registry's linear learners whose rule it computes
(:data:`BATCHED`: :mod:`service.learning.rules`' double ramp, double sigmoid and full-label
rules); a linear learner with another rule is refused by name.

Rows may be held to a query budget (``budgets``: one fresh per-event
:class:`~service.learning.budget.query.QueryBudget` or ``None`` per row): such a row asks as
:class:`~service.learning.budget.budgeted.Budgeted` around the single learner does, with the
budget's probability for the row's ``query_utility`` (through
:class:`~service.learning.budget.query.BudgetRows`).

Buffers are preallocated; a step on ``B = 900`` rows of 68 features is a few dozen numpy
calls on arrays of length ``B`` plus two passes over ``B x d``.

>>> import numpy as np
>>> batch = BatchLearner(["dral", "dsal", "dsol"], n_features=2, cost=[0.1, 0.25, 0.4], eta=1.0)
>>> X = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
>>> labels, scores, probs, queried = batch.step(X, np.array([1.0, 1.0, 1.0]),
...                                             np.array([0.5, 0.5, 0.5]))
>>> labels.tolist(), queried.tolist(), batch.steps.tolist()
([0, 0, 0], [True, True, True], [1, 1, 1])
>>> [round(v, 4) for v in batch.W[:, 0].tolist()]   # DRAL: eta d y x; DS*: 2 eta gamma q
[0.1, 0.3932, 0.3932]
>>> BatchLearner(["dral", "dsal"], n_features=5, cost=0.25).to_learners()[1].eta
InverseTime(eta0=0.8333333333333334, tau=1000.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .base import check_int, check_param, check_seed, quiet, raise_non_finite
from .budget.query import BudgetRows, QueryBudget
from .errors import DimensionError, HyperparameterError, InputError, LabelError, NonFiniteError
from .linear.learner import LinearLearner
from .losses import (
    FloatArray,
    double_ramp_gradient,
    double_ramp_query,
    double_ramp_query_utility,
    double_sigmoid_gradient,
    double_sigmoid_query_probability,
    reject_decision,
)
from .preprocessing import check_min_std
from .registry import ALGORITHMS
from .rules import DoubleRampRule, DoubleSigmoidRule, FullLabelRule
from .schedules import (
    DEFAULT_GAMMA,
    Constant,
    DSALTheory,
    InverseTime,
    Schedule,
    as_schedule,
    default_dral_eta,
    default_ds_eta,
)

__all__ = ["BATCHED", "BatchLearner", "BatchStandardizer"]

#: the rules the batch computes (a learner class's rule is the mixin it is built on)
_RAMP, _SIGMOID, _FULL = "ramp", "sigmoid", "full"


def _rule(cls: type[Any]) -> str | None:
    if issubclass(cls, FullLabelRule):  # before its base, the double sigmoid rule
        return _FULL
    if issubclass(cls, DoubleSigmoidRule):
        return _SIGMOID
    if issubclass(cls, DoubleRampRule):
        return _RAMP
    return None


_CLASSES: dict[str, type[LinearLearner]] = {
    name: cls
    for name, cls in ALGORITHMS.items()
    if issubclass(cls, LinearLearner) and _rule(cls) is not None
}
#: algorithm name -> the rule its rows follow, for every algorithm the batch takes
BATCHED: dict[str, str] = {name: str(_rule(cls)) for name, cls in _CLASSES.items()}


def _default_eta(algorithm: str, n_features: int, gamma: float) -> Schedule:
    """The step a single ``algorithm`` learner takes when its ``eta`` is ``None``."""
    if BATCHED[algorithm] == _RAMP:
        return default_dral_eta(n_features)
    return default_ds_eta(n_features, gamma)


def _inverse_time_form(schedule: Schedule) -> tuple[float, float]:
    """Every built-in schedule as ``eta0 / (1 + t / tau)`` (``tau = inf``: constant).

    For a constant, ``eta / (1 + t / inf) = eta / 1.0 = eta`` exactly, so the batched
    step sizes equal the single learner's bit for bit.
    """
    if isinstance(schedule, InverseTime):
        return schedule.eta0, schedule.tau
    if isinstance(schedule, (Constant, DSALTheory)):
        return schedule.eta, math.inf
    raise HyperparameterError(f"unsupported schedule {schedule!r}")  # pragma: no cover


def _held_rows(
    budgets: Sequence[QueryBudget | None] | None,
) -> tuple[npt.NDArray[np.intp], BudgetRows | None]:
    """The rows held to a budget, and their budgets in lockstep (``None`` if there are none)."""
    chosen = [(i, q) for i, q in enumerate(budgets or ()) if q is not None]
    rows = np.array([i for i, _ in chosen], dtype=np.intp)
    return rows, BudgetRows([q for _, q in chosen]) if chosen else None


def _per_row(name: str, value: Any, n_rows: int) -> npt.NDArray[Any]:
    arr = np.asarray(value)
    if arr.ndim == 0:
        return np.full(n_rows, arr.item())
    if arr.shape != (n_rows,):
        raise HyperparameterError(f"{name} must be a scalar or have {n_rows} values")
    return arr


class BatchLearner:
    r"""``B`` independent linear reject-option learners updated in lockstep.

    Parameters
    ----------
    algorithm:
        ``"dral"``, ``"dsal"`` or ``"dsol"`` for every row, or one name per row.
    n_features:
        Features per example.
    cost, gamma, rho:
        A scalar for every row or one value per row ($d \in (0, 0.5)$, $\gamma > 0$,
        initial $\rho \ge 0$; ``gamma`` is ignored by DRAL rows).
    eta:
        One step size (number, schedule or config) for every row, or one per row.
        ``None`` (for every row, or as a row's entry) takes the single learner's default
        for that row: :func:`~service.learning.schedules.default_dral_eta` of ``n_features``
        for DRAL, :func:`~service.learning.schedules.default_ds_eta` of ``n_features`` and the
        row's ``gamma`` for DSAL/DSOL.
    W:
        Initial weights, shape ``(B, n_features)`` (default zeros).
    budgets:
        ``None``, or one entry per row: ``None`` (the row asks by its own rule) or a fresh
        per-event :class:`~service.learning.budget.query.QueryBudget` the row is held to.
    n_rows:
        ``B``, when no argument is given per row.
    seed:
        Seed of the generator that draws coins when :meth:`step` gets none.
    """

    __slots__ = (
        "_budget",
        "_budget_rows",
        "_codes",
        "_cost",
        "_eta0",
        "_full",
        "_gamma",
        "_groups",
        "_n",
        "_next",
        "_ramp",
        "_rho",
        "_rng",
        "_steps",
        "_tau",
        "_tmp",
        "_W",
        "algorithms",
        "n_features",
    )

    def __init__(
        self,
        algorithm: str | Sequence[str],
        n_features: int,
        cost: float | Sequence[float] | FloatArray,
        *,
        gamma: float | Sequence[float] | FloatArray = DEFAULT_GAMMA,
        eta: Any = None,
        rho: float | Sequence[float] | FloatArray = 1.0,
        W: Any = None,
        n_rows: int | None = None,
        seed: int | None = 0,
        budgets: Sequence[QueryBudget | None] | None = None,
    ) -> None:
        self.n_features = check_int("n_features", n_features, 1)
        sizes = {
            len(v)
            for v in (algorithm, cost, gamma, rho, eta)
            if isinstance(v, (Sequence, np.ndarray)) and not isinstance(v, str)
        }
        if W is not None:
            sizes.add(len(np.asarray(W)))
        if budgets is not None:
            sizes.add(len(budgets))
        if n_rows is not None:
            sizes.add(check_int("n_rows", n_rows, 1))
        if len(sizes) != 1:
            raise HyperparameterError(
                f"cannot tell the number of rows B (candidates {sorted(sizes)}); pass n_rows "
                "or give per-row arguments of one common length"
            )
        b = sizes.pop()
        if b < 1:
            raise HyperparameterError("a batch needs at least one row")
        self._n = b
        names = [algorithm] * b if isinstance(algorithm, str) else list(algorithm)
        for name in names:
            if name not in _CLASSES:
                raise HyperparameterError(
                    f"unknown algorithm {name!r}; expected one of {sorted(_CLASSES)}"
                )
        self.algorithms: tuple[str, ...] = tuple(names)
        self._codes = np.array([list(_CLASSES).index(a) for a in names], dtype=np.int8)
        self._ramp = np.array([BATCHED[a] == _RAMP for a in names])
        self._full = np.array([BATCHED[a] == _FULL for a in names])
        self._groups: list[tuple[str, npt.NDArray[np.intp] | slice]] = []
        for code, name in enumerate(_CLASSES):
            rows = np.flatnonzero(self._codes == code)
            if rows.size == b:
                self._groups = [(name, slice(None))]
                break
            if rows.size:
                self._groups.append((name, rows))
        self._cost = np.array([check_param("cost", c) for c in _per_row("cost", cost, b)])
        self._gamma = np.array([check_param("gamma", g) for g in _per_row("gamma", gamma, b)])
        self._rho = np.array([check_param("rho", r) for r in _per_row("rho", rho, b)])
        if eta is None or isinstance(eta, (int, float, Mapping, Constant, InverseTime, DSALTheory)):
            etas: list[Any] = [eta] * b
        else:
            etas = list(eta)
        schedules = [
            _default_eta(a, self.n_features, float(g)) if e is None else as_schedule(e)
            for a, g, e in zip(names, self._gamma, etas, strict=True)
        ]
        forms = [_inverse_time_form(s) for s in schedules]
        self._eta0 = np.array([f[0] for f in forms])
        self._tau = np.array([f[1] for f in forms])
        if W is None:
            self._W = np.zeros((b, self.n_features))
        else:
            self._W = np.array(W, dtype=np.float64)
            if self._W.shape != (b, self.n_features) or not np.isfinite(self._W).all():
                raise HyperparameterError(
                    f"W must be a finite array of shape {(b, self.n_features)}"
                )
        self._steps = np.zeros(b, dtype=np.int64)
        self._budget_rows, self._budget = _held_rows(budgets)
        self._next = np.empty_like(self._W)
        self._tmp = np.empty_like(self._W)
        self._rng = np.random.default_rng(check_seed(seed))

    # -- conversions -------------------------------------------------------------------
    @classmethod
    def from_learners(cls, learners: Sequence[LinearLearner], *, seed: int | None = 0) -> Any:
        """A batch whose rows start from the given single learners' current state."""
        if not learners:
            raise HyperparameterError("from_learners needs at least one learner")
        n = {lrn.n_features for lrn in learners}
        if len(n) != 1:
            raise HyperparameterError(f"learners disagree on n_features: {sorted(n)}")
        if any(
            lrn.rho_eta_max is not None or lrn.intercept_eta_min is not None for lrn in learners
        ):
            raise HyperparameterError(
                "a batch takes one step per row: learners with rho_eta_max or "
                "intercept_eta_min run one at a time"
            )
        if any(getattr(lrn, "tail", 0.0) for lrn in learners):
            raise HyperparameterError("a batch runs the paper's losses: a tail runs alone")
        batch = cls(
            [lrn.algorithm for lrn in learners],
            n.pop(),
            [lrn.cost for lrn in learners],
            gamma=[getattr(lrn, "gamma", DEFAULT_GAMMA) for lrn in learners],
            eta=[lrn.eta for lrn in learners],
            rho=[lrn.rho for lrn in learners],
            W=np.stack([lrn.w for lrn in learners]),
            seed=seed,
        )
        batch._steps[:] = [lrn.steps for lrn in learners]
        return batch

    def to_learners(self) -> list[LinearLearner]:
        """One single learner per row, in the row's current state."""
        out: list[LinearLearner] = []
        for i, name in enumerate(self.algorithms):
            eta = (
                Constant(float(self._eta0[i]))
                if math.isinf(self._tau[i])
                else InverseTime(float(self._eta0[i]), float(self._tau[i]))
            )
            kwargs: dict[str, Any] = {
                "eta": eta,
                "rho": float(self._rho[i]),
                "w": self._W[i].copy(),
            }
            if BATCHED[name] != _RAMP:
                kwargs["gamma"] = float(self._gamma[i])
            learner = _CLASSES[name](self.n_features, float(self._cost[i]), **kwargs)
            learner._steps = int(self._steps[i])
            out.append(learner)
        return out

    # -- read-only views ---------------------------------------------------------------
    @property
    def n_rows(self) -> int:
        return self._n

    @property
    def W(self) -> FloatArray:
        """Weights, shape ``(B, n_features)`` (a read-only view; changes with each step)."""
        view = self._W.view()
        view.flags.writeable = False
        return view

    @property
    def rho(self) -> FloatArray:
        """Rejection widths, shape ``(B,)`` (a copy)."""
        return self._rho.copy()

    @property
    def steps(self) -> npt.NDArray[np.int64]:
        """Labels absorbed per row (a copy)."""
        return self._steps.copy()

    @property
    def cost(self) -> FloatArray:
        return self._cost.copy()

    # -- one lockstep trial ------------------------------------------------------------
    @quiet
    def step(
        self, X: Any, y: Any, coins: Any = None
    ) -> tuple[npt.NDArray[np.int8], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """Decide one example per row, then update the rows that query their label.

        ``X`` has shape ``(B, n_features)``, ``y`` holds ``+1``/``-1`` per row and
        ``coins`` one uniform in ``[0, 1)`` per row (row ``b`` queries iff
        ``coins[b] < p_b``; ``None`` draws them from the batch's generator). Returns
        ``(labels, scores, query_probabilities, queried)``, new arrays of shape ``(B,)``.
        On bad input nothing changes.
        """
        b = self._n
        X = np.asarray(X, dtype=np.float64)
        if X.shape != (b, self.n_features):
            raise DimensionError(f"X must have shape {(b, self.n_features)}, got {X.shape}")
        y = np.asarray(y, dtype=np.float64)
        if y.shape != (b,):
            raise DimensionError(f"y must have shape {(b,)}, got {y.shape}")
        if not (np.abs(y) == 1.0).all():
            raise LabelError("y must hold only +1 and -1")
        if coins is None:
            u = self._rng.random(b)
        else:
            u = np.asarray(coins, dtype=np.float64)
            if u.shape != (b,):
                raise DimensionError(f"coins must have shape {(b,)}, got {u.shape}")
            if not ((u >= 0.0).all() and (u < 1.0).all()):
                raise InputError("coins must all be in [0, 1)")

        W, rho = self._W, self._rho
        scores: FloatArray = np.einsum("ij,ij->i", W, X)
        if not math.isfinite(float(np.add.reduce(scores))) and not np.isfinite(scores).all():
            raise_non_finite(X, "X")
        labels = reject_decision(scores, rho)
        z = y * scores
        probs = np.empty(b)
        dz = np.empty(b)
        drho = np.empty(b)
        for name, rows in self._groups:
            f, r, zz, c = scores[rows], rho[rows], z[rows], self._cost[rows]
            rule = BATCHED[name]
            if rule == _RAMP:
                probs[rows] = double_ramp_query(f, r)
                dz[rows], drho[rows] = double_ramp_gradient(zz, r, c)
            else:
                g = self._gamma[rows]
                probs[rows] = 1.0 if rule == _FULL else double_sigmoid_query_probability(f, r, g)
                dz[rows], drho[rows] = double_sigmoid_gradient(zz, r, c, g)
        budget = self._budget
        if budget is not None:
            rows = self._budget_rows
            utility = probs[rows].copy()
            ramp = self._ramp[rows]
            utility[ramp] = double_ramp_query_utility(scores[rows][ramp], rho[rows][ramp])
            utility[self._full[rows]] = 1.0
            probs[rows], _ = budget.ask(utility, u[rows])
        queried = u < probs

        eta = self._eta0 / (1.0 + self._steps / self._tau)
        coef = eta * dz * y
        coef[~queried] = 0.0
        rho_new = rho - eta * drho
        np.maximum(rho_new, 0.0, out=rho_new)
        rho_new = np.where(queried, rho_new, rho)
        np.multiply(X, coef[:, None], out=self._tmp)
        np.subtract(W, self._tmp, out=self._next)
        if not (
            math.isfinite(float(np.add.reduce(rho_new)))
            and math.isfinite(float(np.add.reduce(coef)))
            and np.isfinite(self._next[queried]).all()
        ):
            raise NonFiniteError("step refused: it would make some row's w or rho non-finite")
        self._W, self._next = self._next, W
        self._rho = rho_new
        self._steps += queried
        if budget is not None:
            budget.commit()
        return labels, scores, probs, queried

    def __repr__(self) -> str:
        kinds = sorted(set(self.algorithms))
        return f"BatchLearner(rows={self._n}, algorithms={kinds}, n_features={self.n_features})"


class BatchStandardizer:
    """``B`` independent online standardisers in lockstep (one per replay run).

    ``learn(X)`` and ``transform(X)`` take one example per row (shape ``(B, n_features)``)
    and apply exactly the formulas of
    :class:`~service.learning.preprocessing.OnlineStandardizer`, in the same floating-point
    order, so row ``b`` equals a standalone standardiser fed row ``b`` bit for bit.
    Combine with ``Intercept().transform_many(...)`` for the bias column.

    >>> z = BatchStandardizer(n_rows=2, n_features=1)
    >>> z.learn(np.array([[1.0], [10.0]])); z.learn(np.array([[3.0], [10.0]]))
    >>> z.transform(np.array([[3.0], [12.0]])).tolist()
    [[1.0], [2.0]]
    """

    __slots__ = ("_count", "_delta", "_m2", "_mean", "_scale", "_tmp", "min_std")

    def __init__(self, n_rows: int, n_features: int, *, min_std: float = 1e-9) -> None:
        b = check_int("n_rows", n_rows, 1)
        d = check_int("n_features", n_features, 1)
        self.min_std = check_min_std(min_std)
        self._count = 0
        self._mean = np.zeros((b, d))
        self._m2 = np.zeros((b, d))
        self._scale = np.ones((b, d))
        self._delta = np.empty((b, d))
        self._tmp = np.empty((b, d))

    @property
    def count(self) -> int:
        return self._count

    @property
    def mean(self) -> FloatArray:
        return self._mean.copy()

    def _check(self, X: Any) -> FloatArray:
        X = np.asarray(X, dtype=np.float64)
        if X.shape != self._mean.shape:
            raise DimensionError(f"X must have shape {self._mean.shape}, got {X.shape}")
        return X  # type: ignore[no-any-return]

    @quiet
    def transform(self, X: Any) -> FloatArray:
        """Standardise one example per row (a new array)."""
        X = self._check(X)
        out: FloatArray = (X - self._mean) * self._scale
        return out

    @quiet
    def learn(self, X: Any) -> None:
        """Welford update of every row; NaN/inf anywhere refuses the whole batch."""
        X = self._check(X)
        if not math.isfinite(float(np.add.reduce(X, axis=None))) and not np.isfinite(X).all():
            raise_non_finite(X, "X")
        count = self._count + 1
        delta, tmp, scale = self._delta, self._tmp, self._scale
        np.subtract(X, self._mean, out=delta)
        np.divide(delta, count, out=tmp)
        self._mean += tmp  # mean + delta / n
        np.subtract(X, self._mean, out=tmp)
        tmp *= delta  # (x - new mean) * delta
        self._m2 += tmp
        self._count = count
        np.divide(self._m2, count, out=tmp)
        np.sqrt(tmp, out=tmp)  # std
        scale.fill(1.0)
        np.divide(1.0, tmp, out=scale, where=tmp > self.min_std)
