"""The exception tree of :mod:`service.localkafka` (drawn in the package docstring)."""

from __future__ import annotations

from service.errors import AbstainError

__all__ = ["FetchError", "LocalKafkaError", "StartError", "StateFileError"]


class LocalKafkaError(AbstainError, RuntimeError):
    """Base of every error raised by this package."""


class FetchError(LocalKafkaError):
    """The broker's jars could not be fetched."""


class StartError(LocalKafkaError):
    """The broker did not start or did not answer in time."""


class StateFileError(LocalKafkaError):
    """A state file exists but cannot be read."""
