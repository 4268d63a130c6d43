"""The desk's errors (drawn in :mod:`service.desk`)."""

from __future__ import annotations

from service.errors import AbstainError

__all__ = ["AccountsError", "DeskError", "Refused", "Unavailable"]


class DeskError(AbstainError):
    """Something the label desk cannot do."""


class AccountsError(DeskError, ValueError):
    """The users file cannot be used; the message says what to fix."""


class Refused(DeskError):
    """A person's action is refused: ``status`` is the HTTP status, ``code`` a stable word
    (``already_answered``, ``expired``, ``not_yours``, ...) and the message says why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


class Unavailable(DeskError):
    """Kafka did not acknowledge in time: nothing was saved, the request stays open."""
