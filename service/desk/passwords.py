r"""Salted password hashes with the standard library's scrypt.

A hash is one string, ``scrypt$<n>$<r>$<p>$<salt>$<digest>`` (salt and digest in URL-safe
base64), so a users file needs nothing else. Verification costs the same whether or not the
user exists (:func:`verify` with ``None`` checks against a dummy hash).

>>> h = hash_password("correct horse", n=2**10)
>>> h.startswith("scrypt$1024$8$1$")
True
>>> verify("correct horse", h), verify("wrong", h)
(True, False)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Final

__all__ = ["DEFAULT_N", "hash_password", "verify", "well_formed"]

#: scrypt cost: 2**14 x 8 x 1 takes 16 MiB and ~50 ms per check
DEFAULT_N: Final = 2**14
_R: Final = 8
_P: Final = 1
_LEN: Final = 32
_MAXMEM: Final = 64 * 1024 * 1024


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _derive(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM,
                          dklen=_LEN)  # fmt: skip


def hash_password(password: str, *, n: int = DEFAULT_N) -> str:
    """A new salted hash of ``password``."""
    if not password:
        raise ValueError("the password is empty")
    salt = secrets.token_bytes(16)
    return f"scrypt${n}${_R}${_P}${_b64(salt)}${_b64(_derive(password, salt, n, _R, _P))}"


def well_formed(encoded: str) -> bool:
    """True if ``encoded`` looks like a hash made by :func:`hash_password`.

    >>> well_formed("scrypt$16384$8$1$c2FsdA$ZGlnZXN0"), well_formed("plain-text")
    (True, False)
    """
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        return False
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        _unb64(parts[4]), _unb64(parts[5])
    except ValueError:
        return False
    return n > 1 and n & (n - 1) == 0 and n <= 2**20 and 1 <= r <= 32 and 1 <= p <= 16


_DUMMY: Final = f"scrypt${DEFAULT_N}${_R}${_P}${_b64(b'0' * 16)}${_b64(b'0' * _LEN)}"


def verify(password: str, encoded: str | None) -> bool:
    """True if ``password`` matches ``encoded``; ``None`` (no such user) costs the same and
    is False."""
    target = encoded if encoded is not None and well_formed(encoded) else _DUMMY
    _, n, r, p, salt, digest = target.split("$")
    got = _derive(password, _unb64(salt), int(n), int(r), int(p))
    return hmac.compare_digest(got, _unb64(digest)) and target is encoded
