r"""A learner that notices when the world changes and recovers by itself.

:class:`Adaptive` holds a *champion* (any learner of this package: it decides every event)
and watches what the champion does on its labels:

1. **Detect.** Each label is first a test: the champion's 0-d-1 loss $L$ on it (1 wrong,
   $d$ rejected, 0 right), before it learns from it, goes to a change detector
   (:class:`~service.learning.drift.ADWIN` by default, checking at every label). A change
   counts when the detector fires and the recent losses are the *higher* ones (a model
   that improves is not a change). A champion that collapses (rejects at least 95 % of a
   window of labels while $\rho$ grows, :class:`~service.learning.collapse.CollapseWatch`)
   counts as a change too.
2. **Challenge.** At a change, challengers start beside the champion and learn from the
   same labels: ``"fresh"``, the champion's configuration from scratch ($w = 0$, step
   clock 0, $\rho$ as configured), and ``"mirror"``, the champion with $f$ negated and
   the $\rho$ it had at the change (where the detector puts it): after a change that
   makes the champion wrong more often than right, its mirror is right more often than
   wrong. Every later label is a paired test: with $\Delta_i = L_i^{champion} - L_i^{c}$,
   a challenger takes over once it has ``min_labels`` labels and
   $\bar\Delta > \max(0,\, z\, s_\Delta / \sqrt{n})$ (the best one if several pass);
   challengers that have not won after ``patience`` labels are dropped. The pattern of
   River's adaptive random forest (background learners started at a change), judged on
   the champion's own labels.
3. **Explore.** For the first ``explore_start`` labels of the model and the
   ``explore_after`` labels after each change, the query utility of every event is at
   least ``explore_floor``: the labels spread over the events instead of crowding where
   the champion (new, or wrong since the change) believes it is unsure (randomised
   uncertainty sampling, Žliobaitė et al., 2014). With a
   :class:`~service.learning.QueryBudget` the budget still holds, and every decision's
   ``query_probability`` is the one it was really asked with.

The wrapper has the face of a learner (``decide``, ``decide_many``, ``update``,
``query_utility``, ``rho``, ``steps``, ``to_state``, ...), so it goes wherever a learner
goes, :class:`~service.learning.Budgeted` included. ``update`` takes the probability the
label was asked with (``query_probability``) for :attr:`Adaptive.risk_since_change`, the
importance-weighted risk of the champion on the labels since the last change (or the
start). Everything is one versioned, JSON-safe state record (``"abstain.adaptive"``).
Each part can be turned off: ``detector=None`` (no detection), ``challengers=()``
(detect and count, never replace), ``explore_floor=0``.

>>> from service.learning import DSAL
>>> model = Adaptive(DSAL(n_features=2, cost=0.25))
>>> rng = np.random.default_rng(0)
>>> for t in range(600):
...     x = [float(rng.normal()), 1.0]
...     y = (1 if x[0] > 0 else -1) * (1 if t < 300 else -1)   # labels flip at t = 300
...     _ = model.update(x, y)
>>> model.changes_detected, model.takeovers, model.champion_origin
(1, 1, 'mirror')
>>> model.decide([2.0, 1.0]).label                           # the flipped concept
-1
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar, Final

import numpy as np
import numpy.typing as npt

from . import state as st
from .base import (
    Decision,
    check_coin,
    check_int,
    check_label,
    check_seed,
    draw_queries,
    draw_query,
    features,
)
from .challengers import CHALLENGER_KINDS, Challenger, challenger_for
from .collapse import CollapseWatch
from .drift import ADWIN, PageHinkley, detector_from_state
from .errors import HyperparameterError, InputError, StateError
from .losses import FloatArray, zero_d_one_loss
from .registry import learner_from_state
from .risk import RiskEstimate, importance_weight

__all__ = ["ADAPTIVE_FORMAT", "CHALLENGER_KINDS", "Adaptive"]

ADAPTIVE_FORMAT: Final = "abstain.adaptive"
_RHO_HISTORY: Final = 256


def _fraction(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HyperparameterError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and 0.0 <= v <= 1.0):
        raise HyperparameterError(f"{name} must be in [0, 1], got {value!r}")
    return v


def _probability(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise InputError(f"query_probability must be a number in (0, 1], got {value!r}")
    p = float(value)
    if not (math.isfinite(p) and 0.0 < p <= 1.0):
        raise InputError(f"query_probability must be in (0, 1], got {value!r}")
    return p


class Adaptive:
    """A champion learner with change detection, challengers and exploration.

    Parameters
    ----------
    learner:
        The champion at the start (a learner of this package, e.g. :class:`DSAL`).
    detector:
        The change detector over the champion's losses on its labels: an
        :class:`~service.learning.drift.ADWIN` or
        :class:`~service.learning.drift.PageHinkley`, or ``None`` (no detection). Default
        ``ADWIN(delta=0.05, clock=1)``: false alarms cost little (a challenger that does
        not win is dropped), a late detection costs a whole window of mistakes.
    challengers:
        Kinds started at a change, from :data:`CHALLENGER_KINDS` (default both).
    min_labels, z, patience:
        The takeover test (module docstring): at least ``min_labels`` paired labels
        (default 5), a mean gain above ``z`` standard errors (default 1), and challengers
        dropped after ``patience`` labels without winning (default 200).
    explore_floor, explore_start, explore_after:
        The least query utility of every event (default 0.5) during the first
        ``explore_start`` labels (default 10) and the ``explore_after`` labels after a
        change (default 20).
    collapse_window:
        Labels per window of the collapse watch (default 50; 0 turns it off).
    seed:
        Seed of the generator that draws query coins when none is supplied.
    """

    param_names: ClassVar[tuple[str, ...]] = (
        "challengers",
        "min_labels",
        "z",
        "patience",
        "explore_floor",
        "explore_start",
        "explore_after",
        "collapse_window",
    )
    __slots__ = (
        "challengers",
        "champion",
        "champion_origin",
        "collapse_window",
        "detector",
        "explore_after",
        "explore_floor",
        "explore_start",
        "min_labels",
        "patience",
        "seed",
        "z",
        "_explore_left",
        "_changes",
        "_labels",
        "_last_change",
        "_risk",
        "_rhos",
        "_rng",
        "_running",
        "_takeovers",
        "_watch",
    )

    def __init__(
        self,
        learner: Any,
        *,
        detector: ADWIN | PageHinkley | None | str = "default",
        challengers: Sequence[str] = CHALLENGER_KINDS,
        min_labels: int = 5,
        z: float = 1.0,
        patience: int = 200,
        explore_floor: float = 0.5,
        explore_start: int = 10,
        explore_after: int = 20,
        collapse_window: int = 50,
        seed: int | None = 0,
    ) -> None:
        if not callable(getattr(learner, "query_utility", None)):
            raise HyperparameterError(f"not a learner of service.learning: {learner!r}")
        if detector == "default":
            detector = ADWIN(delta=0.05, clock=1)
        if detector is not None and not isinstance(detector, (ADWIN, PageHinkley)):
            raise HyperparameterError(f"detector must be ADWIN, PageHinkley or None: {detector!r}")
        kinds = tuple(challengers)
        if not set(kinds) <= set(CHALLENGER_KINDS) or len(set(kinds)) != len(kinds):
            raise HyperparameterError(f"challengers must be distinct kinds of {CHALLENGER_KINDS}")
        self.champion = learner
        self.champion_origin = "initial"
        self.detector = detector
        self.challengers = kinds
        self.min_labels = check_int("min_labels", min_labels, 1)
        if isinstance(z, bool) or not isinstance(z, (int, float)) or not 0.0 <= z <= 10.0:
            raise HyperparameterError(f"z must be a number in [0, 10], got {z!r}")
        self.z = float(z)
        self.patience = check_int("patience", patience, 1)
        self.explore_floor = _fraction("explore_floor", explore_floor)
        self.explore_start = check_int("explore_start", explore_start, 0)
        self.explore_after = check_int("explore_after", explore_after, 0)
        self.collapse_window = check_int("collapse_window", collapse_window, 0)
        self._watch = CollapseWatch(window=collapse_window) if collapse_window else None
        self._running: list[Challenger] = []
        self._rhos: deque[float] = deque(maxlen=_RHO_HISTORY)
        self._risk = RiskEstimate()
        self._explore_left = self.explore_start
        self._labels = 0
        self._changes = 0
        self._takeovers = 0
        self._last_change: int | None = None
        self.seed = check_seed(seed)
        self._rng = np.random.default_rng(self.seed)

    # -- the learner's face ------------------------------------------------------------
    @property
    def algorithm(self) -> str:
        return str(self.champion.algorithm)

    @property
    def n_features(self) -> int:
        return int(self.champion.n_features)

    @property
    def cost(self) -> float:
        return float(self.champion.cost)

    @property
    def rho(self) -> float:
        return float(self.champion.rho)

    @property
    def steps(self) -> int:
        """Labels the current champion has learned from."""
        return int(self.champion.steps)

    @property
    def w(self) -> FloatArray | None:
        """The champion's weights (``None`` for a kernel learner)."""
        return getattr(self.champion, "w", None)

    def weight_norm(self) -> float:
        return float(self.champion.weight_norm())

    # -- what it has seen --------------------------------------------------------------
    @property
    def labels(self) -> int:
        """Labels learned from."""
        return self._labels

    @property
    def changes_detected(self) -> int:
        """Changes detected (rising losses, or a collapse)."""
        return self._changes

    @property
    def takeovers(self) -> int:
        """Times a challenger replaced the champion."""
        return self._takeovers

    @property
    def last_change(self) -> int | None:
        """The label count at the last detected change (``None``: none yet)."""
        return self._last_change

    @property
    def risk_since_change(self) -> RiskEstimate:
        """Importance-weighted risk of the champion on the labels since the last change or
        takeover (a copy; ``.risk``, ``.interval()``)."""
        return RiskEstimate.from_state(self._risk.to_state())

    @property
    def exploring(self) -> bool:
        """Whether utilities are floored now (the start, or just after a change)."""
        return self._explore_left > 0 and self.explore_floor > 0.0

    @property
    def running(self) -> tuple[str, ...]:
        """Kinds of the challengers running now."""
        return tuple(c.kind for c in self._running)

    # -- deciding ----------------------------------------------------------------------
    def query_utility(self, f: Any) -> Any:
        """The champion's utility of scores ``f``, floored while exploring."""
        u = self.champion.query_utility(f)
        if not self.exploring:
            return u
        if isinstance(u, np.ndarray):
            return np.maximum(u, self.explore_floor)
        return max(float(u), self.explore_floor)

    def decide(self, x: Any, coin: float | None = None) -> Decision:
        """The champion's label and score; the query probability is the champion's, floored
        while exploring. ``coin`` decides the query (``coin < p``); without it the
        wrapper's own generator draws one when ``0 < p < 1``."""
        if coin is not None:
            coin = check_coin(coin)
        d = self.champion.decide(x, coin=0.0)  # a fixed coin: the champion's generator rests
        p = d.query_probability
        if self.exploring:
            p = max(p, self.explore_floor)
        return Decision(d.label, d.score, d.rho, draw_query(p, coin, self._rng), p)

    def decide_many(
        self, X: Any, coins: Any = None
    ) -> tuple[npt.NDArray[np.int8], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """:meth:`decide` for the rows of ``X``, in order: ``(labels, scores,
        query_probabilities, queries)``."""
        m = np.shape(X)[0] if np.ndim(X) == 2 else -1
        labels, scores, probs, _ = self.champion.decide_many(X, coins=np.zeros(max(m, 0)))
        probs = np.asarray(probs, dtype=np.float64)
        if self.exploring:
            probs = np.maximum(probs, self.explore_floor)
        return labels, scores, probs, draw_queries(probs, coins, self._rng)

    # -- learning ----------------------------------------------------------------------
    def _loss(self, learner: Any, x: FloatArray, y: float) -> float:
        f = float(learner.decide(x, coin=0.0).score)
        return float(zero_d_one_loss(y * f, float(learner.rho), self.cost))

    def update(self, x: Any, y: Any, *, query_probability: float = 1.0) -> bool:
        """Learn the label ``y`` of ``x``, asked with probability ``query_probability``.

        The champion (and any challenger) is first tested on it, then learns from it; the
        detector reads the champion's loss; a change starts the challengers, and a
        challenger that passes the paired test becomes the champion. Returns whether the
        champion's parameters moved. Bad input raises an
        :class:`~service.learning.errors.InputError` and changes nothing.
        """
        z = features(x, self.n_features)
        yv = check_label(y)
        p = _probability(query_probability)
        decided = self.champion.decide(z, coin=0.0)
        loss = float(zero_d_one_loss(yv * decided.score, decided.rho, self.cost))
        gains = [loss - self._loss(c.learner, z, yv) for c in self._running]
        rho = float(self.champion.rho)
        moved = bool(self.champion.update(z, yv))  # refuses bad input before any change
        self._risk.add(loss, p)
        weight = importance_weight(p, self._risk.max_weight)
        for c, gain in zip(self._running, gains, strict=True):
            c.learner.update(z, yv)
            c.add(gain * weight)
        self._labels += 1
        self._rhos.append(rho)
        if self._explore_left > 0:
            self._explore_left -= 1
        if self._changed(loss, decided.label, rho):
            self._start_change()
        self._maybe_take_over()
        return moved

    def _changed(self, loss: float, label: int, rho: float) -> bool:
        change = False
        if self.detector is not None and self.detector.update(loss):
            change = getattr(self.detector, "rising", True)
        if self._watch is not None:
            before = self._watch.status().windows
            self._watch.observe(label, rho)
            status = self._watch.status()
            change = change or (status.windows > before and status.collapsed)
        return bool(change)

    def _start_change(self) -> None:
        self._changes += 1
        self._last_change = self._labels
        self._explore_left = self.explore_after
        self._risk = RiskEstimate(max_weight=self._risk.max_weight)
        if self._running or not self.challengers:
            return
        # the rho the champion had before the change: a wrong champion's rho grows, and the
        # detector's estimate of where the change is may be late, so the least rho over
        # twice as many labels back
        back = getattr(self.detector, "recent", 0) if self.detector is not None else 0
        recent = list(self._rhos)[-(2 * back + 1) :]
        rho_then = min(recent) if recent else self.rho
        self._running = [
            Challenger(kind, challenger_for(self.champion, kind, rho_then))
            for kind in self.challengers
        ]

    def _maybe_take_over(self) -> None:
        if not self._running:
            return
        if any(c.winning(self.min_labels, self.z) for c in self._running):
            # one challenger is surely better: the best of them on the same labels wins
            best = max(self._running, key=lambda c: c.mean if c.n >= self.min_labels else -2.0)
            self.champion = best.learner
            self.champion_origin = best.kind
            self._running = []
            self._takeovers += 1
            self._risk = RiskEstimate(max_weight=self._risk.max_weight)
            self._rhos.clear()
            if self.detector is not None:
                self.detector = _restarted(self.detector)
            if self._watch is not None:
                self._watch = CollapseWatch(window=self.collapse_window)
        elif self._running[0].n >= self.patience:
            self._running = []

    # -- state -------------------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """Hyperparameters as JSON-safe values (the detector's are in its own record)."""
        params = {name: getattr(self, name) for name in self.param_names}
        params["challengers"] = list(self.challengers)
        params["seed"] = self.seed
        return params

    def to_state(self) -> dict[str, Any]:
        """One versioned, JSON-safe record: parameters, champion, challengers, detector,
        collapse watch and what the wrapper has counted."""
        return {
            "format": ADAPTIVE_FORMAT,
            "version": st.VERSION,
            "params": self.get_params(),
            "champion": self.champion.to_state(),
            "champion_origin": self.champion_origin,
            "challengers": [c.to_state() for c in self._running],
            "detector": None if self.detector is None else self.detector.to_state(),
            "collapse_watch": None if self._watch is None else self._watch.to_state(),
            "learned": {
                "labels": self._labels,
                "changes": self._changes,
                "takeovers": self._takeovers,
                "last_change": self._last_change,
                "explore_left": self._explore_left,
                "rhos": list(self._rhos),
                "risk": self._risk.to_state(),
                "rng": st.rng_state(self._rng),
            },
        }

    @classmethod
    def from_state(cls, state: Any) -> Adaptive:
        """Rebuild from :meth:`to_state` output (the same decisions and the same future)."""
        record = st.read_record(state, ADAPTIVE_FORMAT)
        params = dict(st.read_mapping(record, "params"))
        learned = st.read_mapping(record, "learned")
        unknown = set(params) - {*cls.param_names, "seed"}
        if unknown:
            raise StateError(f"adaptive state params hold unknown names {sorted(unknown)}")
        det = record.get("detector")
        try:
            model = cls(
                learner_from_state(record.get("champion")),
                detector=None if det is None else detector_from_state(det),
                **params,
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, StateError):
                raise
            raise StateError(f"adaptive state params are invalid: {exc}") from exc
        origin = record.get("champion_origin")
        if origin not in ("initial", *CHALLENGER_KINDS):
            raise StateError(f"adaptive state field 'champion_origin' is invalid: {origin!r}")
        model.champion_origin = str(origin)
        running = record.get("challengers")
        if not isinstance(running, list):
            raise StateError("adaptive state field 'challengers' must be a list")
        model._running = [Challenger.from_state(c) for c in running]
        watch = record.get("collapse_watch")
        if (watch is None) != (model._watch is None):
            raise StateError("adaptive state: the collapse watch does not fit collapse_window")
        if watch is not None:
            model._watch = CollapseWatch.from_state(watch)
        model._labels = st.read_int(learned, "labels")
        model._changes = st.read_int(learned, "changes")
        model._takeovers = st.read_int(learned, "takeovers")
        last = learned.get("last_change")
        model._last_change = None if last is None else st.read_int(learned, "last_change")
        model._explore_left = st.read_int(learned, "explore_left")
        rhos = learned.get("rhos")
        if not isinstance(rhos, list) or len(rhos) > _RHO_HISTORY:
            raise StateError(f"adaptive state field 'rhos' must be a list of <= {_RHO_HISTORY}")
        model._rhos.extend(st.read_floats(learned, "rhos", (len(rhos),)).tolist())
        model._risk = RiskEstimate.from_state(learned.get("risk"))
        model._rng = st.rng_from_state(learned.get("rng"))
        return model

    def __repr__(self) -> str:
        return (
            f"Adaptive({self.champion!r}, origin={self.champion_origin!r}, "
            f"changes={self._changes}, takeovers={self._takeovers}, running={self.running})"
        )


def _restarted(detector: ADWIN | PageHinkley) -> ADWIN | PageHinkley:
    """A detector with the same parameters and an empty window (its count of detections
    is kept by the wrapper, not by the detector)."""
    return type(detector)(**detector.get_params())
