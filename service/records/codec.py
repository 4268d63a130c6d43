"""One codec for every record: orjson out, validated JSON in, errors with a reason.

Parsing never trusts its input: helpers here return typed values or raise
:class:`BadMessage`, whose ``reason`` is a :class:`~service.records.reasons.Reason` from the
closed set :data:`DEAD_LETTER_REASONS` (what the dead-letter topic and the
``abstain_dead_letters_total`` counter record).
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from service.errors import AbstainError
from service.records.reasons import Reason

__all__ = [
    "DEAD_LETTER_REASONS",
    "MAX_MAGNITUDE",
    "MAX_SPARSE_SIZE",
    "MAX_SPREAD_SIZE",
    "SPARSE_FROM",
    "BadMessage",
    "RecordError",
    "SparseNumbers",
    "array_of",
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
    "numbers_of",
    "obj",
    "own_size",
    "packed_numbers",
    "read_at",
    "read_numbers",
    "sparse_at",
    "spread",
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
    """Serialise to compact JSON bytes (numpy arrays allowed), held in memory of their own
    size: orjson returns its bytes in the buffer it wrote them to, rounded up to a power of
    two (16 KiB for 1.5 KiB of JSON, 4 KiB for a few bytes), and a record kept in a table
    (an answered request's mark, a history step) would hold all of it for as long as it
    is kept.

    >>> dumps({"w": [0.5, 1.0]})
    b'{"w":[0.5,1.0]}'
    """
    return own_size(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY))


def own_size(raw: bytes) -> bytes:
    """``raw`` in memory of its own size (a copy: what holds the bytes may hold more, as
    orjson's output does; :func:`dumps`)."""
    return b"".join((raw, b""))


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
_INT: Final = frozenset({int})


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


#: a list of at least this many numbers with at most a quarter of them non-zero is written
#: as its non-zero entries (:func:`packed_numbers`): a declared model's features and the
#: moments of its hashed buckets; shorter or denser lists are written as they are
SPARSE_FROM: Final = 256
#: the most numbers a list written sparsely may stand for (2^23: more than a declared model
#: of the most buckets has inputs). Features read in that form stay in it
#: (:class:`SparseNumbers`: what reading one costs grows with the entries written, not with
#: the size claimed); a longer list is always written whole
MAX_SPARSE_SIZE: Final = 1 << 23
#: the most numbers a list written sparsely and read whole (a label request's moments) may
#: stand for: a record claiming more is refused before anything of its size is made, so a
#: few bytes cost a reader no more than a whole list a message can hold
MAX_SPREAD_SIZE: Final = 1 << 16

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


class SparseNumbers(Sequence[float]):
    """A long list of numbers, most of them +0.0, held as the others: their indices
    (:attr:`at`, strictly increasing below :attr:`size`) and values (:attr:`values`), so
    that a row of 2^18 hashed buckets with 300 set costs 300 numbers to read, keep, compare
    and write again (:func:`packed_numbers`). It reads as the whole list does (``len``,
    items, iteration: 0.0 where nothing is held) and equals any sequence of the same numbers;
    :meth:`array` makes it whole. It never changes.

    >>> s = SparseNumbers(4, np.array([1, 3]), np.array([2.0, 5.0]))
    >>> len(s), s[1], s[-1], list(s), s == [0.0, 2.0, 0.0, 5.0], s.array().tolist()
    (4, 2.0, 5.0, [0.0, 2.0, 0.0, 5.0], True, [0.0, 2.0, 0.0, 5.0])
    """

    __slots__ = ("at", "size", "values")

    def __init__(self, size: int, at: IntArray, values: FloatArray) -> None:
        self.size = size
        self.at: IntArray = np.asarray(at, dtype=np.int64)
        self.values: FloatArray = np.asarray(values, dtype=np.float64)
        self.at.flags.writeable = False
        self.values.flags.writeable = False

    @classmethod
    def of(cls, row: FloatArray) -> SparseNumbers:
        """The entries of ``row`` other than +0.0 (a -0.0 is kept: it reads back bit for
        bit)."""
        at = np.flatnonzero((row != 0.0) | np.signbit(row))
        return cls(row.size, at, row[at])

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            out: list[float] = self.array()[i].tolist()
            return out
        k = operator.index(i)
        if k < 0:
            k += self.size
        if not 0 <= k < self.size:
            raise IndexError("index out of range")
        j = int(np.searchsorted(self.at, k))
        return float(self.values[j]) if j < self.at.size and self.at[j] == k else 0.0

    def __iter__(self) -> Any:
        return iter(self.array().tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SparseNumbers):
            mine, theirs = self.values != 0.0, other.values != 0.0
            return (
                self.size == other.size
                and np.array_equal(self.at[mine], other.at[theirs])
                and np.array_equal(self.values[mine], other.values[theirs])
            )
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == self.size and self.array().tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def array(self) -> FloatArray:
        """The numbers whole, as a new float64 array."""
        out = np.zeros(self.size)
        out[self.at] = self.values
        return out

    def __repr__(self) -> str:
        return f"SparseNumbers({self.size}, at={self.at.tolist()}, values={self.values.tolist()})"


def array_of(values: Sequence[float]) -> FloatArray:
    """``values`` as a new float64 array (a :class:`SparseNumbers` made whole from its
    entries, instead of converting each number)."""
    if type(values) is SparseNumbers:
        return values.array()
    return np.array(values, dtype=np.float64)


def numbers_of(row: FloatArray) -> Sequence[float]:
    """A row of numbers as a record holds them: one of :data:`SPARSE_FROM` or more numbers
    as a :class:`SparseNumbers` of its entries, the others as a list.

    >>> numbers_of(np.array([0.0, 1.5])), numbers_of(np.zeros(300)).at.tolist()
    ([0.0, 1.5], [])
    """
    if row.size < SPARSE_FROM:
        values: list[float] = row.tolist()
        return values
    return SparseNumbers.of(np.asarray(row, dtype=np.float64))


def sparse_at(*columns: Sequence[float], most: int = MAX_SPARSE_SIZE) -> list[int] | None:
    """The indices where any of the equally long ``columns`` holds anything but +0.0 (-0.0
    counts: a list written sparsely reads back bit for bit), when writing those alone pays
    (at least :data:`SPARSE_FROM` numbers, at most a quarter of them held) and a reader
    takes that form (at most ``most`` numbers); else None.

    >>> sparse_at([0.0] * 300 + [2.0], [0.0] * 299 + [-0.0, 0.0])
    [299, 300]
    >>> sparse_at([1.0] * 300) is None, sparse_at([0.0, 1.0]) is None
    (True, True)
    """
    n = len(columns[0])
    if not SPARSE_FROM <= n <= most or any(4 * (n - column.count(0.0)) > n for column in columns):
        return None  # (a count of zeros, -0.0 among them, rules out most dense lists fast)
    held = np.zeros(n, dtype=bool)
    for column in columns:
        values = np.asarray(column, dtype=np.float64)
        held |= (values != 0.0) | np.signbit(values)
    at = np.flatnonzero(held)
    if 4 * at.size > n:
        return None
    out: list[int] = at.tolist()
    return out


def packed_numbers(values: Sequence[float]) -> list[float] | dict[str, Any]:
    """``values`` as a record writes them: the list, or, when most are zero
    (:func:`sparse_at`; a :class:`SparseNumbers` by its own entries),
    ``{"size": n, "at": [indices], "values": [numbers there]}``, every other number being
    0.0. :func:`read_numbers` reads either back, bit for bit.

    >>> packed_numbers([0.0] * 299 + [1.5])
    {'size': 300, 'at': [299], 'values': [1.5]}
    >>> packed_numbers([1.0, 0.0])
    [1.0, 0.0]
    >>> read_numbers(packed_numbers([0.0] * 299 + [1.5]), "features")[-2:]
    [0.0, 1.5]
    """
    n = len(values)
    if type(values) is SparseNumbers:
        if SPARSE_FROM <= n <= MAX_SPARSE_SIZE and 4 * values.at.size <= n:
            return {"size": n, "at": values.at.tolist(), "values": values.values.tolist()}
        whole: list[float] = values.array().tolist()
        return whole
    at = sparse_at(values)
    if at is None:
        return list(values)
    return {"size": n, "at": at, "values": [values[i] for i in at]}


def read_numbers(value: Any, what: str) -> Sequence[float]:
    """A list of finite numbers as a record holds it: a list (:func:`feature_list`), or the
    sparse form :func:`packed_numbers` writes, checked (a ``size`` of 1 to
    :data:`MAX_SPARSE_SIZE`, indices strictly increasing below it, as many finite values)
    and kept in that form (:class:`SparseNumbers`); ``what`` names the field in the error.

    >>> list(read_numbers({"size": 3, "at": [0, 2], "values": [1, 2.5]}, "features"))
    [1.0, 0.0, 2.5]
    >>> read_numbers({"size": 3, "at": [2, 0], "values": [1, 2]}, "features")
    Traceback (most recent call last):
    service.records.codec.BadMessage: schema: features 'at' must be increasing indices below 3
    """
    if isinstance(value, list):
        return feature_list(value)
    if not isinstance(value, dict) or set(value) != {"size", "at", "values"}:
        raise BadMessage(
            "schema", f"{what} must be a list of numbers, or an object of size, at and values"
        )
    size = value["size"]
    if type(size) is not int or not 1 <= size <= MAX_SPARSE_SIZE:
        raise BadMessage("schema", f"{what} 'size' must be an integer from 1 to {MAX_SPARSE_SIZE}")
    at = read_at(value["at"], size, what)
    values = value["values"]
    if not isinstance(values, list) or len(values) != len(at):
        raise BadMessage("schema", f"{what} 'values' must be a list as long as 'at'")
    numbers = np.array(feature_list(values), dtype=np.float64)
    held = (numbers != 0.0) | np.signbit(numbers)  # a +0.0 listed is not kept (canonical)
    return SparseNumbers(size, np.array(at, dtype=np.int64)[held], numbers[held])


def read_at(value: Any, size: int, what: str) -> list[int]:
    """``value`` if it is a list of integers, strictly increasing, from 0 to below
    ``size``; else :class:`BadMessage` naming ``what``."""
    if (
        not isinstance(value, list)
        or not _INT.issuperset(map(type, value))
        or (value and not (value[0] >= 0 and value[-1] < size))
        or not all(map(operator.lt, value, value[1:]))
    ):
        raise BadMessage("schema", f"{what} 'at' must be increasing indices below {size}")
    return value


def spread(at: Sequence[int], values: Sequence[float], size: int) -> list[float]:
    """``size`` numbers: ``values`` at the indices ``at`` (as :func:`read_at` checks them,
    as many as ``values``), 0.0 elsewhere."""
    out = np.zeros(size)
    out[at] = values
    whole: list[float] = out.tolist()
    return whole


def feature_value(value: Any, where: str) -> float:
    """One feature: a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadMessage("schema", f"feature {where} must be a number")
    return finite(value, f"feature {where}")
