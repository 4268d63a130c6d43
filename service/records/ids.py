"""The deterministic ids and coins that make replays repeatable.

- ``request_id = blake2b(model, event id)``: re-scoring an event after a crash asks for the
  same label again, never a second one; the learner and the label desk check a request's id
  against it.
- DSAL's query coin and the audit coin are uniforms drawn from a hash of (model, event id,
  model version): a replayed event makes the same choice.
"""

from __future__ import annotations

import hashlib

__all__ = ["coin", "request_id"]


def request_id(model: str, event_id: str) -> str:
    """Deterministic label-request id for (model, event id).

    >>> request_id("m", "e1") == request_id("m", "e1") != request_id("m", "e2")
    True
    >>> len(request_id("m", "e1"))
    32
    """
    return hashlib.blake2b(f"{model}\x1f{event_id}".encode(), digest_size=16).hexdigest()


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
