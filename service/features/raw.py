r"""Events of a declared model read from their bytes, a tokens field without a string per token.

orjson makes a Python string of every token of an event, and the encoder then looks each up
in its cache: for an event of 300 tokens that is most of what scoring it costs. A
:class:`RawReader` decodes an event's fields with msgspec, leaving each cached tokens field
(:attr:`Encoder.cached <service.features.encode.Encoder>`) as its JSON bytes, and reads those
bytes in one compiled pass (numba) that checks they are an array of plain strings (valid
UTF-8, no escape, no control character) and gives each token's input: MurmurHash3_x86_32 of
``name^token``'s UTF-8 bytes, the same input the encoder gives it.

The reader accepts only what orjson decodes to the same values: an event it is not sure of
(an escape in a token, an integer beyond 64 bits, a key it does not know, a nested value, a
duplicate key of the envelope's, anything msgspec refuses) gives None, and the caller
decodes it with orjson as before. So an event reads the same whichever way it went: the
same decision, the same dead letter with the same reason (``tests/features/test_raw.py``).

>>> from service.features.declaration import FieldsConfig
>>> from service.features.encode import encoder_of
>>> decl = FieldsConfig.model_validate({"hash_bits": 4, "fields": {
...     "amount": "number", "words": "tokens"}})
>>> reader = RawReader(encoder_of(decl))
>>> fields = reader.fields(b'{"amount": 2.5, "words": ["refund", "urgent", "refund"]}')
>>> fields["amount"], fields["words"].inputs.tolist()
(2.5, [4, 9, 4])
>>> encoder_of(decl).sparse({"words": ["refund", "urgent", "refund"]})[0].tolist()
[0, 4, 9, 4]
>>> reader.fields(b'{"amount": 2.5, "words": ["a\\"b"]}') is None   # an escape: orjson's way
True
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable
from typing import Any, Final, Protocol

import msgspec
import numpy as np
import orjson
from msgspec.structs import astuple

from service.features.declaration import FieldsConfig

__all__ = ["Envelope", "RawReader", "RawTokens", "read_envelope", "reader_of"]

_log = logging.getLogger(__name__)
_LOW: Final = -(1 << 63)
_HIGH: Final = 1 << 64  # orjson reads an integer in [-2^63, 2^64) as an int, beyond as a float
_SCALARS: Final = frozenset({str, float, bool, type(None)})
_NULL: Final = msgspec.Raw(b"null")
_UNMATCHED: Final = re.compile(r'["\\\x00-\x1f]')  # what msgspec refuses in a field's name


class Encoder(Protocol):
    """What a reader needs of :class:`~service.features.encode.Encoder` (which reads this
    module's :class:`RawTokens`)."""

    declaration: FieldsConfig
    seed: int
    offset: int

    @property
    def cached(self) -> tuple[str, ...]: ...

    @property
    def mask(self) -> int: ...


class RawTokens:
    """A tokens field read from its bytes: its inputs (one per occurrence, in order) and the
    JSON bytes, decoded only when a person is shown the field."""

    __slots__ = ("encoder", "inputs", "raw")

    def __init__(self, inputs: np.ndarray, raw: bytes, encoder: Encoder) -> None:
        self.inputs = inputs
        self.raw = raw
        self.encoder = encoder  # whose inputs they are: another encoder reads the tokens

    def tokens(self) -> list[str]:
        """The tokens as orjson decodes them."""
        value: list[str] = orjson.loads(self.raw)
        return value


class Envelope(msgspec.Struct, forbid_unknown_fields=True):
    """An event's keys (any other key: the event goes orjson's way), ``features`` unread."""

    id: Any = None
    model: Any = None
    ts: Any = None
    features: msgspec.Raw = _NULL


_ENVELOPE: Final = msgspec.json.Decoder(Envelope)


def read_envelope(raw: bytes) -> Envelope | None:
    """``raw``'s envelope, its features unread; None when orjson should read it (msgspec
    refuses it, a value is not one orjson decodes the same, or there are no features)."""
    try:
        env = _ENVELOPE.decode(raw)
    except (msgspec.MsgspecError, RecursionError):  # RecursionError: nested deep
        return None
    if not (_plain(env.id) and _plain(env.model) and _plain(env.ts)) or env.features == _NULL:
        return None
    return env


def _plain(value: Any) -> bool:
    """``value`` is a scalar orjson decodes to the same Python value."""
    if type(value) is int:
        return _LOW <= value < _HIGH
    return type(value) in _SCALARS


class RawReader:
    """Reads the fields of a declared model's events (the module docstring)."""

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        declaration = encoder.declaration
        self._raw = tuple(encoder.cached)
        self._max_tokens = {n: declaration.fields[n].max_tokens for n in self._raw}
        self._prefixes = {n: _bytes(f"{n}^".encode()) for n in self._raw}
        # attributes f0, f1, ... named as the fields are (a field's name need not be one)
        fields = [
            (
                f"f{i}",
                msgspec.Raw if name in self._raw else Any,
                msgspec.field(default=msgspec.UNSET, name=name),
            )
            for i, name in enumerate(declaration.fields)
        ]
        # an undeclared field goes orjson's way: its bytes are never checked here
        struct = msgspec.defstruct("Fields", fields, forbid_unknown_fields=True)
        self._decode: Callable[[bytes], Any] = msgspec.json.Decoder(struct).decode
        # per field in declared order: its name, and a cached tokens field's prefix bytes
        # and room (one token more than it takes: the encoder names the excess)
        self._specs = tuple(
            (name, self._prefixes.get(name), self._max_tokens.get(name, 0) + 1)
            for name in declaration.fields
        )
        self._hash = (encoder.seed, encoder.mask, encoder.offset)
        self._read = _kernel()  # compiled now (about a second, once a process)

    def fields(self, raw: bytes) -> dict[str, Any] | None:
        """The fields of ``raw`` (an event's ``features`` object) as orjson decodes them,
        each cached tokens field a :class:`RawTokens`; None when orjson should read them."""
        try:
            decoded = self._decode(raw)
        except (msgspec.MsgspecError, RecursionError):  # RecursionError: nested deep
            return None
        out: dict[str, Any] = {}
        for (name, prefix, room), value in zip(self._specs, astuple(decoded), strict=True):
            if value is msgspec.UNSET:
                continue
            if prefix is not None:
                if value == _NULL:  # a null field: missing, as orjson reads it
                    out[name] = None
                    continue
                tokens = self._tokens(prefix, room, value)
                if tokens is None:
                    return None
                out[name] = tokens
            elif type(value) in _SCALARS or (type(value) is int and _LOW <= value < _HIGH):
                out[name] = value
            else:  # a list, an object, an integer orjson reads as a float: orjson's way
                return None
        return out

    def _tokens(self, prefix: np.ndarray, room: int, raw: msgspec.Raw) -> RawTokens | None:
        """A tokens field's bytes ``raw`` read (``prefix``: its ``name^``), or None: orjson's
        way (not an array of plain strings, or more than ``room`` tokens)."""
        # no more room than the bytes can hold (a token takes at least 2 bytes and a comma)
        out = np.empty(min(room, len(raw) // 3 + 1), dtype=np.int64)
        count = self._read(_bytes(raw), prefix, *self._hash, out)
        if count < 0:
            return None
        return RawTokens(out[:count], bytes(raw), self.encoder)


_READERS: dict[int, tuple[Encoder, RawReader | None]] = {}


def reader_of(encoder: Encoder) -> RawReader | None:
    """The :class:`RawReader` of ``encoder``, made once; None when it has no cached tokens
    field (its events gain nothing from being read here) or a field's name msgspec cannot
    match (a quote, a backslash or a control character in it)."""
    held = _READERS.get(id(encoder))
    if held is not None and held[0] is encoder:
        return held[1]
    reader: RawReader | None = None
    if encoder.cached and not any(_UNMATCHED.search(n) for n in encoder.declaration.fields):
        try:
            reader = RawReader(encoder)
        except (ImportError, OSError) as failed:  # numba or llvmlite does not load here
            _log.warning("tokens fields are read through orjson: no compiled pass (%s)", failed)
    if len(_READERS) >= 256:  # encoders made again and again (tests): start afresh
        _READERS.clear()
    _READERS[id(encoder)] = (encoder, reader)
    return reader


@functools.cache
def _kernel() -> Callable[..., int]:
    """The compiled pass (numba compiles it once a process, at its first use)."""
    from service.features.scan import read_tokens  # numba: imported by a reader alone

    kernel: Callable[..., int] = read_tokens
    # compiled now, for the arguments a reader gives (read-only bytes and prefix)
    kernel(_bytes(b"[]"), _bytes(b"x^"), 0, 0, 0, np.empty(1, dtype=np.int64))
    return kernel


def _bytes(raw: bytes | msgspec.Raw) -> np.ndarray:
    return np.frombuffer(raw, dtype=np.uint8)
