"""Closed sets: where a message came from, what was decided, why something was refused.

Each is a ``StrEnum``: a member is its own string, so it goes into JSON, metric labels and
log lines as the plain value (``Reason.SCHEMA == "schema"``).

>>> Reason("expired") is Reason.EXPIRED
True
>>> f"{Source.LABEL_REQUESTS}"
'label-requests'
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["IGNORED", "REFUSED", "Action", "Reason", "Source"]


class Source(StrEnum):
    """The input a dead letter came from (the ``source`` label of the dead-letter counter)."""

    FEATURES = "features"
    LABELS = "labels"
    LABEL_REQUESTS = "label-requests"


class Action(StrEnum):
    """What a decision does with its event."""

    PREDICT = "predict"
    REJECT = "reject"


class Reason(StrEnum):
    """Why a message was refused or changed nothing (dead letters, ignored labels)."""

    NOT_JSON = "not_json"
    SCHEMA = "schema"
    FEATURE_COUNT = "feature_count"
    NON_FINITE = "non_finite"
    UNKNOWN_MODEL = "unknown_model"
    BAD_LABEL = "bad_label"
    UNKNOWN_REQUEST = "unknown_request"
    EXPIRED = "expired"
    ALREADY_APPLIED = "already_applied"
    OVERSIZE = "oversize"
    REDELIVERED = "redelivered"  # never dead-lettered: a redelivered label is a no-op


#: reasons a label changed nothing (``abstain_labels_ignored_total{reason}``)
IGNORED: Final = (
    Reason.REDELIVERED,
    Reason.ALREADY_APPLIED,
    Reason.EXPIRED,
    Reason.UNKNOWN_REQUEST,
)
#: reasons an update was refused (``abstain_updates_refused_total{reason}``)
REFUSED: Final = (Reason.NON_FINITE,)
