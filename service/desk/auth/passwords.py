r"""Salted password hashes with the standard library's scrypt.

A hash is one string, ``scrypt$<n>$<r>$<p>$<salt>$<digest>`` (salt and digest in URL-safe
base64), so a users file needs nothing else. Verification costs the same whether or not the
user exists (:func:`verify` with ``None`` checks against a dummy hash).

>>> h = hash_password("correct horse", n=2**10)
>>> h.startswith("scrypt$1024$8$1$")
True
>>> verify("correct horse", h), verify("wrong", h)
(True, False)

A users file may only hold hashes as costly as the default or more, within bounds
(:func:`cost_problem`): a weak hash is refused when the desk starts, and so is one so costly
that every login attempt would tie up the desk:

>>> cost_problem(h)
'scrypt n=1024, r=8 takes 1 MiB: at least 16 MiB (n=16384, r=8)'
>>> cost_problem(hash_password("x", n=DEFAULT_N)) is None
True

Checks are slow on purpose (~50 ms): the desk runs them off its event loop
(:mod:`service.desk.auth.logins`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Final

__all__ = ["DEFAULT_N", "cost_problem", "hash_password", "verify", "well_formed"]

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
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, maxmem=_MAXMEM, dklen=_LEN
    )


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


_MIN_WORK: Final = DEFAULT_N * _R  # 128 * n * r bytes of memory: 16 MiB
_MAX_MEMORY_WORK: Final = _MAXMEM // 128  # n * r within the memory bound (64 MiB)
_MAX_WORK: Final = 4 * DEFAULT_N * _R * _P  # n * r * p: at most four default checks


def cost_problem(encoded: str) -> str | None:
    """Why the well-formed hash ``encoded`` may not be used by the desk (too weak, or so
    costly that a login would take memory or time from everybody); None if it may."""
    _, n_, r_, p_, _, _ = encoded.split("$")
    n, r, p = int(n_), int(r_), int(p_)
    mib = 128 * n * r // 2**20
    if n * r < _MIN_WORK:
        least = f"at least 16 MiB (n={DEFAULT_N}, r={_R})"
        return f"scrypt n={n}, r={r} takes {max(1, mib)} MiB: {least}"
    if n * r > _MAX_MEMORY_WORK:
        return f"scrypt n={n}, r={r} takes {mib} MiB: at most {_MAXMEM // 2**20} MiB"
    if n * r * p > _MAX_WORK:
        return f"scrypt n={n}, r={r}, p={p} costs more than four default checks"
    return None


_DUMMY: Final = f"scrypt${DEFAULT_N}${_R}${_P}${_b64(b'0' * 16)}${_b64(b'0' * _LEN)}"


def verify(password: str, encoded: str | None) -> bool:
    """True if ``password`` matches ``encoded``; ``None`` (no such user) costs the same and
    is False."""
    target = encoded if encoded is not None and well_formed(encoded) else _DUMMY
    _, n, r, p, salt, digest = target.split("$")
    got = _derive(password, _unb64(salt), int(n), int(r), int(p))
    return hmac.compare_digest(got, _unb64(digest)) and target is encoded
