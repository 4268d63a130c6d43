"""Every record abstain reads or writes, typed, frozen, with one codec and one validator.

This package is the one place that knows the wire and state formats. It imports the
standard library, numpy and orjson only (never faust, aiokafka or the web layer), so
``service.metrics``, ``service.web``, ``service.stream`` and every tool depend on it and it
depends on none of them.

- :mod:`.reasons`: the closed sets (:class:`Source`, :class:`Action`, :class:`Reason`);
- :mod:`.codec`: orjson out, validated JSON in, :class:`BadMessage` with a reason;
- :mod:`.wire`: topic records (feature event, decision, label request, label, dead letter);
- :mod:`.labels`: what else the labels topic carries (corrections, second opinions, orders)
  and its one parser;
- :mod:`.state`: table and snapshot records (model envelope, pending entry, parked label);
- :mod:`.history`: the steps of the learner's history (what a correction reaches back to);
- :mod:`.champions`: which model of each group serves (the models topic's champions record);
- :mod:`.skips`: an operator's order to move a partition past a batch no worker can read;
- :mod:`.signing`: the HMAC signature of model snapshots;
- :mod:`.ids`: the label-request id and the query and audit coins (hashes: replays repeat).

The package exports the records of the topics, their parsers and errors, the
label-request id and coins, and the snapshot signer; everything else is imported from its
module (e.g. :class:`~.labels.Rollback` from ``service.records.labels``).

Errors::

    AbstainError
     └── RecordError        (ValueError) a record cannot be used
          └── BadMessage    one consumed message refused; .reason (a Reason), .detail
"""

from service.records.champions import Champions
from service.records.codec import BadMessage, RecordError
from service.records.ids import coin, request_id
from service.records.labels import Correction, Opinion
from service.records.reasons import Action, Reason
from service.records.signing import SIGNATURE_HEADER, Signer
from service.records.state import (
    MODEL_FORMAT_VERSION,
    ModelEnvelope,
    PendingEntry,
    parse_model_envelope,
)
from service.records.wire import (
    DeadLetter,
    Decision,
    FeatureEvent,
    Label,
    LabelRequest,
    RawMessage,
    feature_event,
    parse_feature_event,
    parse_label,
    parse_label_request,
)

__all__ = [
    "Action",
    "BadMessage",
    "Champions",
    "Correction",
    "DeadLetter",
    "Decision",
    "FeatureEvent",
    "Label",
    "LabelRequest",
    "MODEL_FORMAT_VERSION",
    "ModelEnvelope",
    "Opinion",
    "PendingEntry",
    "RawMessage",
    "Reason",
    "RecordError",
    "SIGNATURE_HEADER",
    "Signer",
    "coin",
    "feature_event",
    "parse_feature_event",
    "parse_label",
    "parse_label_request",
    "parse_model_envelope",
    "request_id",
]
