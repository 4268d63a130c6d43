r"""A learner that notices when the world changes and recovers by itself.

:class:`Adaptive` holds a *champion* (any learner of this package; it decides every event)
and watches what the champion does on its labels:

1. **Detect.** Each label is first a test of the champion, before it learns from it. A
   change detector (:class:`~service.learning.drift.ADWIN` by default, looking at every
   label) reads whether the champion's score was on the wrong side, $\mathbb 1[y f(x) < 0]$
   (the error of its margin: unlike the 0-d-1 loss it does not hide a champion that has
   turned to rejecting); ``signal="loss"`` reads the 0-d-1 loss instead. A change counts
   when the detector fires and the recent values are the *higher* ones (a model that
   improves is not a change). A champion that collapses (rejects at least 95 % of a window
   of labels while $\rho$ grows, :class:`~service.learning.risk.collapse.CollapseWatch`) counts
   as a change too. The labels a model asks for crowd where it is unsure, so a champion
   that has become *confidently* wrong (after a label flip, one that moved its intercept
   until every event falls on one side) can be right on most of them while wrong on most
   events. A second detector of the same kind (``weighted``, on by default) therefore
   reads each label's signal $e_i$ weighted by how unlikely it was to be asked,
   $e_i\,\underline p / p_i$ in $[0, 1]$, with $\underline p$ the least query probability
   seen (at least $1/$``max_weight``). Its mean over the labels asked in a stretch of
   events is $\underline p\,\sum_t e_t / \sum_t p_t$: the champion's error rate over
   *all* the events, scaled (the importance-weighted estimate, in a detector's range), so
   the few labels a budget spends uniformly (:class:`~service.learning.QueryBudget`'s
   ``explore``) carry the change. With every label asked the two detectors read the
   same values.
2. **Challenge.** At a change, challengers start where the champion was just before it
   (the detector says how many labels ago; the model remembers its last labels and
   snapshots of the champion, :mod:`service.learning.adaptive.recall`): ``"mirror"``, the champion
   with its score negated (after a change that makes the champion wrong more often than
   right, its mirror is right more often than wrong), ``"fresh"``, the champion's
   configuration from scratch ($w = 0$, step clock 0), and ``"tail"`` (double sigmoid
   learners), the champion with the other loss: the logistic tail on if it was off
   (:func:`~service.learning.losses.double_sigmoid_loss`), off if it was on. The paper's
   loss is flat where the model is confidently wrong, robust to noise but slow to follow a
   boundary that keeps moving (a real stream such as electricity prices); the tail keeps a
   slope there. Which one a stream needs shows in the same test, so the stream chooses.
   They are tested on, then learn from, the remembered labels since the change, then
   every new label. With
   $\Delta_i = L_i^{\text{champion}} - L_i^{\text{challenger}}$ (0-d-1 losses on the same
   label), a challenger takes over once ``min_labels`` new labels came in and the mean of
   $\Delta_i$ exceeds $z$ standard errors (an error that allows for gains coming in runs,
   as they do on a stream whose labels are correlated in time:
   :class:`~service.learning.adaptive.challengers.Paired`) while the mean of
   $\Delta_i / p_i$ (unbiased for the difference of the risks on the stream, too noisy on
   a few labels for a test of its own) is positive, and once it is surely better in the
   same sense than every challenger before it in ``challengers`` (so a fresh model must
   beat the mirror, which keeps what the champion knew). Challengers that have not won
   after ``patience`` labels are dropped. The pattern of River's adaptive random forest
   (background learners started at a change), judged on the model's own labels. After a
   takeover the champion it replaced runs as the one challenger of a contest of its own
   (``"previous"``, ``take_back``), by the same test and ``patience``: a takeover won on
   the remembered labels (where the champion was picked for being wrong, so its mirror is
   right by construction) and wrong from its first new label is taken back, which no
   detector would see (the new champion's error is steady from its start).
3. **Explore.** For the first ``explore_start`` labels the query utility of every event is
   at least ``explore_floor``, and for the ``explore_after`` labels after each change at
   least ``after_floor`` (1 by default: every event alike, with a budget a uniform sample
   of the events): the labels spread over the events instead of crowding where the
   champion (new, or wrong since the change) believes it is unsure (randomised uncertainty
   sampling, Žliobaitė et al., 2014), and the challengers are judged on the stream, not
   only where the labels crowd. With a :class:`~service.learning.QueryBudget` the budget
   still holds, and every decision's ``query_probability`` is the one it was really asked
   with. Without one the floor of the wrapper's own ``query_probability`` also ends after
   ``explore_events`` decisions (by default as many as the floor needs to ask its labels:
   ``ceil(labels / floor)``, 20 after a change): labels come back late, and a floor that
   waited for them would ask every event until they do. Decisions count while the floor
   is on (:attr:`Adaptive.explored`, the one thing deciding changes); the
   utilities a budget scales (:meth:`Adaptive.query_utility`) keep the floor for its
   labels, since the budget already bounds what it asks.

The wrapper has the face of a learner (``decide``, ``decide_many``, ``update``,
``query_utility``, ``rho``, ``steps``, ``to_state``, ...), so it goes wherever a learner
goes, :class:`~service.learning.Budgeted` included. ``update`` takes the probability the
label was asked with (``query_probability``): it weights the challengers' test and
:attr:`Adaptive.risk_since_change`, the importance-weighted risk of the champion on the
labels since the last change or takeover. Everything is one versioned, JSON-safe state
record (``"abstain.adaptive"``). Each part can be turned off: ``detector=None``,
``collapse_window=0``, ``challengers=()`` (detect and count, never replace),
``explore_floor=0``, ``memory=0`` (challengers start at the detection).

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
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Final

import numpy as np
import numpy.typing as npt

from .. import state as st
from ..base import (
    Decision,
    check_coin,
    check_int,
    check_label,
    check_seed,
    draw_queries,
    draw_query,
    features,
)
from ..drift import ADWIN, PageHinkley, detector_from_state
from ..errors import HyperparameterError, InputError, LearningError, StateError
from ..losses import FloatArray, zero_d_one_loss
from ..registry import learner_from_state
from ..risk.collapse import CollapseWatch
from ..risk.estimate import RiskEstimate, importance_weight
from ..sparse import SparseRow, as_input
from .challengers import (
    CHALLENGER_KINDS,
    PREVIOUS,
    Challenger,
    Contest,
    base_for,
    challenger_for,
)
from .recall import Recall

__all__ = ["ADAPTIVE_FORMAT", "CHALLENGER_KINDS", "SIGNALS", "TESTS", "Adaptive"]

ADAPTIVE_FORMAT: Final = "abstain.adaptive"
SIGNALS: Final = ("error", "loss")
TESTS: Final = ("both", "plain", "weighted")


def _number(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HyperparameterError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not (math.isfinite(v) and low <= v <= high):
        raise HyperparameterError(f"{name} must be in [{low:g}, {high:g}], got {value!r}")
    return v


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise HyperparameterError(f"{name} must be one of {choices}, got {value!r}")
    return str(value)


def _probability(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise InputError(f"query_probability must be a number in (0, 1], got {value!r}")
    p = float(value)
    if not (math.isfinite(p) and 0.0 < p <= 1.0):
        raise InputError(f"query_probability must be in (0, 1], got {value!r}")
    return p


def default_detector() -> ADWIN:
    """ADWIN at $\\delta = 0.2$ looking at every label: false alarms cost little (a
    challenger that does not win is dropped), a late detection a window of mistakes."""
    return ADWIN(delta=0.2, clock=1)


class Adaptive:
    """A champion learner with change detection, challengers and exploration.

    Parameters
    ----------
    learner:
        The champion at the start (a learner of this package, e.g. :class:`DSAL`).
    detector:
        An :class:`~service.learning.drift.ADWIN` or
        :class:`~service.learning.drift.PageHinkley`, or ``None`` (no detection); by
        default :func:`default_detector`.
    signal:
        What the detector reads per label: ``"error"`` (default), the champion's score on
        the wrong side; ``"loss"``, its 0-d-1 loss.
    weighted:
        Whether a second detector of the same kind reads the signal weighted by
        $\\underline p / p$ (module docstring; default ``True``).
    challengers:
        Kinds started at a change, in order of preference (default ``("mirror", "fresh",
        "tail")``; a kind that does not apply to the learner is skipped).
    min_labels, z, test, patience:
        The takeover test (module docstring): ``min_labels`` new labels since the
        challengers started (default 10), a mean gain above ``z`` standard errors (allowing
        for runs of gains; default 2: the test is repeated at every label, and at 1 a
        challenger that is merely as good as the champion wins by chance) with a positive
        importance-weighted mean (``test="both"``; ``"plain"``: the first alone,
        ``"weighted"``: the test on the weighted gains), challengers dropped after
        ``patience`` labels without winning (default 200).
    memory:
        Labels remembered to start challengers at the change (default 32; 0: at the
        detection).
    explore_floor, explore_start, after_floor, explore_after:
        The least query utility of every event during the first ``explore_start`` labels
        (default 0.5 for 10 labels) and the ``explore_after`` labels after a change
        (default 1, for 20 labels).
    explore_events:
        The most decisions a floor raises the wrapper's own query probability for (a
        model without a budget); ``None`` (default): ``ceil(labels / floor)`` of the floor
        in force, the decisions it takes that floor to ask its labels (20 at the start and
        after a change).
    collapse_window:
        Labels per window of the collapse watch (default 50; 0 turns it off).
    take_back:
        After a takeover, keep the champion it replaced as the one challenger of a contest
        of its own, judged by the same test: a takeover the next labels prove wrong is
        taken back (default true). A champion wrong from its first label gives the
        detector a steady error, so no change would be seen; a change while this contest
        runs starts the challengers of a change instead, and a champion taken back is not
        challenged so again.
    seed:
        Seed of the generator that draws query coins when none is supplied.
    """

    param_names: ClassVar[tuple[str, ...]] = (
        "signal",
        "weighted",
        "challengers",
        "min_labels",
        "z",
        "test",
        "patience",
        "memory",
        "explore_floor",
        "after_floor",
        "explore_start",
        "explore_after",
        "explore_events",
        "collapse_window",
        "take_back",
        "seed",
    )
    __slots__ = (
        *param_names,
        "champion",
        "champion_origin",
        "detector",
        "weighted_detector",
        "_changes",
        "_explore_left",
        "_explored",
        "_floor",
        "_labels",
        "_last_change",
        "_least_p",
        "_recall",
        "_risk",
        "_rng",
        "_contest",
        "_serving",
        "_serving_running",
        "_takeovers",
        "_watch",
    )

    def __init__(
        self,
        learner: Any,
        *,
        detector: ADWIN | PageHinkley | None | str = "default",
        signal: str = "error",
        weighted: bool = True,
        challengers: Sequence[str] = CHALLENGER_KINDS,
        min_labels: int = 10,
        z: float = 2.0,
        test: str = "both",
        patience: int = 200,
        memory: int = 32,
        explore_floor: float = 0.5,
        after_floor: float = 1.0,
        explore_start: int = 10,
        explore_after: int = 20,
        explore_events: int | None = None,
        collapse_window: int = 50,
        take_back: bool = True,
        seed: int | None = 0,
    ) -> None:
        if not callable(getattr(learner, "query_utility", None)):
            raise HyperparameterError(f"not a learner of service.learning: {learner!r}")
        if isinstance(detector, str) and detector == "default":
            detector = default_detector()
        if detector is not None and not isinstance(detector, (ADWIN, PageHinkley)):
            raise HyperparameterError(f"detector must be ADWIN, PageHinkley or None: {detector!r}")
        kinds = tuple(challengers)
        if not all(k in CHALLENGER_KINDS for k in kinds) or len(set(kinds)) != len(kinds):
            raise HyperparameterError(f"challengers must be distinct kinds of {CHALLENGER_KINDS}")
        self.champion = learner
        self.champion_origin = "initial"
        if not isinstance(weighted, bool):
            raise HyperparameterError(f"weighted must be true or false, got {weighted!r}")
        self.detector = detector
        self.weighted = weighted
        self.weighted_detector = _twin(detector) if weighted else None
        self.signal = _choice("signal", signal, SIGNALS)
        self.challengers = kinds
        self.min_labels = check_int("min_labels", min_labels, 1)
        self.z = _number("z", z, 0.0, 10.0)
        self.test = _choice("test", test, TESTS)
        self.patience = check_int("patience", patience, 1)
        self.memory = check_int("memory", memory, 0)
        self.explore_floor = _number("explore_floor", explore_floor, 0.0, 1.0)
        self.after_floor = _number("after_floor", after_floor, 0.0, 1.0)
        self.explore_start = check_int("explore_start", explore_start, 0)
        self.explore_after = check_int("explore_after", explore_after, 0)
        self.explore_events = (
            None if explore_events is None else check_int("explore_events", explore_events, 0)
        )
        self.collapse_window = check_int("collapse_window", collapse_window, 0)
        if not isinstance(take_back, bool):
            raise HyperparameterError(f"take_back must be true or false, got {take_back!r}")
        self.take_back = take_back
        self.seed = check_seed(seed)
        self._watch = CollapseWatch(window=collapse_window) if collapse_window else None
        self._contest = Contest()
        self._recall = Recall(self.memory)
        self._serving = False  # a view read to decide only (from_state's ``serving``)
        self._serving_running: tuple[str, ...] = ()  # such a view's running challengers
        self._risk = RiskEstimate()
        self._explore_left = self.explore_start
        self._explored = 0
        self._floor = self.explore_floor
        self._labels = 0
        self._changes = 0
        self._takeovers = 0
        self._last_change: int | None = None
        self._least_p = 1.0
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

    @property
    def takes_rows(self) -> bool:
        """Whether the champion learns each input as the entries it sets."""
        return bool(getattr(self.champion, "takes_rows", False))

    def finite(self) -> bool:
        """Whether the champion's parameters are finite."""
        check = getattr(self.champion, "finite", None)
        return True if check is None else bool(check())

    def weight_norm(self) -> float:
        return float(self.champion.weight_norm())

    # -- what it has seen --------------------------------------------------------------
    @property
    def labels(self) -> int:
        """Labels learned from."""
        return self._labels

    @property
    def changes_detected(self) -> int:
        """Changes detected (rising errors, or a collapse)."""
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
        takeover (a copy: ``.risk``, ``.interval()``)."""
        return RiskEstimate.from_state(self._risk.to_state())

    @property
    def exploring(self) -> bool:
        """Whether utilities are floored now (the start, or just after a change)."""
        return self._explore_left > 0 and self._floor > 0.0

    @property
    def explore_decisions(self) -> int:
        """The most decisions the floor in force raises the query probability for
        (``explore_events``, or ``ceil(labels / floor)``; 0 when none is in force)."""
        if self._floor <= 0.0:
            return 0
        if self.explore_events is not None:
            return self.explore_events
        labels = self.explore_start if self._last_change is None else self.explore_after
        return math.ceil(labels / self._floor)

    @property
    def explored(self) -> int:
        """Decisions scored under the floor in force so far."""
        return self._explored

    def _floored_decisions(self, m: int) -> int:
        """How many of the next ``m`` decisions the floor raises; counts them."""
        if not self.exploring:
            return 0
        k = min(max(self.explore_decisions - self._explored, 0), m)
        self._explored += k
        return k

    def continue_from(self, previous: Any) -> None:
        """Keep counting the decisions of ``previous``, an earlier version of this model
        that scored where this one will (a stream worker swapping versions), when both are
        under the same floor (the same changes detected): versions written by the label
        path never decide, so their count is the label path's, not the scorer's."""
        if isinstance(previous, Adaptive) and previous._changes == self._changes:
            self._explored = max(self._explored, previous._explored)

    @property
    def running(self) -> tuple[str, ...]:
        """Kinds of the challengers running now (a model read to serve: as its record
        names them)."""
        if self._serving:
            return self._serving_running
        return tuple(c.kind for c in self._contest.running)

    # -- deciding ----------------------------------------------------------------------
    def query_utility(self, f: Any) -> Any:
        """The champion's utility of scores ``f``, floored while exploring."""
        u = self.champion.query_utility(f)
        if not self.exploring:
            return u
        if isinstance(u, np.ndarray):
            return np.maximum(u, self._floor)
        return max(float(u), self._floor)

    def decide(self, x: Any, coin: float | None = None) -> Decision:
        """The champion's label and score; the query probability is the champion's, floored
        while exploring, for at most :attr:`explore_decisions` decisions (counted).
        ``coin`` decides the query (``coin < p``); without it the wrapper's own generator
        draws one when ``0 < p < 1``."""
        if coin is not None:
            coin = check_coin(coin)
        d = self.champion.decide(x, coin=0.0)  # a fixed coin: the champion's generator rests
        p = d.query_probability
        if self._floored_decisions(1):
            p = max(p, self._floor)
        return Decision(d.label, d.score, d.rho, draw_query(p, coin, self._rng), p)

    def decide_many(
        self, X: Any, coins: Any = None
    ) -> tuple[npt.NDArray[np.int8], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """:meth:`decide` for the rows of ``X``, in order: ``(labels, scores,
        query_probabilities, queries)``; the floor raises the first rows the decisions left
        under it allow."""
        m = np.shape(X)[0] if np.ndim(X) == 2 else -1
        labels, scores, probs, _ = self.champion.decide_many(X, coins=np.zeros(max(m, 0)))
        return self._floored(labels, scores, probs, coins)

    def decide_scores(
        self, scores: FloatArray, coins: Any = None
    ) -> tuple[npt.NDArray[np.int8], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """:meth:`decide_many` of rows whose champion's scores are ``scores`` (a linear
        champion's :meth:`~service.learning.linear.learner.LinearLearner.decide_scores`)."""
        labels, scores, probs, _ = self.champion.decide_scores(scores, np.zeros(len(scores)))
        return self._floored(labels, scores, probs, coins)

    def _floored(
        self, labels: Any, scores: Any, probs: Any, coins: Any
    ) -> tuple[npt.NDArray[np.int8], FloatArray, FloatArray, npt.NDArray[np.bool_]]:
        """The champion's decisions with the exploration floor, queries drawn by ``coins``."""
        probs = np.array(probs, dtype=np.float64)
        k = self._floored_decisions(probs.shape[0])
        if k:
            probs[:k] = np.maximum(probs[:k], self._floor)
        return labels, scores, probs, draw_queries(probs, coins, self._rng)

    # -- learning ----------------------------------------------------------------------
    def _loss(self, learner: Any, x: FloatArray | SparseRow, y: float) -> float:
        f = float(learner.decide(x, coin=0.0).score)
        return float(zero_d_one_loss(y * f, float(learner.rho), self.cost))

    def update(
        self,
        x: Any,
        y: Any,
        *,
        query_probability: float = 1.0,
        max_weight: float | None = None,
        weight: float = 1.0,
    ) -> bool:
        """Learn the label ``y`` of ``x``, asked with probability ``query_probability``.

        The champion (and any challenger) is first tested on it, then learns from it; the
        detector reads the champion's error; a change starts the challengers, and one
        that passes the test becomes the champion. Returns whether the champion's
        parameters moved. ``max_weight`` caps the label's importance weight $1/p$ (the
        stream's cap for the model; default: the cap the model has, 100 at first);
        ``weight`` (a linear learner's importance weight, for a shadow that learns from
        its champion's labels) is passed to the learners' steps. Bad input raises an
        :class:`~service.learning.errors.InputError` and changes nothing.
        """
        self._refuse_if_serving("learn")
        z = self._input(x)
        yv = check_label(y)
        p = _probability(query_probability)
        if max_weight is not None and max_weight != self._risk.max_weight:
            self._risk = _recapped(self._risk, max_weight)
        step: dict[str, float] = {} if weight == 1.0 else {"weight": float(weight)}
        decided = self.champion.decide(z, coin=0.0)
        loss = float(zero_d_one_loss(yv * decided.score, decided.rho, self.cost))
        losses = [self._loss(c.learner, z, yv) for c in self._contest.running]
        self._recall.snapshot(self._labels, self.champion)
        self._recall.before(self.champion, z)
        moved = bool(self.champion.update(z, yv, **step))  # refuses bad input before a change
        weight = importance_weight(p, self._risk.max_weight)
        self._contest.score(loss, losses, weight)
        for c in self._contest.running:
            c.learner.update(z, yv, **step)
        if self._contest:
            self._contest.new_labels += 1
        self._recall.remember(self._labels, z, yv, p, loss)
        self._labels += 1
        self._risk.add(loss, p)
        if self._explore_left > 0:
            self._explore_left -= 1
        wrong = float(yv * decided.score < 0.0)
        back = self._changed(wrong if self.signal == "error" else loss, p, decided)
        if back is not None:
            self._start_change(back)
        self._maybe_take_over()
        return moved

    def _changed(self, signal: float, p: float, decided: Decision) -> int | None:
        """Feed the detectors and the collapse watch; at a change, how many labels ago it
        began by the detector that saw it (0 for a collapse), else ``None``."""
        back: int | None = None
        plain = self.detector
        if plain is not None and plain.update(signal) and getattr(plain, "rising", True):
            back = int(getattr(plain, "recent", 0))
        twin = self.weighted_detector
        if twin is not None:
            p = max(p, 1.0 / self._risk.max_weight)
            self._least_p = min(self._least_p, p)
            if twin.update(signal * self._least_p / p) and getattr(twin, "rising", True):
                back = max(back or 0, int(getattr(twin, "recent", 0)))
        if self._watch is not None:
            before = self._watch.status().windows
            self._watch.observe(decided.label, decided.rho)
            status = self._watch.status()
            if back is None and status.windows > before and status.collapsed:
                back = 0
        return back

    def _input(self, x: Any) -> FloatArray | SparseRow:
        """``x`` as the champion takes it: its row when it learns rows."""
        if getattr(self.champion, "takes_rows", False):
            return as_input(x, self.n_features)
        return features(x, self.n_features)

    def _start_change(self, back: int) -> None:
        self._changes += 1
        self._last_change = self._labels
        self._explore_left = self.explore_after
        self._explored = 0
        self._floor = self.after_floor
        self._risk = RiskEstimate(max_weight=self._risk.max_weight)
        if self._taking_back():
            self._contest = Contest()  # a change: the challengers of a change instead
        if self._contest or not self.challengers:
            return
        change = self._labels - back
        _, w, rho, since = self._recall.since(change, _weights_now(self.champion))
        champion = self.champion
        built = [(k, challenger_for(champion, k, rho=rho, w=w)) for k in self.challengers]
        self._contest = Contest([Challenger(k, c) for k, c in built if c is not None])
        for n, z, y, p, loss in since:  # as if the challengers had started at the change
            if n < change:  # between the snapshot and the change: the old concept still
                continue
            losses = [self._loss(c.learner, z, y) for c in self._contest.running]
            self._contest.score(loss, losses, importance_weight(p, self._risk.max_weight))
            for c in self._contest.running:
                c.learner.update(z, y)

    def _taking_back(self) -> bool:
        """Whether the contest running is the one after a takeover (the champion replaced)."""
        running = self._contest.running
        return len(running) == 1 and running[0].kind == PREVIOUS

    def _maybe_take_over(self) -> None:
        contest = self._contest
        if not contest:
            return
        best = contest.winner(self.z, self.test) if contest.new_labels >= self.min_labels else None
        if best is None:
            if contest.running[0].record.n >= self.patience:
                self._contest = Contest()
            return
        previous, back = self.champion, best.kind == PREVIOUS
        self.champion, self.champion_origin = best.learner, best.kind
        # the champion it replaced stays in a contest of its own, so that a takeover the
        # labels after it prove wrong is taken back (a detector sees no change in a champion
        # wrong from its first label); a champion taken back is not challenged so again
        take_back = self.take_back and not back
        self._contest = Contest([Challenger(PREVIOUS, previous)] if take_back else None)
        self._takeovers += 1
        self._risk = RiskEstimate(max_weight=self._risk.max_weight)
        self._recall.clear()
        if self.detector is not None:
            self.detector = _twin(self.detector)
        if self.weighted_detector is not None:
            self.weighted_detector = _twin(self.weighted_detector)
        if self._watch is not None:
            self._watch = CollapseWatch(window=self.collapse_window)

    # -- state -------------------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """Hyperparameters as JSON-safe values (the detector's are in its own record)."""
        params = {name: getattr(self, name) for name in self.param_names}
        params["challengers"] = list(self.challengers)
        return params

    def to_state(self) -> dict[str, Any]:
        """One versioned, JSON-safe record: parameters, champion, challengers, detector,
        collapse watch, what the model remembers and what it has counted."""
        self._refuse_if_serving("write its state")
        champion = self.champion.to_state()
        return {
            "format": ADAPTIVE_FORMAT,
            "version": st.VERSION,
            "params": self.get_params(),
            "champion": champion,
            "champion_origin": self.champion_origin,
            "contest": self._contest.to_state(base_for(self.champion, champion)),
            "detector": None if self.detector is None else self.detector.to_state(),
            "weighted_detector": (
                None if self.weighted_detector is None else self.weighted_detector.to_state()
            ),
            "collapse_watch": None if self._watch is None else self._watch.to_state(),
            "recall": self._recall.to_state(_weights_now(self.champion)),
            "learned": {
                "labels": self._labels,
                "changes": self._changes,
                "takeovers": self._takeovers,
                "last_change": self._last_change,
                "explore_left": self._explore_left,
                "explored": self._explored,
                "floor": self._floor,
                "least_p": self._least_p,
                "risk": self._risk.to_state(),
                "rng": st.rng_state(self._rng),
            },
        }

    def _refuse_if_serving(self, what: str) -> None:
        if self._serving:
            raise LearningError(
                f"a model read to serve cannot {what}: its challengers and what it remembers "
                "were not read (read its state without serving=True)"
            )

    @classmethod
    def from_state(cls, state: Any, *, serving: bool = False) -> Adaptive:
        """Rebuild from :meth:`to_state` output (the same decisions and the same future).

        ``serving``: read what deciding needs alone (what a scorer serves): the champion,
        the exploration and the counts, not the challengers of a running contest nor the
        labels and snapshots it remembers (a wide model's most numbers; their records must
        still be objects). Such a model decides as the whole one does, and refuses to
        learn or to write its state."""
        record = st.read_record(state, ADAPTIVE_FORMAT)
        params = dict(st.read_mapping(record, "params"))
        unknown = set(params) - set(cls.param_names)
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
        _restore(model, record, serving=serving)
        model._serving = serving
        return model

    def __repr__(self) -> str:
        return (
            f"Adaptive({self.champion!r}, origin={self.champion_origin!r}, "
            f"changes={self._changes}, takeovers={self._takeovers}, running={self.running})"
        )


def _twin(detector: ADWIN | PageHinkley | None) -> ADWIN | PageHinkley | None:
    """A fresh detector of the same kind and parameters (``None`` for none)."""
    return None if detector is None else type(detector)(**detector.get_params())


def _recapped(risk: RiskEstimate, max_weight: float) -> RiskEstimate:
    """``risk`` with its sums kept and its cap of importance weights changed."""
    record = risk.to_state()
    return RiskEstimate.from_state(
        {**record, "params": {**record["params"], "max_weight": max_weight}}
    )


def _running_kinds(contest: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The kinds of the challengers a contest record runs: a whole record's challengers, or
    a served record's ``running`` (:func:`~.parts.serving_state`)."""
    if contest is None:
        return ()
    listed = contest.get("running")
    if listed is None:
        listed = [
            c.get("kind") if isinstance(c, Mapping) else None
            for c in contest.get("challengers") or ()
        ]
    kinds = (*CHALLENGER_KINDS, PREVIOUS)
    if (
        not isinstance(listed, list)
        or len(listed) > len(kinds)
        or not all(k in kinds for k in listed)
    ):
        raise StateError(f"adaptive state: the running challengers are not kinds of {kinds}")
    return tuple(str(k) for k in listed)


def _restore(model: Adaptive, record: Any, *, serving: bool = False) -> None:
    """Fill a freshly built model with what its record says it learned (``serving``: all
    but its contest and recall, which stay empty)."""
    origin = record.get("champion_origin")
    if origin not in ("initial", *CHALLENGER_KINDS, PREVIOUS):
        raise StateError(f"adaptive state field 'champion_origin' is invalid: {origin!r}")
    model.champion_origin = str(origin)
    contest, recall = record.get("contest"), record.get("recall")
    if serving:
        if not isinstance(contest, Mapping | None) or not isinstance(recall, Mapping):
            raise StateError("adaptive state fields 'contest' and 'recall' must be objects")
        model._serving_running = _running_kinds(contest)
    else:
        if isinstance(contest, Mapping) and "running" in contest:
            raise StateError(
                "adaptive state: a record read to serve (its challengers and recall left "
                "out) cannot be learned on"
            )
        running = isinstance(contest, Mapping) and contest.get("challengers")
        base = base_for(model.champion) if running else (None, None)
        model._contest = Contest.from_state(contest, base)
    watch = record.get("collapse_watch")
    if (watch is None) != (model._watch is None):
        raise StateError("adaptive state: the collapse watch does not fit collapse_window")
    if watch is not None:
        model._watch = CollapseWatch.from_state(watch)
    if not serving:
        model._recall = Recall.from_state(
            model.memory,
            recall,
            model.n_features,
            _weights_now(model.champion),
            rows=getattr(model.champion, "takes_rows", False),
        )
    learned = st.read_mapping(record, "learned")
    model._labels = st.read_int(learned, "labels")
    model._changes = st.read_int(learned, "changes")
    model._takeovers = st.read_int(learned, "takeovers")
    last = learned.get("last_change")
    model._last_change = None if last is None else st.read_int(learned, "last_change")
    model._explore_left = st.read_int(learned, "explore_left")
    model._explored = st.read_int(learned, "explored") if "explored" in learned else 0
    model._floor = st.read_float(learned, "floor", minimum=0.0)
    if "least_p" in learned:  # absent in a record written before the weighted detector
        model._least_p = st.read_float(learned, "least_p", minimum=1e-12)
        if model._least_p > 1.0:
            raise StateError("adaptive state field 'least_p' must be at most 1")
    twin = record.get("weighted_detector")
    if (twin is not None) and model.weighted_detector is None:
        raise StateError("adaptive state: a weighted detector without weighted and a detector")
    if twin is not None:
        model.weighted_detector = detector_from_state(twin)
    model._risk = RiskEstimate.from_state(learned.get("risk"))
    model._rng = st.rng_from_state(learned.get("rng"))


def _weights_now(learner: Any) -> Any:
    """``learner``'s weights to be read at once and not kept (a linear learner's own
    array, not lent: its next label need not copy it); None for a kernel learner."""
    peek = getattr(learner, "peek", None)
    return peek()[0] if callable(peek) else getattr(learner, "w", None)
