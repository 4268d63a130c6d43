"""Errors raised by :mod:`service.replay` (the tree is drawn in the package docstring)."""

from __future__ import annotations

from service.errors import AbstainError

__all__ = ["ReplayConfigError", "ReplayError"]


class ReplayError(AbstainError, ValueError):
    """Base of every error raised on purpose by :mod:`service.replay`."""


class ReplayConfigError(ReplayError):
    """A replay or benchmark option is invalid (unknown algorithm, cost outside (0, 0.5), ...)."""
