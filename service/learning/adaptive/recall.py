"""What an :class:`~service.learning.adaptive.Adaptive` model remembers of its recent past:
the last labels it learned from and where its champion was a few labels apart, so that
challengers can be started *at* a change that is only noticed some labels later.

* :class:`Recall` keeps the last ``size`` labelled examples (the input as the learner saw
  it, the label, the probability it was asked with, the champion's 0-d-1 loss on it before
  learning from it) and, every :data:`SNAPSHOT_EVERY` labels, a snapshot of the champion's
  weights (linear learners; ``None`` for kernel learners) and width $\\rho$.
* :meth:`Recall.since` gives the snapshot taken at or before a given label whose labels
  since are all remembered, and those labels, in order.

All of it is plain numbers and round-trips through :meth:`Recall.to_state`. A remembered
input of a wide model is written as where it is set (``x_at``, ``x_to``). A snapshot's
weights are written as the ones that differ from the next snapshot's (the newest: from the
champion's weights now, which :meth:`Recall.to_state` is given): ``w_at`` their indices,
``w_to`` their values, bit for bit. A snapshot a few labels old differs in the weights of
the inputs those labels set, so a wide model whose events set few inputs writes a few
numbers per snapshot instead of its width. Where more than half of them differ (a dense
model's), the weights are written whole (``w``), as records written before hold them.

A champion that learns rows (a wide model's: each label writes the weights of its row's
entries, in place) is not copied at each snapshot either: the recall keeps each snapshot's
record alone and, for the newest, the weights each label since was about to write, as they
were (:meth:`Recall.before`). A snapshot's weights are the champion's now with those put
back, newest first; its record is what a copy would have written, bit for bit. A snapshot
then costs the entries its labels set, not the model's width, in time and in memory.

>>> from service.learning import DSAL
>>> recall, champion = Recall(16), DSAL(n_features=8, cost=0.25)
>>> for t in range(20):  # rows that set two of the eight inputs
...     recall.snapshot(t, champion)
...     x = np.array([1.0, float(t % 3)] + [0.0] * 6)
...     _ = champion.update(x, 1)
...     recall.remember(t, x, 1.0, 0.5, 0.25)
>>> at, w, rho, labels = recall.since(13)
>>> at, len(labels), labels[0][0]
(8, 12, 8)
>>> record = recall.to_state(champion.w)
>>> [s["w_at"] for s in record["snapshots"]]   # the weights changed since each snapshot
[[0, 1], [0, 1], [0, 1]]
>>> Recall.from_state(16, record, 8, champion.w).since(13)[1] == w
True
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from .. import state as st
from ..errors import StateError
from ..losses import FloatArray
from ..sparse import SparseRow

__all__ = ["SNAPSHOT_EVERY", "Recall", "Remembered", "Snapshot"]

SNAPSHOT_EVERY: Final = 8
"""Labels between two snapshots of the champion."""

Snapshot = tuple[int, list[float] | FloatArray | None, float]
"""(labels learned before it, the champion's weights or ``None``, its rho)."""
Remembered = tuple[int, FloatArray | SparseRow, float, float, float]
"""(label number, input, label, query probability, the champion's loss on it)."""


class Recall:
    """The last ``size`` labels (plus up to one snapshot period) and the snapshots that
    reach as far back."""

    __slots__ = (
        "size",
        "_delta",
        "_labels",
        "_records",
        "_snapshot_records",
        "_snapshots",
        "_undo",
    )

    def __init__(self, size: int) -> None:
        self.size = size
        self._labels: deque[Remembered] = deque(maxlen=size + SNAPSHOT_EVERY if size else 0)
        # each remembered label's record, made once: a label never changes once remembered,
        # so every state written while it is remembered holds the same record (a learner
        # writes a state per label; making 40 of these each time was most of its cost)
        self._records: deque[dict[str, Any]] = deque(maxlen=self._labels.maxlen)
        self._snapshots: deque[Snapshot] = deque(maxlen=size // SNAPSHOT_EVERY + 2)
        # the record of every snapshot but the newest (whose weights are written against the
        # champion's now, in to_state): each against the snapshot after it, made once
        self._snapshot_records: deque[dict[str, Any]] = deque(
            maxlen=(self._snapshots.maxlen or 1) - 1
        )
        # a champion that learns rows: its snapshots keep no weights (``None`` in
        # _snapshots), only their records; the newest one's weights are the champion's now
        # with _undo put back: before each label since it, the weights its row was about to
        # write, as they were (module docstring)
        self._delta = False
        self._undo: list[tuple[npt.NDArray[np.int64], FloatArray]] = []

    def snapshot(self, label: int, champion: Any) -> None:
        """Before the champion learns label number ``label``: keep where it is, every
        :data:`SNAPSHOT_EVERY` labels. A champion that learns rows (and lets its weights
        be read in place: ``peek``) is kept as what its labels change (:meth:`before`)."""
        if self.size and label % SNAPSHOT_EVERY == 0:
            if getattr(champion, "takes_rows", False) and callable(getattr(champion, "peek", None)):
                now = champion.peek()[0]
                if self._snapshots:  # the newest so far, written against the champion now
                    self._snapshot_records.append(
                        self._newest_record(now)
                        if self._delta
                        else _snapshot_record(self._snapshots[-1], now)
                    )
                self._delta, self._undo = True, []
                self._snapshots.append((label, None, champion.rho))
                return
            w = getattr(champion, "w", None)
            if w is not None and not getattr(champion, "takes_rows", False):
                w = st.float_list(w)
            if self._delta and self._snapshots:  # the newest kept as a change: made whole
                self._make_whole(champion.peek()[0] if w is None else np.asarray(w))
            self._snap((label, w, champion.rho))

    def before(self, champion: Any, x: Any) -> None:
        """Before ``champion`` learns input ``x``: the weights the label may write, as they
        are (a snapshot kept as a change; a row writes the weights of its entries alone)."""
        if self._delta and self._snapshots:
            if type(x) is not SparseRow:  # no rows after all: the snapshots made whole
                self._make_whole(champion.peek()[0])
                return
            w = champion.peek()[0]
            self._undo.append((x.indices, w[x.indices]))

    def _snap(self, item: Snapshot) -> None:
        if self._snapshots:  # the newest so far is written against this one from now on
            self._snapshot_records.append(_snapshot_record(self._snapshots[-1], item[1]))
        self._snapshots.append(item)

    def _newest_before(self) -> tuple[npt.NDArray[np.int64], FloatArray]:
        """The weights the labels since the newest snapshot may have changed (sorted, each
        once) and their values at that snapshot."""
        if not self._undo:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        idx = np.concatenate([i for i, _ in self._undo])
        old = np.concatenate([v for _, v in self._undo])
        at, first = np.unique(idx, return_index=True)  # each weight as it was first
        return at, old[first]

    def _newest_record(self, now: FloatArray) -> st.FrozenRecord:
        """The newest snapshot's record written against the weights ``now`` (what
        :func:`_snapshot_record` writes of its whole weights, bit for bit)."""
        n, _, rho = self._snapshots[-1]
        at, was = self._newest_before()
        differ = was.view(np.uint64) != now[at].view(np.uint64)
        if 2 * int(np.count_nonzero(differ)) > now.size:  # most differ: whole
            whole = now.copy()
            whole[at] = was
            return st.FrozenRecord(n=n, w=st.float_list(whole), rho=rho)
        return st.FrozenRecord(
            n=n, rho=rho, w_at=st.IndexList(at[differ]), w_to=st.float_list(was[differ])
        )

    def _weights(self, k: int, now: FloatArray) -> FloatArray:
        """Snapshot ``k``'s weights (kept as a change): the weights ``now`` with what
        changed since each snapshot from the newest back to ``k`` put back."""
        out = np.array(now, dtype=np.float64)
        at, was = self._newest_before()
        out[at] = was
        for j in range(len(self._snapshots) - 2, k - 1, -1):
            record = self._snapshot_records[j]
            if "w_at" in record:  # the weights that differ from the next snapshot's
                out = st.changed(record, "w", out, out.size, "a snapshot", copy=False)
            else:
                out = st.read_floats(record, "w", (out.size,))
        return out

    def _make_whole(self, now: FloatArray) -> None:
        """Keep every snapshot's weights whole from now on (the champion no longer learns
        rows)."""
        whole = [self._weights(k, now) for k in range(len(self._snapshots))]
        self._snapshots = deque(
            (
                (n, st.float_list(w), rho)
                for (n, _, rho), w in zip(self._snapshots, whole, strict=True)
            ),
            maxlen=self._snapshots.maxlen,
        )
        self._delta, self._undo = False, []

    def remember(
        self, label: int, x: FloatArray | SparseRow, y: float, p: float, loss: float
    ) -> None:
        if self.size:
            kept = x if type(x) is SparseRow else np.array(x, dtype=np.float64)
            self._keep((label, kept, y, p, loss))

    def _keep(self, item: Remembered) -> None:
        n, x, y, p, loss = item
        self._labels.append(item)
        self._records.append(st.FrozenRecord(n=n, **_input_record(x), y=y, p=p, loss=loss))

    def since(self, label: int, now: Any = None) -> tuple[int, Any, float | None, list[Remembered]]:
        """The latest snapshot at or before ``label`` whose labels since are all remembered,
        with those labels: ``(snapshot's label, weights, rho, labels)``; without one,
        ``(label, None, None, [])``. ``now``: the champion's weights (a snapshot kept as
        a change is read from them, and its weights are a new array, not a list)."""
        oldest = self._labels[0][0] if self._labels else label
        for k in range(len(self._snapshots) - 1, -1, -1):
            at, w, rho = self._snapshots[k]
            if oldest <= at <= label:
                if self._delta:
                    if now is None:
                        raise ValueError("a snapshot kept as a change needs the weights now")
                    w = self._weights(k, np.asarray(now, dtype=np.float64))
                return at, w, rho, [r for r in self._labels if r[0] >= at]
        return label, None, None, []

    def clear(self) -> None:
        self._labels.clear()
        self._records.clear()
        self._snapshots.clear()
        self._snapshot_records.clear()
        self._delta, self._undo = False, []

    def to_state(self, w: Any = None) -> dict[str, Any]:
        """The remembered labels and the snapshots, the newest snapshot's weights written
        against ``w`` (the champion's now; ``None``: whole). Each record but the newest
        snapshot's is shared by the states made while it is kept: a
        :class:`~service.learning.state.FrozenRecord`, never changed once made."""
        snapshots = list(self._snapshot_records)
        if self._snapshots and self._delta:
            if w is None:
                raise ValueError("a snapshot kept as a change is written against the weights")
            snapshots.append(self._newest_record(np.asarray(w, dtype=np.float64)))
        elif self._snapshots:
            snapshots.append(_snapshot_record(self._snapshots[-1], w))
        return {"labels": list(self._records), "snapshots": snapshots}

    @classmethod
    def from_state(
        cls, size: int, record: Any, n_features: int, w: Any = None, *, rows: bool = False
    ) -> Recall:
        """The recall of :meth:`to_state`'s ``record``; ``w`` the champion's weights it was
        written against; ``rows``: the champion learns rows
        (:class:`~service.learning.sparse.SparseRow`), which the inputs are read as."""
        if not isinstance(record, Mapping):
            raise StateError("adaptive state field 'recall' must be an object")
        out = cls(size)
        labels, snaps = record.get("labels"), record.get("snapshots")
        if not isinstance(labels, list) or not isinstance(snaps, list):
            raise StateError("adaptive state field 'recall' needs 'labels' and 'snapshots'")
        if len(labels) > (out._labels.maxlen or 0) or len(snaps) > (out._snapshots.maxlen or 0):
            raise StateError("adaptive state field 'recall' holds more than it can")
        for item in labels:
            if not isinstance(item, Mapping):
                raise StateError("a remembered label must be an object")
            whole = _input(item, n_features)
            x: FloatArray | SparseRow = SparseRow.dense(whole) if rows else whole
            y = st.read_float(item, "y")
            if y not in (1.0, -1.0):
                raise StateError(f"a remembered label must be +1 or -1, got {y!r}")
            p = st.read_float(item, "p", minimum=0.0)
            loss = st.read_float(item, "loss", minimum=0.0)
            out._keep((st.read_int(item, "n"), x, y, p, loss))
        if not all(isinstance(item, Mapping) for item in snaps):
            raise StateError("a snapshot must be an object")
        after = None if w is None else np.asarray(w, dtype=np.float64)
        read: list[Snapshot] = []
        for item in reversed(snaps):  # each written against the one after it
            weights = _snapshot_weights(item, after, n_features)
            rho = st.read_float(item, "rho", minimum=0.0)
            read.append(
                (st.read_int(item, "n"), None if weights is None else st.float_list(weights), rho)
            )
            after = weights
        for snapshot in reversed(read):
            out._snap(snapshot)
        if rows and w is not None and read and all(r[1] is not None for r in read):
            out._keep_changes(np.asarray(w, dtype=np.float64))
        return out

    def _keep_changes(self, now: FloatArray) -> None:
        """Keep the snapshots read whole (a champion of rows) as changes from now on: their
        records stay, their weights go; the newest one's, against ``now``, is what the
        labels since it changed."""
        newest = self._snapshots[-1][1]
        changes = st.changes_from(np.asarray(newest, dtype=np.float64), now)
        if changes is None:  # most weights changed since: kept whole
            return
        at, was = changes
        self._undo = [(np.array(at, dtype=np.int64), np.array(was, dtype=np.float64))]
        self._snapshots = deque(
            ((n, None, rho) for n, _, rho in self._snapshots), maxlen=self._snapshots.maxlen
        )
        self._delta = True


def _input_record(x: FloatArray | SparseRow) -> dict[str, Any]:
    """A remembered input as its record writes it: where it is not +0.0 (``x_at``, and
    ``x_to`` there, bit for bit) when at most half of at least
    :data:`~service.learning.state.SHARED_FROM` inputs are (a wide model's row sets a few
    hundred of 2^18), else whole (``x``); a row always as its entries."""
    if isinstance(x, SparseRow):
        return {"x_at": st.IndexList(x.indices), "x_to": st.float_list(x.values)}
    if x.size >= st.SHARED_FROM:
        changes = st.changes_from(x, np.zeros(x.size))
        if changes is not None:
            return {"x_at": changes[0], "x_to": changes[1]}
    return {"x": st.float_list(x)}


def _input(item: Mapping[str, Any], n_features: int) -> FloatArray:
    """A remembered label's input, either form of :func:`_input_record`."""
    if "x_at" not in item:
        return st.read_floats(item, "x", (n_features,))
    if "x" in item:
        raise StateError("a remembered label's input is written whole or as where it is set")
    return st.changed(item, "x", np.zeros(n_features), n_features, "a remembered label")


def _snapshot_record(snapshot: Snapshot, base: Any) -> st.FrozenRecord:
    """The record of ``snapshot``: its weights as those that differ (bit for bit) from
    ``base``, or whole without a base of the same length."""
    n, w, rho = snapshot
    changes = None if w is None else st.changes_from(w, base)
    if changes is None:
        whole = st.float_list(w) if isinstance(w, np.ndarray) else w
        return st.FrozenRecord(n=n, w=whole, rho=rho)
    return st.FrozenRecord(n=n, rho=rho, w_at=changes[0], w_to=changes[1])


def _snapshot_weights(
    item: Mapping[str, Any], after: npt.NDArray[np.float64] | None, n_features: int
) -> npt.NDArray[np.float64] | None:
    """A snapshot record's weights: whole, ``None`` (a kernel learner's), or those of the
    snapshot after it (``after``) with the ones that differ put back."""
    if "w_at" not in item:
        return None if item.get("w") is None else st.read_floats(item, "w", (n_features,))
    return st.changed(item, "w", after, n_features, "a snapshot")
