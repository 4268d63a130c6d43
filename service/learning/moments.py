r"""Per-feature moments of a set of rows that merge exactly: what a scorer learns from every
event it scores, and what a standardiser takes in.

A :class:`Moments` holds the count $n$, the mean $\mu$ and the sum of squared deviations
$M_2 = \sum (x - \mu)^2$ of each feature. Two sets $A$ and $B$ merge without their rows
(Chan, Golub & LeVeque, 1979): with $n = n_A + n_B$ and $\delta = \mu_B - \mu_A$,

.. math::

    \mu = \mu_A + \delta\, \frac{n_B}{n}, \qquad
    M_2 = M_{2,A} + M_{2,B} + \delta^2\, \frac{n_A n_B}{n},

so moments gathered by several scorers, in batches, merge into the moments of all their
events, in any order. :meth:`Moments.add_many` takes a batch of rows (its own moments by
numpy, then the merge); :meth:`Moments.take` hands the moments over and starts afresh (a
scorer attaches them to its next label request); :meth:`Moments.to_record` and
:meth:`Moments.from_record` are the JSON-safe form, read back as untrusted input.

>>> a, b = Moments(1), Moments(1)
>>> a.add_many([[1.0], [2.0]]); b.add_many([[3.0], [4.0]])
>>> a.merge(b)
>>> a.count, a.mean.tolist(), a.m2.tolist()                  # of 1, 2, 3, 4
(4, [2.5], [5.0])
>>> Moments.from_record(a.to_record(), 1).mean.tolist()
[2.5]

A record read from a topic is untrusted twice over: :meth:`Moments.from_record` checks that
it is moments at all, :func:`implausible` that no scorer could have gathered it from events
like those the statistics rest on. For a record of $c$ rows (its claimed count) against
statistics of $n$ rows with mean $\hat\mu_j$ and standard deviation $\hat s_j$, feature $j$
is implausible when

.. math::

    |\mu_j - \hat\mu_j| > \hat s_j \left(K \sqrt{1/c + 1/\sqrt n} + D\right)
    \quad\text{or}\quad
    M_{2,j} / c > V \hat s_j^2 \left(1 + K \sqrt{2/c + 2/\sqrt n}\right),

with $K$ = :data:`GATE_SIGMAS` (5 standard errors of sampling between the record and the
statistics; the statistics count as $\sqrt n$ rows, since a stream's events come in runs
(a day, a cycle) and $n$ of them say less than $n$ independent draws), $D$ =
:data:`GATE_DRIFT` (3 standard deviations of drift: the newest events of a feature that
grows steadily lie $\sqrt 3$ of them ahead of all the events so far) and $V$ =
:data:`GATE_SPREAD` (a variance up to 9 times the statistics'). One event may lie about 8
standard deviations out; a record claiming many rows little more than $D$, however many it
claims. Features the statistics hold constant (standard deviation at most ``min_std``) are
not judged: there is no scale to judge them by.

A record that passes counts for $w \le 100$ rows, and :func:`merge_step` bounds how far it
moves the statistics: the mean of each judged feature by at most
$a = B \sqrt{w / (n (n + w))}$ standard deviations and its variance by at most a factor
$e^{\pm b}$, $b = B (\sqrt{2w} + 1) / (n + w)$, with $B$ = :data:`STEP_SIGMAS` (3): three
times how far the rows of a real record move them (the sampling error of a mean of $w$
rows merged into $n$, of their variance likewise). A series of records that each lie just
inside the bounds moves the statistics by a sum of such steps, which shrink as the
statistics rest on more rows: with $n$ = 10,000, thirty records of 100 rows move a mean
by at most 0.09 standard deviations and a variance by a factor of at most 1.14. The price:
a feature that drifts faster than that (one that grows without end, such as a timestamp)
falls behind and its records are then refused; a cycle (a time of day) comes back.

>>> seen = Moments(1); seen.add_many([[1.0], [2.0], [3.0], [4.0]])
>>> lie = Moments.from_record({"count": 10**9, "mean": [40.0], "m2": [10**9]}, 1)
>>> verdict = implausible(lie, 4, seen.mean, np.sqrt(seen.m2 / seen.count))
>>> verdict.kind, verdict.feature
('mean', 0)
>>> verdict.detail
'feature 0: mean 40 is 33.5 sd from 2.5 (at most 6.5 for 1000000000 rows)'
>>> implausible(seen, 4, seen.mean, np.sqrt(seen.m2 / seen.count)) is None
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np

from .base import check_int, features_matrix, quiet
from .errors import InputError
from .losses import FloatArray

__all__ = [
    "GATE_DRIFT",
    "GATE_SIGMAS",
    "GATE_SPREAD",
    "MAX_MAGNITUDE",
    "STEP_SIGMAS",
    "Implausible",
    "Moments",
    "bounds",
    "implausible",
    "merge_step",
]

MAX_MAGNITUDE: Final = 1e100
"""The largest mean (and square root of a variance) a moments record may carry; beyond it
the record is refused (the squares of such values would overflow)."""

GATE_SIGMAS: Final = 5.0
"""$K$ of :func:`implausible`: standard errors of sampling allowed between a record and the
statistics."""
GATE_DRIFT: Final = 3.0
"""$D$ of :func:`implausible`: standard deviations of drift allowed between a record's mean
and the statistics', however many rows the record claims."""
GATE_SPREAD: Final = 9.0
"""$V$ of :func:`implausible`: how many times the statistics' variance a record's may be
(before its sampling error)."""
STEP_SIGMAS: Final = 3.0
"""$B$ of :func:`merge_step`: how many times its sampling error one record may move the
statistics."""


class Moments:
    """Count, per-feature mean and sum of squared deviations of the rows added so far.

    Rows with a feature of magnitude above :data:`MAX_MAGNITUDE` (or NaN, or infinite) are
    left out of :meth:`add_many`: their squares would not be finite.
    """

    __slots__ = ("_n", "count", "m2", "mean")

    def __init__(self, n_features: int) -> None:
        self._n = check_int("n_features", n_features, 1)
        self.count = 0
        self.mean: FloatArray = np.zeros(self._n)
        self.m2: FloatArray = np.zeros(self._n)

    @property
    def n_features(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self.count > 0

    @quiet
    def add_many(self, X: Any) -> None:
        """Add the rows of ``X`` (the finite ones of sane magnitude)."""
        X = features_matrix(X, self._n)
        if X.shape[0] == 0:
            return
        ok = (np.abs(X) <= MAX_MAGNITUDE).all(axis=1)  # False for NaN too
        if not ok.all():
            X = X[ok]
            if X.shape[0] == 0:
                return
        mean = X.mean(axis=0)
        d = X - mean
        self._merge(X.shape[0], mean, np.einsum("ij,ij->j", d, d))

    def merge(self, other: Moments) -> None:
        """Add the rows ``other`` holds (it is not changed)."""
        if other.n_features != self._n:
            raise InputError(f"moments of {other.n_features} features, not {self._n}")
        if other.count:
            self._merge(other.count, other.mean, other.m2)

    def _merge(self, count: int, mean: FloatArray, m2: FloatArray) -> None:
        n = self.count + count
        delta = mean - self.mean
        self.m2 = self.m2 + m2 + delta * delta * (self.count * count / n)
        self.mean = self.mean + delta * (count / n)
        self.count = n

    def take(self) -> Moments:
        """The moments gathered so far; this object starts afresh."""
        out = Moments(self._n)
        out.count, out.mean, out.m2 = self.count, self.mean, self.m2
        self.count, self.mean, self.m2 = 0, np.zeros(self._n), np.zeros(self._n)
        return out

    def padded(self, n_features: int) -> Moments:
        """These moments followed by those of features that held only zeros, to
        ``n_features`` in all (a new object).

        >>> m = Moments(1); m.add_many([[2.0], [4.0]])
        >>> p = m.padded(3); p.count, p.mean.tolist(), p.m2.tolist()
        (2, [3.0, 0.0, 0.0], [2.0, 0.0, 0.0])
        """
        if n_features < self._n:
            raise InputError(f"cannot pad moments of {self._n} features to {n_features}")
        out = Moments(n_features)
        out.count = self.count
        out.mean[: self._n] = self.mean
        out.m2[: self._n] = self.m2
        return out

    def to_record(self) -> dict[str, Any]:
        """``{"count": n, "mean": [...], "m2": [...]}`` (JSON-safe)."""
        return {"count": self.count, "mean": self.mean.tolist(), "m2": self.m2.tolist()}

    @classmethod
    def from_record(cls, record: Any, n_features: int) -> Moments:
        """Read :meth:`to_record` output as untrusted input: a count >= 1, ``n_features``
        finite means of magnitude at most :data:`MAX_MAGNITUDE` and as many sums of
        squared deviations in ``[0, count * MAX_MAGNITUDE**2)``; anything else raises an
        :class:`~service.learning.errors.InputError` saying what is wrong.

        >>> Moments.from_record({"count": 2, "mean": [0.0], "m2": [-1.0]}, 1)
        Traceback (most recent call last):
        ...
        service.learning.errors.InputError: moments field 'm2' must hold numbers >= 0 and \
below count * 1e200
        """
        if not isinstance(record, Mapping):
            raise InputError(f"moments must be an object, got {type(record).__name__}")
        count = record.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InputError(f"moments field 'count' must be an integer >= 1, got {count!r}")
        out = cls(n_features)
        mean = _floats(record, "mean", out._n)
        m2 = _floats(record, "m2", out._n)
        if not (np.abs(mean) <= MAX_MAGNITUDE).all():
            raise InputError("moments field 'mean' must hold numbers within +-1e100")
        if not ((m2 >= 0.0).all() and (m2 < count * MAX_MAGNITUDE**2).all()):
            raise InputError("moments field 'm2' must hold numbers >= 0 and below count * 1e200")
        out.count, out.mean, out.m2 = count, mean, m2
        return out

    def __repr__(self) -> str:
        return f"Moments({self._n}, count={self.count})"


_PLAIN: Final = frozenset({int, float})


def _floats(record: Mapping[str, Any], key: str, n: int) -> FloatArray:
    value = record.get(key)
    if not isinstance(value, list) or len(value) != n:
        raise InputError(f"moments field {key!r} must be a list of {n} numbers")
    # every item a plain int or float: one pass in C; otherwise item by item (a bool is
    # refused, a subclass of int or float taken)
    if not _PLAIN.issuperset(map(type, value)) and any(
        isinstance(v, bool) or not isinstance(v, (int, float)) for v in value
    ):
        raise InputError(f"moments field {key!r} must be a list of {n} numbers")
    try:
        arr = np.array(value, dtype=np.float64)
    except OverflowError:
        raise InputError(f"moments field {key!r} holds a number beyond any float") from None
    if not np.isfinite(arr).all():
        raise InputError(f"moments field {key!r} must hold finite numbers")
    return arr


def bounds(c: int, n: int) -> tuple[float, float]:
    """The largest distance of a record's mean (in standard deviations) and the largest
    ratio of its variance to the statistics' that :func:`implausible` takes, for a record
    of ``c`` rows against statistics of ``n``.

    >>> [round(b, 2) for b in bounds(1, 100)], [round(b, 2) for b in bounds(10**9, 10**4)]
    ([8.24, 75.75], [3.5, 15.36])
    """
    rows = math.sqrt(n)
    return (
        GATE_SIGMAS * math.sqrt(1.0 / c + 1.0 / rows) + GATE_DRIFT,
        GATE_SPREAD * (1.0 + GATE_SIGMAS * math.sqrt(2.0 / c + 2.0 / rows)),
    )


@dataclass(frozen=True, slots=True)
class Implausible:
    """Why a moments record is not what a scorer could have gathered: ``kind`` ``"mean"``
    or ``"spread"``, the ``feature`` (the worst one) and a ``detail`` that names both; or
    ``"width"``: moments of other features than the model gathers (``feature`` 0)."""

    kind: Literal["mean", "spread", "width"]
    feature: int
    detail: str


def implausible(
    record: Moments, count: int, mean: FloatArray, std: FloatArray, *, min_std: float = 1e-9
) -> Implausible | None:
    """Whether ``record`` is implausible against statistics of ``count`` rows with ``mean``
    and (population) ``std`` (the rule in the module docstring); None when it is plausible,
    when it is empty, or before the statistics rest on any row. The worst feature (the
    largest excess over its bound) is named."""
    if not record.count or count < 1:
        return None
    c, judged = record.count, std > min_std
    if not judged.any():
        return None
    s = np.where(judged, std, 1.0)
    with np.errstate(all="ignore"):
        z = np.abs(record.mean - mean) / s
        ratio = record.m2 / c / (s * s)
    z_max, r_max = bounds(c, count)
    over_z = np.where(judged, z / z_max, 0.0)
    over_r = np.where(judged, ratio / r_max, 0.0)
    j_z, j_r = int(np.argmax(over_z)), int(np.argmax(over_r))
    if over_z[j_z] <= 1.0 and over_r[j_r] <= 1.0:
        return None
    if over_z[j_z] >= over_r[j_r]:
        return Implausible(
            "mean",
            j_z,
            f"feature {j_z}: mean {record.mean[j_z]:.3g} is {z[j_z]:.3g} sd from "
            f"{mean[j_z]:.3g} (at most {z_max:.2g} for {c} rows)",
        )
    return Implausible(
        "spread",
        j_r,
        f"feature {j_r}: variance {record.m2[j_r] / c:.3g} is {ratio[j_r]:.3g} times "
        f"{s[j_r] ** 2:.3g} (at most {r_max:.2g} for {c} rows)",
    )


def merge_step(rows: int, n: int) -> tuple[float, float]:
    """``(a, b)``: how far one record of ``rows`` rows merged into statistics of ``n`` may
    move each mean (``a`` standard deviations) and each variance (a factor within
    ``exp(-b)`` and ``exp(b)``); the rule in the module docstring.

    >>> [round(v, 4) for v in merge_step(100, 10_000)]
    [0.003, 0.0045]
    >>> [round(v, 3) for v in merge_step(50, 50)]
    [0.3, 0.33]
    """
    return (
        STEP_SIGMAS * math.sqrt(rows / (n * (n + rows))),
        STEP_SIGMAS * (math.sqrt(2.0 * rows) + 1.0) / (n + rows),
    )
