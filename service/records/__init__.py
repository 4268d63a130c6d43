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

Errors::

    AbstainError
     └── RecordError        (ValueError) a record cannot be used
          └── BadMessage    one consumed message refused; .reason (a Reason), .detail
"""

from service.records.champions import (
    CHAMPIONS_KEY,
    CHAMPIONS_MAX_SERIAL,
    Champions,
    parse_champions,
)
from service.records.codec import (
    DEAD_LETTER_REASONS,
    BadMessage,
    RecordError,
    decode_json,
    decode_object,
    dumps,
    encode_finite,
)
from service.records.history import Note, Step, parse_step
from service.records.ids import coin, request_id
from service.records.labels import (
    ROLES,
    Correction,
    LabelsRecord,
    Opinion,
    Role,
    Rollback,
    Seed,
    parse_labels_record,
)
from service.records.reasons import IGNORED, REFUSED, Action, Reason, Source
from service.records.signing import SIGNATURE_HEADER, Signer
from service.records.skips import SkipOrder, is_skip_key, parse_skip_order, skip_key
from service.records.state import (
    MAX_MAGNITUDE,
    MODEL_FORMAT,
    MODEL_FORMAT_VERSION,
    ModelEnvelope,
    ParkedLabel,
    PendingEntry,
    parse_model_envelope,
    parse_parked_label,
    parse_pending_entry,
)
from service.records.wire import (
    DeadLetter,
    Decision,
    FeatureEvent,
    FeatureMoments,
    Label,
    LabelRequest,
    RawMessage,
    label_from_dict,
    label_request_from_dict,
    parse_feature_event,
    parse_label,
    parse_label_request,
    plain_feature_row,
)

__all__ = [
    "CHAMPIONS_KEY",
    "CHAMPIONS_MAX_SERIAL",
    "DEAD_LETTER_REASONS",
    "IGNORED",
    "MAX_MAGNITUDE",
    "MODEL_FORMAT",
    "MODEL_FORMAT_VERSION",
    "REFUSED",
    "ROLES",
    "Action",
    "BadMessage",
    "Champions",
    "Correction",
    "Decision",
    "DeadLetter",
    "FeatureEvent",
    "FeatureMoments",
    "Label",
    "LabelRequest",
    "LabelsRecord",
    "ModelEnvelope",
    "Note",
    "Opinion",
    "ParkedLabel",
    "PendingEntry",
    "RawMessage",
    "Reason",
    "RecordError",
    "Role",
    "Rollback",
    "SIGNATURE_HEADER",
    "Seed",
    "Signer",
    "SkipOrder",
    "Source",
    "Step",
    "decode_json",
    "decode_object",
    "dumps",
    "encode_finite",
    "is_skip_key",
    "label_from_dict",
    "label_request_from_dict",
    "parse_champions",
    "parse_feature_event",
    "parse_label",
    "parse_label_request",
    "parse_labels_record",
    "parse_model_envelope",
    "parse_parked_label",
    "parse_pending_entry",
    "parse_skip_order",
    "parse_step",
    "plain_feature_row",
    "coin",
    "request_id",
    "skip_key",
]
