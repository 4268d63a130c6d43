"""Wire schemas: what travels on each topic, parsed into typed values or refused.

Every topic carries plain JSON (orjson) with no framework metadata, so any producer can
write it. Parsing never trusts its input: it returns a typed dataclass or raises
:class:`BadMessage` whose ``reason`` is one of :data:`DEAD_LETTER_REASONS`, which is what
the dead-letter topic and the ``abstain_dead_letters_total`` counter record.

Errors::

    ValueError
     └── StreamError            base of this package's errors
          └── BadMessage         one input message refused; .reason (closed set), .detail

>>> ev = parse_feature_event(b'{"id": "e1", "features": [1, 2.5]}', default_model="m")
>>> ev.id, ev.model, ev.features
('e1', 'm', [1.0, 2.5])
>>> parse_feature_event(b'{"id": "e1"}', default_model="m")
Traceback (most recent call last):
...
service.stream.records.BadMessage: schema: missing field 'features'
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import orjson

__all__ = [
    "DEAD_LETTER_REASONS",
    "DEAD_LETTER_SOURCES",
    "BadMessage",
    "Decision",
    "DeadLetter",
    "FeatureEvent",
    "Label",
    "LabelRequest",
    "StreamError",
    "decode_json",
    "decode_state",
    "dumps",
    "encode_state",
    "parse_feature_event",
    "parse_label",
    "parse_label_request",
]

DEAD_LETTER_REASONS: Final = frozenset(
    {
        "not_json",
        "schema",
        "feature_count",
        "non_finite",
        "unknown_model",
        "bad_label",
        "unknown_request",
        "expired",
        "already_applied",
        "oversize",
    }
)
DEAD_LETTER_SOURCES: Final = ("features", "labels", "label-requests")
_RAW_LIMIT: Final = 64 * 1024  # bytes of a refused message kept in its dead letter


class StreamError(ValueError):
    """Base of the stream package's errors."""


class BadMessage(StreamError):
    """One input message cannot be used; ``reason`` says why (closed set)."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in DEAD_LETTER_REASONS:
            raise ValueError(f"unknown dead-letter reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def dumps(value: Any) -> bytes:
    """Serialise to compact JSON bytes (numpy arrays allowed)."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def encode_state(state: Any) -> bytes:
    """Serialise a model state (orjson). Non-finite numbers are refused (orjson would write
    them as ``null``), and so are integers wider than 64 bits: the learning state format
    writes the generator's 128-bit words as decimal strings.

    >>> decode_state(encode_state({"rho": 1.5, "rng": {"inc": str(2**100)}}))["rho"]
    1.5
    >>> encode_state({"w": [1.0, float("nan")]})
    Traceback (most recent call last):
    ...
    service.stream.records.StreamError: model state holds a non-finite number
    """
    try:
        out = orjson.dumps(state, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise StreamError(f"model state is not JSON-safe: {exc}") from exc
    if b"null" in out and not _all_finite(state):  # a scan only when a null was written
        raise StreamError("model state holds a non-finite number")
    return out


def _all_finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_all_finite(v) for v in value)
    if isinstance(value, np.ndarray):
        return value.dtype.kind not in "fc" or bool(np.isfinite(value).all())
    return True


def decode_state(raw: bytes) -> Any:
    """Parse a model state written by :func:`encode_state`."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadMessage("not_json", f"model state: {exc}") from exc


def decode_json(raw: bytes, *, max_bytes: int | None = None) -> Any:
    """Parse JSON bytes; ``NaN``/``Infinity``/overflowing numbers parse (to be refused later as
    ``non_finite``) rather than being confused with garbage.

    >>> decode_json(b'[1e999]')
    [inf]
    >>> decode_json(b'{oops')
    Traceback (most recent call last):
    ...
    service.stream.records.BadMessage: not_json: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
    """  # noqa: E501
    if max_bytes is not None and len(raw) > max_bytes:
        raise BadMessage("oversize", f"{len(raw)} bytes > limit {max_bytes}")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:  # slow path only for messages orjson refused: accepts NaN / Infinity / 1e999
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadMessage("not_json", str(exc)) from exc


def _obj(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadMessage("schema", f"expected a JSON object, got {type(value).__name__}")
    return value


def _field(obj: dict[str, Any], name: str) -> Any:
    if name not in obj:
        raise BadMessage("schema", f"missing field {name!r}")
    return obj[name]


def _text(value: str, where: str) -> str:
    """``value`` if it can be written back out as UTF-8 (no lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadMessage("schema", f"{where} is not valid Unicode text") from None
    return value


def _ident(obj: dict[str, Any], name: str, *, max_len: int = 256) -> str:
    value = _field(obj, name)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise BadMessage("schema", f"field {name!r} must be a string or integer")
    text = _text(value, f"field {name!r}") if isinstance(value, str) else str(value)
    if not text or len(text) > max_len:
        raise BadMessage("schema", f"field {name!r} must have 1..{max_len} characters")
    return text


def _number(obj: dict[str, Any], name: str, *, default: float | None = None) -> float:
    if name not in obj and default is not None:
        return default
    value = _field(obj, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadMessage("schema", f"field {name!r} must be a number")
    return _finite(value, f"field {name!r}")


def _finite(value: int | float, where: str) -> float:
    try:
        number = float(value)
    except OverflowError:  # an integer literal beyond any float
        raise BadMessage("non_finite", f"{where} overflows a float") from None
    if not math.isfinite(number):
        raise BadMessage("non_finite", f"{where} is {number}")
    return number


def _int(obj: dict[str, Any], name: str) -> int:
    value = _field(obj, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadMessage("schema", f"field {name!r} must be an integer")
    return value


@dataclass(frozen=True, slots=True)
class FeatureEvent:
    """An event to score. ``features`` is the raw vector, or a name -> value mapping when the
    model declares ``feature_names`` (resolved by the handler, which knows the model)."""

    id: str
    model: str
    features: list[float] | dict[str, float]
    ts: float | None


def parse_feature_event(
    raw: bytes, *, default_model: str, max_bytes: int | None = None, max_features: int = 100_000
) -> FeatureEvent:
    """``{id, model?, features: [..] | {name: value}, ts?}`` -> :class:`FeatureEvent`."""
    obj = _obj(decode_json(raw, max_bytes=max_bytes))
    event_id = _ident(obj, "id")
    model = _ident(obj, "model") if obj.get("model") is not None else default_model
    feats = _field(obj, "features")
    if isinstance(feats, list):
        if len(feats) > max_features:
            raise BadMessage("feature_count", f"{len(feats)} features > limit {max_features}")
        values: list[float] | dict[str, float] = _feature_list(feats)
    elif isinstance(feats, dict):
        if len(feats) > max_features:
            raise BadMessage("feature_count", f"{len(feats)} features > limit {max_features}")
        values = {_text(k, "a feature name"): _feature_value(v, "named") for k, v in feats.items()}
    else:
        raise BadMessage("schema", "field 'features' must be a list or an object")
    ts = _number(obj, "ts") if obj.get("ts") is not None else None
    return FeatureEvent(id=event_id, model=model, features=values, ts=ts)


_NUMBER_TYPES: Final = frozenset({float, int})


def _feature_list(feats: list[Any]) -> list[float]:
    """A list of finite numbers as floats. Fast path: every item a plain int or float whose
    float is finite (one vectorised check); otherwise item by item, for the exact error."""
    if _NUMBER_TYPES.issuperset(map(type, feats)):
        try:
            arr = np.array(feats, dtype=np.float64)
        except OverflowError:  # an integer beyond any float: let the slow path name it
            pass
        else:
            if np.isfinite(arr).all():
                out: list[float] = arr.tolist()
                return out
    return [_feature_value(v, str(i)) for i, v in enumerate(feats)]


def _feature_value(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadMessage("schema", f"feature {where} must be a number")
    return _finite(value, f"feature {where}")


@dataclass(frozen=True, slots=True)
class Decision:
    """What the scorer decided for one event (``abstain.decisions``, key = event id)."""

    id: str
    model: str
    action: str  # "predict" | "reject"
    label: int | None  # +1 / -1, None when rejected
    score: float
    rho: float
    model_version: int
    queried: bool
    query_probability: float
    ts: float

    def to_json(self) -> bytes:
        return orjson.dumps(self)  # dataclasses natively, in field order


@dataclass(frozen=True, slots=True)
class LabelRequest:
    """A request for the true label of one scored event (``abstain.label-requests``,
    key = model). ``features`` are the raw features, before preprocessing."""

    request_id: str
    event_id: str
    model: str
    features: list[float]
    score: float
    rho: float
    decided_label: int  # +1, -1, 0 = rejected
    query_probability: float  # effective probability, audit included
    model_version: int
    requested_at: float
    expires_at: float
    priority: float

    def to_json(self) -> bytes:
        return orjson.dumps(self)  # dataclasses natively, in field order

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__slots__}
        out["features"] = list(self.features)
        return out


def parse_label_request(raw: bytes, *, max_bytes: int | None = None) -> LabelRequest:
    """Parse a label request (written by scorers; still checked)."""
    obj = _obj(decode_json(raw, max_bytes=max_bytes))
    return label_request_from_dict(obj)


def label_request_from_dict(obj: dict[str, Any]) -> LabelRequest:
    """Validate a decoded label request."""
    feats = _field(obj, "features")
    if not isinstance(feats, list):
        raise BadMessage("schema", "field 'features' must be a list")
    decided = _int(obj, "decided_label")
    if decided not in (-1, 0, 1):
        raise BadMessage("schema", f"decided_label must be -1, 0 or 1, got {decided}")
    p = _number(obj, "query_probability")
    if not 0.0 < p <= 1.0:
        raise BadMessage("schema", f"query_probability must be in (0, 1], got {p}")
    return LabelRequest(
        request_id=_ident(obj, "request_id"),
        event_id=_ident(obj, "event_id"),
        model=_ident(obj, "model"),
        features=_feature_list(feats),
        score=_number(obj, "score"),
        rho=_number(obj, "rho"),
        decided_label=decided,
        query_probability=p,
        model_version=_int(obj, "model_version"),
        requested_at=_number(obj, "requested_at"),
        expires_at=_number(obj, "expires_at"),
        priority=_number(obj, "priority", default=0.0),
    )


@dataclass(frozen=True, slots=True)
class Label:
    """A true label for a requested event (``abstain.labels``, key = model)."""

    request_id: str
    model: str
    label: int  # +1 / -1
    labelled_by: str
    ts: float | None

    def to_json(self) -> bytes:
        return orjson.dumps(self)  # dataclasses natively, in field order


def parse_label(raw: bytes, *, max_bytes: int | None = None) -> Label:
    """``{request_id, model, label: 1|-1, labelled_by?, ts?}`` -> :class:`Label`.

    >>> parse_label(b'{"request_id": "r", "model": "m", "label": 0}')
    Traceback (most recent call last):
    ...
    service.stream.records.BadMessage: bad_label: label must be 1 or -1, got 0
    """
    obj = _obj(decode_json(raw, max_bytes=max_bytes))
    return label_from_dict(obj)


def label_from_dict(obj: dict[str, Any]) -> Label:
    """Validate a decoded label."""
    request_id = _ident(obj, "request_id")
    model = _ident(obj, "model")
    value = _field(obj, "label")
    if isinstance(value, bool) or value not in (1, -1) or isinstance(value, float | str):
        raise BadMessage("bad_label", f"label must be 1 or -1, got {value!r}")
    by = obj.get("labelled_by", "")
    if not isinstance(by, str) or len(by) > 256:
        raise BadMessage("schema", "field 'labelled_by' must be a short string")
    _text(by, "field 'labelled_by'")
    ts = _number(obj, "ts") if obj.get("ts") is not None else None
    return Label(request_id=request_id, model=model, label=int(value), labelled_by=by, ts=ts)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A refused input and why (``abstain.dead-letters``)."""

    source: str  # "features" | "labels" | "label-requests" (metric label)
    topic: str
    partition: int
    offset: int
    reason: str
    detail: str
    raw: bytes

    def to_json(self) -> bytes:
        raw = self.raw[:_RAW_LIMIT]
        try:
            text, encoding = raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(raw).decode("ascii"), "base64"
        return dumps(
            {
                "topic": self.topic,
                "partition": self.partition,
                "offset": self.offset,
                "reason": self.reason,
                "detail": self.detail[:1000].encode("utf-8", "backslashreplace").decode(),
                "raw": text,
                "raw_encoding": encoding,
                "truncated": len(self.raw) > _RAW_LIMIT,
            }
        )
