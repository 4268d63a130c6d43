r"""Preprocessing steps, kept apart from the learners (which compute $f(x) = w \cdot x$ as
the paper does) and composed with :class:`Pipeline`.

* :class:`OnlineStandardizer` — $x \mapsto (x - \hat\mu) / \hat s$ with running mean and
  (population) standard deviation from Welford's recurrence; a feature whose $\hat s$ is
  not above ``min_std`` is only centred, never divided by (near) zero.
* :class:`Intercept` — appends a constant feature, so $w$'s last weight is a bias.

A standardiser learns from rows one at a time (:meth:`OnlineStandardizer.learn`) or takes in
the :class:`~service.learning.moments.Moments` of many rows at once
(:meth:`OnlineStandardizer.merge`, :meth:`Pipeline.merge`): a stream worker's scorers gather
the moments of every event they score and the learner merges them into the model's next
version, so the statistics come from every event and still depend only on the version.

Put the :class:`Intercept` *after* the standardiser: a constant feature has zero variance,
so a standardiser after it would centre it to 0. :func:`default_pipeline` does this.

Every step and the pipeline expose ``transform(x)`` (1-D), ``transform_many(X)`` (rows),
``learn(x)`` (update running statistics, never the input) and a JSON-safe
``to_state()`` / ``from_state()``. Transforms return new arrays and never modify their input.

>>> pipe = default_pipeline(2)
>>> for x in ([1.0, 10.0], [3.0, 10.0]):
...     pipe.learn(x)
>>> pipe.transform([3.0, 12.0]).tolist()       # mean (2, 10), std (1, 0): 2nd only centred
[1.0, 2.0, 1.0]
>>> pipe.n_features_out
3
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, Final, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from . import state as st
from .base import check_int, features, features_matrix, quiet, raise_non_finite
from .errors import DimensionError, HyperparameterError, InputError, StateError
from .losses import FloatArray
from .moments import Implausible, Moments, implausible, merge_step
from .sparse import IntArray, SparseRow

__all__ = [
    "BINARY_TOLERANCE",
    "MERGE_ROWS",
    "Intercept",
    "OnlineStandardizer",
    "Pipeline",
    "Preprocessor",
    "default_pipeline",
    "preprocessor_from_state",
    "serving_pipeline",
]


@runtime_checkable
class Preprocessor(Protocol):
    """One composable step."""

    kind: ClassVar[str]

    @property
    def n_features_in(self) -> int | None: ...

    def output_size(self, n_in: int) -> int: ...

    def transform(self, x: Any) -> FloatArray: ...

    def transform_many(self, X: Any) -> FloatArray: ...

    def learn(self, x: Any) -> None: ...

    def to_state(self) -> dict[str, Any]: ...


MERGE_ROWS: Final = 100
"""Rows one moments record counts for at most (:meth:`OnlineStandardizer.merge`), whatever
count it claims: a series of records adds at most 100 rows each, so the rows of the events
before it keep their weight (a model that asks once in 100 events or more often sends
records of fewer)."""

BINARY_TOLERANCE: Final = 1e-9
r"""How far a feature's variance may be from $\hat p(1 - \hat p)$ for it to count as binary
(:meth:`OnlineStandardizer.binary`): rounding, not a value other than 0 or 1."""


def _finite_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise HyperparameterError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise HyperparameterError(f"{name} must be finite, got {value!r}")
    return v


def _as_array(x: Any, ndim: int) -> FloatArray:
    try:
        arr: FloatArray = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"input must be an array of numbers: {exc}") from exc
    if arr.ndim != ndim:
        raise DimensionError(f"input must be a {ndim}-D array, got shape {arr.shape}")
    return arr


def check_min_std(value: Any) -> float:
    v = _finite_number("min_std", value)
    if v < 1e-300:
        raise HyperparameterError(f"min_std must be >= 1e-300 (1/std must stay finite), got {v!r}")
    return v


def _record(kind: str, params: Mapping[str, Any], learned: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "format": st.PREPROCESSOR_FORMAT,
        "version": st.VERSION,
        "kind": kind,
        "params": dict(params),
        "learned": dict(learned),
    }


class Intercept:
    """Append a constant feature (default 1.0) so the last weight acts as a bias.

    >>> Intercept().transform([2.0, 3.0]).tolist()
    [2.0, 3.0, 1.0]
    >>> Intercept(0.5).transform_many([[1.0], [2.0]]).tolist()
    [[1.0, 0.5], [2.0, 0.5]]
    """

    kind: ClassVar[str] = "intercept"
    __slots__ = ("value",)

    def __init__(self, value: float = 1.0) -> None:
        self.value = _finite_number("value", value)

    @property
    def n_features_in(self) -> int | None:
        """Any length is accepted."""
        return None

    def output_size(self, n_in: int) -> int:
        return n_in + 1

    def transform(self, x: Any) -> FloatArray:
        x = _as_array(x, 1)
        out = np.empty(x.shape[0] + 1)
        out[:-1] = x
        out[-1] = self.value
        return out

    def transform_many(self, X: Any) -> FloatArray:
        X = _as_array(X, 2)
        out = np.empty((X.shape[0], X.shape[1] + 1))
        out[:, :-1] = X
        out[:, -1] = self.value
        return out

    def learn(self, x: Any) -> None:
        """Nothing to learn."""

    def to_state(self) -> dict[str, Any]:
        return _record(self.kind, {"value": self.value}, {})

    @classmethod
    def from_state(cls, state: Any) -> Intercept:
        params, _ = _read(state, cls.kind)
        try:
            return cls(**params)
        except (TypeError, ValueError) as exc:
            raise StateError(f"intercept params are invalid: {exc}") from exc

    def __repr__(self) -> str:
        return f"Intercept(value={self.value!r})"


class OnlineStandardizer:
    r"""Running standardisation $x_j \mapsto (x_j - \hat\mu_j) / \hat s_j$.

    Welford's update after the $n$-th example: $\delta = x - \mu$,
    $\mu \mathrel{+}= \delta / n$, $M_2 \mathrel{+}= \delta\,(x - \mu)$, and
    $\hat s = \sqrt{M_2 / n}$. Features with $\hat s \le$ ``min_std`` (constant so far, or
    before any example) are centred only; ``min_std`` (default ``1e-9``, at least
    ``1e-300``) keeps $1/\hat s$ finite. ``learn`` refuses NaN/inf and leaves the
    statistics unchanged.

    ``prior`` (default 0) starts the statistics at ``prior`` pseudo-rows of mean 0 and
    variance 1: a standardiser of inputs that are standardised already (the second step of
    :func:`serving_pipeline`) then moves away from the identity only as the rows it learns
    outweigh them, instead of standardising by the statistics of its first few rows.

    ``uncentred_binary`` (default False): a feature that has held 0 and 1 and nothing else
    (a one-hot level, a flag, a hashed category) is divided by its root mean square
    $\sqrt{\hat p}$ and not centred, so a zero stays zero: a row of such features stays
    sparse, and a label moves only the weights of the features it holds. Whether a feature
    is binary is read from the statistics alone (``mean`` strictly between 0 and 1, and the
    variance $\hat p(1 - \hat p)$, which among values in $[0, 1]$ only 0/1 values give), so
    every process holding the same statistics transforms alike; a feature that later holds
    any other value in $[0, 1]$, in a row learned or in moments merged ``trusted``, is
    standardised as any other from then on (:meth:`binary`). Untrusted moments cannot do
    that (:meth:`merge`). Values outside $[0, 1]$ can match both moments by coincidence
    (eight 0.5 and a 2.0: mean 2/3, variance 2/9); such a feature is then divided by its
    root mean square, uncentred, until its moments part.

    ``uncentred_from`` (default None): the features from this index on (a declared model's
    hashed buckets: categories, flags, token counts) are never centred, whatever they hold,
    and are divided by their root mean square $\sqrt{\hat\mu^2 + \hat s^2}$: a zero stays
    zero, so a row of them stays as sparse as the event that set them (a token counted
    twice makes a bucket no less sparse, where ``uncentred_binary`` would centre it).

    ``squares_from`` (default None): the features from this index on (a declared model's
    hashed buckets) are never centred either, and are divided by their root mean square
    over the rows learnt, the ``prior`` pseudo-rows left out: $\sqrt{\sum x^2 / r}$ for
    $r$ rows (a feature no row has set is divided by 1). Their statistics are those sums of
    squares (``m2``, with ``mean`` kept at 0), so a row changes them only where it is not
    zero: what a label moves, and what a version writes anew, is as sparse as the row. Such
    a standardiser learns from rows, never from moments.

    ``passes_from`` (default None): the features from this index on pass through unchanged
    and their statistics are never learned (kept at mean 0 and no variance: a declared
    model's second standardiser leaves its hashed buckets as the first one scaled them, and
    a label costs it only the numbers).

    >>> z = OnlineStandardizer(1)
    >>> for v in (1.0, 2.0, 3.0, 4.0):
    ...     z.learn([v])
    >>> z.count, z.mean.tolist(), round(float(z.std[0]) ** 2, 12)
    (4, [2.5], 1.25)
    >>> b = OnlineStandardizer(2, uncentred_binary=True)
    >>> for row in ([1.0, 1.0], [0.0, 3.0], [0.0, 5.0], [0.0, 7.0]):
    ...     b.learn(row)
    >>> b.binary().tolist(), b.transform([0.0, 4.0]).tolist(), float(b.transform([1.0, 4.0])[0])
    ([True, False], [0.0, 0.0], 2.0)
    >>> h = OnlineStandardizer(2, uncentred_from=1)
    >>> for row in ([5.0, 0.0], [7.0, 2.0], [9.0, 0.0], [11.0, 2.0]):
    ...     h.learn(row)
    >>> h.transform([8.0, 0.0]).tolist(), round(float(h.transform([8.0, 2.0])[1]), 12)
    ([0.0, 0.0], 1.414213562373)
    >>> u = OnlineStandardizer(2, prior=3, squares_from=1)
    >>> for row in ([1.0, 0.0], [1.0, 2.0]):
    ...     u.learn(row)
    >>> round(float(u.transform([0.0, 2.0])[1]), 12), u.mean.tolist()[1]  # 2 / sqrt(4 / 2)
    (1.414213562373, 0.0)
    >>> p = OnlineStandardizer(2, prior=2, passes_from=1)
    >>> for row in ([5.0, 0.0], [7.0, 2.0]):
    ...     p.learn(row)
    >>> p.transform([3.0, 2.0]).tolist(), p.mean.tolist()
    ([0.0, 2.0], [3.0, 0.0])
    """

    kind: ClassVar[str] = "standardizer"
    __slots__ = (
        "_centre_v",
        "_count",
        "_head",
        "_lent",
        "_listed",
        "_m2",
        "_mean",
        "_n",
        "_scale_v",
        "_stale",
        "min_std",
        "prior",
        "uncentred_binary",
        "uncentred_from",
        "passes_from",
        "squares_from",
    )

    def __init__(
        self,
        n_features: int,
        *,
        min_std: float = 1e-9,
        prior: int = 0,
        uncentred_binary: bool = False,
        uncentred_from: int | None = None,
        passes_from: int | None = None,
        squares_from: int | None = None,
    ) -> None:
        self._n = check_int("n_features", n_features, 1)
        self.uncentred_from = self._index("uncentred_from", uncentred_from)
        self.passes_from = self._index("passes_from", passes_from)
        self.squares_from = self._index("squares_from", squares_from)
        if self.squares_from is not None and (
            self.passes_from is not None or self.uncentred_from is not None
        ):
            raise HyperparameterError("squares_from takes neither passes_from nor uncentred_from")
        self.min_std = check_min_std(min_std)
        self.prior = check_int("prior", prior, 0)
        if not isinstance(uncentred_binary, bool):
            raise HyperparameterError(
                f"uncentred_binary must be true or false, not {uncentred_binary!r}"
            )
        if uncentred_binary and self.prior:
            raise HyperparameterError("uncentred_binary needs prior 0 (pseudo-rows are not binary)")
        self.uncentred_binary = uncentred_binary
        self._count = self.prior
        self._mean = np.zeros(self._n)
        self._m2 = np.full(self._n, float(self.prior))
        for k in (self.passes_from, self.squares_from):
            if k is not None:  # no pseudo-rows where nothing is learnt or sums are kept
                self._m2[k:] = 0.0
        self._stale = False  # centre and scale to make from the statistics when read
        self._head: tuple[FloatArray, FloatArray] | None = None  # rows_from's, when made
        self._lent = False  # whether _mean and _m2 may be read elsewhere: copy to write
        self._scale = np.ones(self._n)
        self._centre = self._mean
        self._listed = st.Listed()  # the lists of its last state (made from them next)

    def _index(self, name: str, value: Any) -> int | None:
        """``value`` as the index of one of the features (None stays None)."""
        if value is None:
            return None
        index = check_int(name, value, 0)
        if index >= self._n:
            raise HyperparameterError(f"{name} must be below n_features ({self._n}), got {index}")
        return index

    @property
    def n_features_in(self) -> int:
        return self._n

    def output_size(self, n_in: int) -> int:
        return n_in

    @property
    def count(self) -> int:
        """Number of examples learned from."""
        return self._count

    @property
    def mean(self) -> FloatArray:
        """Running mean (a copy)."""
        return self._mean.copy()

    @property
    def std(self) -> FloatArray:
        """Running population standard deviation (a copy; zeros before any example)."""
        return np.sqrt(self._m2 / self._count) if self._count else np.zeros(self._n)

    @property
    def affine(self) -> tuple[FloatArray, FloatArray]:
        """``(centre, scale)``: :meth:`transform` is ``(x - centre) * scale`` (read-only
        views; a later :meth:`learn` or :meth:`merge` makes new arrays, these stay)."""
        centre, scale = self._centre.view(), self._scale.view()
        centre.flags.writeable = scale.flags.writeable = False
        self._lent = True  # the centre may be the mean itself
        return centre, scale

    def binary(self) -> npt.NDArray[np.bool_]:
        r"""Which features are binary by the statistics: a mean $\hat p$ strictly between 0
        and 1 and a variance of $\hat p(1 - \hat p)$ (to $10^{-9}$). Values in $[0, 1]$ have
        a variance of at most $\hat p(1 - \hat p)$, equal only when every value is 0 or 1
        (other values can match both moments by coincidence: the class docstring).
        All False without ``uncentred_binary``.

        >>> z = OnlineStandardizer(3, uncentred_binary=True)
        >>> for row in ([0.0, 0.0, 1.0], [1.0, 0.5, 1.0]):
        ...     z.learn(row)
        >>> z.binary().tolist()           # 0 and 1; 0 and 0.5; always 1 (constant)
        [True, False, False]
        """
        return self._binary_of(self._n)

    def _binary_of(self, learnt: int) -> npt.NDArray[np.bool_]:
        """:meth:`binary` of the first ``learnt`` features."""
        if not self.uncentred_binary or not self._count:
            return np.zeros(learnt, dtype=bool)
        mean = self._mean[:learnt]
        gap = np.abs(self._m2[:learnt] / self._count - mean * (1.0 - mean))
        out: npt.NDArray[np.bool_] = (mean > 0.0) & (mean < 1.0) & (gap <= BINARY_TOLERANCE)
        return out

    @property
    def rows_from(self) -> int | None:
        """The inputs from this index on map a zero to a zero and learn where a row is not
        zero alone (``passes_from`` or ``squares_from``): a row's entries there are
        transformed and learnt one by one (:meth:`Pipeline.transform`); None: no such
        inputs."""
        if self.uncentred_from is not None:
            return None
        return self.passes_from if self.passes_from is not None else self.squares_from

    @property
    def _scale(self) -> FloatArray:
        if self._stale:
            self._make_affine()
        return self._scale_v

    @_scale.setter
    def _scale(self, value: FloatArray) -> None:
        self._scale_v = value

    @property
    def _centre(self) -> FloatArray:
        if self._stale:
            self._make_affine()
        return self._centre_v

    @_centre.setter
    def _centre(self, value: FloatArray) -> None:
        self._centre_v = value

    def _refresh_scale(self) -> None:
        """The centre and scale after the statistics changed: made when next read when
        rows are learnt (:attr:`rows_from`; a row's inputs read theirs alone), else now."""
        if self.rows_from is not None:
            self._stale, self._head = True, None
        else:
            self._make_affine()

    def _make_affine(self) -> None:
        k = self.rows_from
        if k is not None:  # the head as below (:meth:`_head_affine`), the tail on its own
            self._stale, self._head = True, None
            centre, scale = self._head_affine()
            if self.squares_from is None:  # passed through: nothing learnt, scale 1
                tail = np.ones(self._n - k)
            else:
                rows = self._count - self.prior
                rms = np.sqrt(self._m2[k:] / rows) if rows > 0 else np.zeros(self._n - k)
                tail = np.divide(1.0, rms, out=np.ones(rms.shape), where=rms > self.min_std)
            self._stale, self._lent = False, True
            self._scale = np.concatenate((scale, tail))
            self._centre = np.concatenate((centre, np.zeros(self._n - k)))
            return
        self._stale = False
        self._lent = True  # the centre may be the mean itself
        std = np.sqrt(self._m2 / self._count)
        scale = np.ones(self._n)
        self._scale = np.divide(1.0, std, out=scale, where=std > self.min_std)
        self._centre = self._mean
        binary = self.binary()
        if binary.any():  # scaled by the root mean square sqrt(p), a zero kept zero
            self._scale = np.where(binary, 1.0 / np.sqrt(np.where(binary, self._mean, 1.0)), scale)
            self._centre = np.where(binary, 0.0, self._mean)
        k = self.uncentred_from
        if k is None and self.squares_from is not None:  # sums of squares of the rows learnt
            k, rows = self.squares_from, self._count - self.prior
            rms = np.sqrt(self._m2[k:] / rows) if rows > 0 else np.zeros(self._n - k)
        elif k is not None:  # never centred: divided by the root mean square
            mean = self._mean[k:]
            rms = np.sqrt(self._m2[k:] / self._count + mean * mean)
        if k is not None:  # a zero kept zero
            tail = np.divide(1.0, rms, out=np.ones(rms.shape), where=rms > self.min_std)
            self._scale = np.concatenate((self._scale[:k], tail))
            centre = self._centre.copy() if self._centre is self._mean else self._centre
            centre[k:] = 0.0
            self._centre = centre

    def _head_affine(self) -> tuple[FloatArray, FloatArray]:
        """The centre and scale of the inputs before :attr:`rows_from` (as
        :meth:`_make_affine` makes them, bit for bit)."""
        k = self.rows_from
        assert k is not None  # noqa: S101 - only rows read it
        if not self._stale:
            return self._centre_v[:k], self._scale_v[:k]
        if self._head is None:
            mean, m2 = self._mean[:k], self._m2[:k]
            std = np.sqrt(m2 / self._count)
            scale = np.divide(1.0, std, out=np.ones(k), where=std > self.min_std)
            centre = mean.copy()
            binary = self._binary_of(k)
            if binary.any():
                scale = np.where(binary, 1.0 / np.sqrt(np.where(binary, mean, 1.0)), scale)
                centre = np.where(binary, 0.0, mean)
            self._head = centre, scale
        return self._head

    def _tail_scale(self, idx: IntArray) -> FloatArray:
        """The scale of the inputs ``idx`` (from :attr:`rows_from` on; their centre is 0)."""
        if not self._stale:
            return self._scale_v[idx]
        if self.squares_from is None:  # passed through: nothing learnt, scale 1
            return np.ones(idx.size)
        rows = self._count - self.prior
        rms = np.sqrt(self._m2[idx] / rows) if rows > 0 else np.zeros(idx.size)
        return np.divide(1.0, rms, out=np.ones(rms.shape), where=rms > self.min_std)

    @quiet
    def transform_entries(
        self, head: FloatArray, idx: IntArray, values: FloatArray
    ) -> tuple[FloatArray, FloatArray]:
        """:meth:`transform` of a row given as its inputs before :attr:`rows_from`
        (``head``, whole) and its entries from there on (``idx``, ``values``): the same
        numbers, bit for bit."""
        centre, scale = self._head_affine()
        return (head - centre) * scale, values * self._tail_scale(idx)

    @quiet
    def learn_entries(self, head: FloatArray, idx: IntArray, values: FloatArray) -> None:
        """:meth:`learn` of a row given as :meth:`transform_entries` takes it, in place:
        the same statistics, bit for bit, in proportion to the row's entries."""
        if not (np.isfinite(head).all() and np.isfinite(values).all()):
            raise_non_finite(np.concatenate((head, values)))
        k = self.rows_from
        assert k is not None  # noqa: S101 - only rows call it
        if self._lent:
            self._mean, self._m2, self._lent = self._mean.copy(), self._m2.copy(), False
        count = self._count + 1
        delta = head - self._mean[:k]
        self._mean[:k] += delta / count
        self._m2[:k] += delta * (head - self._mean[:k])
        if self.squares_from is not None:
            self._m2[idx] += values * values
        self._count = count
        self._refresh_scale()

    @quiet
    def transform(self, x: Any) -> FloatArray:
        x = features(x, self._n)
        out: FloatArray = (x - self._centre) * self._scale
        return out

    @quiet
    def transform_many(self, X: Any) -> FloatArray:
        X = features_matrix(X, self._n)
        out: FloatArray = (X - self._centre) * self._scale
        return out

    @quiet
    def learn(self, x: Any) -> None:
        x = features(x, self._n)
        if not np.isfinite(x).all():
            raise_non_finite(x)
        count = self._count + 1
        k = self.passes_from if self.squares_from is None else self.squares_from
        if k is None:
            delta = x - self._mean
            mean = self._mean + delta / count
            self._m2 = self._m2 + delta * (x - mean)
        else:  # the numbers: the tail passes through, unlearned, or adds its squares
            head = x[:k]
            delta = head - self._mean[:k]
            mean = self._mean.copy()
            mean[:k] += delta / count
            m2 = self._m2.copy()
            m2[:k] += delta * (head - mean[:k])
            if self.squares_from is not None:
                tail = x[k:]
                m2[k:] += tail * tail  # (+ 0.0 where the row is zero: the same bits)
            self._m2 = m2
        self._mean = mean
        self._count = count
        self._refresh_scale()

    def refusal(self, moments: Moments) -> Implausible | None:
        """Why :meth:`merge` would refuse ``moments`` (None: it would take them): they are
        implausible against the statistics so far (:func:`~service.learning.moments.implausible`).
        """
        return self._implausible(*self._learnt(moments))

    def _implausible(self, learnt: int, moments: Moments) -> Implausible | None:
        if not learnt:
            return None  # no feature judged
        mean, std = self._mean[:learnt], self._std_of(learnt)
        return implausible(moments, self._count, mean, std, min_std=self.min_std)

    def _std_of(self, learnt: int) -> FloatArray:
        """:attr:`std` of the first ``learnt`` features."""
        if not self._count:
            return np.zeros(learnt)
        out: FloatArray = np.sqrt(self._m2[:learnt] / self._count)
        return out

    def _takes_moments(self) -> None:
        if self.squares_from is not None:
            raise HyperparameterError("a standardiser of sums of squares learns rows, not moments")

    @property
    def learns(self) -> int:
        """How many features the statistics learn: those before ``passes_from`` (every
        one without it). Moments of these alone are as good as moments of all (:meth:`merge`).
        """
        return self._n if self.passes_from is None else self.passes_from

    def _learnt(self, moments: Moments) -> tuple[int, Moments]:
        """(:attr:`learns`, ``moments`` of those features): as they are, or the first of
        moments of every feature (those passed through stay unlearned)."""
        self._takes_moments()
        k = self.learns
        if moments.n_features == k:
            return k, moments
        if moments.n_features == self._n:
            if k in (0, self._n):  # (the first 0: none, read as [:0])
                return k, moments
            first = Moments(k)
            first.count = moments.count
            first.mean[:] = moments.mean[:k]
            first.m2[:] = moments.m2[:k]
            return k, first
        raise DimensionError(
            f"moments of {moments.n_features} features, not {self._n} (or the {self.learns} learnt)"
        )

    def merge(self, moments: Moments, *, trusted: bool = False) -> int:
        r"""Take in the moments of rows learnt elsewhere (Chan's merge,
        :mod:`service.learning.moments`); return how many rows they counted for (0: none,
        refused).

        ``trusted`` moments (a scorer's, whose signature verified) are not judged: they
        count for at most ``max(count, MERGE_ROWS)`` rows, their mean and variance kept, so
        an abrupt honest change is followed at once (once the statistics rest on 100 rows
        one record can at most double what they rest on).

        A record :meth:`refusal` finds implausible (a mean or variance no scorer could have
        gathered from events like those the statistics rest on) is refused and changes
        nothing. Any other counts for at most :data:`MERGE_ROWS` (100) rows, its mean and
        variance kept, and moves each mean and variance at most one step (a feature
        :meth:`binary` so far keeps a variance of $\hat p(1 - \hat p)$ and stays binary)
        (:func:`~service.learning.moments.merge_step`: three times the sampling error of its
        rows): a series of records that lie adds at most 100 rows each and moves the
        statistics by the sum of such steps, however many rows it claims.

        >>> z = OnlineStandardizer(1)
        >>> m = Moments(1); m.add_many([[1.0], [3.0]])
        >>> z.merge(m), z.count, z.mean.tolist(), z.std.tolist()
        (2, 2, [2.0], [1.0])
        >>> z.merge(Moments.from_record({"count": 10**9, "mean": [1e6], "m2": [0.0]}, 1))
        0
        >>> z.merge(Moments.from_record({"count": 2, "mean": [1e6], "m2": [0.0]}, 1), trusted=True)
        2
        >>> round(z.mean.tolist()[0])
        500001
        """
        learnt, moments = self._learnt(moments)
        if trusted:
            return self._merge_trusted(learnt, moments)
        if self._implausible(learnt, moments) is not None or not moments.count:
            return 0
        count = min(moments.count, MERGE_ROWS)
        seen = moments.m2[:learnt]
        m2 = seen * (count / moments.count) if count < moments.count else seen
        n, total = self._count, self._count + count
        mean = self._mean[:learnt]
        delta = moments.mean[:learnt] - mean
        new_m2 = self._m2[:learnt] + m2 + delta * delta * (n * count / total)
        new_mean = mean + delta * (count / total)
        std = self._std_of(learnt)
        judged = std > self.min_std
        if n and judged.any():  # each judged feature moves at most one step
            a, b = merge_step(count, n)
            reach = np.where(judged, a * std, np.inf)
            new_mean = np.clip(new_mean, mean - reach, mean + reach)
            var, new_var = std * std, new_m2 / total
            low, high = var * math.exp(-b), var * math.exp(b)
            new_m2 = np.where(judged, np.clip(new_var, low, high) * total, new_m2)
            # a binary feature stays binary through untrusted moments, whatever they claim:
            # its variance follows its mean (one record cannot switch its centring back on)
            kept = self._binary_of(learnt)
            if kept.any():
                new_m2 = np.where(kept, new_mean * (1.0 - new_mean) * total, new_m2)
        self._put(learnt, new_mean, new_m2, total)
        return count

    def _merge_trusted(self, learnt: int, moments: Moments) -> int:
        """Chan's merge of trusted ``moments`` (of the first ``learnt`` features), at most
        ``max(count, MERGE_ROWS)`` rows."""
        if not moments.count:
            return 0
        count = min(moments.count, max(self._count, MERGE_ROWS))
        seen = moments.m2[:learnt]
        m2 = seen * (count / moments.count) if count < moments.count else seen
        total = self._count + count
        delta = moments.mean[:learnt] - self._mean[:learnt]
        new_m2 = self._m2[:learnt] + m2 + delta * delta * (self._count * count / total)
        self._put(learnt, self._mean[:learnt] + delta * (count / total), new_m2, total)
        return count

    def _put(self, learnt: int, mean: FloatArray, m2: FloatArray, count: int) -> None:
        """The merged statistics of the first ``learnt`` features (every one: new arrays;
        the numbers before ``passes_from``: in place, those after staying 0)."""
        if learnt == self._n:
            self._mean, self._m2 = mean, m2
        else:
            if self._lent:
                self._mean, self._m2, self._lent = self._mean.copy(), self._m2.copy(), False
            self._mean[:learnt], self._m2[:learnt] = mean, m2
        self._count = count
        self._refresh_scale()

    def to_state(self) -> dict[str, Any]:
        params: dict[str, Any] = {"n_features": self._n, "min_std": self.min_std}
        if self.prior:  # a standardiser without one writes the record it always wrote
            params["prior"] = self.prior
        if self.uncentred_binary:
            params["uncentred_binary"] = True
        if self.uncentred_from is not None:
            params["uncentred_from"] = self.uncentred_from
        if self.passes_from is not None:
            params["passes_from"] = self.passes_from
        if self.squares_from is not None:
            params["squares_from"] = self.squares_from
        return _record(
            self.kind,
            params,
            {
                "count": self._count,
                **st.entries_record("mean", self._mean, self._listed),
                **st.entries_record("m2", self._m2, self._listed),
            },
        )

    @classmethod
    def from_state(cls, state: Any) -> OnlineStandardizer:
        params, learned = _read(state, cls.kind)
        try:
            step = cls(**params)
        except (TypeError, ValueError) as exc:
            raise StateError(f"standardizer params are invalid: {exc}") from exc
        step._count = st.read_int(learned, "count")
        step._mean = st.read_entries(learned, "mean", step._n, "the standardiser's means")
        step._m2 = st.read_entries(learned, "m2", step._n, "the standardiser's sums")
        if (step._m2 < 0.0).any():
            raise StateError("standardizer state field 'm2' holds negative values")
        if step.squares_from is not None and step._mean[step.squares_from :].any():
            raise StateError("standardizer state holds a mean where it keeps sums of squares")
        k = step.passes_from
        if k is not None and (step._mean[k:].any() or step._m2[k:].any()):
            raise StateError("standardizer state learned features it passes through")
        step._centre = step._mean
        if step._count:
            step._refresh_scale()
        return step

    def __repr__(self) -> str:
        prior = f", prior={self.prior}" if self.prior else ""
        binary = ", uncentred_binary=True" if self.uncentred_binary else ""
        if self.uncentred_from is not None:
            binary += f", uncentred_from={self.uncentred_from}"
        if self.passes_from is not None:
            binary += f", passes_from={self.passes_from}"
        if self.squares_from is not None:
            binary += f", squares_from={self.squares_from}"
        return (
            f"OnlineStandardizer({self._n}, min_std={self.min_std!r}{prior}{binary}, "
            f"count={self._count})"
        )


_STEPS: dict[str, Any] = {"intercept": Intercept, "standardizer": OnlineStandardizer}


def _read(state: Any, kind: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    record = st.read_record(state, st.PREPROCESSOR_FORMAT)
    if record.get("kind") != kind:
        raise StateError(f"state is for preprocessing step {record.get('kind')!r}, not {kind!r}")
    return st.read_mapping(record, "params"), st.read_mapping(record, "learned")


def preprocessor_from_state(state: Any) -> Preprocessor:
    """Rebuild any preprocessing step from its state record."""
    record = st.read_record(state, st.PREPROCESSOR_FORMAT)
    kind = record.get("kind")
    if kind not in _STEPS:
        raise StateError(
            f"unknown preprocessing step {kind!r} (known: {sorted(_STEPS)}); upgrade abstain "
            "to a release that knows it"
        )
    step: Preprocessor = _STEPS[str(kind)].from_state(record)
    return step


class Pipeline:
    """Steps applied in order; ``learn`` updates each step's statistics in turn.

    ``n_features`` fixes the input length when the first step does not (an
    :class:`Intercept` accepts any length).

    >>> pipe = Pipeline([Intercept(), Intercept(2.0)], n_features=1)
    >>> pipe.transform([5.0]).tolist(), pipe.n_features_out
    ([5.0, 1.0, 2.0], 3)
    >>> Pipeline.from_state(pipe.to_state()).transform([5.0]).tolist()
    [5.0, 1.0, 2.0]
    """

    __slots__ = ("_n_in", "steps")

    def __init__(self, steps: Iterable[Preprocessor], *, n_features: int | None = None) -> None:
        self.steps: tuple[Preprocessor, ...] = tuple(steps)
        for step in self.steps:
            if not isinstance(step, Preprocessor):
                raise HyperparameterError(f"not a preprocessing step: {step!r}")
        n = None if n_features is None else check_int("n_features", n_features, 1)
        if n is None and self.steps:
            n = self.steps[0].n_features_in
        self._n_in = n
        if n is not None:
            size = n
            for step in self.steps:
                want = step.n_features_in
                if want is not None and want != size:
                    raise HyperparameterError(
                        f"step {step!r} takes {want} features but receives {size}"
                    )
                size = step.output_size(size)

    @property
    def n_features_in(self) -> int | None:
        """Input length, when known."""
        return self._n_in

    @property
    def n_features_out(self) -> int:
        """Output length (what the learner's ``n_features`` must be)."""
        if self._n_in is None:
            raise HyperparameterError(
                "the pipeline's input length is unknown; pass Pipeline(..., n_features=N)"
            )
        size = self._n_in
        for step in self.steps:
            size = step.output_size(size)
        return size

    @property
    def rows_from(self) -> int | None:
        """The index from which every step maps a zero to a zero and learns a row where it
        is not zero alone (standardisers of the same :attr:`OnlineStandardizer.rows_from`,
        then intercepts): a :class:`~service.learning.sparse.SparseRow` is then transformed
        and learnt in proportion to its entries. None: rows are made whole first."""
        k: int | None = None
        intercepts = False
        for step in self.steps:
            if isinstance(step, Intercept):
                intercepts = True
                continue
            if intercepts or not isinstance(step, OnlineStandardizer):
                return None
            mine = step.rows_from
            if mine is None or (k is not None and mine != k):
                return None
            k = mine
        return k if self._n_in is not None else None

    def _entries(self, row: SparseRow) -> tuple[FloatArray, IntArray, FloatArray]:
        """``row`` as its inputs before :attr:`rows_from` (whole) and its entries after."""
        k = self.rows_from
        assert k is not None  # noqa: S101 - the callers checked
        cut = int(np.searchsorted(row.indices, k))
        head = np.zeros(k)
        head[row.indices[:cut]] = row.values[:cut]
        return head, row.indices[cut:], row.values[cut:]

    def _row(self, row: Any) -> Any:
        """``row`` (a :class:`~service.learning.sparse.SparseRow`) made whole when the
        steps do not take rows (anything else as it is)."""
        if type(row) is SparseRow and self.rows_from is None:
            if row.width != self._n_in:
                raise DimensionError(f"a row of {row.width} inputs, not {self._n_in}")
            return row.toarray()
        return row

    def transform(self, x: Any) -> Any:
        """``x`` through every step; a :class:`~service.learning.sparse.SparseRow` gives
        the row of its output (the same numbers, bit for bit, as the whole vector's: its
        entries before :attr:`rows_from` made whole, those after one by one)."""
        x = self._row(x)
        if type(x) is SparseRow:
            return self._transform_row(x)
        out = features(x, self._n_in) if self._n_in is not None else _as_array(x, 1)
        for step in self.steps:
            out = step.transform(out)
        if out is x:
            out = out.copy()
        return out

    def _transform_row(self, row: SparseRow) -> SparseRow:
        n = self._n_in
        if row.width != n:
            raise DimensionError(f"a row of {row.width} inputs, not {n}")
        head, idx, values = self._entries(row)
        constants: list[float] = []
        for step in self.steps:
            if isinstance(step, OnlineStandardizer):
                head, values = step.transform_entries(head, idx, values)
            else:
                assert isinstance(step, Intercept)  # noqa: S101 - rows_from says so
                constants.append(step.value)
        k, m = head.size, len(constants)
        indices = np.concatenate((np.arange(k), idx, np.arange(n, n + m)))
        out = np.concatenate((head, values, np.array(constants, dtype=np.float64)))
        return SparseRow._nonzero(indices, out, n + m)

    def transform_many(self, X: Any) -> FloatArray:
        out = features_matrix(X, self._n_in) if self._n_in is not None else _as_array(X, 2)
        for step in self.steps:
            out = step.transform_many(out)
        if out is X:
            out = out.copy()
        return out

    @property
    def takes_moments(self) -> bool:
        """Whether the pipeline standardises twice, first by the moments of every event
        (:meth:`learn_label`): the shape :func:`serving_pipeline` builds."""
        first = self.steps[0] if self.steps else None
        return (
            len(self.steps) >= 2
            and all(isinstance(step, OnlineStandardizer) for step in self.steps[:2])
            and isinstance(first, OnlineStandardizer)
            and first.squares_from is None
        )

    @property
    def moments_width(self) -> int:
        """How many features the moments :meth:`learn_label` takes cover: the first ones,
        those its first step learns (:attr:`OnlineStandardizer.learns`: a declared model's
        numbers, not its hashed buckets); 0 when it takes none.

        >>> serving_pipeline(5).moments_width, serving_pipeline(5, hashed_from=2).moments_width
        (5, 2)
        >>> serving_pipeline(5, hashed_from=0).moments_width
        0
        """
        if not self.takes_moments:
            return 0
        first = self.steps[0]
        assert isinstance(first, OnlineStandardizer)  # noqa: S101 - takes_moments says so
        return first.learns

    def moments_refusal(self, moments: Moments, *, judge: bool = True) -> Implausible | None:
        """Why :meth:`learn_label` would not merge ``moments`` into the first step (None:
        it would, or the pipeline takes no moments): moments of other features than
        :attr:`moments_width` (``"width"``), or, when ``judge``, implausible ones
        (:meth:`OnlineStandardizer.refusal`).

        >>> serving_pipeline(5, hashed_from=2).moments_refusal(Moments(5)).detail
        'moments of 5 features; the model gathers those of its first 2'
        """
        if not self.takes_moments:
            return None
        first = self.steps[0]
        assert isinstance(first, OnlineStandardizer)  # noqa: S101 - takes_moments says so
        width = first.learns
        if moments.n_features != width:
            detail = f"moments of {moments.n_features} features; the model gathers those of "
            detail += f"its first {width}" if width < first.n_features_in else f"{width}"
            return Implausible("width", 0, detail)
        return first.refusal(moments) if judge else None

    def learn_label(self, x: Any, moments: Moments | None = None, *, trusted: bool = False) -> int:
        """What the statistics learn when the label of raw row ``x`` arrives; return how
        many events the moments counted for.

        A pipeline that :attr:`takes_moments` merges ``moments`` (of the events scored
        since the last ones, ``x`` among them) into its first step, and the labelled row,
        as the first step now transforms it, into the steps after it. Its first step learns
        from moments only: a request without them (the second of a scorer's batch, whose
        events came with the first) teaches the later steps alone. Any other pipeline learns
        ``x`` in every step (:meth:`learn`), as it always did. Moments the first step
        refuses (:meth:`moments_refusal`) count for nothing; the row still teaches the
        later steps. ``trusted`` moments are merged unjudged
        (:meth:`OnlineStandardizer.merge`).

        >>> pipe = serving_pipeline(1)
        >>> seen = Moments(1); seen.add_many([[1.0], [3.0], [5.0]])
        >>> pipe.learn_label([5.0], seen), pipe.steps[0].mean.tolist(), pipe.steps[1].count
        (3, [3.0], 2)
        """
        if not self.takes_moments:
            self.learn(x)
            return 0
        x = self._row(x)
        first = self.steps[0]
        assert isinstance(first, OnlineStandardizer)  # noqa: S101 - takes_moments says so
        if type(x) is SparseRow:
            if x.width != self._n_in:
                raise DimensionError(f"a row of {x.width} inputs, not {self._n_in}")
            merged = 0 if moments is None else first.merge(moments, trusted=trusted)
            head, idx, values = self._entries(x)
            head, values = first.transform_entries(head, idx, values)
            self._learn_entries(head, idx, values, start=1)
            return merged
        cur = features(x, self._n_in) if self._n_in is not None else _as_array(x, 1)
        merged = 0 if moments is None else first.merge(moments, trusted=trusted)
        cur = first.transform(cur)
        last = len(self.steps) - 1
        for i, step in enumerate(self.steps[1:], start=1):
            step.learn(cur)
            if i < last:
                cur = step.transform(cur)
        return merged

    def _learn_entries(
        self, head: FloatArray, idx: IntArray, values: FloatArray, *, start: int
    ) -> None:
        """:meth:`learn` of a row as its entries, from step ``start`` on."""
        last = len(self.steps) - 1
        for i in range(start, len(self.steps)):
            step = self.steps[i]
            if isinstance(step, OnlineStandardizer):
                step.learn_entries(head, idx, values)
                if i < last:
                    head, values = step.transform_entries(head, idx, values)

    def learn(self, x: Any) -> None:
        """Update the running statistics of every step with one raw example."""
        x = self._row(x)
        if type(x) is SparseRow:
            if x.width != self._n_in:
                raise DimensionError(f"a row of {x.width} inputs, not {self._n_in}")
            self._learn_entries(*self._entries(x), start=0)
            return
        cur = features(x, self._n_in) if self._n_in is not None else _as_array(x, 1)
        last = len(self.steps) - 1
        for i, step in enumerate(self.steps):
            step.learn(cur)
            if i < last:
                cur = step.transform(cur)

    def to_state(self) -> dict[str, Any]:
        return {
            "format": st.PIPELINE_FORMAT,
            "version": st.VERSION,
            "n_features": self._n_in,
            "steps": [step.to_state() for step in self.steps],
        }

    @classmethod
    def from_state(cls, state: Any) -> Pipeline:
        record = st.read_record(state, st.PIPELINE_FORMAT)
        steps = record.get("steps")
        if not isinstance(steps, list):
            raise StateError("pipeline state field 'steps' must be a list")
        n = record.get("n_features")
        if n is not None:
            n = st.read_int(record, "n_features", minimum=1)
        try:
            return cls([preprocessor_from_state(s) for s in steps], n_features=n)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, StateError):
                raise
            raise StateError(f"pipeline state is invalid: {exc}") from exc

    def __repr__(self) -> str:
        return f"Pipeline({list(self.steps)!r}, n_features={self._n_in!r})"


def default_pipeline(n_features: int) -> Pipeline:
    """Standardise online, then append an intercept: ``n_features + 1`` outputs."""
    return Pipeline([OnlineStandardizer(n_features), Intercept()])


def label_prior(n_features: int) -> int:
    r"""Pseudo-rows (mean 0, variance 1) the second standardiser of :func:`serving_pipeline`
    starts with: one per feature. The labelled rows' statistics of $d$ features say little
    until there are about $d$ of them (a $d$-dimensional scatter needs $d$ rows to be of full
    rank; $d$ is the least number of degrees of freedom of a proper Wishart prior), so a
    model of many features keeps the scaling of every event longer, one of a few features
    takes its labelled rows' sooner. Measured against a fixed 30 (``docs/results/learning.md``,
    round 3): the same on 30 features, svmguide1's 4 at 5 % of the labels 5.6 % lower.

    >>> label_prior(4), label_prior(30)
    (4, 30)
    """
    return check_int("n_features", n_features, 1)


def serving_pipeline(
    n_features: int,
    *,
    standardize: bool = True,
    intercept: bool = True,
    hashed_from: int | None = None,
) -> Pipeline:
    r"""The preprocessing a model serves (a stream worker's, and the replay's served stack).

    With ``standardize``: two standardisers. The first learns from every event, through the
    moments the scorers gather and the learner merges into each new version
    (:meth:`Pipeline.learn_label`): its statistics rest on every event from the first label
    on, and a score still depends only on the version. The second learns from the labelled
    rows as the first transforms them, starting from :func:`label_prior` pseudo-rows of
    mean 0 and variance 1: once the labels outweigh them it centres and scales by the events
    the learner asks about, which for an active learner lie near the boundary (the curvature
    of the loss is there; a diagonal preconditioner of the steps). The first step leaves a
    binary feature (one-hot levels, flags, hashed categories) uncentred, divided by
    $\sqrt{\hat p}$ (``uncentred_binary``): the second centres it only as the labels
    outweigh its prior. Without moments (a scorer that sends none) the first step stays the
    identity. With ``intercept``: a constant feature last.

    ``hashed_from``: the inputs from this index on are hashed buckets (a declared model's).
    The first standardiser passes them through (``passes_from``: the moments of every event
    are those of the numbers alone, so a scorer's cost and a label request's size do not grow
    with the buckets); the second never centres them and divides each by its root mean
    square over the labelled rows (``squares_from``: their sums of squares, which a row
    changes only where it is not zero; its pseudo-rows are the numbers').
    A row keeps the zeros of the event it came from: what a label moves, and what a version
    remembers of it, is as sparse as the event.

    >>> serving_pipeline(3).n_features_out, serving_pipeline(3, standardize=False).steps
    (4, (Intercept(value=1.0),))
    >>> serving_pipeline(3, hashed_from=1).transform([2.0, 0.0, 3.0]).tolist()
    [2.0, 0.0, 3.0, 1.0]
    """
    steps: list[Preprocessor] = []
    if standardize:
        prior = label_prior(n_features)
        steps += [
            OnlineStandardizer(n_features, uncentred_binary=True, passes_from=hashed_from),
            OnlineStandardizer(n_features, prior=prior, squares_from=hashed_from),
        ]
    if intercept:
        steps.append(Intercept())
    return Pipeline(steps, n_features=n_features)
