"""The deterministic ids and coins that make replays repeatable.

- ``request_id = blake2b(model, event id)``: re-scoring an event after a crash asks for the
  same label again, never a second one; the learner and the label desk check a request's id
  against it.
- DSAL's query coin and the audit coin are uniforms drawn from a hash of (model, event id,
  model version): a replayed event makes the same choice.

:func:`coins` and :func:`request_ids` give a batch's coins and ids together: the very values
:func:`coin` and :func:`request_id` give event by event (the text hashed is the same bytes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

__all__ = ["coin", "coins", "request_id", "request_ids"]

_SHIFT = np.uint64(11)
_SCALE = float(1 << 53)


def request_id(model: str, event_id: str) -> str:
    """Deterministic label-request id for (model, event id).

    >>> request_id("m", "e1") == request_id("m", "e1") != request_id("m", "e2")
    True
    >>> len(request_id("m", "e1"))
    32
    """
    return hashlib.blake2b(f"{model}\x1f{event_id}".encode(), digest_size=16).hexdigest()


def request_ids(model: str, event_ids: Sequence[str]) -> list[str]:
    """:func:`request_id` of every event of ``event_ids`` for ``model``.

    >>> request_ids("m", ["e1", "é"]) == [request_id("m", "e1"), request_id("m", "é")]
    True
    """
    hasher = hashlib.blake2b(f"{model}\x1f".encode(), digest_size=16)
    out = []
    for event_id in event_ids:
        h = hasher.copy()
        h.update(event_id.encode())
        out.append(h.hexdigest())
    return out


def coin(model: str, event_id: str, version: int, purpose: str = "query") -> float:
    """A uniform number in [0, 1) drawn from a hash: the same inputs give the same coin.

    >>> 0.0 <= coin("m", "e1", 0) < 1.0
    True
    >>> coin("m", "e1", 0) == coin("m", "e1", 0) != coin("m", "e1", 1)
    True
    """
    digest = hashlib.blake2b(
        f"{purpose}\x1f{model}\x1f{event_id}\x1f{version}".encode(), digest_size=8
    ).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)


def coins(model: str, event_ids: Sequence[str], version: int, purpose: str = "query") -> np.ndarray:
    """:func:`coin` of every event of ``event_ids`` (one hash each, one conversion for all).

    >>> ids = ["e1", "e2", "é"]
    >>> coins("m", ids, 3).tolist() == [coin("m", e, 3) for e in ids]
    True
    >>> coins("m", [], 0).shape
    (0,)
    """
    head, tail = f"{purpose}\x1f{model}\x1f".encode(), f"\x1f{version}".encode()
    blake2b = hashlib.blake2b
    digests = b"".join(
        [blake2b(head + event_id.encode() + tail, digest_size=8).digest() for event_id in event_ids]
    )
    words = np.frombuffer(digests, dtype=">u8").astype(np.uint64)
    return (words >> _SHIFT).astype(np.float64) / _SCALE
