"""The exception tree of the whole package, rooted at :class:`AbstainError`.

This module imports nothing but the standard library, so every layer (the pure learning
core included) can derive its errors from the root. Callers inside the product catch
:class:`AbstainError` (or a branch of it), never bare ``Exception``; the dead-letter path is
the one place that catches broadly, and it records why.

::

    AbstainError                       anything raised on purpose by abstain
     ├── ConfigError        (ValueError)   invalid settings; names each offending field
     ├── DatasetError       (ValueError)   a dataset file missing, unreadable or malformed
     ├── LearningError      (ValueError)   service.learning (its own tree: learning/__init__)
     │    ├── HyperparameterError, StateError
     │    └── InputError: DimensionError, NonFiniteError, LabelError
     ├── RecordError        (ValueError)   service.records: a record cannot be used
     │    └── BadMessage                    one consumed message refused, with a reason
     ├── StreamError        (RuntimeError) service.stream: the stream cannot go on
     │    ├── TopicError                     a topic is missing or cannot be described
     │    ├── KafkaLoginError                Kafka refused the certificate or the login
     │    ├── InflateRefused                 a record batch inflates past max_inflated_bytes
     │    └── AclError                       Kafka refused to add an ACL
     ├── ReplayError        (ValueError)   service.replay
     │    └── ReplayConfigError
     └── LocalKafkaError    (RuntimeError) service.localkafka
          └── FetchError, StartError, StateFileError

The second base (``ValueError`` or ``RuntimeError``) keeps each error catchable by code that
only knows the standard library.

>>> from service.config import ConfigError
>>> from service.learning import StateError
>>> issubclass(ConfigError, AbstainError) and issubclass(StateError, AbstainError)
True
"""

from __future__ import annotations

__all__ = ["AbstainError"]


class AbstainError(Exception):
    """Root of every error raised on purpose by abstain."""
