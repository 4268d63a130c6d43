"""Learner inputs of a replay: the dataset rows of each run, preprocessed.

Preprocessing uses :mod:`service.learning`'s steps. With ``standardize`` every run owns an
online standardiser: at trial ``t`` it first learns ``x_t`` (a feature vector is visible
before its label, so this uses no label) and then transforms it, so ``x_t`` is scaled with
the statistics of ``x_1 .. x_t`` of that run. The intercept is appended last. Every
(algorithm, cost) learner of a run sees the same inputs. (The alternative the stream
service used to, a standardiser per model that learns from labelled examples only, is run by
:mod:`service.replay.sequential` with ``scaler_fit="labels"``; what it does now, the
moments of every event merged at each label, with ``scaler_fit="moments"``:
:class:`LabelScaler`.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from service.learning import Pipeline
from service.learning.batch import BatchStandardizer
from service.learning.moments import Moments
from service.learning.preprocessing import Intercept, OnlineStandardizer
from service.replay.errors import ReplayConfigError
from service.replay.protocol import TrialPlan

__all__ = ["LabelScaler", "RunFeatures"]

FloatArray = npt.NDArray[np.float64]


class RunFeatures:
    """Learner inputs of every run, trial by trial (the preprocessing of the module doc).

    The runs' standardisers advance in lockstep in one
    :class:`~service.learning.batch.BatchStandardizer` (row ``r`` equals an
    :class:`~service.learning.OnlineStandardizer` fed run ``r``, bit for bit): ``learn``
    then ``transform``, what ``Pipeline.learn`` / ``Pipeline.transform`` do for a
    standardiser followed by an intercept; the intercept column is then added to all runs
    at once with ``Intercept.transform_many``.
    """

    def __init__(
        self, X: FloatArray, plan: TrialPlan, *, standardize: bool, intercept: bool
    ) -> None:
        self.X, self.plan = X, plan
        self.standardize, self.intercept = standardize, intercept
        self.n_features = X.shape[1] + int(intercept)
        self._intercept = Intercept() if intercept else None
        self._static = self._finish(X) if not standardize else X
        self._scaler: BatchStandardizer | None = None
        self._next_t = 0

    def _finish(self, Z: FloatArray) -> FloatArray:
        return Z if self._intercept is None else self._intercept.transform_many(Z)

    def pipeline(self) -> Pipeline:
        """The equivalent :class:`~service.learning.Pipeline` for one run (for checks)."""
        steps: list[Any] = [OnlineStandardizer(self.X.shape[1])] if self.standardize else []
        if self.intercept:
            steps.append(Intercept())
        return Pipeline(steps, n_features=self.X.shape[1])

    def __call__(self, t: int) -> FloatArray:
        """Inputs of trial ``t`` for every run, shape ``(R, n_features)``; call in order."""
        rows = self.plan.indices[:, t]
        if not self.standardize:
            out: FloatArray = self._static[rows]
            return out
        if t == 0:
            self._scaler = BatchStandardizer(self.plan.runs, self.X.shape[1])
        elif t != self._next_t or self._scaler is None:
            raise ReplayConfigError(f"standardised features must be read in order (got t={t})")
        self._next_t = t + 1
        x = self.X[rows]
        self._scaler.learn(x)
        return self._finish(self._scaler.transform(x))

    def run(self, r: int) -> FloatArray:
        """All inputs of run ``r``, shape ``(T, n_features)``, through :meth:`pipeline`."""
        rows = self.plan.indices[r]
        if not self.standardize:
            out: FloatArray = self._static[rows]
            return out
        pipe = self.pipeline()
        z = np.empty((rows.shape[0], self.n_features))
        for t, i in enumerate(rows.tolist()):
            pipe.learn(self.X[i])
            z[t] = pipe.transform(self.X[i])
        return z


class LabelScaler:
    """One model's preprocessing as a stream worker runs it, event by event.

    :meth:`seen` is every event the model scores (its scorers gather their moments when the
    pipeline takes them, :attr:`~service.learning.Pipeline.takes_moments`); :meth:`learn` is
    a label: the pipeline learns as the worker's label path makes it learn,
    :meth:`~service.learning.Pipeline.learn_label` with the moments of the events scored
    since the last label (the labelled one among them), which the scorer sent with the
    label's request, trusted as a keyed worker trusts its scorers' signed moments (merged
    unjudged). Labels come back at once here; in a worker they come later, and the moments
    of the events in between wait for the next request.

    >>> from service.learning import serving_pipeline
    >>> scaler = LabelScaler(serving_pipeline(1))
    >>> for v in (1.0, 2.0, 3.0):
    ...     _ = scaler.seen(np.array([v]))
    >>> scaler.learn(np.array([3.0])).round(4).tolist()   # 1.2247 by the events, then the labels
    [0.6547, 1.0]
    """

    __slots__ = ("_moments", "pipeline")

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        n = pipeline.n_features_in
        self._moments = Moments(n) if pipeline.takes_moments and n is not None else None

    def seen(self, x: FloatArray) -> FloatArray:
        """The model's input for raw row ``x`` (counted among the events scored)."""
        if self._moments is not None:
            self._moments.add_many(x[None, :])
        out: FloatArray = self.pipeline.transform(x)
        return out

    def learn(self, x: FloatArray) -> FloatArray:
        """Learn from the label of raw row ``x``; return its input as transformed now."""
        taken = self._moments.take() if self._moments is not None else None
        self.pipeline.learn_label(x, taken, trusted=True)  # a keyed worker's, signed
        out: FloatArray = self.pipeline.transform(x)
        return out
