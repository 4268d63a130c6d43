"""Decompression with a bound: a record batch that inflates beyond a limit is refused before
it is inflated whole.

A compressed record batch is small on the wire and can be huge once inflated: 58 KB of zstd
inflate to 1.9 GB of zeros. ``fetch_bytes`` bounds what a fetch carries (compressed bytes),
not what a batch becomes, and the client inflates a batch whole before it reads a record of
it. Each decoder here writes into room for ``limit`` bytes and no more, and raises
:class:`InflateRefused` when the batch needs more; what it returns is what the client's own
decoder would have returned. Memory for one batch stays within ``limit`` bytes (plus the
compressed bytes), whatever the batch says of itself.

- gzip: zlib with a ``max_length`` on every call (every member of a multi-member stream);
- zstd and lz4 (Kafka's LZ4 frames): cramjam decodes into an anonymous memory map of
  ``limit + 1`` bytes, one per thread (pages are only taken as they are written, and given
  back after a batch of more than :data:`KEEP_BYTES`), and fails once it is full;
- snappy (raw, or xerial's framing of raw blocks): each raw block states its length before
  its data, so the sum is checked before anything is inflated.

:func:`service.stream.kafka.internals.bound_inflation` installs these as the decoders the
client uses. A refused batch then fails to read like a batch that does not decode, and
:class:`~service.stream.kafka.unreadable.Reader` treats it as one (stopped at or skipped,
dead-lettered with its offsets).

>>> import aiokafka.codec as kafka
>>> payload = b'{"id": "e1", "features": [0.5, 1.0]}' * 1000
>>> zstd_decode(kafka.zstd_encode(payload), 1_000_000) == payload
True
>>> zstd_decode(kafka.zstd_encode(payload), 1000)
Traceback (most recent call last):
...
service.stream.errors.InflateRefused: a zstd batch of 56 bytes inflates beyond 1000 bytes (max_inflated_bytes)
"""  # noqa: E501

from __future__ import annotations

import mmap
import struct
import threading
import zlib
from collections.abc import Callable
from typing import Any

import cramjam

from service.stream.errors import InflateRefused

__all__ = [
    "DECODERS",
    "KEEP_BYTES",
    "gzip_decode",
    "lz4_decode",
    "snappy_decode",
    "zstd_decode",
]

#: how cramjam says that the room it was given is full (cramjam 2.14.0; other failures are
#: errors of the data, raised as they are)
_FULL = "failed to write whole buffer"
#: xerial's snappy framing: 16 header bytes (a magic, a version and a compatible version),
#: then blocks of a 4-byte big-endian length and a raw snappy block
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16
#: the room a thread keeps resident after inflating a batch; what a larger batch took is given
#: back at once
KEEP_BYTES = 8 << 20
_rooms = threading.local()


def _refuse(codec: str, data: Any, limit: int) -> InflateRefused:
    return InflateRefused(
        f"a {codec} batch of {len(data)} bytes inflates beyond {limit} bytes (max_inflated_bytes)"
    )


def _room(limit: int) -> mmap.mmap:
    """This thread's room for ``limit`` bytes and one more (made once: a new map for every
    batch costs more than inflating it)."""
    room: mmap.mmap | None = getattr(_rooms, "room", None)
    if room is None or len(room) != limit + 1:
        if room is not None:
            room.close()
        room = _rooms.room = mmap.mmap(-1, limit + 1)
    return room


def _into_room(
    codec: str, decompress_into: Callable[[Any, Any], int], data: Any, limit: int
) -> bytes:
    room = _room(limit)
    used = limit + 1  # unless told otherwise: all of it
    try:
        used = int(decompress_into(data, room))
        if used > limit:
            raise _refuse(codec, data, limit)
        return room[:used]
    except cramjam.DecompressionError as exc:
        if _FULL in str(exc):
            raise _refuse(codec, data, limit) from None
        raise
    finally:
        if used > KEEP_BYTES:  # the pages go back to the system (they read as zeros again)
            room.madvise(mmap.MADV_DONTNEED)


def zstd_decode(data: Any, limit: int) -> bytes:
    """``data`` (zstd frames) inflated, or :class:`InflateRefused` past ``limit`` bytes."""
    return _into_room("zstd", cramjam.zstd.decompress_into, bytes(data), limit)


def lz4_decode(data: Any, limit: int) -> bytes:
    """``data`` (LZ4 frames) inflated, or :class:`InflateRefused` past ``limit`` bytes."""
    return _into_room("lz4", cramjam.lz4.decompress_into, bytes(data), limit)


def gzip_decode(data: Any, limit: int) -> bytes:
    """``data`` (one or more gzip members, zero padding between them allowed, as Python's
    ``gzip`` reads them) inflated, or :class:`InflateRefused` past ``limit`` bytes.

    >>> import gzip
    >>> gzip_decode(gzip.compress(b"a" * 10) + gzip.compress(b"b" * 5), 100)
    b'aaaaaaaaaabbbbb'
    """
    out = bytearray()
    rest = bytes(data)
    while rest:
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += member.decompress(rest, limit + 1 - len(out))
        if len(out) > limit or member.unconsumed_tail:
            raise _refuse("gzip", data, limit)
        if not member.eof:
            raise EOFError("a gzip member ends before its end-of-stream marker")
        rest = member.unused_data.lstrip(b"\x00")
    return bytes(out)


def _raw_snappy(block: bytes, room: int, data: Any, limit: int) -> bytes:
    if cramjam.snappy.decompress_raw_len(block) > room:
        raise _refuse("snappy", data, limit)
    return bytes(cramjam.snappy.decompress_raw(block))


def snappy_decode(data: Any, limit: int) -> bytes:
    """``data`` (raw snappy, or xerial's blocks of it) inflated, or :class:`InflateRefused`
    when the lengths its blocks state add up past ``limit`` bytes (checked before inflating).

    >>> import aiokafka.codec as kafka
    >>> snappy_decode(kafka.snappy_encode(b"x" * 100_000), 100_000) == b"x" * 100_000
    True
    >>> snappy_decode(kafka.snappy_encode(b"x" * 100_000), 99_999)
    Traceback (most recent call last):
    ...
    service.stream.errors.InflateRefused: a snappy batch of 4740 bytes inflates beyond 99999 bytes (max_inflated_bytes)
    """  # noqa: E501
    raw = bytes(data)
    if not (len(raw) > _XERIAL_HEADER and raw.startswith(_XERIAL_MAGIC)):
        return _raw_snappy(raw, limit, data, limit)
    blocks: list[bytes] = []
    total, cursor = 0, _XERIAL_HEADER
    while cursor < len(raw):
        (size,) = struct.unpack_from("!i", raw, cursor)
        if size < 0:
            raise ValueError(f"a snappy block of {size} bytes")
        block = raw[cursor + 4 : cursor + 4 + size]
        total += cramjam.snappy.decompress_raw_len(block)
        if total > limit:
            raise _refuse("snappy", data, limit)
        blocks.append(block)
        cursor += 4 + size
    return b"".join(_raw_snappy(b, limit, data, limit) for b in blocks)


#: the bounded decoder of each name the client decodes with
DECODERS: dict[str, Callable[..., bytes]] = {
    "gzip_decode": gzip_decode,
    "lz4_decode": lz4_decode,
    "snappy_decode": snappy_decode,
    "zstd_decode": zstd_decode,
}
