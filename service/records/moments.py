"""Whether the moments a label request carries are a worker's (pure).

With ``snapshot_key`` every scorer signs the moments it attaches to a label request
(:func:`~service.records.signing.moments_message`: the model, the request id, the count,
means and squared deviations). The learner's verdict on a request's moments
(:func:`moments_trust`) travels with the request through
:func:`~service.stream.labels.protocol.apply_label`, ``teach``, the shadows, ``abstain
rebuild`` and a correction's re-derivation, so the same record is judged the same way
everywhere:

- ``"trusted"`` (a valid signature by the current or the previous key): merged as a worker's
  own, unjudged (:meth:`~service.learning.OnlineStandardizer.merge` with ``trusted``), so an
  honest abrupt change is followed at once;
- ``"unsigned"`` or ``"bad_signature"``: refused outright (the label is applied without
  them, the request dead-lettered with reason ``moments``);
- None (no key, or no moments): the plausibility gate judges them
  (:meth:`~service.learning.Pipeline.moments_refusal`).

>>> import dataclasses
>>> from service.records.signing import Signer
>>> from service.records.wire import FeatureMoments, LabelRequest
>>> signer = Signer(b"k" * 32)
>>> request = LabelRequest("r1", "e1", "m", [1.0], 0.0, 1.0, 1, 0.5, 0, 0.0, 1.0, 0.5)
>>> moments_trust(signer, request) is None  # no moments
True
>>> unsigned = FeatureMoments(2, (1.0,), (0.5,))
>>> moments_trust(signer, dataclasses.replace(request, moments=unsigned))
'unsigned'
>>> moments_trust(None, dataclasses.replace(request, moments=unsigned)) is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .signing import Signer, moments_message
from .wire import LabelRequest

__all__ = ["MomentsTrust", "Untrusted", "moments_trust", "untrusted"]

#: the learner's verdict on a request's moments (module docstring)
MomentsTrust = Literal["trusted", "unsigned", "bad_signature"]


@dataclass(frozen=True, slots=True)
class Untrusted:
    """Why moments were refused without being judged: ``kind`` ``"unsigned"`` or
    ``"bad_signature"`` (a label value of ``abstain_moments_refused_total``) and a
    ``detail`` for the dead letter."""

    kind: Literal["unsigned", "bad_signature"]
    detail: str


def moments_trust(signer: Signer | None, request: LabelRequest) -> MomentsTrust | None:
    """The verdict on ``request``'s moments with ``signer`` (module docstring)."""
    m = request.moments
    if signer is None or m is None:
        return None
    header = None if m.signature is None else m.signature.encode()
    signed = moments_message(request.model, request.request_id, m.count, m.mean, m.m2)
    why = signer.verify(*signed, header)
    if why is None:
        return "trusted"
    return "unsigned" if why == "unsigned" else "bad_signature"


def untrusted(trust: MomentsTrust | None) -> Untrusted | None:
    """Why moments with verdict ``trust`` are refused outright (None: they are not)."""
    if trust == "unsigned":
        return Untrusted("unsigned", "moments unsigned: a worker signs the moments it gathers")
    if trust == "bad_signature":
        return Untrusted("bad_signature", "moments bad signature: not signed by a worker's key")
    return None
