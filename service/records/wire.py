"""Wire records: what travels on each topic, parsed into typed values or refused.

Every topic carries plain JSON (orjson) with no framework metadata, so any producer can
write it. ``parse_*`` never trusts its input (the service's own topics included): it
returns a frozen record or raises :class:`~service.records.codec.BadMessage`.

>>> ev = parse_feature_event(b'{"id": "e1", "features": [1, 2.5]}', default_model="m")
>>> ev.id, ev.model, ev.features
('e1', 'm', [1.0, 2.5])
>>> parse_feature_event(b'{"id": "e1"}', default_model="m")
Traceback (most recent call last):
...
service.records.codec.BadMessage: schema: missing field 'features'
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as field_
from typing import Any, Final

import numpy as np
import orjson

from service.records.codec import (
    MAX_MAGNITUDE,
    MAX_SPREAD_SIZE,
    SPARSE_FROM,
    BadMessage,
    SparseNumbers,
    decode_json,
    dumps,
    feature_list,
    field,
    ident,
    integer,
    number,
    obj,
    packed_numbers,
    read_at,
    read_numbers,
    sparse_at,
    spread,
    text,
)
from service.records.reasons import Action, Reason, Source

__all__ = [
    "Decision",
    "DeadLetter",
    "FeatureEvent",
    "FeatureMoments",
    "Label",
    "LabelRequest",
    "RawMessage",
    "label_from_dict",
    "label_request_from_dict",
    "feature_event",
    "parse_feature_event",
    "parse_label",
    "parse_label_request",
    "plain_feature_row",
]

_RAW_LIMIT: Final = 64 * 1024  # bytes of a refused message kept in its dead letter


@dataclass(frozen=True, slots=True)
class RawMessage:
    """A consumed message: its bytes and where it came from."""

    value: bytes
    topic: str
    partition: int
    offset: int
    key: bytes | None = None
    timestamp: float | None = None  # the record's Kafka timestamp, seconds (None: unknown)
    signature: bytes | None = None  # its ``abstain-signature`` header (records.signing)


@dataclass(frozen=True, slots=True)
class FeatureEvent:
    """An event to score. ``features`` is the raw vector, or a name -> value mapping when the
    model declares ``feature_names`` or ``fields`` (its values as sent: resolved by the
    handler, which knows the model and what its names take)."""

    id: str
    model: str
    features: list[float] | dict[str, Any]
    ts: float | None


def parse_feature_event(
    raw: bytes, *, default_model: str, max_bytes: int | None = None, max_features: int = 100_000
) -> FeatureEvent:
    """``{id, model?, features: [..] | {name: value}, ts?}`` -> :class:`FeatureEvent`."""
    return feature_event(
        decode_json(raw, max_bytes=max_bytes),
        default_model=default_model,
        max_features=max_features,
    )


def feature_event(value: Any, *, default_model: str, max_features: int = 100_000) -> FeatureEvent:
    """:func:`parse_feature_event` of an event's JSON already decoded (``value``)."""
    record = obj(value)
    event_id = ident(record, "id")
    model = ident(record, "model") if record.get("model") is not None else default_model
    feats = field(record, "features")
    if isinstance(feats, list):
        if len(feats) > max_features:
            raise BadMessage("feature_count", f"{len(feats)} features > limit {max_features}")
        values: list[float] | dict[str, Any] = feature_list(feats)
    elif isinstance(feats, dict):
        if len(feats) > max_features:
            raise BadMessage("feature_count", f"{len(feats)} features > limit {max_features}")
        values = {text(k, "a feature name"): v for k, v in feats.items()}
        for k, v in values.items():  # never a feature of any kind (NaN, +-Infinity)
            if type(v) is float and not math.isfinite(v):
                raise BadMessage("non_finite", f"feature {k!r:.80} is not finite")
    else:
        raise BadMessage("schema", "field 'features' must be a list or an object")
    ts = number(record, "ts") if record.get("ts") is not None else None
    return FeatureEvent(id=event_id, model=model, features=values, ts=ts)


_PLAIN: Final[frozenset[type]] = frozenset({float, int})


def plain_feature_row(
    raw: bytes,
    inputs: Mapping[str, int],
    *,
    default_model: str,
    max_bytes: int | None = None,
    max_features: int = 100_000,
) -> tuple[str, str, list[Any], float | None] | None:
    """``(model, id, features, ts)`` of an event in the common shape, None otherwise.

    The common shape is ``{"id": "...", "features": [numbers], "model"?, "ts"?}`` for a model
    of ``inputs`` (model -> number of features it takes) with a list of exactly that length;
    a batch of such rows is checked together by its caller (one array, one finiteness
    check). Anything else, and anything this check doubts, is None: :func:`parse_feature_event`
    then parses the event alone and names the exact problem.

    >>> plain_feature_row(b'{"id": "e1", "features": [1, 2.5]}', {"m": 2}, default_model="m")
    ('m', 'e1', [1, 2.5], None)
    >>> plain_feature_row(b'{"id": "e1", "features": [1]}', {"m": 2}, default_model="m") is None
    True
    """
    if max_bytes is not None and len(raw) > max_bytes:
        return None
    try:
        record = orjson.loads(raw)  # refuses lone surrogates: every str encodes as UTF-8
    except orjson.JSONDecodeError:
        return None
    if type(record) is not dict:
        return None
    event_id, feats = record.get("id"), record.get("features")
    model = record.get("model")
    name = default_model if model is None else model
    n_inputs = inputs.get(name) if type(name) is str else None
    ts = record.get("ts")
    if (
        n_inputs is None
        or type(event_id) is not str
        or not 0 < len(event_id) <= 256
        or type(feats) is not list
        or len(feats) != n_inputs
        or len(feats) > max_features
        or not (ts is None or (type(ts) in _PLAIN and math.isfinite(ts)))
        or not _PLAIN.issuperset(map(type, feats))
    ):
        return None
    return name, event_id, feats, None if ts is None else float(ts)


@dataclass(frozen=True, slots=True)
class Decision:
    """What the scorer decided for one event (``abstain.decisions``, key = event id)."""

    id: str
    model: str
    action: Action
    label: int | None  # +1 / -1, None when rejected
    score: float
    rho: float
    model_version: int
    queried: bool
    query_probability: float
    ts: float

    def to_json(self) -> bytes:
        """The record on the decisions topic."""
        return orjson.dumps(self)  # dataclasses natively, in field order


@dataclass(frozen=True, slots=True)
class FeatureMoments:
    """The moments of the events a scorer scored for a model since its last label request
    for it (the requested event among them): count, per-feature mean and sum of squared
    deviations of the raw features. The learner merges them into the model's standardiser
    (``service.learning.Moments``): those of the features its first standardiser learns,
    the first ones (every feature of a dense model; a declared model's numbers, not its
    hashed buckets). Read from the topic like everything else: a count >= 1, as many
    finite means (within +-:data:`~service.records.codec.MAX_MAGNITUDE`) as sums (>= 0,
    below ``count * MAX_MAGNITUDE**2``), at least one and at most as many as the request
    has features; the learner refuses moments of another width than its model gathers."""

    count: int
    mean: tuple[float, ...]
    m2: tuple[float, ...]
    # the scorer's signature of the moments with ``snapshot_key``
    # (:func:`~service.records.signing.moments_message`); None: unsigned
    signature: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The moments whole: a mean and a sum for every feature."""
        return {
            "count": self.count,
            "mean": list(self.mean),
            "m2": list(self.m2),
            "signature": self.signature,
        }

    def to_record(self) -> dict[str, Any]:
        """The moments as a label request writes them: whole (:meth:`to_dict`), or, when
        most features had only zeros since the last request (a declared model's hashed
        features of a dense model of many: :func:`~service.records.codec.sparse_at`), the
        features that did not alone, ``{"count", "size", "at", "mean", "m2", "signature"}``
        (``size``: how many features the moments cover). The signature covers the moments
        whole either way."""
        at = sparse_at(self.mean, self.m2, most=MAX_SPREAD_SIZE)
        if at is None:
            return self.to_dict()
        mean, m2 = self.mean, self.m2
        return {
            "count": self.count,
            "size": len(mean),
            "at": at,
            "mean": [mean[i] for i in at],
            "m2": [m2[i] for i in at],
            "signature": self.signature,
        }


@dataclass(frozen=True, slots=True)
class LabelRequest:
    """A request for the true label of one scored event (``abstain.label-requests``,
    key = model). ``features`` are the raw features, before preprocessing; a model that
    declares ``fields`` sends the event's ``fields`` instead, which the learner encodes
    under the model's declaration as the scorer did (``features`` None:
    :func:`~service.stream.labels.admission.inputs_of`)."""

    request_id: str
    event_id: str
    model: str
    # a list, or (a declared model's, read or made sparse) a
    # :class:`~service.records.codec.SparseNumbers`; None: encode ``fields``
    features: Sequence[float] | None
    score: float
    rho: float
    decided_label: int  # +1, -1, 0 = rejected
    query_probability: float  # effective probability, audit included
    model_version: int
    requested_at: float
    expires_at: float
    priority: float
    # the decision each shadow of the model made on this event when it was scored (its
    # loss is charged on it); absent in records written before shadows existed
    shadow_labels: Mapping[str, int] = field_(default_factory=dict)
    # the member of the model's group that decided (a promoted shadow); None: the model
    served_by: str | None = None
    # the moments of the events scored since the scorer's last request for the model;
    # None: records written before they existed, or a scorer that sends none
    moments: FeatureMoments | None = None
    # the event's fields as its producer sent them, those its model reads (a model that
    # declares ``fields``): what the desk shows a person and, when ``features`` is None,
    # what the learner encodes; None for the others
    fields: Mapping[str, Any] | None = None

    @property
    def server(self) -> str:
        """The model whose decision, probability and version this request carries."""
        return self.served_by or self.model

    def to_json(self) -> bytes:
        """The record on the label-requests topic (:meth:`to_dict`, encoded)."""
        if not self.sparse and type(self.features) is list:
            return orjson.dumps(self)  # dataclasses natively, in field order
        return dumps(self.to_dict())

    @property
    def sparse(self) -> bool:
        """Whether the features and moments may be written sparsely: a request of a model
        that declares ``fields`` (its hashed buckets are mostly zeros), of at least
        :data:`~service.records.codec.SPARSE_FROM` inputs. Others are written as they
        always were."""
        feats = self.features
        return self.fields is not None and (feats is None or len(feats) >= SPARSE_FROM)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a record writes them, in a plain dict; when :attr:`sparse`, the
        features and the moments that are mostly zeros in their sparse form
        (:func:`~service.records.codec.packed_numbers`, :meth:`FeatureMoments.to_record`),
        else as lists (copies)."""
        out = {name: getattr(self, name) for name in self.__slots__}
        sparse, moments = self.sparse, self.moments
        feats = self.features
        if feats is not None:
            out["features"] = (
                packed_numbers(feats) if sparse or type(feats) is SparseNumbers else list(feats)
            )
        out["shadow_labels"] = dict(self.shadow_labels)
        if moments is not None:
            out["moments"] = moments.to_record() if sparse else moments.to_dict()
        out["fields"] = None if self.fields is None else dict(self.fields)
        return out


def parse_label_request(raw: bytes, *, max_bytes: int | None = None) -> LabelRequest:
    """Parse a label request (written by scorers; still checked)."""
    if max_bytes is None or len(raw) <= max_bytes:
        try:
            record = orjson.loads(raw)  # finite numbers only (orjson refuses NaN, 1e999)
        except orjson.JSONDecodeError:
            record = None
        if type(record) is dict:
            plain = _plain_request(record, finite=True)
            return plain if plain is not None else _label_request(record)
    record = obj(decode_json(raw, max_bytes=max_bytes))
    return label_request_from_dict(record)


def label_request_from_dict(record: dict[str, Any]) -> LabelRequest:
    """Validate a decoded label request."""
    plain = _plain_request(record, finite=False)
    return plain if plain is not None else _label_request(record)


_FLOAT: Final[frozenset[type]] = frozenset({float})
_NUMBER: Final[frozenset[type]] = frozenset({float, int})
_REQUEST_NUMBERS: Final = ("score", "rho", "requested_at", "expires_at")


def _plain_request(record: dict[str, Any], *, finite: bool) -> LabelRequest | None:
    """The request of ``record`` when it has the shape scorers write most often (text ids,
    a list of floats or a declared model's fields alone, numbers, no shadow labels, no
    moments), checked in one pass; None for anything else, which :func:`_label_request`
    checks field by field (the same request, or the error that names the problem).
    ``finite``: orjson parsed ``record`` (its numbers are finite, its text valid UTF-8)."""
    get: Callable[..., Any] = record.get
    feats, decided, p, version = (
        get("features"),
        get("decided_label"),
        get("query_probability"),
        get("model_version"),
    )
    request_id: str = get("request_id")
    event_id: str = get("event_id")
    model: str = get("model")
    numbers = [get(name) for name in _REQUEST_NUMBERS]
    priority = get("priority", 0.0)
    shadows, served_by, moments = get("shadow_labels"), get("served_by"), get("moments")
    shown = get("fields")
    texts = [request_id, event_id, model] + ([] if served_by is None else [served_by])
    if feats is None and type(shown) is dict:  # a declared model's: its fields alone
        texts += shown  # the fields' names (their values are the model's to check)
        feats = []
    elif shown is not None:
        return None
    if (
        type(feats) is not list
        or type(decided) is not int
        or decided not in (-1, 0, 1)
        or type(p) is not float
        or not 0.0 < p <= 1.0
        or type(version) is not int
        or not all(type(t) is str and 0 < len(t) <= 256 for t in texts)
        or not _NUMBER.issuperset(map(type, numbers))
        or type(priority) not in _NUMBER
        or not (shadows is None or (type(shadows) is dict and not shadows))
        or moments is not None
        or not _FLOAT.issuperset(map(type, feats))
        or not (finite or _checked(feats, [*numbers, p, priority], texts))
    ):
        return None
    score, rho, requested_at, expires_at = (float(n) for n in numbers)
    return LabelRequest(
        request_id=request_id,
        event_id=event_id,
        model=model,
        features=None if shown is not None else list(feats),
        score=score,
        rho=rho,
        decided_label=decided,
        query_probability=p,
        model_version=version,
        requested_at=requested_at,
        expires_at=expires_at,
        priority=float(priority),
        shadow_labels={},
        served_by=served_by,
        fields=None if shown is None else dict(shown),
    )


def _checked(feats: list[float], numbers: list[Any], texts: list[str]) -> bool:
    """What orjson would have checked: finite numbers (an integer within a float's
    range), text that encodes as UTF-8."""
    try:
        return (
            all(map(math.isfinite, feats))
            and all(map(math.isfinite, numbers))
            and all(t.encode() is not None for t in texts)
        )
    except (OverflowError, UnicodeEncodeError):
        return False


def _label_request(record: dict[str, Any]) -> LabelRequest:
    """Validate a decoded label request, field by field (the exact problem named)."""
    shown = _fields(record)
    features = None
    if record.get("features") is not None or shown is None:  # none: encode the fields
        features = read_numbers(field(record, "features"), "features")
    decided = integer(record, "decided_label")
    if decided not in (-1, 0, 1):
        raise BadMessage("schema", f"decided_label must be -1, 0 or 1, got {decided}")
    p = number(record, "query_probability")
    if not 0.0 < p <= 1.0:
        raise BadMessage("schema", f"query_probability must be in (0, 1], got {p}")
    return LabelRequest(
        request_id=ident(record, "request_id"),
        event_id=ident(record, "event_id"),
        model=ident(record, "model"),
        features=features,
        score=number(record, "score"),
        rho=number(record, "rho"),
        decided_label=decided,
        query_probability=p,
        model_version=integer(record, "model_version"),
        requested_at=number(record, "requested_at"),
        expires_at=number(record, "expires_at"),
        priority=number(record, "priority", default=0.0),
        shadow_labels=_shadow_labels(record),
        served_by=ident(record, "served_by") if record.get("served_by") is not None else None,
        moments=_moments(record, MAX_SPREAD_SIZE if features is None else len(features)),
        fields=shown,
    )


def _fields(record: dict[str, Any]) -> dict[str, Any] | None:
    """The optional ``fields`` of a label request: an object (what the desk shows)."""
    value = record.get("fields")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadMessage("schema", "field 'fields' must be an object")
    return {text(k, "a field name"): v for k, v in value.items()}


def _moments(record: dict[str, Any], n: int) -> FeatureMoments | None:
    """The optional ``moments`` of a label request (:class:`FeatureMoments`) of ``n``
    features: of the first 1 to ``n`` of them."""
    value = record.get("moments")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadMessage("schema", "field 'moments' must be an object")
    count = integer(value, "count")
    if count < 1:
        raise BadMessage("schema", f"moments count must be >= 1, got {count}")
    at = None
    if value.get("at") is None:  # whole: as many numbers in each as the moments cover
        width = len(mean) if isinstance(mean := field(value, "mean"), list) else 0
        need, size = width if 1 <= width <= n else -1, f"1 to {n} numbers, as many in each"
    else:
        width, most = value.get("size", n), min(n, MAX_SPREAD_SIZE)
        if type(width) is not int or not 1 <= width <= most:
            raise BadMessage("schema", f"moments 'size' must be an integer from 1 to {most}")
        at = read_at(value["at"], width, "moments")
        need, size = len(at), "numbers as long as 'at'"
    parts = []
    for key in ("mean", "m2"):
        items = field(value, key)
        if not isinstance(items, list) or len(items) != need:
            raise BadMessage("schema", f"moments {key!r} must be a list of {size}")
        parts.append(feature_list(items))
    mean, m2 = parts  # the numbers written (those of a sparse record: zero elsewhere)
    if mean and float(np.abs(mean).max()) > MAX_MAGNITUDE:
        raise BadMessage("schema", f"moments 'mean' must be within +-{MAX_MAGNITUDE:g}")
    below = count * MAX_MAGNITUDE * MAX_MAGNITUDE if count < MAX_MAGNITUDE else math.inf
    if m2 and not (float(np.min(m2)) >= 0.0 and float(np.max(m2)) < below):
        raise BadMessage("schema", "moments 'm2' must be >= 0 and below count * 1e200")
    if at is not None:
        mean, m2 = spread(at, mean, width), spread(at, m2, width)
    signature = value.get("signature")
    if signature is not None and (not isinstance(signature, str) or len(signature) > 256):
        raise BadMessage("schema", "moments 'signature' must be a short string")
    return FeatureMoments(count, tuple(mean), tuple(m2), signature)


def _shadow_labels(record: dict[str, Any]) -> dict[str, int]:
    """The optional ``shadow_labels`` map: model name -> +1, -1 or 0."""
    value = record.get("shadow_labels")
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 64:
        raise BadMessage("schema", "field 'shadow_labels' must be an object of at most 64 models")
    out = {}
    for name, label in value.items():
        text(name, "a shadow model name")
        if isinstance(label, bool) or label not in (-1, 0, 1) or not isinstance(label, int):
            raise BadMessage("schema", f"shadow_labels[{name!r}] must be -1, 0 or 1")
        out[name] = int(label)
    return out


@dataclass(frozen=True, slots=True)
class Label:
    """A true label for a requested event (``abstain.labels``, key = model)."""

    request_id: str
    model: str
    label: int  # +1 / -1
    labelled_by: str
    ts: float | None

    def to_json(self) -> bytes:
        """The record on the labels topic."""
        return orjson.dumps(self)  # dataclasses natively, in field order


def parse_label(raw: bytes, *, max_bytes: int | None = None) -> Label:
    """``{request_id, model, label: 1|-1, labelled_by?, ts?}`` -> :class:`Label`.

    >>> parse_label(b'{"request_id": "r", "model": "m", "label": 0}')
    Traceback (most recent call last):
    ...
    service.records.codec.BadMessage: bad_label: label must be 1 or -1, got 0
    """
    record = obj(decode_json(raw, max_bytes=max_bytes))
    return label_from_dict(record)


def label_from_dict(record: dict[str, Any]) -> Label:
    """Validate a decoded label."""
    request_id = ident(record, "request_id")
    model = ident(record, "model")
    value = field(record, "label")
    if isinstance(value, bool) or value not in (1, -1) or isinstance(value, float | str):
        raise BadMessage("bad_label", f"label must be 1 or -1, got {value!r}")
    by = record.get("labelled_by", "")
    if not isinstance(by, str) or len(by) > 256:
        raise BadMessage("schema", "field 'labelled_by' must be a short string")
    text(by, "field 'labelled_by'")
    ts = number(record, "ts") if record.get("ts") is not None else None
    return Label(request_id=request_id, model=model, label=int(value), labelled_by=by, ts=ts)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A refused input and why (``abstain.dead-letters``)."""

    source: Source
    topic: str
    partition: int
    offset: int
    reason: Reason
    detail: str
    raw: bytes
    #: the last offset of a range refused together (an unreadable batch); None: one record
    last_offset: int | None = None

    @classmethod
    def of(cls, source: Source, message: RawMessage, reason: str, detail: str) -> DeadLetter:
        """The dead letter of a consumed ``message``."""
        return cls(
            Source(source),
            message.topic,
            message.partition,
            message.offset,
            Reason(reason),
            detail,
            message.value,
        )

    def to_json(self) -> bytes:
        """The record on the dead-letters topic (raw input as text, or base64 if binary)."""
        raw = self.raw[:_RAW_LIMIT]
        try:
            body, encoding = raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            body, encoding = base64.b64encode(raw).decode("ascii"), "base64"
        out = {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "reason": self.reason,
            "detail": self.detail[:1000].encode("utf-8", "backslashreplace").decode(),
            "raw": body,
            "raw_encoding": encoding,
            "truncated": len(self.raw) > _RAW_LIMIT,
        }
        if self.last_offset is not None:
            out["last_offset"] = self.last_offset
        return dumps(out)
