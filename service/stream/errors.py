"""Errors of :mod:`service.stream` (the whole tree: :mod:`service.errors`)."""

from __future__ import annotations

from service.errors import AbstainError

__all__ = ["StreamError", "TopicError"]


class StreamError(AbstainError, RuntimeError):
    """The stream cannot go on as configured."""


class TopicError(StreamError):
    """A topic is missing or cannot be described."""
