"""What the team view shows of a model's learning: its last detected change, the changes
and takeovers so far, whether it is relearning now, and the corrections it does not hold
yet (:class:`CorrectionsWaiting`).

A model served inside :class:`service.learning.Adaptive` (the default) carries in its
snapshot the label count at its last detected change, how many changes were detected and
how many times a challenger took over, and its risk since the last change or takeover. The
desk reads them from the snapshot it follows on the models topic (the worker's follower):
nothing is asked of the worker.

A model is **relearning** for ``patience`` labels after a detected change (the model's own
setting, 200 by default: the labels a challenger has to take over before it is dropped), and
for as long as challengers are still running: its answers steer which learner serves next,
so they are worth more than usual. A model served without the wrapper (``adaptive.enabled =
false``) has no row (:func:`change_of` is ``None``).

>>> from service.config import ModelConfig
>>> from service.stream.models.served import ServedModel, initial_envelope
>>> served = ServedModel.from_envelope(ModelConfig(n_features=2),
...                                    initial_envelope("m", ModelConfig(n_features=2)))
>>> row = change_of(served)
>>> row.changes, row.last_change, row.relearning, row.detects
(0, None, False, True)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from service.learning import Adaptive

__all__ = ["WAIT_AT_MOST", "ChangeRow", "Changes", "CorrectionsWaiting", "change_of"]


@dataclass(frozen=True, slots=True)
class ChangeRow:
    """One model's learning, as of the snapshot the desk serves."""

    version: int  # the snapshot's version
    labels: int  # labels the model has learned from
    detects: bool  # a change detector or a collapse watch is on
    changes: int  # changes detected so far
    takeovers: int  # challengers that replaced the champion so far
    last_change: int | None  # label count at the last detected change (None: none yet)
    risk: float | None  # risk since the last change or takeover (None: no label since)
    risk_labels: int  # labels that risk is over
    challengers: tuple[str, ...]  # challengers running now
    window: int  # labels after a change during which the model is marked relearning

    @property
    def since(self) -> int | None:
        """Labels since the last detected change (None: none yet)."""
        return None if self.last_change is None else max(0, self.labels - self.last_change)

    @property
    def relearning(self) -> bool:
        """A change within the last ``window`` labels, or challengers still running."""
        since = self.since
        return since is not None and (since < self.window or bool(self.challengers))


def change_of(served: Any) -> ChangeRow | None:
    """The learning row of a served model; ``None`` for a learner without the wrapper (or
    no model)."""
    learner = getattr(served, "learner", None)
    if not isinstance(learner, Adaptive):
        return None
    estimate = learner.risk_since_change
    risk = float(estimate.risk)
    return ChangeRow(
        version=int(served.version),
        labels=learner.labels,
        detects=learner.detector is not None or learner.collapse_window > 0,
        changes=learner.changes_detected,
        takeovers=learner.takeovers,
        last_change=learner.last_change,
        risk=risk if estimate.labels > 0 and math.isfinite(risk) else None,
        risk_labels=int(estimate.labels),
        challengers=learner.running,
        window=int(learner.patience),
    )


class Changes:
    """:func:`change_of` for every model, recomputed only for a model whose served
    snapshot was replaced (snapshots are swapped, never mutated): a refresh of the team
    view costs a dictionary lookup per model."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[Any, ChangeRow | None]] = {}

    def rows(self, served: Mapping[str, Any]) -> dict[str, ChangeRow]:
        """Rows of the adaptive models among ``served`` (name -> served model)."""
        out: dict[str, ChangeRow] = {}
        for name, model in served.items():
            known = self._rows.get(name)
            if known is None or known[0] is not model:
                known = (model, change_of(model))
                self._rows[name] = known
            if known[1] is not None:
                out[name] = known[1]
        return out


#: seconds after which a correction the model does not hold is no longer counted as queued
#: (the learner refused it: a dead letter; a derivation never takes that long)
WAIT_AT_MOST = 600.0


class CorrectionsWaiting:
    """Corrections the desk read on the labels topic (and its book took) that the model it
    serves does not hold yet: the learner applies them together once derived
    (``ModelEnvelope.corrected_to`` says up to which labels offset a snapshot holds them).
    One not held after :data:`WAIT_AT_MOST` seconds was refused by the learner.

    >>> from service.records import ModelEnvelope
    >>> waiting = CorrectionsWaiting(clock=lambda: 0.0)
    >>> for offset in (40, 41, 45):
    ...     waiting.add("m", 0, offset)
    >>> served = ModelEnvelope("m", 9, {}, {}, labels_partition=0, corrected_to=41)
    >>> waiting.count("m", served)
    1
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # model -> (partition, offset, when it was read)
        self._read: dict[str, list[tuple[int, int, float]]] = {}

    def add(self, model: str, partition: int, offset: int) -> None:
        """A correction of ``model`` read at labels ``partition``, ``offset``."""
        self._read.setdefault(model, []).append((partition, offset, self.clock()))

    def count(self, model: str, envelope: Any) -> int:
        """The corrections of ``model`` its served ``envelope`` does not hold (those it holds,
        or that waited too long, are forgotten)."""
        read = self._read.get(model)
        if not read:
            return 0
        partition = getattr(envelope, "labels_partition", -1)
        held = getattr(envelope, "corrected_to", -1)
        oldest = self.clock() - WAIT_AT_MOST
        read[:] = [(p, o, t) for p, o, t in read if (p != partition or o > held) and t > oldest]
        return len(read)

    def counts(self, served: Mapping[str, Any]) -> dict[str, int]:
        """:meth:`count` of every model with corrections waiting, given the served models
        (name -> a served model with its ``envelope``)."""
        out = {}
        for name in list(self._read):
            model = served.get(name)
            n = self.count(name, getattr(model, "envelope", None))
            if n:
                out[name] = n
        return out
