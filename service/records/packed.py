"""Model versions in a compact binary form: the structure as JSON, the arrays as raw doubles.

A model's state is mostly arrays of floats (weights, moments, remembered inputs). As JSON
each float takes 18-24 bytes and a parse; here each takes 8 bytes, copied. Layout::

    MAGIC (4 bytes) | header length (u32, little-endian) | header | doubles | sparse

The header is the JSON ``[D, record]``: ``D`` the number of float64 (little-endian) in
``doubles``, and the record with each list of at least :data:`MIN_PACKED` floats (outside
any ``params`` section: hyperparameters stay as written) replaced by a reference, an object
of one key:

* ``{"$d": [i, n]}``: the ``n`` doubles from number ``i`` of ``doubles``;
* ``{"$z": [offset, n, k, fill]}``: ``n`` floats all equal to ``fill`` (0.0 or 1.0, bit for
  bit) but ``k`` of them: at byte ``offset`` of ``sparse``, ``k`` u32 gaps (the first
  index, then each index less the one before it, above 0: strictly increasing), then their
  ``k`` float64. Written where it is smaller: the weights of an untrained model, a hashed
  model's untouched buckets. (``{"$s": ...}``, the same with the indices themselves, is
  what the earlier form, ``MAGIC_2``, wrote: still read.)
* ``{"$i": [offset, k]}``: a list of ``k`` increasing indices (at least :data:`MIN_PACKED`;
  where the numbers of a list differ from another: a challenger's weights from the
  champion's) as ``k`` u32 gaps at byte ``offset`` of ``sparse``. A wide model's indices
  are close together: their gaps compress to a fraction of their bytes.

Reading gives back exactly the record that was packed (lists of Python floats, bit for bit),
so a reader that took the JSON form reads this one the same way. The first byte is not one
a JSON text can start with, so a reader can tell the two forms apart.

A packed record of at least :data:`COMPRESS_FROM` bytes is written compressed
(:func:`squeeze`: ``ZMAGIC | packed length (u32) | zstd frame``) when that is smaller: a wide
model's indices and structure compress to about half, a dense model's doubles hardly at all
(it stays below the size). Kafka compresses the batches it carries either way; this form
is what counts against a message's size limit and what a learner's table holds. A reader
refuses a compressed record that claims to expand past :data:`EXPANSION` times its own
size before it makes anything of that size, and one whose frame expands to more or less
than it claims.

>>> rec = {"w": [i / 7 for i in range(20)], "m": [0.0] * 300 + [2.0], "n": 3}
>>> rec["params"] = {"s": [1.0] * 20}
>>> raw = pack(rec)
>>> unpack(raw) == rec, len(raw), len(orjson.dumps(rec))
(True, 332, 1656)
>>> unpack(raw[:-1])
Traceback (most recent call last):
...
service.records.codec.BadMessage: schema: a packed array reaches past the record's end
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import Any, Final

import cramjam
import numpy as np
import numpy.typing as npt
import orjson

from service.learning.state import FloatList, FrozenRecord, IndexList
from service.records.codec import BadMessage, RecordError

__all__ = [
    "COMPRESS_FROM",
    "EXPANSION",
    "MAGIC",
    "MAX_ELEMENTS",
    "MIN_PACKED",
    "ZMAGIC",
    "check",
    "checked",
    "header_of",
    "is_packed",
    "pack",
    "squeeze",
    "unpack",
]

MAGIC: Final = b"\xabAM3"
#: the first bytes of a record in the earlier packed form (absolute indices, no ``$i``):
#: still read
MAGIC_2: Final = b"\xabAM2"
#: the first bytes of a packed record written compressed (:func:`squeeze`)
ZMAGIC: Final = b"\xabAMZ"
#: packed records of at least this many bytes are written compressed when that is smaller
COMPRESS_FROM: Final = 64 * 1024
#: how many times its own size a compressed record may expand to (a reader refuses one that
#: claims more before it makes anything of that size; a writer compresses no further)
EXPANSION: Final = 16
#: zstd's level: at 2^10 buckets and 300 tokens, level 1 writes 148 KiB, level 2 116 KiB (in
#: 0.9 ms instead of 0.6), level 3 116 KiB (1.0 ms)
_LEVEL: Final = 2
#: packed records of at least this many bytes (a wide model's, near a message's limit) are
#: compressed at :data:`_HARDER` (a model of 2^18 buckets, 37,000 of them learned: 827 KiB
#: at level 2, 791 KiB at 3, in 1.7x the time)
_HARDER_FROM: Final = 1 << 20
_HARDER: Final = 3
#: lists shorter than this stay in the header (a reference costs about as much)
MIN_PACKED: Final = 16
#: floats a record may expand to in all (a bound on what a small hostile record can cost)
MAX_ELEMENTS: Final = 1 << 23
_LENGTH: Final = struct.Struct("<I")
_FILLS: Final = (0.0, 1.0)
_FILL_BITS: Final = tuple(np.array(_FILLS, dtype="<f8").view("<u8").tolist())
_DENSE, _SPARSE, _ESCAPE = "$d", "$s", "$$"
#: a sparse array with its indices as gaps, and a list of increasing indices as gaps
_GAPS, _INDICES = "$z", "$i"
#: a record's own object of one such key is written inside {"$$": ...}, never as a reference
_RESERVED: Final = frozenset((_DENSE, _SPARSE, _ESCAPE, _GAPS, _INDICES))
_MOST_INDEX: Final = (1 << 32) - 1


def is_packed(raw: bytes) -> bool:
    """True if ``raw`` is in this form, compressed or not (not JSON)."""
    return raw[:4] in (MAGIC, MAGIC_2, ZMAGIC)


def squeeze(raw: bytes) -> bytes:
    """A record :func:`pack` wrote, compressed when it is at least :data:`COMPRESS_FROM`
    bytes and that makes it smaller (and expands no more than :data:`EXPANSION` times:
    what any reader takes); else ``raw`` itself. :func:`unpack` reads either.

    >>> w = (np.random.default_rng(0).integers(0, 2**16, 20_000) / 2**16).tolist()
    >>> raw = pack({"w": w})                 # 16 bits of each double vary: about 3x smaller
    >>> small = squeeze(raw)
    >>> small[:4] == ZMAGIC, len(small) < len(raw) // 2, unpack(small) == unpack(raw)
    (True, True, True)
    >>> squeeze(pack({"w": w[:20]})) == pack({"w": w[:20]})         # short: as it is
    True
    >>> squeeze(pack({"w": [0.5] * 20_000})) == pack({"w": [0.5] * 20_000})  # 100x: as it is
    True
    """
    if len(raw) < COMPRESS_FROM or raw[:4] not in (MAGIC, MAGIC_2):
        return raw
    level = _HARDER if len(raw) >= _HARDER_FROM else _LEVEL
    frame = bytes(cramjam.zstd.compress(raw, level=level))
    if 8 + len(frame) >= len(raw) or len(raw) > EXPANSION * (8 + len(frame)):
        return raw
    return b"".join([ZMAGIC, _LENGTH.pack(len(raw)), frame])


def _expanded(raw: bytes) -> bytes:
    """The packed record a compressed one holds; :class:`BadMessage` when it claims to
    expand past :data:`EXPANSION` times its size, or its frame is not what it claims."""
    if len(raw) < 8:
        raise BadMessage("schema", "not a packed record")
    (size,) = _LENGTH.unpack_from(raw, 4)
    most = EXPANSION * len(raw)
    if size > most:
        raise BadMessage("schema", f"a compressed record claims {size} bytes (at most {most})")
    out = bytearray(size)
    try:
        made = cramjam.zstd.decompress_into(raw[8:], out)
    except cramjam.DecompressionError as exc:
        raise BadMessage("schema", f"a compressed record does not expand: {exc}") from None
    if made != size:
        raise BadMessage("schema", f"a compressed record expands to {made} bytes, not {size}")
    return bytes(out)


def header_of(raw: bytes) -> bytes:
    """The JSON header of a record :func:`pack` wrote (the record without its arrays),
    compressed (:func:`squeeze`) or not."""
    if raw[:4] == ZMAGIC:
        raw = _expanded(raw)
    (size,) = _LENGTH.unpack_from(raw, 4)
    return raw[8 : 8 + size]


def _array_of(value: Any, kind: type) -> npt.NDArray[np.float64] | None:
    """The float64 array a list or array of ``kind`` is packed as, None if it stays in the
    header (shorter than :data:`MIN_PACKED`, or not all floats)."""
    if kind is FloatList and value.array is not None and len(value) >= MIN_PACKED:
        return value.array  # type: ignore[no-any-return]  # the array it was made from
    if kind is list or kind is tuple or kind is FloatList:
        if len(value) >= MIN_PACKED and type(value[0]) is float:
            # numpy classifies in C: float64 and one-dimensional only when every item is
            # a float (or an int among floats: read back as a float of the same value)
            try:
                values = np.array(value)
            except ValueError:  # lists of unequal lengths inside
                return None
            if values.dtype == np.float64 and values.ndim == 1:
                return values
        return None
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind == "f":
        return np.asarray(value, dtype="<f8")
    return None


#: the most bytes one item of the header takes as JSON, with its separator: a float (17
#: significant digits, a sign, a point, an exponent), an integer of 64 bits (and room for
#: true, null, quotes); a string adds 6 bytes a character (escaped as \\uXXXX at most)
_FLOAT_TEXT, _INT_TEXT = 26, 22
#: the most bytes a reference takes in the header (``{"$z":[o,n,k,1.0]}``, numbers of u32)
_REF_TEXT: Final = 64


class _Checker:
    """Walks a record as :class:`_Packer` does, building nothing: collects the arrays it
    would pack, checks every number left in the header, and counts the most bytes the
    packed record can take (:attr:`most`: every number in the header at its longest,
    every array dense)."""

    __slots__ = ("big", "bound", "key", "lists", "most")

    def __init__(self, bound: float) -> None:
        self.lists: list[npt.NDArray[np.float64]] = []  # each list as a 1-d float array
        self.bound = bound
        self.big = False  # a number left in the header has a magnitude of ``bound`` or more
        self.key = f"packed.check<{bound!r}"  # a FrozenRecord's memo of this check
        self.most = 8 + _INT_TEXT + 4  # magic, length, ``[D, ...]``

    def number(self, value: float) -> float:
        if not math.isfinite(value):
            raise RecordError("model state holds a non-finite number")
        if abs(value) >= self.bound:
            self.big = True
        self.most += _FLOAT_TEXT
        return value

    def walk(self, value: Any) -> None:
        kind = type(value)
        if kind is float:
            self.number(value)
        elif kind is dict:  # braces, an escape, the keys, and room for an item and its
            # separator per value (what an integer, true or null takes; floats, text and
            # lists add what they take beyond it)
            self.most += 10 + 6 * sum(map(len, value)) + (3 + _INT_TEXT) * len(value)
            for k, v in value.items():
                if k != "params":
                    self.walk(v)
                else:  # hyperparameters: written as they are, not checked
                    self.most += len(orjson.dumps(v, option=orjson.OPT_SERIALIZE_NUMPY))
        elif kind is str:
            self.most += 6 * len(value)
        elif kind is not int and kind is not bool and value is not None:
            self.other(value, kind)

    def other(self, value: Any, kind: type) -> None:
        if kind is FrozenRecord:
            self.frozen(value)
            return
        if kind is IndexList:  # gaps of u32 where it is long and increasing, else JSON
            gaps = _gapped(value) is not None
            self.most += _REF_TEXT + (4 if gaps else _INT_TEXT) * len(value)
            return
        array = _array_of(value, kind)
        if array is not None:
            self.lists.append(array)
            self.most += _REF_TEXT + 8 * array.size  # (a sparse form is written if smaller)
        elif kind is list or kind is tuple or kind is FloatList:
            self.most += 2 + _INT_TEXT * len(value)
            for v in value:
                self.walk(v)
        elif isinstance(value, Mapping):
            self.walk(dict(value))
        elif isinstance(value, float | np.floating):
            self.walk(float(value))
        else:  # what orjson writes of anything else (a record never holds one)
            self.most += len(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)) + 1

    def frozen(self, record: FrozenRecord) -> None:
        """Check ``record`` (its arrays too) once per bound: a record shared by the states
        of many versions (a remembered label) is walked again only if a value in it has
        changed since (:meth:`~service.learning.state.FrozenRecord.unchanged`)."""
        memo = record.memo.get(self.key)
        if memo is None or not record.unchanged():
            inner = _Checker(self.bound)
            inner.walk(dict(record))
            _checked(inner.lists, self.bound)
            memo = (inner.big, inner.most)
            if record.unchanged():
                record.memo[self.key] = memo
        self.big = self.big or memo[0]
        self.most += memo[1]


class _Packer(_Checker):
    """Replaces the float lists of a record with references, keeping the lists in order,
    and its lists of increasing indices (:class:`~service.learning.state.IndexList`) with
    references to their gaps."""

    __slots__ = ("indices", "refs")

    def __init__(self, bound: float) -> None:
        super().__init__(bound)
        self.refs: list[dict[str, list[Any]]] = []  # each list's reference, set by pack()
        self.indices: list[tuple[dict[str, list[Any]], npt.NDArray[np.int64]]] = []

    def _indices(self, value: IndexList) -> dict[str, list[Any]] | None:
        """The reference of an index list written as its gaps (set by :func:`pack`); None
        when it stays in the header (short, or not increasing within a u32)."""
        at = _gapped(value)
        if at is None:
            return None
        ref: dict[str, list[Any]] = {}
        self.indices.append((ref, at))
        return ref

    def _ref(self, values: npt.NDArray[np.float64]) -> dict[str, list[Any]]:
        ref: dict[str, list[Any]] = {}
        self.lists.append(values)
        self.refs.append(ref)
        return ref

    def pack(self, value: Any) -> Any:
        kind = type(value)
        if kind is float:
            return self.number(value)
        if kind is dict:
            out = {k: v if k == "params" else self.pack(v) for k, v in value.items()}
            return {_ESCAPE: out} if len(out) == 1 and next(iter(out)) in _RESERVED else out
        if kind is int or kind is str or kind is bool or value is None:
            return value
        if kind is IndexList:
            ref = self._indices(value)
            if ref is not None:
                return ref
        array = _array_of(value, kind)
        if array is not None:
            return self._ref(array)
        if kind is list or kind is tuple or kind is FloatList:
            return [self.pack(v) for v in value]
        if isinstance(value, Mapping):
            return self.pack(dict(value))
        if isinstance(value, float | np.floating):
            return self.pack(float(value))
        return value


#: lists of at least this many numbers on average are counted one by one (in place); shorter
#: ones in one vectorised pass over all of them (a count per list costs more than its numbers)
_COUNTED_EACH: Final = 1024


def _fills(flat: npt.NDArray[np.float64], sizes: list[int]) -> npt.NDArray[np.intp]:
    """For each list of ``sizes`` laid end to end in ``flat``: the index in :data:`_FILLS`
    of the fill whose sparse form is smaller than the dense one, or -1 (two passes over
    ``flat`` in all, whatever the number of lists).

    >>> _fills(np.array([0.0, 0.0, 0.0, 5.0, 1.0, 1.0, 1.0, 2.0, 3.0]), [4, 3, 2]).tolist()
    [0, 1, -1]
    """
    out = np.full(len(sizes), -1, dtype=np.intp)
    if not sizes or not flat.size:
        return out
    bits = flat.view("<u8")
    n = np.asarray(sizes)
    for which in (1, 0):  # 0.0 wins over 1.0 where both would do
        if flat.size >= _COUNTED_EACH * len(sizes):
            ends = np.cumsum(sizes).tolist()
            same = np.array(
                [
                    np.count_nonzero(bits[end - size : end] == _FILL_BITS[which])
                    for end, size in zip(ends, sizes, strict=True)
                ]
            )
        else:
            starts = np.cumsum([0, *sizes[:-1]])
            same = np.add.reduceat((bits == _FILL_BITS[which]).astype(np.int64), starts)
        out[(n - same) * 12 < n * 8] = which
    return out


def _checked(lists: list[npt.NDArray[np.float64]], bound: float) -> npt.NDArray[np.float64]:
    """``lists`` laid end to end, every number in them finite and below ``bound`` (the
    largest and the least of them: NaN in either when there is one)."""
    flat = np.concatenate(lists) if lists else np.empty(0)
    if flat.size:
        high, low = float(flat.max()), float(flat.min())
        if not (math.isfinite(high) and math.isfinite(low)):
            raise RecordError("model state holds a non-finite number")
        if max(high, -low) >= bound:
            raise RecordError(f"model state holds a learned number of magnitude >= {bound:g}")
    return flat


def _gapped(value: IndexList) -> npt.NDArray[np.int64] | None:
    """The indices of ``value`` when they are written as gaps (at least :data:`MIN_PACKED`,
    strictly increasing, within a u32); None when the list stays in the header."""
    if len(value) < MIN_PACKED:
        return None
    at = value.array if value.array is not None else np.array(value, dtype=np.int64)
    if at[0] < 0 or at[-1] > _MOST_INDEX or not (np.diff(at) > 0).all():
        return None
    return at


def check(record: Mapping[str, Any], *, bound: float = math.inf) -> bool:
    """Raise what :func:`pack` raises for ``record``, without encoding it (what a learner
    checks of a version it may never write); True if a number :func:`pack` would leave in
    the header (a list too short to pack, a single number) has a magnitude of ``bound`` or
    more, which the caller judges (it may be a setting, not a learned number).

    >>> check({"w": [0.5] * 20, "n": 1e120}, bound=1e100)
    True
    >>> check({"w": [0.5] * 19 + [float("nan")]})
    Traceback (most recent call last):
    ...
    service.records.codec.RecordError: model state holds a non-finite number
    """
    return checked(record, bound=bound)[0]


def checked(record: Mapping[str, Any], *, bound: float = math.inf) -> tuple[bool, int]:
    """What :func:`check` gives, and the most bytes :func:`pack` can make of ``record``
    (at least its length: a learner that must keep a version within a message's size
    encodes only those that may not fit).

    >>> rec = {"w": [0.25] * 300, "at": [1, 2], "name": "m", "params": {"eta": 0.5}}
    >>> checked(rec)[1] >= len(pack(rec)), checked(rec)[1] < 2 * len(pack(rec))
    (True, True)
    """
    checker = _Checker(bound)
    checker.walk(record)
    _checked(checker.lists, bound)
    return checker.big, checker.most


def pack(record: Mapping[str, Any], *, bound: float = math.inf) -> bytes:
    """``record`` (JSON-safe, numpy arrays allowed) in the packed form; raises
    :class:`~service.records.codec.RecordError` if a number in it is not finite, or one in a
    packed array has a magnitude of ``bound`` or more."""
    packer = _Packer(bound)
    body = packer.pack(record)
    sizes = [v.size for v in packer.lists]
    flat = _checked(packer.lists, bound)
    fill = _fills(flat, sizes)
    dense: list[npt.NDArray[np.float64]] = []
    sparse: list[bytes] = []
    start = kept = sparse_at = 0
    for n, ref, which in zip(sizes, packer.refs, fill.tolist(), strict=True):
        values = flat[start : start + n]
        start += n
        if which < 0:
            ref[_DENSE] = [kept, n]
            dense.append(values)
            kept += n
            continue
        where = np.flatnonzero(values.view("<u8") != _FILL_BITS[which])
        ref[_GAPS] = [sparse_at, n, where.size, _FILLS[which]]
        sparse += [_gaps(where), values[where].tobytes()]
        sparse_at += 12 * where.size
    for ref, at in packer.indices:
        ref[_INDICES] = [sparse_at, at.size]
        sparse.append(_gaps(at))
        sparse_at += 4 * at.size
    try:  # every float in it was checked on the walk
        header = orjson.dumps([kept, body], option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError as exc:
        raise RecordError(f"model state is not JSON-safe: {exc}") from exc
    if len(dense) == len(packer.lists):  # no list went sparse: the doubles are flat's
        doubles = flat.tobytes()
    else:
        doubles = np.concatenate(dense).tobytes() if dense else b""
    return b"".join([MAGIC, _LENGTH.pack(len(header)), header, doubles, *sparse])


def _gaps(at: npt.NDArray[np.intp] | npt.NDArray[np.int64]) -> bytes:
    """Increasing indices as u32 gaps (the first from 0): a wide model's indices are close
    together, and their gaps compress to a fraction of the indices' bytes."""
    out = np.empty(at.size, dtype="<u4")
    if at.size:
        out[0] = at[0]
        np.subtract(at[1:], at[:-1], out=out[1:], casting="unsafe")
    return out.tobytes()


class _Unpacker:
    __slots__ = ("bound", "doubles", "gaps", "left", "sparse")

    def __init__(
        self, doubles: npt.NDArray[np.float64], sparse: memoryview, bound: float, gaps: bool
    ):
        self.gaps = gaps  # the current form (MAGIC): references to gaps are read as such
        self.bound = bound
        self.doubles = doubles
        self.sparse = sparse
        self.left = MAX_ELEMENTS

    def _take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise BadMessage("schema", f"a packed record expands past {MAX_ELEMENTS} floats")

    def _slice(self, at: int, size: int) -> memoryview:
        if at + size > len(self.sparse):
            raise BadMessage("schema", "a packed array reaches past the record's end")
        return self.sparse[at : at + size]

    def _dense(self, args: Any) -> list[float]:
        if not (isinstance(args, list) and len(args) == 2 and all(type(i) is int for i in args)):
            raise BadMessage("schema", "a packed array's reference is malformed")
        at, n = args
        if at < 0 or n < 0 or at + n > self.doubles.size:
            raise BadMessage("schema", "a packed array reaches past the record's end")
        self._take(n)
        return FloatList(self.doubles[at : at + n])  # its array: no conversion in from_state

    def _positions(self, at: int, k: int, gaps: bool) -> npt.NDArray[np.int64]:
        """``k`` u32 at byte ``at`` of the sparse arrays, as indices (``gaps``: each but
        the first from the one before, and then above it: strictly increasing)."""
        read = np.frombuffer(self._slice(at, 4 * k), dtype="<u4").astype(np.int64)
        if not gaps:
            if k > 1 and not (np.diff(read) > 0).all():
                raise BadMessage("schema", "a packed sparse array's indices are out of order")
            return read
        if k > 1 and not (read[1:] > 0).all():
            raise BadMessage("schema", "a packed list of indices is not increasing")
        return np.cumsum(read)

    def _index_list(self, args: Any) -> IndexList:
        if not (
            isinstance(args, list)
            and len(args) == 2
            and all(type(i) is int and i >= 0 for i in args)
        ):
            raise BadMessage("schema", "a packed list of indices' reference is malformed")
        at, k = args
        self._take(k)
        return IndexList(self._positions(at, k, gaps=True))

    def _sparse(self, args: Any, *, gaps: bool = False) -> list[float]:
        if not (
            isinstance(args, list)
            and len(args) == 4
            and all(type(i) is int and i >= 0 for i in args[:3])
            and type(args[3]) is float
            and args[3] in _FILLS
            and args[2] <= args[1]
        ):
            raise BadMessage("schema", "a packed sparse array's reference is malformed")
        at, n, k, fill = args
        self._take(n)
        where = self._positions(at, k, gaps)
        found = np.frombuffer(self._slice(at + 4 * k, 8 * k), dtype="<f8")
        if k and int(where[-1]) >= n:
            raise BadMessage("schema", "a packed sparse array's indices are out of order")
        self._check(found)
        values = np.full(n, fill)
        values[where] = found
        return FloatList(values)

    def _check(self, values: npt.NDArray[np.float64]) -> None:
        if not np.isfinite(values).all():
            raise BadMessage("schema", "a packed array holds a non-finite number")
        if values.size and float(np.abs(values).max()) >= self.bound:
            raise BadMessage(
                "schema", f"a packed record holds a number of magnitude >= {self.bound:g}"
            )

    def walk(self, value: Any) -> Any:
        if isinstance(value, dict):
            if len(value) == 1:
                kind = next(iter(value))
                if kind == _DENSE:
                    return self._dense(value[kind])
                if kind == _SPARSE:
                    return self._sparse(value[kind])
                if kind == _GAPS and self.gaps:
                    return self._sparse(value[kind], gaps=True)
                if kind == _INDICES and self.gaps:
                    return self._index_list(value[kind])
                if kind == _ESCAPE and isinstance(value[kind], dict):
                    return {k: self.walk(v) for k, v in value[kind].items()}
            return {k: v if k == "params" else self.walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.walk(v) for v in value]
        if isinstance(value, float) and abs(value) >= self.bound:
            raise BadMessage(
                "schema", f"a packed record holds a number of magnitude >= {self.bound:g}"
            )
        return value


def unpack(raw: bytes, *, max_bytes: int | None = None, bound: float = math.inf) -> dict[str, Any]:
    """The record :func:`pack` wrote; :class:`~service.records.codec.BadMessage` for anything
    else (a reference that is malformed or reaches outside the record, a non-finite float,
    more than :data:`MAX_ELEMENTS` floats in all, a number outside a ``params`` section of
    magnitude ``bound`` or more)."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise BadMessage("oversize", f"{len(raw)} bytes > limit {max_bytes}")
    if raw[:4] == ZMAGIC:
        raw = _expanded(raw)
    if raw[:4] not in (MAGIC, MAGIC_2) or len(raw) < 8:
        raise BadMessage("schema", "not a packed record")
    (size,) = _LENGTH.unpack_from(raw, 4)
    if 8 + size > len(raw):
        raise BadMessage("schema", "a packed record's header reaches past its end")
    try:
        header = orjson.loads(raw[8 : 8 + size])
    except orjson.JSONDecodeError as exc:
        raise BadMessage("not_json", f"a packed record's header: {exc}") from None
    if not (
        isinstance(header, list)
        and len(header) == 2
        and type(header[0]) is int
        and 0 <= header[0] <= (len(raw) - 8 - size) // 8
        and isinstance(header[1], dict)
    ):
        raise BadMessage("schema", "a packed record's header is not [doubles, object]")
    end = 8 + size + 8 * header[0]
    unpacker = _Unpacker(
        np.frombuffer(raw, dtype="<f8", count=header[0], offset=8 + size),
        memoryview(raw)[end:],
        bound,
        raw[:4] == MAGIC,
    )
    unpacker._check(unpacker.doubles)
    out: dict[str, Any] = unpacker.walk(header[1])
    return out
