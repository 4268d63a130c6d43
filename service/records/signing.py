"""Signed model snapshots: an HMAC-SHA256 over the record's key and value, in a header.

The learner signs every snapshot it publishes on the models topic with the configured key
(``snapshot_key``); every worker checks the signature before it serves a snapshot and
refuses one that is unsigned or does not verify. The value (the model version, in its
packed form or as JSON) is unchanged: the signature rides in a header.

Header ``abstain-signature``: ``v1:<key id>:<hex digest>``, where the key id is the first 16
hex digits of SHA-256 of the key (it names the key without revealing it) and the digest is
HMAC-SHA256(key, record key + NUL + record value). Binding the record key stops a snapshot
of one model from being replayed as another's.

Rotation: a verifier holds the current key and, during a rotation, the previous one
(``snapshot_key_previous``); the signer uses the current key only. The learner re-signs its
models' newest snapshots when it starts and periodically, so once every worker runs with the
new key (and the old one as previous) and one re-sign period has passed, the previous key can
be dropped.

>>> signer = Signer(b"k" * 32)
>>> header = signer.sign(b"m", b'{"version": 1}')
>>> signer.verify(b"m", b'{"version": 1}', header) is None
True
>>> signer.verify(b"other", b'{"version": 1}', header)
'bad_signature'
>>> Signer(b"z" * 32).verify(b"m", b'{"version": 1}', header)
'bad_signature'
>>> signer.verify(b"m", b'{"version": 1}', None)
'unsigned'
>>> rotated = Signer(b"n" * 32, previous=[b"k" * 32])
>>> rotated.verify(b"m", b'{"version": 1}', header), rotated.is_current(header)
(None, False)

**Moments.** A scorer signs the moments a label request carries with the same key, over
:func:`moments_message` (the model, the request id, the count, means and squared
deviations), so that the learner merges only moments a worker gathered:

>>> signed = signer.sign(*moments_message("m", "r1", 2, [1.0], [0.5])).decode()
>>> signer.verify(*moments_message("m", "r1", 2, [1.0], [0.5]), signed.encode())
>>> signer.verify(*moments_message("m", "r1", 2, [9.0], [0.5]), signed.encode())
'bad_signature'
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import Final

import orjson

__all__ = ["SIGNATURE_HEADER", "Signer", "key_id", "moments_message", "signer_of"]

SIGNATURE_HEADER: Final = "abstain-signature"
_VERSION: Final = "v1"


def key_id(key: bytes) -> str:
    """A short public name of ``key`` (first 16 hex digits of its SHA-256)."""
    return hashlib.sha256(key).hexdigest()[:16]


def signer_of(key: str | None, previous: str | None = None) -> Signer | None:
    """The signer of ``key`` that also verifies with ``previous``; None without a key."""
    if key is None:
        return None
    return Signer(key.encode(), [] if previous is None else [previous.encode()])


def moments_message(
    model: str, request_id: str, count: int, mean: Sequence[float], m2: Sequence[float]
) -> tuple[bytes, bytes]:
    """The (record key, value) a moments signature covers: the model, and the request id
    with the moments as orjson writes ``[count, mean, m2]`` (floats: a record read back
    gives the same bytes)."""
    numbers = [int(count), [float(v) for v in mean], [float(v) for v in m2]]
    return model.encode(), request_id.encode() + b"\x00" + orjson.dumps(numbers)


def _digest(key: bytes, record_key: bytes, value: bytes) -> str:
    return hmac.new(key, record_key + b"\x00" + value, hashlib.sha256).hexdigest()


class Signer:
    """Signs with ``key``; verifies with ``key`` or any of ``previous``."""

    def __init__(self, key: bytes, previous: Iterable[bytes] = ()) -> None:
        self._key = key
        self.key_id = key_id(key)
        self._keys = {self.key_id: key, **{key_id(k): k for k in previous}}

    def sign(self, record_key: bytes, value: bytes) -> bytes:
        """The header value for a record."""
        return f"{_VERSION}:{self.key_id}:{_digest(self._key, record_key, value)}".encode()

    def verify(self, record_key: bytes, value: bytes, header: bytes | None) -> str | None:
        """None if ``header`` is a valid signature of the record by a known key, else the
        reason: ``unsigned`` (no header) or ``bad_signature``."""
        if header is None:
            return "unsigned"
        try:
            version, kid, digest = header.decode("ascii").split(":")
        except (UnicodeDecodeError, ValueError):
            return "bad_signature"
        key = self._keys.get(kid)
        if version != _VERSION or key is None:
            return "bad_signature"
        ok = hmac.compare_digest(digest, _digest(key, record_key, value))
        return None if ok else "bad_signature"

    def is_current(self, header: bytes | None) -> bool:
        """True if ``header`` names the current key (a record signed with a previous one is
        written again signed with the current key by whoever keeps it)."""
        return header is not None and header.startswith(f"{_VERSION}:{self.key_id}:".encode())
