"""Challengers of an :class:`~service.learning.adaptive.Adaptive` champion.

A challenger is a learner of the champion's class and configuration, started at a change:

* ``"fresh"`` — nothing learned yet ($w = 0$, step clock 0, the configured $\rho$);
* ``"mirror"`` — the champion with its score negated ($f \to -f$: linear weights, or a
  kernel learner's coefficients) and a given $\rho$;
* ``"tail"`` — the champion as it was at the change with the other loss: a double sigmoid
  learner's logistic ``tail`` (:func:`~service.learning.losses.double_sigmoid_loss`) switched
  on (at :data:`TAIL`) if it was off, off if it was on. The paper's loss is flat where the
  model is confidently wrong, which makes it robust to noise and slow to follow a boundary
  that keeps moving; the tail is the other way round. Which one a stream needs shows in the
  paired test, so the wrapper lets the stream choose. No such challenger for the double
  ramp learners (:func:`challenger_for` gives ``None``).

A linear learner's are built from its arrays, as the learner its state record would give
(bit for bit, in time of its width rather than a float object a weight); any other
learner's through its state record, so any learner of this package works.
A :class:`Challenger` also keeps its paired record against the champion: the sum and the
sum of squares of the (importance-weighted) gains, the champion's loss minus its own, on
every label since it started.

>>> from service.learning import DSAL
>>> champion = DSAL(n_features=2, cost=0.25, w=[1.0, -2.0])
>>> challenger_for(champion, "mirror").w.tolist()
[-1.0, 2.0]
>>> challenger_for(champion, "mirror", w=[3.0, 0.0], rho=0.5).w.tolist()
[-3.0, -0.0]
>>> challenger_for(champion, "fresh").w.tolist()
[0.0, 0.0]
>>> other = challenger_for(champion, "tail", w=[3.0, 0.0])
>>> other.w.tolist(), other.tail, challenger_for(other, "tail").tail
([3.0, 0.0], 2.0, 0.0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from .. import state as st
from ..errors import HyperparameterError, StateError
from ..linear.normalized import Normalizer
from ..registry import learner_from_state

__all__ = [
    "CHALLENGER_KINDS",
    "PREVIOUS",
    "MAX_AUTOCORRELATION",
    "Challenger",
    "Contest",
    "TAIL",
    "Paired",
    "challenger_for",
]

CHALLENGER_KINDS: Final = ("mirror", "fresh", "tail")
#: the champion a challenger replaced, kept in a contest of its own after the takeover
PREVIOUS: Final = "previous"
#: the logistic tail a ``"tail"`` challenger of a champion without one learns with
TAIL: Final = 2.0
#: the most the lag-1 autocorrelation of the gains counts for in the takeover test
MAX_AUTOCORRELATION: Final = 0.9
_TINY: Final = 1e-12


def challenger_for(
    learner: Any, kind: str, *, rho: float | None = None, w: Sequence[float] | None = None
) -> Any:
    """A challenger of ``kind`` for ``learner``, built through its state record (``None``:
    no challenger of that kind for this learner).

    A mirror negates ``w`` (a linear learner's weights as they were at the change; by
    default its weights now) or a kernel learner's coefficients, and takes the width
    ``rho`` (default: the learner's now). A tail challenger takes the same ``w`` and ``rho``
    unnegated, and the other loss. A fresh challenger takes the configured ones.
    """
    if kind == "fresh":
        if callable(getattr(learner, "from_arrays", None)):  # a linear learner: made anew
            cls = type(learner)
            return getattr(cls, "_from_params", cls)(**learner.get_params())
        return learner_from_state(_fresh_record(learner))
    if kind not in CHALLENGER_KINDS:
        raise HyperparameterError(f"challenger kind must be one of {CHALLENGER_KINDS}: {kind!r}")
    if kind == "tail" and not hasattr(learner, "tail"):
        return None
    if callable(getattr(learner, "from_arrays", None)):  # a linear learner: its arrays
        return _linear(learner, kind, rho=rho, w=w)
    record = learner.to_state()
    learned = dict(record["learned"])
    if "w_at" in learned:  # written as its entries: whole, to negate or replace
        del learned["w_at"], learned["w_to"]
        learned["w"] = _floats(learner.w if w is None else w)
    if w is not None:
        learned["w"] = _floats(w)
    if rho is not None:
        learned["rho"] = rho
    if kind == "tail":
        params = {**record["params"], "tail": 0.0 if learner.tail else TAIL}
        return learner_from_state({**record, "params": params, "learned": learned})
    for key in ("w", "coef"):  # linear weights, or a kernel learner's coefficients
        if key in learned:
            learned[key] = st.float_list(-_array_of(learned[key]))  # -0.0 for 0.0, as -v
    return learner_from_state({**record, "learned": learned})


def _linear(learner: Any, kind: str, *, rho: float | None, w: Any) -> Any:
    """:func:`challenger_for` a linear learner (a mirror or a tail), built from its record
    without the arrays and the arrays themselves: the learner the record of its numbers
    gives, bit for bit, in time and memory of its width instead of a float object each
    (``tests/learning/adaptive/test_challengers.py`` holds the two ways together)."""
    record = learner.to_state(arrays=False)
    mine, sums = learner.peek()
    base = mine if w is None else _array_of(w)
    if kind == "tail":
        weights = np.array(base, dtype=np.float64)
        params = {**record["params"], "tail": 0.0 if learner.tail else TAIL}
        record = {**record, "params": params}
    else:  # a mirror: -0.0 for 0.0, as -v
        weights = np.negative(np.asarray(base, dtype=np.float64))
    if rho is not None:
        record = {**record, "learned": {**record["learned"], "rho": rho}}
    return type(learner).from_arrays(record, weights, None if sums is None else sums.copy())


def _array_of(values: Any) -> npt.NDArray[np.float64]:
    """A list of floats as an array (a :class:`~service.learning.state.FloatList`'s own)."""
    if type(values) is st.FloatList and values.array is not None:
        return values.array
    return np.asarray(values, dtype=np.float64)


def _floats(values: Any) -> list[Any]:
    """Weights as a state record's list (an array's read back without a float each)."""
    if type(values) is st.FloatList:
        return values
    return st.float_list(np.array(values, dtype=np.float64))


#: what a challenger's state is written against: the champion's weights and normaliser
#: sums, as arrays (None: a kernel learner's, or none yet)
Base = tuple[Any, Any]


def base_of(champion: Mapping[str, Any]) -> Base:
    """The champion's weights and normaliser sums in its state record ``champion`` (as
    :meth:`~service.learning.linear.LinearLearner.to_state` writes it)."""
    learned = champion.get("learned")
    if not isinstance(learned, Mapping):
        return None, None
    w = _array(learned.get("w"))
    params = champion.get("params")
    if "w_at" in learned and isinstance(params, Mapping):  # written as its entries
        n = params.get("n_features")
        w = st.read_entries(learned, "w", n, "the champion's weights") if type(n) is int else None
    grads = None if w is None else Normalizer.sums_of(learned.get("normalizer"), len(w))
    return w, grads


def base_for(champion: Any, state: Mapping[str, Any] | None = None) -> Base:
    """:func:`base_of` the ``champion`` (whose state record is ``state``, made when needed),
    taken from the learner itself where it holds them (a linear learner: the same arrays,
    without reading its record back)."""
    if callable(getattr(champion, "peek", None)):  # read now, not kept
        return champion.peek()  # type: ignore[no-any-return]
    return base_of(champion.to_state() if state is None else state)


def _array(values: Any) -> Any:
    if type(values) is st.FloatList and values.array is not None:
        return values.array
    return np.asarray(values, dtype=np.float64) if isinstance(values, list) else None


def _fresh_record(learner: Any) -> dict[str, Any]:
    """The state record of ``learner``'s configuration with nothing learned yet."""
    cls = type(learner)
    build = getattr(cls, "_from_params", cls)
    out: dict[str, Any] = build(**learner.get_params()).to_state()
    return out


class Paired:
    r"""A paired record of one model against another on the same labels: per label, the
    gain (the other's 0-d-1 loss minus this one's), as it is and weighted by the label's
    importance weight ``1/p`` (whose mean estimates, without bias, how much lower this
    model's risk on the stream is).

    The test's standard error allows for gains that come in runs. On a stream whose
    labels are correlated in time (a real one: electricity prices, sensors) the gains of
    successive labels are too, and $s/\sqrt n$ understates the error of their mean: a run
    of a dozen labels the champion gets wrong looks like a dozen independent ones. With
    $\hat r$ the lag-1 autocorrelation of the gains (from the sum of the products of
    successive gains), the standard error is that of an AR(1) series,

    .. math::

        \operatorname{se} = \frac{s}{\sqrt n}\,\sqrt{\frac{1 + \hat r}{1 - \hat r}},
        \qquad \hat r \in [0, \bar r],\ \bar r = 0.9

    ($\hat r$ clipped: gains that alternate do not make the test easier, and one estimated
    from a few labels never makes it more than $\sqrt{19} \approx 4.4$ times harder). On a
    stream in random order $\hat r \approx 0$ and the test is the plain one.

    >>> runs, mixed = Paired(), Paired()
    >>> for g in [1.0] * 6 + [-1.0] * 2 + [1.0] * 6 + [-1.0] * 2:  # gains in runs
    ...     runs.add(g, 1.0)
    >>> for g in [1.0, 1.0, -1.0, 1.0] * 4:                       # the same gains, mixed
    ...     mixed.add(g, 1.0)
    >>> round(runs.mean, 3) == round(mixed.mean, 3), round(runs.autocorrelation(), 3)
    (True, 0.467)
    >>> mixed.winning(10, 2.0, "plain"), runs.winning(10, 2.0, "plain")
    (True, False)
    """

    __slots__ = ("cross", "last", "n", "squares", "total", "wsquares", "wtotal")

    def __init__(self) -> None:
        self.n, self.total, self.squares = 0, 0.0, 0.0
        self.wtotal, self.wsquares = 0.0, 0.0
        # the sum of the products of successive gains (None: a record written before it
        # was kept, whose test stays the plain one) and the last gain
        self.cross: float | None = 0.0
        self.last = 0.0

    def add(self, gain: float, weight: float) -> None:
        if self.cross is not None and self.n:
            self.cross += gain * self.last
        self.last = gain
        self.n += 1
        self.total += gain
        self.squares += gain * gain
        self.wtotal += gain * weight
        self.wsquares += (gain * weight) ** 2

    @property
    def mean(self) -> float:
        """Mean gain per label (on the labels as asked)."""
        return self.total / self.n if self.n else 0.0

    @property
    def weighted_mean(self) -> float:
        """Mean importance-weighted gain."""
        return self.wtotal / self.n if self.n else 0.0

    def autocorrelation(self) -> float:
        r"""$\hat r$, the lag-1 autocorrelation of the gains clipped to $[0, \bar r]$ (0 on
        fewer than 3 labels, gains that do not vary, or a record without products)."""
        if self.cross is None or self.n < 3:
            return 0.0
        mean = self.total / self.n
        var = self.squares / self.n - mean * mean
        if var <= _TINY:
            return 0.0
        r = (self.cross / (self.n - 1) - mean * mean) / var
        return min(max(r, 0.0), MAX_AUTOCORRELATION)

    def winning(self, min_labels: int, z: float, test: str = "both") -> bool:
        """At least ``min_labels`` labels and a mean gain above ``z`` standard errors (the
        class docstring's, which allows for runs): on the labels as asked (``"plain"``),
        importance-weighted (``"weighted"``), or on the labels as asked with a positive
        importance-weighted mean (``"both"``: the weighted gains are too noisy for a test on
        a few labels, but they keep a challenger that only wins where the labels crowd from
        winning)."""
        if self.n < min_labels:
            return False
        r = self.autocorrelation()
        z = z * math.sqrt((1.0 + r) / (1.0 - r))
        if test == "weighted":
            return _above(self.wtotal, self.wsquares, self.n, z)
        plain = _above(self.total, self.squares, self.n, z)
        if test == "plain":
            return plain
        return plain and self.wtotal > 0.0

    def to_state(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "total": self.total,
            "squares": self.squares,
            "wtotal": self.wtotal,
            "wsquares": self.wsquares,
            **({} if self.cross is None else {"cross": self.cross, "last": self.last}),
        }

    @classmethod
    def from_state(cls, record: Any) -> Paired:
        if not isinstance(record, Mapping):
            raise StateError(f"a paired record must be an object, got {record!r}")
        out = cls()
        out.n = st.read_int(record, "n")
        out.total = st.read_float(record, "total")
        out.squares = st.read_float(record, "squares", minimum=0.0)
        out.wtotal = st.read_float(record, "wtotal")
        out.wsquares = st.read_float(record, "wsquares", minimum=0.0)
        if "cross" in record:  # kept since the test allows for runs
            out.cross = st.read_float(record, "cross")
            out.last = st.read_float(record, "last")
        else:
            out.cross = None
        return out


class Challenger:
    """A challenger and its paired record against the champion since it started."""

    __slots__ = ("kind", "learner", "record")

    def __init__(self, kind: str, learner: Any, record: Paired | None = None) -> None:
        self.kind, self.learner = kind, learner
        self.record = Paired() if record is None else record

    def to_state(self, base: Base = (None, None)) -> dict[str, Any]:
        """The record of this challenger: a linear learner's weights and normaliser sums as
        those that differ from the champion's (``base``: :func:`base_of`; a mirror's weights
        from the champion's negated), whole where most differ."""
        if callable(getattr(self.learner, "peek", None)):  # a linear learner's arrays
            return self._against_base(base)
        return self._from_record(base)

    def _from_record(self, base: Base) -> dict[str, Any]:
        """:meth:`to_state` from the learner's own record (any learner)."""
        state = self.learner.to_state()
        learned = state.get("learned")
        if isinstance(learned, dict) and ("w" in learned or "w_at" in learned):
            learned = {k: v for k, v in learned.items() if k not in ("w_at", "w_to")}
            w = learned.get("w")  # whole, or (written as its own entries) the array
            mine = w if w is not None else self.learner.w
            changes = st.changes_from(mine, self._against(base[0]))
            if self.kind == "mirror" and base[0] is not None:
                flipped = st.changes_from(mine, np.negative(base[0]))
                if flipped is not None and (changes is None or len(flipped[0]) < len(changes[0])):
                    changes, learned["against"] = flipped, "negated"
            if changes is not None:
                learned.pop("w", None)
                learned["w_at"], learned["w_to"] = changes
            elif w is None:  # against the champion's only: whole
                learned["w"] = st.float_list(np.array(mine, dtype=np.float64))
            normalizer = learned.get("normalizer")
            n = 0 if base[1] is None else len(base[1])
            sums = self._sums(normalizer, n) if n else None
            if sums is not None:
                changes = st.changes_from(sums, base[1])
                if changes is not None:
                    learned["normalizer"] = {"grads_at": changes[0], "grads_to": changes[1]}
            state = {**state, "learned": learned}
        return {"kind": self.kind, "learner": state, **self.record.to_state()}

    def _against_base(self, base: Base) -> dict[str, Any]:
        """:meth:`to_state` of a linear learner, its arrays taken from the learner (the
        same record, key for key, as the general way below writes from its own record)."""
        learner = self.learner
        state = learner.to_state(arrays=False)
        mine, sums = learner.peek()
        changes = st.changes_from(mine, self._against(base[0]))
        negated = False
        if self.kind == "mirror" and base[0] is not None:
            flipped = st.changes_from(mine, np.negative(base[0]))
            if flipped is not None and (changes is None or len(flipped[0]) < len(changes[0])):
                changes, negated = flipped, True
        whole = changes is None and learner.weights_whole()
        learned: dict[str, Any] = dict(learner.weights_record()) if whole else {}
        learned.update(state["learned"])
        if sums is not None:
            n = 0 if base[1] is None else len(base[1])
            diff = st.changes_from(sums, base[1]) if n and len(sums) == n else None
            learned["normalizer"] = (
                {"grads_at": diff[0], "grads_to": diff[1]}
                if diff is not None
                else learner.sums_record()
            )
        if changes is not None:
            if negated:
                learned["against"] = "negated"
            learned["w_at"], learned["w_to"] = changes
        elif not whole:
            learned["w"] = st.float_list(np.array(mine, dtype=np.float64))
        return {
            "kind": self.kind,
            "learner": {**state, "learned": learned},
            **self.record.to_state(),
        }

    def _sums(self, record: Any, n: int) -> Any:
        """The normaliser sums its state ``record`` holds (of ``n``): the learner's own
        array where it has one (what the record was written from), else the record's."""
        if not isinstance(record, Mapping):
            return None
        sums = getattr(self.learner, "sums", None)
        if isinstance(sums, np.ndarray) and len(sums) == n:
            return sums
        return Normalizer.sums_of(record, n)

    def _against(self, w: Any) -> Any:
        """The weights this challenger's are written against: the champion's ``w``, negated
        for a mirror as 0 - w (a weight an update went past is +0.0, not -0.0), or, when
        that differs in fewer (``"against": "negated"``: a wide model's mirror keeps the
        -0.0 of each weight no label has moved since the change), each sign flipped."""
        return None if w is None else (np.subtract(0.0, w) if self.kind == "mirror" else w)

    @classmethod
    def from_state(cls, record: Any, base: Base = (None, None)) -> Challenger:
        if not isinstance(record, Mapping) or record.get("kind") not in (
            *CHALLENGER_KINDS,
            PREVIOUS,
        ):
            raise StateError(f"a challenger record needs a kind in {CHALLENGER_KINDS}")
        kind = str(record["kind"])
        state = record.get("learner")
        learned = state.get("learned") if isinstance(state, Mapping) else None
        if isinstance(learned, Mapping):
            learned = dict(learned)
            against = learned.pop("against", None)
            if against is not None and (against != "negated" or kind != "mirror"):
                raise StateError("only a mirror's weights are written against the negated")
            w = cls(kind, None)._against(base[0])
            if against is not None and base[0] is not None:
                w = np.negative(base[0])
            if "w_at" in learned:
                if "w" in learned:
                    raise StateError("a challenger's weights are written whole or as changes")
                n = 0 if w is None else len(w)
                learned["w"] = st.changed(learned, "w", w, n, "a challenger").tolist()
                del learned["w_at"], learned["w_to"]
            normalizer = learned.get("normalizer")
            if (
                isinstance(normalizer, Mapping)
                and "grads_at" in normalizer
                and "fill" not in normalizer  # written against its own prior, not the champion
            ):
                grads, n = base[1], 0 if base[1] is None else len(base[1])
                sums = st.changed(normalizer, "grads", grads, n, "a challenger's normaliser")
                learned["normalizer"] = {"grads": sums.tolist()}
            state = {**state, "learned": learned}  # type: ignore[dict-item]
        learner = learner_from_state(state)
        return cls(kind, learner, Paired.from_state(record))


def _above(total: float, squares: float, n: int, z: float) -> bool:
    mean = total / n
    spread = math.sqrt(max(squares / n - mean * mean, 0.0) / n)
    return mean > 0.0 and mean > z * spread


class Contest:
    """The challengers running against a champion: their paired records against it, one
    duel per pair of challengers (the gain of the later one over the earlier one), and the
    new labels since they started. Empty when no challenger runs."""

    __slots__ = ("duels", "new_labels", "running")

    def __init__(self, running: list[Challenger] | None = None) -> None:
        self.running: list[Challenger] = running or []
        self.duels = {(j, i): Paired() for i in range(len(self.running)) for j in range(i)}
        self.new_labels = 0

    def __bool__(self) -> bool:
        return bool(self.running)

    def score(self, champion_loss: float, losses: list[float], weight: float) -> None:
        """One label: each challenger against the champion and against those before it."""
        for i, c in enumerate(self.running):
            c.record.add(champion_loss - losses[i], weight)
            for j in range(i):
                self.duels[(j, i)].add(losses[j] - losses[i], weight)

    def winner(self, z: float, test: str) -> Challenger | None:
        """The first challenger, in order, surely better than the champion and than every
        challenger before it (see :meth:`Paired.winning`)."""
        for i, c in enumerate(self.running):
            if c.record.winning(2, z, test) and all(
                self.duels[(j, i)].winning(2, z, test) for j in range(i)
            ):
                return c
        return None

    def to_state(self, base: Base = (None, None)) -> dict[str, Any]:
        """The record of the contest, the challengers' written against ``base``."""
        return {
            "challengers": [c.to_state(base) for c in self.running],
            "duels": [{"pair": list(k), **d.to_state()} for k, d in self.duels.items()],
            "new_labels": self.new_labels,
        }

    @classmethod
    def from_state(cls, record: Any, base: Base = (None, None)) -> Contest:
        if not isinstance(record, Mapping):
            raise StateError("adaptive state field 'contest' must be an object")
        running, duels = record.get("challengers"), record.get("duels")
        if not isinstance(running, list) or not isinstance(duels, list):
            raise StateError("a contest needs lists of 'challengers' and 'duels'")
        out = cls([Challenger.from_state(c, base) for c in running])
        for d in duels:
            pair = d.get("pair") if isinstance(d, Mapping) else None
            if not (isinstance(pair, list) and len(pair) == 2 and tuple(pair) in out.duels):
                raise StateError(f"a contest holds a duel of no running pair: {pair!r}")
            out.duels[(pair[0], pair[1])] = Paired.from_state(d)
        if len(duels) != len(out.duels):
            raise StateError("a contest needs one duel per pair of challengers")
        out.new_labels = st.read_int(record, "new_labels")
        return out
