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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from .base import check_int, features_matrix, quiet
from .errors import InputError
from .losses import FloatArray

__all__ = ["MAX_MAGNITUDE", "Moments"]

MAX_MAGNITUDE: Final = 1e100
"""The largest mean (and square root of a variance) a moments record may carry; beyond it
the record is refused (the squares of such values would overflow)."""


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


def _floats(record: Mapping[str, Any], key: str, n: int) -> FloatArray:
    value = record.get(key)
    if not isinstance(value, list) or len(value) != n:
        raise InputError(f"moments field {key!r} must be a list of {n} numbers")
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise InputError(f"moments field {key!r} must be a list of {n} numbers")
    try:
        arr = np.array(value, dtype=np.float64)
    except OverflowError:
        raise InputError(f"moments field {key!r} holds a number beyond any float") from None
    if not np.isfinite(arr).all():
        raise InputError(f"moments field {key!r} must hold finite numbers")
    return arr
