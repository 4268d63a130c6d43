r"""Shared machinery of the linear reject-option learners $f(x) = w \cdot x$.

The concrete algorithms (:class:`~service.learning.linear.dral.DRAL`,
:class:`~service.learning.linear.dsal.DSAL`, :class:`~service.learning.linear.dsal.DSOL`) only
say how likely a query is and which (sub)gradient a label gives; everything else — input checks,
the update step, read-only parameters, batched decisions and the state record — is here.

The step: with the schedule's $\eta_t$ ($t$ = labels absorbed) and a label's gradient
$(\partial L/\partial z, \partial L/\partial \rho)$ at $z = y\,w \cdot x$,

.. math::

    w \leftarrow w - \eta_t \frac{\partial L}{\partial z}\, y x, \qquad
    \rho \leftarrow \max\Bigl(0,\ \rho - \min(\eta_t, \bar\eta_\rho)
        \frac{\partial L}{\partial \rho}\Bigr),

and the last weight takes $\max(\eta_t, \underline\eta_b)$ instead of $\eta_t$. By default
$\bar\eta_\rho = \infty$ and $\underline\eta_b = 0$ (``rho_eta_max`` and
``intercept_eta_min`` are ``None``): one step for everything, the papers' update. The two bounds
are for a learner that must keep up with a changing stream
(:class:`~service.learning.adaptive.Adaptive` sets them, see
:mod:`service.learning.adaptive.parts`): a cap on $\rho$'s step keeps one label from moving
the rejection width by much (with few features the default step, $5/(n+1)$, is near 1), and
a floor on the last weight, the intercept's when an
:class:`~service.learning.preprocessing.Intercept` comes last, keeps the boundary's position
moving at its first pace while the other weights settle.

``update_rule="normalized"`` replaces this step by the one of
:mod:`service.learning.linear.normalized` (importance-weight aware, per-coordinate adaptive,
invariant to the scale of the loss, $\rho$ in the units of the score; the same schedule and
bounds); the default, ``"sgd"``, is the update above, exactly as the papers print it.

The hot path stays lean: one ``dot`` per decision (a NaN or an infinity in ``x`` makes
the score non-finite, so checking the score checks ``x``), scalar math through
:mod:`math`, and an update that builds a new ``w`` instead of writing into the old one,
so a refused update leaves the model exactly as it was and ``learner.w`` snapshots stay
valid. The public methods run under :data:`~service.learning.base.quiet` (numpy's
floating-point warnings off): every result that matters is checked for finiteness
explicitly, and bad input surfaces as a :class:`~service.learning.errors.NonFiniteError`,
never as a stray ``RuntimeWarning``.

Throughput note: :meth:`LinearLearner.decide_many` is one BLAS matrix-vector product plus
a few passes over the scores. numpy's bundled OpenBLAS may split that product over
several threads, which on a small shared machine costs far more than it saves; processes
that score in bulk (worker, replay, benchmarks) should set ``OPENBLAS_NUM_THREADS=1``
before numpy is imported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
    features_matrix,
    quiet,
    raise_non_finite,
)
from ..errors import HyperparameterError, InputError, NonFiniteError, StateError
from ..losses import FloatArray, reject_decision
from ..schedules import Schedule, as_schedule
from ..sparse import SPARSE_FROM, SparseRow, as_input
from .normalized import Normalizer, normalized_step, normalizer_ok, row_step

__all__ = ["UPDATES", "LinearLearner"]

_L = TypeVar("_L", bound="LinearLearner")
_BOUNDS = ("rho_eta_max", "intercept_eta_min")
#: the update rules: the papers' stochastic gradient step, and the normalized one
UPDATES = ("sgd", "normalized")


class LinearLearner:
    """Base class: a linear reject-option learner with parameters ``(w, rho)``.

    Subclasses set :attr:`algorithm`, :attr:`param_names` and implement
    :meth:`_query_probability` and :meth:`_gradient` (both receive floats or arrays), and
    :meth:`_default_eta`, the step used when ``eta`` is ``None`` (it may read
    ``n_features`` and any hyperparameter the subclass sets before calling this
    constructor). The schedule is then stored like a given one, so a learner rebuilt from
    its state keeps it.
    """

    algorithm: ClassVar[str] = ""
    param_names: ClassVar[tuple[str, ...]] = (
        "n_features",
        "cost",
        "eta",
        "rho_eta_max",
        "intercept_eta_min",
        "update_rule",
        "seed",
    )

    __slots__ = (
        "cost",
        "eta",
        "intercept_eta_min",
        "n_features",
        "rho_eta_max",
        "seed",
        "update_rule",
        "_lent",
        "_lent_sums",
        "_listed",
        "_normalizer",
        "_rho",
        "_rng",
        "_steps",
        "_w",
    )

    n_features: int
    cost: float
    eta: Schedule
    rho_eta_max: float | None
    intercept_eta_min: float | None
    update_rule: str
    seed: int | None

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
        self.n_features = check_int("n_features", n_features, 1)
        self.cost = check_param("cost", cost)
        if update_rule not in UPDATES:
            raise HyperparameterError(f"update_rule must be one of {UPDATES}, got {update_rule!r}")
        self.update_rule = update_rule
        self.eta = self._default_eta() if eta is None else as_schedule(eta)
        self.rho_eta_max = _bound("rho_eta_max", rho_eta_max)
        self.intercept_eta_min = _bound("intercept_eta_min", intercept_eta_min)
        self.seed = check_seed(seed)
        self._rho = check_param("rho", rho)
        if w is None:
            w_arr = np.zeros(self.n_features)
        else:
            try:
                w_arr = np.array(w, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise HyperparameterError(f"w must be a sequence of numbers: {exc}") from exc
            if w_arr.shape != (self.n_features,):
                raise HyperparameterError(
                    f"w must have {self.n_features} values, got shape {w_arr.shape}"
                )
            if not np.isfinite(w_arr).all():
                raise HyperparameterError("w must hold finite values")
        self._w: FloatArray = w_arr
        self._lent = False  # whether _w may be read elsewhere: copy it to write it
        self._lent_sums = False  # the same of the normaliser's sums
        self._listed = st.Listed()  # the lists of its last state (made from them next)
        self._steps = 0
        self._rng = np.random.default_rng(self.seed)
        self._normalizer = (
            Normalizer.empty(self.n_features) if update_rule == "normalized" else None
        )

    # -- parameters --------------------------------------------------------------------
    @property
    def w(self) -> FloatArray:
        """Current weights: a read-only view that later updates do not change (each update
        builds a new array instead of writing into the old one)."""
        self._lent = True
        view = self._w.view()
        view.flags.writeable = False
        return view

    @property
    def takes_rows(self) -> bool:
        """Whether it learns each input as the entries it sets
        (:class:`~service.learning.sparse.SparseRow`: from
        :data:`~service.learning.sparse.SPARSE_FROM` inputs on)."""
        return self.n_features >= SPARSE_FROM

    @property
    def sums(self) -> FloatArray | None:
        """The normalised update's sums (a read-only view, lent as :attr:`w` is); None for
        the paper's step."""
        if self._normalizer is None:
            return None
        self._lent_sums = True
        view = self._normalizer.grads.view()
        view.flags.writeable = False
        return view

    def peek(self) -> tuple[FloatArray, FloatArray | None]:
        """The weights and the normaliser's sums (None for the paper's step) as they are
        now, not lent: to be read at once and not kept (a state written from them copies
        what it holds), so the next update need not copy them."""
        return self._w, None if self._normalizer is None else self._normalizer.grads

    def weights_whole(self) -> bool:
        """Whether :meth:`weights_record` writes the weights whole (else as their entries:
        :func:`~service.learning.state.entries_record`'s rule)."""
        w = self._w
        return w.size < st.SHARED_FROM or 2 * int(np.count_nonzero(w.view(np.uint64))) > w.size

    def weights_record(self) -> dict[str, Any]:
        """The weights as :meth:`to_state` writes them (whole or as their entries)."""
        return st.entries_record("w", self._w, self._listed)

    def sums_record(self) -> dict[str, Any] | None:
        """The normaliser's sums as :meth:`to_state` writes them (None: the paper's step)."""
        return None if self._normalizer is None else self._normalizer.to_state(self._listed)

    def _own(self) -> None:
        """Make the weights and sums its own before a label writes them in place (a
        view, a state or a snapshot may still read the ones it has; a snapshot of the
        weights alone copies them alone)."""
        if self._lent:
            self._w = self._w.copy()
            self._lent = False
        if self._lent_sums:
            if self._normalizer is not None:
                self._normalizer = Normalizer(self._normalizer.grads.copy())
            self._lent_sums = False

    @property
    def rho(self) -> float:
        """Current rejection width (always ``>= 0``)."""
        return self._rho

    @property
    def steps(self) -> int:
        """Number of labels absorbed by :meth:`update` (the step-size clock ``t``)."""
        return self._steps

    def finite(self) -> bool:
        """Whether ``w`` and ``rho`` are finite (without lending ``w``). A learner of rows
        (:attr:`takes_rows`) checks ``rho`` alone: every write of its weights checks what
        it writes (a row's entries, a whole update, a state read), so they stay finite,
        and a scan of all of them would cost each label the model's width."""
        if self.takes_rows:
            return math.isfinite(self._rho)
        w = self._w
        return math.isfinite(self._rho) and (
            math.isfinite(float(np.add.reduce(w))) or bool(np.isfinite(w).all())
        )

    def weight_norm(self) -> float:
        r"""$\|w\|$ (the kernel learners give the RKHS norm of $f$ under the same name)."""
        return math.sqrt(float(self._w.dot(self._w)))

    # -- algorithm hooks ---------------------------------------------------------------
    def _default_eta(self) -> Schedule:  # pragma: no cover - abstract
        raise NotImplementedError

    def _query_probability(self, f: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _gradient(self, z: Any, rho: float) -> tuple[Any, Any]:  # pragma: no cover
        raise NotImplementedError

    def _width(self) -> float:
        r"""The width of the loss's slopes in score units (the double sigmoid's
        $1/\gamma$; the double ramp's ramps are 1 wide)."""
        return 1.0

    # -- decisions ---------------------------------------------------------------------
    @quiet
    def decide(self, x: Any, coin: float | None = None) -> Decision:
        """Label ``x`` (+1, -1 or 0 = reject) and say whether to query its label.

        ``coin`` is a uniform draw in ``[0, 1)``: the label is queried iff ``coin < p``.
        Without it, a coin is drawn from the learner's own generator, and only when
        ``0 < p < 1``. The model is not changed.
        """
        x = as_input(x, self.n_features)
        if type(x) is SparseRow:
            f = x.dot(self._w)
            if not math.isfinite(f):
                raise_non_finite(x.values)
        else:
            f = float(self._w.dot(x))
            if not math.isfinite(f):
                raise_non_finite(x)
        p = self._query_probability(f)
        query = draw_query(p, coin, self._rng)
        return Decision(reject_decision(f, self._rho), f, self._rho, query, p)

    @quiet
    def decide_many(
        self, X: Any, coins: Any = None
    ) -> tuple[npt.NDArray[np.int8], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """Decide a batch of examples (rows of ``X``) with the current model.

        Returns ``(labels, scores, query_probabilities, queries)`` as arrays. ``coins``
        (one uniform per row) plays the role of :meth:`decide`'s ``coin``; without it the
        learner's generator draws one coin per row with ``0 < p < 1``, in row order, so
        ``decide_many`` makes the same choices as :meth:`decide` called row by row.
        """
        X = features_matrix(X, self.n_features)
        scores: FloatArray = X @ self._w
        if not math.isfinite(float(np.add.reduce(scores))) and not np.isfinite(scores).all():
            raise_non_finite(X, "X")
        return self.decide_scores(scores, coins)

    def decide_scores(
        self, scores: FloatArray, coins: Any = None
    ) -> tuple[npt.NDArray[np.int8], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """:meth:`decide_many` of rows whose scores (w . x) are ``scores`` (finite:
        computed elsewhere, as a sparse row's are), the same arrays."""
        if not math.isfinite(float(np.add.reduce(scores))) and not np.isfinite(scores).all():
            raise NonFiniteError("a score is NaN or infinite")
        labels = reject_decision(scores, self._rho)
        probs = self._query_probability(scores)
        if not isinstance(probs, np.ndarray):
            probs = np.full(scores.shape, probs)
        queries = draw_queries(probs, coins, self._rng)
        return labels, scores, probs, queries

    # -- learning ----------------------------------------------------------------------
    @quiet
    def update(self, x: Any, y: Any, *, weight: float = 1.0) -> bool:
        r"""Absorb the true label ``y`` of ``x``; return whether ``w`` or ``rho`` moved.

        ``weight`` $h \in (0, 10^6]$ is an importance weight (default 1: the plain update):
        the label counts $h$ times. A weight above 1 is taken in $n = \lceil h \rceil$
        sub-steps of $h/n \le 1$ each at the same step size, the gradient re-evaluated after
        each: the discretised importance-weight-aware update of Karampatziakis & Langford
        (2011). A heavy label then moves the model only as far as its loss keeps a slope
        (DRAL stops at the edge of its ramp), where one step $h$ times as long would
        overshoot. Either way the step clock advances by one.

        Raises a :class:`~service.learning.errors.InputError` (a ``ValueError``) on bad
        input or when the step would make the model non-finite; the model is then unchanged.
        """
        x = as_input(x, self.n_features)
        yv = check_label(y)
        h = _weight(weight)
        if type(x) is SparseRow:
            if self._normalizer is not None:
                return self._normalized_row(x, yv, h)
            return self._sgd_row(x, yv, h, weight)
        if self._normalizer is not None:
            return self._normalized(x, yv, h)
        w, rho, moved = self._sgd(self._w, x, yv, h, weight, last=True)
        self._w = w
        self._rho = rho
        self._steps += 1
        return moved

    def _sgd(
        self, w: FloatArray, x: FloatArray, yv: float, h: float, weight: float, *, last: bool
    ) -> tuple[FloatArray, float, bool]:
        """The paper's step on weights ``w`` of inputs ``x`` (a new array; ``last``: the
        last of them is the intercept's, with its own floor): the new ``(w, rho)`` and
        whether they moved; refused when not finite."""
        rho = self._rho
        steps = self._steps
        eta = self.eta(steps)
        eta_rho = eta if self.rho_eta_max is None else min(eta, self.rho_eta_max)
        low = self.intercept_eta_min
        eta_b = eta if low is None or eta >= low else low
        n = 1 if h <= 1.0 else math.ceil(h)
        h = h / n
        moved = False
        for _ in range(n):
            f = float(w.dot(x))
            if not math.isfinite(f):
                if moved:
                    raise NonFiniteError(
                        f"update refused: a sub-step of weight {weight} overflowed"
                    )
                raise_non_finite(x)
            dz, drho = self._gradient(yv * f, rho)
            if dz == 0.0 and drho == 0.0:
                break
            c = h * eta * dz * yv
            rho = rho - h * eta_rho * drho
            if rho < 0.0:
                rho = 0.0
            if eta_b == eta or not last:
                w = w - c * x
            else:  # the intercept's floor: its own step
                before = float(w[-1])
                w = w - c * x
                w[-1] = before - h * eta_b * dz * yv * float(x[-1])
            moved = True
        # a finite squared norm proves every weight finite; if it is not finite, look closer
        if not math.isfinite(rho) or (
            not math.isfinite(float(w.dot(w))) and not np.isfinite(w).all()
        ):
            raise NonFiniteError(
                f"update refused: it would make w or rho non-finite (step {steps}, eta {eta})"
            )
        return w, rho, moved

    def _normalized(self, x: FloatArray, yv: float, h: float) -> bool:
        """:meth:`update` by :func:`~service.learning.linear.normalized.normalized_step`."""
        if not math.isfinite(float(self._w.dot(x))):
            raise_non_finite(x)
        assert self._normalizer is not None  # noqa: S101 - the caller checked
        gathered = Normalizer(self._normalizer.grads)
        eta = float(self.eta(self._steps))
        rho_eta = eta if self.rho_eta_max is None else min(eta, self.rho_eta_max)
        low = self.intercept_eta_min
        w, rho, moved = normalized_step(
            self._w,
            self._rho,
            x,
            yv,
            h,
            gathered,
            self._gradient,
            eta=eta,
            width=self._width(),
            rho_eta=rho_eta,
            last_eta=eta if low is None or eta >= low else low,
        )
        if not (
            math.isfinite(rho) and np.isfinite(w).all() and normalizer_ok(gathered)
        ):  # the model stays as it was
            raise NonFiniteError(
                f"update refused: it would make w or rho non-finite (step {self._steps})"
            )
        self._w, self._rho, self._normalizer = w, rho, gathered
        self._steps += 1
        return moved

    def _sgd_row(self, row: SparseRow, yv: float, h: float, weight: float) -> bool:
        """:meth:`update` of a row by the paper's step: the weights of its entries move."""
        idx = row.indices
        last = idx.size > 0 and int(idx[-1]) == self.n_features - 1  # the intercept is set
        w, rho, moved = self._sgd(self._w[idx], row.values, yv, h, weight, last=last)
        self._own()
        self._w[idx] = w
        self._rho = rho
        self._steps += 1
        return moved

    def _normalized_row(self, row: SparseRow, yv: float, h: float) -> bool:
        """:meth:`update` of a row by :func:`~service.learning.linear.normalized.row_step`:
        the weights and sums of its entries move, in place."""
        assert self._normalizer is not None  # noqa: S101 - the caller checked
        eta = float(self.eta(self._steps))
        rho_eta = eta if self.rho_eta_max is None else min(eta, self.rho_eta_max)
        low = self.intercept_eta_min
        step = row_step(
            self._w,
            self._rho,
            row,
            yv,
            h,
            self._normalizer,
            self._gradient,
            eta=eta,
            width=self._width(),
            rho_eta=rho_eta,
            last_eta=eta if low is None or eta >= low else low,
        )
        if step.w is None:
            raise_non_finite(row.values)
        assert step.w is not None  # noqa: S101 - for mypy
        assert step.grads is not None  # noqa: S101 - for mypy
        if not (
            math.isfinite(step.rho) and np.isfinite(step.w).all() and np.isfinite(step.grads).all()
        ):  # the model stays as it was
            raise NonFiniteError(
                f"update refused: it would make w or rho non-finite (step {self._steps})"
            )
        self._own()
        if step.prior is not None:  # the first label that moves w set every sum's prior
            self._normalizer = Normalizer(step.prior)
        idx = row.indices
        self._w[idx] = step.w
        self._normalizer.grads[idx] = step.grads
        self._rho = step.rho
        self._steps += 1
        return step.moved

    # -- state -------------------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """Hyperparameters as JSON-safe values (the constructor's keywords; a step bound
        that is not set, the paper's update rule and a ``tail`` of 0 are left out, so such
        a learner's record is what it was before they existed)."""
        params: dict[str, Any] = {}
        for name in self.param_names:
            value = getattr(self, name)
            if (
                (value is None and name in _BOUNDS)
                or (name == "update_rule" and value == "sgd")
                or (name == "tail" and value == 0.0)
            ):
                continue
            params[name] = value.to_config() if name == "eta" else value
        return params

    def to_state(self, *, arrays: bool = True) -> dict[str, Any]:
        """A versioned, JSON-safe record of hyperparameters and learned values (not
        ``arrays``: without the weights and the normaliser's sums, which a challenger writes
        against the champion's: :meth:`weights_record`, :meth:`sums_record`)."""
        learned = {
            **(self.weights_record() if arrays else {}),
            "rho": self._rho,
            "steps": self._steps,
            "rng": st.rng_state(self._rng),
        }
        if arrays and self._normalizer is not None:
            learned["normalizer"] = self.sums_record()
        return st.learner_record(self.algorithm, self.get_params(), learned)

    @classmethod
    def from_state(cls: type[_L], state: Any) -> _L:
        """Rebuild a learner from :meth:`to_state` output (same decisions, same updates)."""
        learner, learned = st.open_learner_record(state, cls.algorithm, cls.param_names, cls)
        learner._w = st.read_entries(learned, "w", learner.n_features, "the weights")
        learner._restore(learned)
        if learner._normalizer is not None:
            learner._normalizer = Normalizer.from_state(
                learned.get("normalizer"), learner.n_features
            )
        return learner

    @classmethod
    def from_arrays(cls: type[_L], state: Any, w: FloatArray, sums: FloatArray | None = None) -> _L:
        """:meth:`from_state` of a record written without its arrays
        (``to_state(arrays=False)``), given them: the weights ``w`` and the normaliser's
        sums ``sums`` (None: nothing gathered yet), taken as they are (the caller's to
        give away). The learner a record of the same numbers gives, bit for bit, without
        turning a wide model's arrays into lists and back.

        >>> from service.learning import DSOL
        >>> a = DSOL(n_features=2, cost=0.25, update_rule="normalized", w=[1.0, -2.0])
        >>> b = DSOL.from_arrays(a.to_state(arrays=False), np.array([3.0, -0.0]))
        >>> b.w.tolist(), b.to_state(arrays=False) == a.to_state(arrays=False)
        ([3.0, -0.0], True)
        """
        learner, learned = st.open_learner_record(state, cls.algorithm, cls.param_names, cls)
        n = learner.n_features
        if "w" in learned or "w_at" in learned or "normalizer" in learned:
            raise StateError("a record given its arrays must be written without them")
        if w.dtype != np.float64 or w.shape != (n,) or not np.isfinite(w).all():
            raise StateError(f"the weights must be {n} finite numbers")
        learner._w = w
        learner._restore(learned)
        if learner._normalizer is not None and sums is not None:
            if sums.dtype != np.float64 or sums.shape != (n,) or not (sums >= 0.0).all():
                raise StateError(f"the normaliser's sums must be {n} numbers >= 0")
            learner._normalizer = Normalizer(sums)
        return learner

    def _restore(self, learned: Mapping[str, Any]) -> None:
        """Read the scalars of a record's ``learned`` section (:meth:`to_state`)."""
        self._rho = st.read_float(learned, "rho", minimum=0.0)
        self._steps = st.read_int(learned, "steps")
        self._rng = st.rng_from_state(learned.get("rng"))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params}, rho={self._rho!r}, steps={self._steps})"


def _bound(name: str, value: Any) -> float | None:
    """An optional step bound: ``None`` or a finite number > 0."""
    return None if value is None else check_param(name, value)


def _weight(value: Any) -> float:
    """An importance weight: a finite number in ``(0, 1e6]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"weight must be a number, got {value!r}")
    h = float(value)
    if not (math.isfinite(h) and 0.0 < h <= 1e6):
        raise InputError(f"weight must be in (0, 1e6], got {value!r}")
    return h
