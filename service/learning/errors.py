"""Errors raised by :mod:`service.learning` (the tree is drawn in the package docstring).

Every error is a :class:`ValueError`, so callers that only know the standard library
still catch it, and a :class:`service.errors.AbstainError` (the package-wide root, a
standard-library-only module); callers inside the product catch :class:`LearningError`.
"""

from __future__ import annotations

from service.errors import AbstainError

__all__ = [
    "DimensionError",
    "HyperparameterError",
    "InputError",
    "LabelError",
    "LearningError",
    "NonFiniteError",
    "StateError",
]


class LearningError(AbstainError, ValueError):
    """Base of every error raised on purpose by :mod:`service.learning`."""


class HyperparameterError(LearningError):
    """A constructor or configuration argument lies outside its declared bounds."""


class InputError(LearningError):
    """An example (x, y or a query coin) the model cannot take; the model is unchanged."""


class DimensionError(InputError):
    """``x`` has the wrong shape or number of features."""


class NonFiniteError(InputError):
    """``x`` holds NaN or infinity, or an update would make ``w`` or ``rho`` non-finite."""


class LabelError(InputError):
    """``y`` is not ``+1`` or ``-1``."""


class StateError(LearningError):
    """A state record this release cannot read: unknown format or version, or corrupt fields."""
