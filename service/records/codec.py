"""One codec for every record: orjson out, validated JSON in, errors with a reason.

Parsing never trusts its input: helpers here return typed values or raise
:class:`BadMessage`, whose ``reason`` is a :class:`~service.records.reasons.Reason` from the
closed set :data:`DEAD_LETTER_REASONS` (what the dead-letter topic and the
``abstain_dead_letters_total`` counter record).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import orjson

from service.errors import AbstainError
from service.records.reasons import Reason

__all__ = [
    "DEAD_LETTER_REASONS",
    "MAX_MAGNITUDE",
    "BadMessage",
    "RecordError",
    "decode_json",
    "decode_object",
    "dumps",
    "encode_finite",
    "feature_list",
    "feature_value",
    "field",
    "finite",
    "ident",
    "integer",
    "number",
    "obj",
    "text",
]

#: every learned number of a model's state (its weights and rho, the standardiser's sums, a
#: kernel learner's coefficients and support, the risk sums), and the moments a label
#: request carries, stay below this magnitude: a snapshot beyond it is refused when read,
#: an update that would go beyond it is refused when made (a learner's configured
#: ``params`` are not bounded)
MAX_MAGNITUDE: Final = 1e100

#: reasons a message can be dead-lettered for (every :class:`Reason` but ``redelivered``)
DEAD_LETTER_REASONS: Final = frozenset(r for r in Reason if r is not Reason.REDELIVERED)


class RecordError(AbstainError, ValueError):
    """A record cannot be used (the root of this module's errors)."""


class BadMessage(RecordError):
    """One input message cannot be used; ``reason`` says why (closed set)."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in DEAD_LETTER_REASONS:
            raise ValueError(f"unknown dead-letter reason {reason!r}")
        super().__init__(f"{reason}: {detail}")
        self.reason = Reason(reason)
        self.detail = detail


def dumps(value: Any) -> bytes:
    """Serialise to compact JSON bytes (numpy arrays allowed)."""
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)


def encode_finite(state: Any) -> bytes:
    """Serialise a model state (orjson). Non-finite numbers are refused (orjson would write
    them as ``null``), and so are integers wider than 64 bits: the learning state format
    writes the generator's 128-bit words as decimal strings.

    >>> decode_object(encode_finite({"rho": 1.5, "rng": {"inc": str(2**100)}}))["rho"]
    1.5
    >>> encode_finite({"w": [1.0, float("nan")]})
    Traceback (most recent call last):
    ...
    service.records.codec.RecordError: model state holds a non-finite number
    """
    try:
        out = orjson.dumps(state, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise RecordError(f"model state is not JSON-safe: {exc}") from exc
    if b"null" in out and not _all_finite(state):  # a scan only when a null was written
        raise RecordError("model state holds a non-finite number")
    return out


def _all_finite(value: Any) -> bool:
    """True if no float in ``value`` (dicts, lists and tuples at any depth, numpy floats and
    float arrays) is NaN or infinite.

    A walk over a stack (no call per container). A list is first summed: a sum that comes
    out a finite Python float is one of numbers all finite (a NaN or an infinity among the
    terms leaves the sum NaN or infinite; a string, a container or None raises), so most
    lists of weights need no look at each item; any other sum (an overflow of finite
    numbers, numpy objects inside) leaves the list to the item-by-item checks."""
    stack = [value]
    pop, extend = stack.pop, stack.extend
    with np.errstate(all="ignore"):  # numpy scalars summed: an overflow decides nothing
        while stack:
            item = pop()
            kind = type(item)
            if kind is float:
                if not _isfinite(item):
                    return False
            elif kind is dict:
                extend(item.values())
            elif kind is list or kind is tuple:
                if not _finite_items(item, extend):
                    return False
            elif kind in _LEAVES:
                continue
            elif isinstance(item, float):
                if not _isfinite(item):
                    return False
            elif isinstance(item, dict):
                extend(item.values())
            elif isinstance(item, list | tuple):
                if not _finite_items(item, extend):
                    return False
            elif (
                isinstance(item, np.ndarray)
                and item.dtype.kind in "fc"
                and not np.isfinite(item).all()
            ):
                return False
    return True


_isfinite: Final = math.isfinite
_LEAVES: Final = frozenset({str, int, bool, type(None)})


def _finite_items(items: list[Any] | tuple[Any, ...], later: Callable[[Any], None]) -> bool:
    """False if a number of ``items`` is not finite; items that are not numbers (records,
    strings, arrays) are handed to ``later`` to be walked."""
    try:
        total = sum(items)
    except (TypeError, ValueError, ArithmeticError):  # not all numbers; an int past float
        pass
    else:
        if type(total) is float and _isfinite(total):
            return True
    try:  # a list of numbers at C speed
        return all(map(_isfinite, items))
    except (TypeError, OverflowError):  # records or strings inside; an int past float
        later(items)
        return True


def decode_object(raw: bytes, *, max_bytes: int | None = None) -> dict[str, Any]:
    """Parse JSON bytes that must hold an object: state records, which this service writes
    with orjson, so anything orjson would not read (``NaN``, ``1e999``) is refused here.

    >>> decode_object(b'[1]')
    Traceback (most recent call last):
    ...
    service.records.codec.BadMessage: schema: expected a JSON object, got list
    >>> decode_object(b'{"w": [NaN]}')
    Traceback (most recent call last):
    ...
    service.records.codec.BadMessage: not_json: unexpected character, expected a JSON value: line 1 column 8 (char 7)
    """  # noqa: E501
    if max_bytes is not None and len(raw) > max_bytes:
        raise BadMessage("oversize", f"{len(raw)} bytes > limit {max_bytes}")
    try:
        return obj(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        raise BadMessage("not_json", str(exc)) from None


def decode_json(raw: bytes, *, max_bytes: int | None = None) -> Any:
    """Parse JSON bytes; ``NaN``/``Infinity``/overflowing numbers parse (to be refused later as
    ``non_finite``) rather than being confused with garbage.

    >>> decode_json(b'[1e999]')
    [inf]
    >>> decode_json(b'{oops')
    Traceback (most recent call last):
    ...
    service.records.codec.BadMessage: not_json: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)
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


def decode_versioned(
    raw: bytes, *, fmt: str, version: int, what: str, max_bytes: int | None = None
) -> dict[str, Any]:
    """A JSON object whose ``format`` is ``fmt`` and ``format_version`` is ``version``;
    ``what`` names the record in the refusal.

    >>> decode_versioned(b'{"format": "x", "format_version": 2}', fmt="x", version=1, what="a")
    Traceback (most recent call last):
    ...
    service.records.codec.BadMessage: schema: a has format_version 2; this worker reads 1: upgrade the worker
    """  # noqa: E501
    record = decode_object(raw, max_bytes=max_bytes)
    if record.get("format") != fmt:
        raise BadMessage("schema", f"{what} has an unknown format")
    if record.get("format_version") != version:
        raise BadMessage(
            "schema",
            f"{what} has format_version "
            f"{record.get('format_version')!r}; this worker reads {version}: "
            "upgrade the worker",
        )
    return record


def obj(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object."""
    if not isinstance(value, dict):
        raise BadMessage("schema", f"expected a JSON object, got {type(value).__name__}")
    return value


def field(record: dict[str, Any], name: str) -> Any:
    """``record[name]``, or a ``schema`` error naming the missing field."""
    if name not in record:
        raise BadMessage("schema", f"missing field {name!r}")
    return record[name]


def text(value: str, where: str) -> str:
    """``value`` if it can be written back out as UTF-8 (no lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadMessage("schema", f"{where} is not valid Unicode text") from None
    return value


def ident(record: dict[str, Any], name: str, *, max_len: int = 256) -> str:
    """An identifier: a non-empty string (or integer) of at most ``max_len`` characters."""
    value = field(record, name)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise BadMessage("schema", f"field {name!r} must be a string or integer")
    out = text(value, f"field {name!r}") if isinstance(value, str) else str(value)
    if not out or len(out) > max_len:
        raise BadMessage("schema", f"field {name!r} must have 1..{max_len} characters")
    return out


def number(record: dict[str, Any], name: str, *, default: float | None = None) -> float:
    """A finite number (``default`` when the field is absent and a default is given)."""
    if name not in record and default is not None:
        return default
    value = field(record, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadMessage("schema", f"field {name!r} must be a number")
    return finite(value, f"field {name!r}")


def finite(value: int | float, where: str) -> float:
    """``value`` as a finite float, or a ``non_finite`` error."""
    try:
        out = float(value)
    except OverflowError:  # an integer literal beyond any float
        raise BadMessage("non_finite", f"{where} overflows a float") from None
    if not math.isfinite(out):
        raise BadMessage("non_finite", f"{where} is {out}")
    return out


def integer(record: dict[str, Any], name: str) -> int:
    """An integer field (not a bool, not a float)."""
    value = field(record, name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadMessage("schema", f"field {name!r} must be an integer")
    return value


_NUMBER_TYPES: Final = frozenset({float, int})


def feature_list(feats: list[Any]) -> list[float]:
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
    return [feature_value(v, str(i)) for i, v in enumerate(feats)]


def feature_value(value: Any, where: str) -> float:
    """One feature: a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadMessage("schema", f"feature {where} must be a number")
    return finite(value, f"feature {where}")
