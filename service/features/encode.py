r"""An event's fields as a model's inputs, under its declaration (pure: mmh3 and numpy).

:meth:`Encoder.sparse` gives the coordinates an event sets and their values;
:meth:`Encoder.dense` the whole input vector. A hashed key is MurmurHash3 (x86, 32 bit,
seeded) of its UTF-8 bytes, keeping the low ``hash_bits`` bits: the same on every process,
machine and restart (Python's ``hash()`` of a string is salted per process and is never
used). Keys: ``name`` (a boolean), ``name=value`` (a category), ``name^token`` (a token),
``name?`` (a missing indicator), ``a*b`` (a cross of two keys). Several keys may share a
bucket: their values add.

A tokens field that no cross reads is encoded through a cache of the inputs its tokens land
on (at most :data:`CACHED_TOKENS` words of at most :data:`CACHED_LENGTH` characters a
field, emptied when full: a few MiB whatever events bring), so a word seen before costs
one lookup instead of its key, its hash and its count: the inputs are the same, each
occurrence adding 1 where the uncached path adds the count once.

>>> from service.features.declaration import FieldsConfig
>>> enc = Encoder(FieldsConfig.model_validate({"hash_bits": 4, "fields": {
...     "amount": "number", "country": "category", "new_device": "boolean",
...     "merchant": {"kind": "category", "missing": "indicator"}, "tokens": "tokens"}}))
>>> idx, val = enc.sparse({"amount": 12.5, "country": "SE", "new_device": True,
...                        "merchant": None, "tokens": "refund urgent refund"})
>>> [(int(i), float(v)) for i, v in zip(idx, val)]     # the keys, then each token
[(0, 12.5), (13, 1.0), (5, 1.0), (3, 1.0), (1, 1.0), (5, 1.0), (1, 1.0)]
>>> enc.dense({"tokens": ["refund", "urgent", "refund"]})[1:6].tolist()  # merchant? at 3
[2.0, 0.0, 1.0, 0.0, 1.0]
>>> bucket("country=SE", seed=0, bits=4)     # stable: the same on every machine
12
>>> enc.sparse({"amount": "12.5"})
Traceback (most recent call last):
service.features.encode.FieldError: field 'amount': a string where a number is declared
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, Final

import mmh3
import numpy as np
import numpy.typing as npt

from service.features.declaration import FieldsConfig, FieldSpec
from service.features.raw import RawTokens

__all__ = ["CACHED_LENGTH", "CACHED_TOKENS", "Encoder", "FieldError", "bucket", "encoder_of"]

#: the tokens a field's cache holds before it is emptied (bounded whatever events bring)
CACHED_TOKENS: Final = 1 << 15
#: the longest token cached (a longer one is hashed each time: it cannot fill the memory)
CACHED_LENGTH: Final = 64

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
_INPUT: Final = np.dtype("<i8")  # an input as the token cache holds it

_NAMES: Final = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "an object",
}
_TEXT: Final = frozenset({str})
_WANTS: Final = {
    "number": "a number",
    "boolean": "a boolean",
    "category": "a category (a string)",
    "tokens": "tokens (a list of strings or a string)",
}


class FieldError(ValueError):
    """An event's field does not fit the declaration; ``field`` names it."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"field {field!r:.80}: {detail}")
        self.field = field
        self.detail = detail


def bucket(key: str, *, seed: int, bits: int) -> int:
    """The hashed bucket of ``key``: MurmurHash3_x86_32 of its UTF-8 bytes, low ``bits``.
    (The bytes are made here: mmh3 5.3.1 given a ``str`` with a lone surrogate, which no
    encoding holds, crashes the process; ``str.encode`` raises UnicodeEncodeError.)"""
    return int(mmh3.hash(key.encode(), seed, False)) & ((1 << bits) - 1)


def _kind_of(value: Any) -> str:
    return _NAMES.get(type(value), type(value).__name__)


class Encoder:
    """Encodes events under one :class:`~service.features.declaration.FieldsConfig`."""

    def __init__(self, declaration: FieldsConfig) -> None:
        self.declaration = declaration
        self.numbers: dict[str, int] = {n: i for i, n in enumerate(declaration.numbers)}
        self.offset = len(self.numbers)
        self.width = declaration.width
        self.seed = declaration.seed
        self._mask = declaration.buckets - 1
        self._specs = declaration.fields
        self._read = [(n, spec) for n, spec in self._specs.items() if spec.kind != "ignore"]
        crossed = {name for pair in declaration.cross for name in pair}
        # token -> input, per tokens field no cross reads (the module docstring)
        self._cached: dict[str, dict[str, bytes]] = {
            name: {}
            for name, spec in self._specs.items()
            if spec.kind == "tokens" and name not in crossed
        }

    @property
    def cached(self) -> tuple[str, ...]:
        """The tokens fields encoded through a cache (no cross reads them): the fields a
        :class:`~service.features.raw.RawReader` reads from an event's bytes."""
        return tuple(self._cached)

    @property
    def mask(self) -> int:
        """The low bits of a hash that make a bucket (``buckets - 1``)."""
        return self._mask

    @property
    def names(self) -> tuple[str, ...]:
        """A name per input: the number fields', then ``#i`` per bucket."""
        return (*self.numbers, *(f"#{i}" for i in range(self.declaration.buckets)))

    def shown(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of an event the model reads (declared, not ignored, present), in
        declared order, as sent (a number as the float it reads, a category as the text it
        hashes): what a person answering its label request is shown. For an event that
        :meth:`sparse` takes.

        >>> enc = Encoder(FieldsConfig.model_validate(
        ...     {"hash_bits": 2, "fields": {"b": "category", "a": "number", "x": "ignore"}}))
        >>> enc.shown({"a": 1, "x": [0] * 100, "b": "SE", "z": 2})
        {'b': 'SE', 'a': 1.0}
        """
        out: dict[str, Any] = {}
        for name, spec in self._specs.items():
            value = fields.get(name)
            if spec.kind == "ignore" or name not in fields:
                continue
            if type(value) is RawTokens:
                value = value.tokens()
            if value is None or spec.kind in ("boolean", "tokens"):
                out[name] = value
            elif spec.kind == "number":
                out[name] = _number(name, value)
            else:  # a category: its text, as it is hashed
                out[name] = value if type(value) is str else str(value)
        return out

    def keys(self, fields: Mapping[str, Any]) -> dict[int, str]:
        """The keys of ``fields`` (an event :meth:`sparse` takes) by the input they land on,
        keys that share a bucket joined by `` | ``: what an input of this event stands for
        (the desk's "weighs most").

        >>> enc = Encoder(FieldsConfig.model_validate(
        ...     {"hash_bits": 4, "fields": {"a": "number", "b": "category"}}))
        >>> enc.keys({"a": 2.0, "b": "SE"})
        {0: 'a', 5: 'b=SE'}
        """
        out: dict[int, str] = {}
        for idx, keys, _ in self._parts(fields, keyed=True):
            for i, key in zip(idx, keys, strict=True):
                out[i] = key if i not in out else f"{out[i]} | {key}"
        return out

    def sparse(self, fields: Mapping[str, Any]) -> tuple[IntArray, FloatArray]:
        """The coordinates ``fields`` sets and their values (a coordinate may repeat: the
        values add): the numbers, the other keys, then each cached tokens field's
        occurrences; :class:`FieldError` names the first field that does not fit."""
        inputs: list[int] = []
        values: list[float] = []
        tokens: list[IntArray] = []
        for idx, _, val in self._parts(fields, keyed=False):
            if isinstance(idx, np.ndarray):  # a cached tokens field's: each value is 1
                tokens.append(idx)
            else:
                inputs += idx
                values += val or ()
        out = np.array(inputs, dtype=np.int64)
        if tokens:
            out = np.concatenate([out, *tokens])
        ones = np.ones(out.size)
        ones[: len(values)] = values
        return out, ones

    def check(self, fields: Mapping[str, Any]) -> None:
        """:class:`FieldError` where :meth:`sparse` raises it (the first field that does not
        fit, in the same words), without hashing a key: the learner's admission of a label
        request, whose fields a scorer encoded already. (``tests/features/test_encode.py``
        holds the two together.)

        >>> enc = Encoder(FieldsConfig.model_validate(
        ...     {"hash_bits": 4, "fields": {"a": "number", "t": "tokens"}}))
        >>> enc.check({"a": 2.0, "t": ["x", "y"]})
        >>> enc.check({"a": 2.0, "t": ["x", 3]})
        Traceback (most recent call last):
        service.features.encode.FieldError: field 't': token 1 is an integer, not a string
        """
        self._undeclared(fields)
        hashed: list[tuple[str, str]] = []  # (field, its keys' text): sparse hashes them last
        for name, spec in self._read:
            kind = spec.kind
            value = fields.get(name)
            if value is None:
                if _indicated(name, spec):
                    hashed.append((name, name))
                continue
            if kind == "number":
                _number(name, value)
            elif name in self._cached:  # sparse hashes a cached field's tokens in its turn
                tokens = _token_list(name, spec, value)
                _check_tokens(name, tokens)
                if tokens:
                    _valid_text(name, name + "".join(tokens))
            else:
                keys = _keys(name, spec, value)[0]
                if keys:
                    hashed.append((name, "".join(keys)))
        for name, text in hashed:
            _valid_text(name, text)

    def _undeclared(self, fields: Mapping[str, Any]) -> None:
        """:class:`FieldError` naming a field the model does not declare, when it refuses
        those."""
        if self.declaration.undeclared == "refuse":
            for name in fields:
                if name not in self._specs:
                    raise FieldError(name, "not declared by the model")

    def dense(self, fields: Mapping[str, Any]) -> FloatArray:
        """The model's whole input vector of ``fields`` (``width`` floats)."""
        idx, val = self.sparse(fields)
        return np.bincount(idx, weights=val, minlength=self.width).astype(np.float64)

    def _parts(
        self, fields: Mapping[str, Any], *, keyed: bool
    ) -> list[tuple[Sequence[int] | IntArray, list[str], list[float] | None]]:
        """(inputs, keys, values) of ``fields``: the numbers (one part), then each field's
        keys and the crosses; :class:`FieldError` names the first field that does not fit.
        Unless ``keyed``, a cached tokens field's part has no keys, an input per occurrence
        (:meth:`_token_inputs`) and values None: each is 1."""
        self._undeclared(fields)
        numbers: tuple[list[int], list[str], list[float]] = ([], [], [])
        parts: list[tuple[Sequence[int] | IntArray, list[str], list[float] | None]] = [numbers]
        hashed: dict[str, tuple[list[str], list[float]]] = {}
        for name, spec in self._read:
            kind = spec.kind
            value = fields.get(name)
            if value is None:
                if _indicated(name, spec):
                    hashed[name] = ([f"{name}?"], [1.0])
                if kind == "number":
                    numbers[0].append(self.numbers[name])
                    numbers[1].append(name)
                    numbers[2].append(0.0)
                continue
            if kind == "number":
                numbers[0].append(self.numbers[name])
                numbers[1].append(name)
                numbers[2].append(_number(name, value))
                continue
            if type(value) is RawTokens:  # read from the event's bytes (service.features.raw)
                if not keyed and value.encoder is self and len(value.inputs) <= spec.max_tokens:
                    parts.append((value.inputs, [], None))
                    continue
                value = value.tokens()  # keys, or too many: the tokens as orjson reads them
            if not keyed and name in self._cached:
                parts.append((self._token_inputs(name, _token_list(name, spec, value)), [], None))
                continue
            hashed[name] = _keys(name, spec, value)
        for name, (keys, values) in hashed.items():
            try:
                parts.append((self._hash_all(keys), keys, values))
            except UnicodeEncodeError:  # a lone surrogate (\ud800): not text of any encoding
                raise FieldError(name, "text that is not valid Unicode") from None
        for a, b in self.declaration.cross:
            (ka, va), (kb, vb) = hashed.get(a, ([], [])), hashed.get(b, ([], []))
            keys = [f"{x}*{y}" for x in ka for y in kb]
            parts.append((self._hash_all(keys), keys, [x * y for x in va for y in vb]))
        return parts

    def _token_inputs(self, name: str, tokens: list[Any]) -> IntArray:
        """The input of each of ``tokens`` (a list :func:`_token_list` gave) in field
        ``name``, one per occurrence, through the field's cache; :class:`FieldError` when a
        token is not a string or not valid Unicode. Only a string's input is ever cached,
        so a token of another type (or one never seen) misses and is checked. The cache
        holds each input as its 8 bytes, so the inputs of a whole event are joined and read
        as one array, never as a Python integer each."""
        cache = self._cached[name]
        try:  # the lookups in C (an itemgetter of one key gives the value, not a tuple)
            found = itemgetter(*tokens)(cache) if len(tokens) > 1 else (cache[tokens[0]],)
            return np.frombuffer(b"".join(found), dtype=_INPUT)
        except (KeyError, TypeError, IndexError):  # a token not seen (or not a string); none
            pass
        _check_tokens(name, tokens)
        hash32, seed, mask, offset = mmh3.hash, self.seed, self._mask, self.offset
        prefix = f"{name}^"
        inputs: list[bytes] = []
        for token in tokens:
            packed = cache.get(token)
            if packed is None:
                try:
                    i = offset + (hash32((prefix + token).encode(), seed, False) & mask)
                except UnicodeEncodeError:  # a lone surrogate: not text of any encoding
                    raise FieldError(name, "text that is not valid Unicode") from None
                packed = i.to_bytes(8, "little")
                if len(token) <= CACHED_LENGTH:
                    if len(cache) >= CACHED_TOKENS:
                        cache.clear()
                    cache[token] = packed
            inputs.append(packed)
        return np.frombuffer(b"".join(inputs), dtype=_INPUT)

    def _hash_all(self, keys: list[str]) -> list[int]:
        """The input of each key (:func:`bucket`, after the numbers). mmh3's ``signed`` is
        given by position: by keyword it costs four times the hash."""
        hash32, seed, mask, offset = mmh3.hash, self.seed, self._mask, self.offset
        return [offset + (hash32(key.encode(), seed, False) & mask) for key in keys]


def _number(name: str, value: Any) -> float:
    if type(value) is bool or not isinstance(value, int | float):
        raise FieldError(name, f"{_kind_of(value)} where a number is declared")
    try:
        number = float(value)
    except OverflowError:
        raise FieldError(name, "an integer too large for a float") from None
    if not math.isfinite(number):
        raise FieldError(name, "not a finite number")
    return number


def _indicated(name: str, spec: FieldSpec) -> bool:
    """Whether missing or null field ``name`` sets its indicator; :class:`FieldError` when
    the model refuses it missing."""
    if spec.missing == "refuse":
        raise FieldError(name, "missing or null, and the model refuses that")
    return spec.missing == "indicator"


def _valid_text(name: str, text: str) -> None:
    """:class:`FieldError` when ``text`` of field ``name`` holds a lone surrogate (no
    encoding holds it: hashing its UTF-8 bytes fails). A lone surrogate in any of a list of
    strings is one in their concatenation: Python never pairs two into a character."""
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise FieldError(name, "text that is not valid Unicode") from None


def _keys(name: str, spec: FieldSpec, value: Any) -> tuple[list[str], list[float]]:
    """The hashed keys of a present value of a boolean, category or tokens field, and their
    values."""
    kind = spec.kind
    if kind == "boolean":
        if type(value) is not bool:
            raise FieldError(name, f"{_kind_of(value)} where a boolean is declared")
        return ([name], [1.0]) if value else ([], [])
    if kind == "category":
        if type(value) is str or type(value) is int:
            return [f"{name}={value}"], [1.0]
        raise FieldError(name, f"{_kind_of(value)} where {_WANTS[kind]} is declared")
    tokens = _token_list(name, spec, value)
    _check_tokens(name, tokens)
    counts = Counter(tokens)
    prefix = f"{name}^"
    return [prefix + t for t in counts], [float(c) for c in counts.values()]


def _token_list(name: str, spec: FieldSpec, value: Any) -> list[Any]:
    """The tokens of a present value of tokens field ``name`` (a list, or a string split at
    white space), not yet checked to be strings; :class:`FieldError` when it is neither or
    holds more than the field's ``max_tokens``."""
    tokens: list[Any]
    if type(value) is str:
        tokens = value.split()
    elif type(value) is list:
        tokens = value
    else:
        raise FieldError(name, f"{_kind_of(value)} where {_WANTS[spec.kind]} is declared")
    if len(tokens) > spec.max_tokens:
        raise FieldError(name, f"{len(tokens)} tokens > max_tokens {spec.max_tokens}")
    return tokens


def _check_tokens(name: str, tokens: list[Any]) -> None:
    """:class:`FieldError` naming the first of ``tokens`` that is not a string."""
    if not _TEXT.issuperset(map(type, tokens)):
        i, token = next((i, t) for i, t in enumerate(tokens) if type(t) is not str)
        raise FieldError(name, f"token {i} is {_kind_of(token)}, not a string")


_ENCODERS: dict[int, tuple[FieldsConfig, Encoder]] = {}


def encoder_of(declaration: FieldsConfig) -> Encoder:
    """The :class:`Encoder` of ``declaration``, made once per declaration object (settings
    are read once and kept; a declaration is frozen)."""
    held = _ENCODERS.get(id(declaration))
    if held is not None and held[0] is declaration:
        return held[1]
    if len(_ENCODERS) >= 256:  # settings read again and again (tests): start afresh
        _ENCODERS.clear()
    encoder = Encoder(declaration)
    _ENCODERS[id(declaration)] = (declaration, encoder)
    return encoder
