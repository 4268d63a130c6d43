r"""Rows that set few of a model's inputs, as the entries they set.

A declared model's event sets a few dozen or a few hundred of its inputs (its numbers and
the buckets its keys hash to) out of thousands. :class:`SparseRows` holds a batch of such
rows as the entries each sets, as the encoder gave them (compressed rows: a column may
repeat within a row, its values add; neither sorted nor merged, which would cost more than
scoring them). :class:`~service.learning.sparse_scoring.SparseScorer` scores them in
proportion to the entries, and :meth:`SparseRows.head` gives the numbers a scorer gathers
the moments of. A learner takes one input as a :class:`SparseRow`, whose entries are
canonical (sorted, each once).

>>> rows = SparseRows.of([(np.array([3, 0, 3]), np.array([1.0, 2.0, 1.0])),
...                       (np.array([1]), np.array([5.0]))], width=4)
>>> rows.indptr.tolist(), rows.indices.tolist(), rows.values.tolist()
([0, 3, 4], [3, 0, 3, 1], [1.0, 2.0, 1.0, 5.0])
>>> rows.toarray().tolist()
[[2.0, 0.0, 0.0, 2.0], [0.0, 5.0, 0.0, 0.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from .base import features
from .errors import DimensionError
from .losses import FloatArray

__all__ = ["SPARSE_FROM", "IntArray", "SparseRow", "SparseRows", "as_input"]

IntArray = npt.NDArray[np.int64]

SPARSE_FROM: Final = 1024
"""Learners of at least this many inputs learn each input as the entries it sets
(:class:`SparseRow`): a label then costs in proportion to what its event sets, not to the
model's width."""


class SparseRow:
    r"""One input of ``width`` numbers as the entries that are not zero: ``indices``
    increasing, each once, ``values`` beside them, never 0.0 or -0.0 (the *canonical* form:
    a row made from its whole vector and one made from the entries an event sets are the
    same row, bit for bit, so every path a label takes learns the same numbers). Never
    changed.

    A learner of at least :data:`SPARSE_FROM` inputs takes any input as its row: its score
    is the sum of its entries' products with the weights, in the order of the entries, and
    a label moves the weights, sums and statistics of those entries alone.

    >>> row = SparseRow.of([5, 1, 5, 2], [1.0, 2.0, 1.0, 0.0], width=8)
    >>> row.indices.tolist(), row.values.tolist()
    ([1, 5], [2.0, 2.0])
    >>> row == SparseRow.dense(row.toarray()), row.dot(np.arange(8.0))
    (True, 12.0)
    """

    __slots__ = ("indices", "values", "width")

    def __init__(self, indices: IntArray, values: FloatArray, width: int) -> None:
        self.indices = indices
        self.values = values
        self.width = width

    @classmethod
    def of(cls, indices: Any, values: Any, width: int) -> SparseRow:
        """The row of entries ``indices`` and ``values`` (a repeated index's values add, in
        the order given, from +0.0, as ``np.bincount`` makes the whole vector)."""
        idx, val = _entries(
            np.asarray(indices, dtype=np.int64), np.asarray(values, dtype=np.float64), width
        )
        return cls._nonzero(idx, val, width)

    @classmethod
    def dense(cls, x: FloatArray) -> SparseRow:
        """The row of the whole vector ``x``."""
        at = np.flatnonzero(x)
        return cls(at, x[at], x.shape[0])

    @classmethod
    def _nonzero(cls, idx: IntArray, val: FloatArray, width: int) -> SparseRow:
        kept = val != 0.0
        if not kept.all():
            idx, val = idx[kept], val[kept]
        return cls(idx, val, width)

    def dot(self, w: FloatArray) -> float:
        """The score ``w . x`` (the entries' products added in their order)."""
        return float(w[self.indices].dot(self.values))

    def toarray(self) -> FloatArray:
        """The whole vector."""
        out = np.zeros(self.width)
        out[self.indices] = self.values
        return out

    def __len__(self) -> int:
        return self.width

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SparseRow):
            return NotImplemented
        return (
            self.width == other.width
            and np.array_equal(self.indices, other.indices)
            and np.array_equal(self.values.view(np.int64), other.values.view(np.int64))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SparseRow(width={self.width}, entries={self.indices.size})"


def as_input(x: Any, n_features: int) -> FloatArray | SparseRow:
    """``x`` as a learner of ``n_features`` inputs takes it: a :class:`SparseRow` from
    :data:`SPARSE_FROM` inputs on (made from a whole vector when given one), else the
    whole vector (:func:`~service.learning.base.features`)."""
    if type(x) is SparseRow:
        if x.width != n_features:
            raise DimensionError(f"a row of {x.width} inputs, not {n_features}")
        return x
    x = features(x, n_features)
    return SparseRow.dense(x) if n_features >= SPARSE_FROM else x


class SparseRows:
    """A batch of rows of ``width`` columns as the entries each sets (see the module
    docstring): row ``r`` adds ``values[indptr[r]:indptr[r + 1]]`` at the columns
    ``indices[indptr[r]:indptr[r + 1]]`` beside them (a column may repeat). Built by
    :meth:`of`; never changed."""

    __slots__ = ("_rows", "indices", "indptr", "values", "width")

    def __init__(self, indptr: IntArray, indices: IntArray, values: FloatArray, width: int):
        self.indptr = indptr
        self.indices = indices
        self.values = values
        self.width = width
        self._rows: IntArray | None = None

    @classmethod
    def of(cls, entries: Sequence[tuple[Any, Any]], width: int) -> SparseRows:
        """The rows of ``entries`` (per row: its columns and their values, as given; a
        column may repeat: its values add). Columns must lie in ``[0, width)``."""
        n = len(entries)
        lengths = np.fromiter((len(i) for i, _ in entries), dtype=np.int64, count=n)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        if not n or not indptr[-1]:
            return cls(indptr, _EMPTY_INT, _EMPTY, width)
        idx = np.concatenate([np.asarray(i, dtype=np.int64) for i, _ in entries])
        val = np.concatenate([np.asarray(v, dtype=np.float64) for _, v in entries])
        _columns(idx, width)
        return cls(indptr, idx, val, width)

    def __len__(self) -> int:
        return len(self.indptr) - 1

    @property
    def rows(self) -> IntArray:
        """The row of each entry."""
        if self._rows is None:
            self._rows = np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.indptr))
        return self._rows

    def row(self, r: int) -> tuple[IntArray, FloatArray]:
        """Row ``r``'s columns and values (views)."""
        a, b = int(self.indptr[r]), int(self.indptr[r + 1])
        return self.indices[a:b], self.values[a:b]

    def take(self, rows: Sequence[int] | IntArray) -> SparseRows:
        """The rows ``rows``, in that order."""
        parts = [self.row(int(r)) for r in rows]
        lengths = np.fromiter((len(i) for i, _ in parts), dtype=np.int64, count=len(parts))
        indptr = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        if not parts or not indptr[-1]:
            return SparseRows(indptr, _EMPTY_INT, _EMPTY, self.width)
        indices = np.concatenate([i for i, _ in parts])
        values = np.concatenate([v for _, v in parts])
        return SparseRows(indptr, indices, values, self.width)

    def toarray(self, rows: Sequence[int] | IntArray | None = None) -> FloatArray:
        """The rows (all, or ``rows`` in that order) as a dense matrix of ``width`` columns."""
        part = self if rows is None else self.take(rows)
        return part._summed(part.rows, part.indices, part.values, self.width)

    def head(self, k: int) -> FloatArray:
        """The first ``k`` columns of every row as a dense matrix (a declared model's
        numbers), in proportion to the entries there.

        >>> SparseRows.of([([0, 3], [2.0, 1.0]), ([1], [5.0])], width=4).head(2).tolist()
        [[2.0, 0.0], [0.0, 5.0]]
        """
        there = self.indices < k
        return self._summed(self.rows[there], self.indices[there], self.values[there], k)

    def _summed(self, rows: IntArray, columns: IntArray, values: FloatArray, k: int) -> FloatArray:
        """A matrix of ``k`` columns per row, each cell the sum of its entries in their
        order from +0.0 (as ``np.bincount`` makes one row whole, bit for bit)."""
        n = len(self)
        if not values.size:
            return np.zeros((n, k))
        out = np.bincount(rows * k + columns, weights=values, minlength=n * k)
        return out.astype(np.float64, copy=False).reshape(n, k)

    def __repr__(self) -> str:
        return f"SparseRows({len(self)} rows, width={self.width}, entries={self.indices.size})"


def _sorted(keys: IntArray, val: FloatArray) -> tuple[IntArray, FloatArray]:
    """``keys`` in increasing order and ``val`` beside them, equal keys in the order given
    (a stable sort; as one sort of each key with its place in its low bits when both fit
    in 62 bits, twice as fast as numpy's stable argsort).

    >>> k, v = _sorted(np.array([5, 1, 5, 0]), np.array([1.0, 2.0, 3.0, 4.0]))
    >>> k.tolist(), v.tolist()
    ([0, 1, 5, 5], [4.0, 2.0, 1.0, 3.0])
    """
    places = keys.size
    low = max(1, (places - 1).bit_length())
    if (int(keys.max()) + 1).bit_length() + low <= 62:
        packed = (keys << low) | np.arange(places, dtype=np.int64)
        packed.sort()
        order = packed & ((1 << low) - 1)
        return packed >> low, val[order]
    order = np.argsort(keys, kind="stable")
    return keys[order], val[order]


def _columns(idx: IntArray, width: int) -> None:
    """:class:`DimensionError` when a column of ``idx`` lies outside ``[0, width)``."""
    if idx.size and not (int(idx.min()) >= 0 and int(idx.max()) < width):
        raise DimensionError(f"a column outside [0, {width})")


def _merged(keys: IntArray, val: FloatArray) -> tuple[IntArray, FloatArray]:
    """Sorted ``keys`` (not empty) each once, the values of equal keys summed in order
    from +0.0, as ``np.bincount`` sums them (``np.add.reduceat`` adds the first to the
    rest); ``val`` a new array, written in place."""
    first = np.empty(keys.size, dtype=bool)
    first[0] = True
    np.not_equal(keys[1:], keys[:-1], out=first[1:])
    if not first.all():
        segment = np.cumsum(first) - 1
        val = np.bincount(segment, weights=val).astype(np.float64, copy=False)
        keys = keys[first]
    val += 0.0  # a sum starts at +0.0 (as np.bincount's): a lone -0.0 is 0.0
    return keys, val


def _entries(idx: IntArray, val: FloatArray, width: int) -> tuple[IntArray, FloatArray]:
    """One row's entries in the canonical form of a :class:`SparseRow` (columns increasing,
    each once, repeats summed in order from +0.0)."""
    if not idx.size:
        return _EMPTY_INT, _EMPTY
    _columns(idx, width)
    return _merged(*_sorted(idx, val))


_EMPTY: FloatArray = np.zeros(0)
_EMPTY_INT: IntArray = np.zeros(0, dtype=np.int64)
