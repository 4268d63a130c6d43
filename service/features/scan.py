"""The pass that reads a tokens field's JSON bytes (:mod:`service.features.raw`), compiled
with numba (at the first call, once a process): an array of plain strings (valid UTF-8, no
escape, no control character) and each token's input, MurmurHash3_x86_32 (seeded) of the
field's ``name^`` and the token's bytes, the low bits, after the numbers.

>>> import mmh3, numpy as np
>>> out = np.empty(4, dtype=np.int64)
>>> raw, prefix = np.frombuffer(b'["ab", "c"]', np.uint8), np.frombuffer(b"t^", np.uint8)
>>> read_tokens(raw, prefix, 7, 15, 2, out), out[:2].tolist()
(2, [9, 17])
>>> [2 + (mmh3.hash(k, 7, False) & 15) for k in (b"t^ab", b"t^c")]
[9, 17]
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

__all__ = ["read_tokens"]


@numba.njit(nogil=True, cache=False)
def _blank(b: int) -> bool:
    """JSON white space."""
    return b == 32 or b == 10 or b == 13 or b == 9


@numba.njit(nogil=True, cache=False)
def _lead(b: int) -> tuple[int, int, int]:
    """The continuation bytes UTF-8 wants after lead byte ``b`` and the range of the first
    (no overlong form, no UTF-16 surrogate, nothing past U+10FFFF); 0 when ``b`` leads none."""
    if 0xC2 <= b <= 0xDF:
        return 1, 0x80, 0xBF
    if b == 0xE0:
        return 2, 0xA0, 0xBF
    if b == 0xED:
        return 2, 0x80, 0x9F
    if 0xE1 <= b <= 0xEF:
        return 2, 0x80, 0xBF
    if b == 0xF0:
        return 3, 0x90, 0xBF
    if 0xF1 <= b <= 0xF3:
        return 3, 0x80, 0xBF
    if b == 0xF4:
        return 3, 0x80, 0x8F
    return 0, 0, 0


@numba.njit(nogil=True, cache=False)
def _round(h: Any, k: Any) -> Any:
    """MurmurHash3_x86_32's step of the 4-byte block ``k`` into the state ``h``."""
    m32 = np.uint64(0xFFFFFFFF)
    k = (k * np.uint64(0xCC9E2D51)) & m32
    k = ((k << np.uint64(15)) | (k >> np.uint64(17))) & m32
    h ^= (k * np.uint64(0x1B873593)) & m32
    h = ((h << np.uint64(13)) | (h >> np.uint64(19))) & m32
    return (h * np.uint64(5) + np.uint64(0xE6546B64)) & m32


@numba.njit(nogil=True, cache=False)
def _final(h: Any, k: Any, held: int, length: int) -> Any:
    """The hash of a key of ``length`` bytes, the last ``held`` (fewer than 4) in ``k``."""
    m32 = np.uint64(0xFFFFFFFF)
    if held:
        k = (k * np.uint64(0xCC9E2D51)) & m32
        k = ((k << np.uint64(15)) | (k >> np.uint64(17))) & m32
        h ^= (k * np.uint64(0x1B873593)) & m32
    h ^= np.uint64(length)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & m32
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & m32
    return h ^ (h >> np.uint64(16))


@numba.njit(nogil=True, cache=False)
def _start(prefix: Any, seed: int) -> tuple[Any, Any, int]:
    """The hash's state after ``prefix``: the state, the bytes held and how many."""
    h, k, held = np.uint64(seed) & np.uint64(0xFFFFFFFF), np.uint64(0), 0
    for b in prefix:
        k |= np.uint64(b) << np.uint64(8 * held)
        held += 1
        if held == 4:
            h, k, held = _round(h, k), np.uint64(0), 0
    return h, k, held


@numba.njit(nogil=True, cache=False)
def read_tokens(  # noqa: C901, PLR0912 - one pass over the bytes
    buf: Any, prefix: Any, seed: int, mask: int, offset: int, out: Any
) -> int:
    """The inputs of the JSON array of plain strings in ``buf`` into ``out``: their count,
    or -1 when ``buf`` is anything else or holds more than ``out`` has room for (then the
    caller reads it with orjson). Each string's bytes are checked and hashed in one pass."""
    n, base = buf.shape[0], prefix.shape[0]
    h0, k0, held0 = _start(prefix, seed)
    i = 0
    while i < n and _blank(buf[i]):
        i += 1
    if i >= n or buf[i] != 91:  # [
        return -1
    i += 1
    while i < n and _blank(buf[i]):
        i += 1
    count, empty = 0, i < n and buf[i] == 93  # ]
    while not empty:
        if i >= n or buf[i] != 34 or count >= out.shape[0]:  # "
            return -1
        i += 1
        h, k, held, length, need, lo, hi = h0, k0, held0, base, 0, 0x80, 0xBF
        while True:
            if i >= n:
                return -1
            b = buf[i]
            if need:
                if b < lo or b > hi:
                    return -1
                need, lo, hi = need - 1, 0x80, 0xBF
            elif b == 34:
                break
            elif b == 92 or b < 32:  # an escape or a control character
                return -1
            elif b >= 0x80:
                need, lo, hi = _lead(b)
                if not need:
                    return -1
            k |= np.uint64(b) << np.uint64(8 * held)
            held, length, i = held + 1, length + 1, i + 1
            if held == 4:
                h, k, held = _round(h, k), np.uint64(0), 0
        out[count] = offset + np.int64(_final(h, k, held, length) & np.uint64(mask))
        count += 1
        i += 1
        while i < n and _blank(buf[i]):
            i += 1
        if i < n and buf[i] == 44:  # ,
            i += 1
            while i < n and _blank(buf[i]):
                i += 1
            continue
        if i >= n or buf[i] != 93:
            return -1
        break
    i += 1
    while i < n and _blank(buf[i]):
        i += 1
    return count if i == n else -1
