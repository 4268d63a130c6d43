"""Learning when the world changes: :class:`~.learner.Adaptive` wraps any learner, watches its
labels with a change detector (:mod:`service.learning.drift`) and lets challengers started
from the labels it remembers (:mod:`.recall`, :mod:`.challengers`) take over when they are
better. It rebuilds the learners it holds through the registry, so it sits above it (as
:mod:`service.learning.budget.budgeted` does). :mod:`.parts` builds the learner a model
serves (the wrapper with the parts its configuration turns on) for the worker and the replay."""

from .learner import ADAPTIVE_FORMAT, CHALLENGER_KINDS, SIGNALS, TESTS, Adaptive
from .parts import (
    RHO_STEP,
    Parts,
    is_adaptive_state,
    learner_for,
    serving_learner,
    serving_state,
    tracking_steps,
)

__all__ = [
    "ADAPTIVE_FORMAT",
    "CHALLENGER_KINDS",
    "SIGNALS",
    "RHO_STEP",
    "TESTS",
    "Adaptive",
    "Parts",
    "is_adaptive_state",
    "learner_for",
    "serving_learner",
    "serving_state",
    "tracking_steps",
]
