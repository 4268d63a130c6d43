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

__all__ = ["IGNORED", "MOMENTS_REFUSED", "REFUSED", "Action", "Reason", "Source"]


class Source(StrEnum):
    """The input a dead letter came from (the ``source`` label of the dead-letter counter)."""

    FEATURES = "features"
    LABELS = "labels"
    LABEL_REQUESTS = "label-requests"
    MODELS = "models"
    CHANGELOGS = "changelogs"  # the learner's own tables, read back at every start


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
    BAD_KEY = "bad_key"  # the record's key is not what its content says (model name)
    WRONG_PARTITION = "wrong_partition"  # not on the partition its model's key maps to
    FORGED_ID = "forged_id"  # a request id the service would not derive from (model, event)
    DUPLICATE_ID = "duplicate_id"  # an event id seen before with other features
    UNSIGNED = "unsigned"  # a snapshot without a signature while a key is configured
    BAD_SIGNATURE = "bad_signature"  # a snapshot whose signature does not verify
    UNKNOWN_VERSION = "unknown_version"  # a rollback to a version the learner no longer keeps
    NOT_ANSWERED = "not_answered"  # a correction of a request that has no label to correct
    BEYOND_REACH = "beyond_reach"  # a correction of a label older than the model keeps
    NOT_AUTHOR = "not_author"  # an author's correction of a label someone else gave
    UNREADABLE = "unreadable"  # a record batch the client cannot read (codec, CRC, a record)
    HISTORY_UNTRUSTED = "history_untrusted"  # the learner's history failed its checks
    REPLAYED = "replayed"  # a copy of a correction or an order the learner already took
    FIELD = "field"  # an event's field does not fit its model's declaration (named)
    MOMENTS = "moments"  # a label request's moments no scorer gathered or signed (not merged)
    REDELIVERED = "redelivered"  # never dead-lettered: a redelivered label is a no-op


#: reasons a label changed nothing (``abstain_labels_ignored_total{reason}``)
IGNORED: Final = (
    Reason.REDELIVERED,
    Reason.ALREADY_APPLIED,
    Reason.EXPIRED,
    Reason.UNKNOWN_REQUEST,
)
#: why a label request's moments were not merged (``abstain_moments_refused_total{reason}``):
#: without a key, a mean or a variance no scorer could have gathered from events like the
#: model's so far; with ``snapshot_key``, moments no worker signed (none, or a bad signature);
#: either way, moments of other features than the model gathers (``width``)
MOMENTS_REFUSED: Final = ("mean", "spread", "width", "unsigned", "bad_signature")
#: reasons an update was refused (``abstain_updates_refused_total{reason}``)
REFUSED: Final = (Reason.NON_FINITE,)
