"""Errors of :mod:`service.stream` (the whole tree: :mod:`service.errors`)."""

from __future__ import annotations

from service.errors import AbstainError

__all__ = [
    "DATA_ERRORS",
    "AclError",
    "InflateRefused",
    "KafkaLoginError",
    "StreamError",
    "TopicError",
]

#: errors bad data could still provoke despite validation (a bug met by odd data): the
#: scorer and the learner dead-letter the record (reason ``schema``, the error in the detail)
#: and go on. Kafka errors are not among them: the loop that meets one starts again from its
#: last commit (the learner after reading its tables again).
DATA_ERRORS = (ValueError, TypeError, KeyError, IndexError, UnicodeError, ArithmeticError)


class StreamError(AbstainError, RuntimeError):
    """The stream cannot go on as configured."""


class TopicError(StreamError):
    """A topic is missing or cannot be described."""


class KafkaLoginError(StreamError):
    """Kafka refused the connection for good at start-up: an untrusted or mismatched
    certificate, or a refused login. The message names the setting to fix, never a secret."""


class InflateRefused(StreamError):
    """A compressed record batch would inflate beyond ``max_inflated_bytes``: refused before
    it is inflated whole (:mod:`service.stream.kafka.inflate`); read as a batch that cannot be
    read."""


class AclError(StreamError):
    """Kafka refused to add an ACL (``abstain kafka acls --apply``)."""
