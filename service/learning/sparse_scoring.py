r"""Scores of sparse rows through a pipeline, in proportion to what the rows set.

:class:`SparseScorer` gives the scores $w \cdot T(x)$ of
:class:`~service.learning.sparse.SparseRows` through a pipeline $T$ of standardisers and
intercepts without making a row of the model's width: a column that no step centres keeps
its zeros (a standardiser maps $x$ to $(x - c)\,s$, so with $c = 0$ a zero stays zero), and
only the columns a step centres are made whole, one small matrix for the batch. Each entry
is scaled as the dense path scales its column (a column that repeats in a row, per entry),
and the sum of a score runs in another order, so a score agrees with the dense one to
rounding, and a row's score is the same, bit for bit, in any batch.

>>> from service.learning.preprocessing import Intercept, Pipeline
>>> rows = SparseRows.of([([3, 0, 3], [1.0, 2.0, 1.0]), ([1], [5.0])], width=4)
>>> scorer = SparseScorer.of(Pipeline([Intercept()], n_features=4), [1., 2., 3., 4., 0.5])
>>> scorer.scores(rows).tolist()          # the dense w . [x, 1]: 2 + 8 + 0.5, 10 + 0.5
[10.5, 10.5]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import DimensionError
from .losses import FloatArray
from .preprocessing import Intercept, OnlineStandardizer, Pipeline
from .sparse import SparseRows

__all__ = ["SparseScorer"]


class SparseScorer:
    """Scores of :class:`SparseRows` through a pipeline and a linear model's weights ``w``
    (see the module docstring); :meth:`of` gives None for a pipeline of other steps."""

    __slots__ = ("_dense", "_intercept", "_place", "_steps", "_w", "_width")

    def __init__(
        self,
        steps: list[tuple[FloatArray, FloatArray]],
        intercept: float,
        w: FloatArray,
        width: int,
    ) -> None:
        self._steps = steps
        self._w = w
        self._width = width
        self._intercept = intercept  # the intercepts' share of every score
        centred = np.zeros(width, dtype=bool)
        for centre, _ in steps:
            centred |= centre != 0.0
        self._dense = np.flatnonzero(centred)  # the columns a zero does not stay zero in
        self._place = np.full(width, -1, dtype=np.int64)  # column -> its place among them
        self._place[self._dense] = np.arange(self._dense.size)

    @classmethod
    def of(cls, pipeline: Pipeline, w: Any) -> SparseScorer | None:
        """The scorer of ``pipeline`` (standardisers, then intercepts) and weights ``w``
        (its output's length); None for any other pipeline."""
        width = pipeline.n_features_in
        steps: list[tuple[FloatArray, FloatArray]] = []
        values: list[float] = []
        for step in pipeline.steps:
            if isinstance(step, OnlineStandardizer) and not values:
                steps.append(step.affine)
            elif isinstance(step, Intercept):
                values.append(step.value)
            else:
                return None
        w = np.asarray(w, dtype=np.float64)
        if width is None or w.shape != (width + len(values),):
            return None
        intercept = 0.0
        for k, value in enumerate(values):
            intercept += float(w[width + k]) * value
        return cls(steps, intercept, w[:width], width)

    def scores(self, rows: SparseRows) -> FloatArray:
        """Each row's score (NaN or infinite where the scaled row or the score overflow:
        the caller refuses those rows alone)."""
        if rows.width != self._width:
            raise DimensionError(f"rows of {rows.width} columns, not {self._width}")
        n = len(rows)
        idx, val, row = rows.indices, rows.values, rows.rows
        w = self._w
        with np.errstate(over="ignore", invalid="ignore"):
            if self._dense.size:
                place = self._place[idx]
                held = place >= 0
                m = self._dense.size  # the rows made whole there (repeats summed)
                made = np.bincount(row[held] * m + place[held], weights=val[held], minlength=n * m)
                block: FloatArray = made.astype(np.float64, copy=False).reshape(n, m)
                for centre, scale in self._steps:
                    block = (block - centre[self._dense]) * scale[self._dense]
                out: FloatArray = np.add.reduce(block * w[self._dense], axis=1)  # row alone
                keep = ~held
                idx, val, row = idx[keep], val[keep], row[keep]
            else:
                out = np.zeros(n)
            z = val
            for _, scale in self._steps:  # (z - 0) * s is z * s, bit for bit
                z = z * scale[idx]
            out += np.bincount(row, weights=w[idx] * z, minlength=n)
            out += self._intercept
        return out

    def __repr__(self) -> str:
        return f"SparseScorer(width={self._width}, centred={self._dense.size})"
