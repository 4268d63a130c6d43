r"""Which answered label requests a second person is asked about (pure: no Kafka, no clock).

The label desk shows a request that was answered to a second person (never the first,
never with the first answer) when :func:`second_opinion` says why; the offline replay
uses the same function, so a replay of a label log asks about the same requests the desk
asked about. Three reasons, checked in this order (the first that holds is returned):

- ``contradicts``: the model decided (did not reject) with a margin, :math:`|f(x)| - \rho
  \ge` ``confident_margin``, and the answer says the opposite;
- ``weight``: the answer trains with a large importance weight, :math:`\min(1/p, W) \ge`
  ``min_weight`` (:func:`importance_weight`; :math:`W` is ``max_importance_weight``, the
  learner's cap, :math:`p` the request's query probability);
- ``share``: a hash coin of the request id (:func:`share_coin`) falls below ``share``:
  the same requests on every replica, after a restart and in a replay.

>>> from service.config import SecondOpinions
>>> from service.records import LabelRequest
>>> rule = SecondOpinions(share=0.0, min_weight=20.0, confident_margin=1.0)
>>> def req(score, decided, p):
...     return LabelRequest("r1", "e1", "m", [0.0], score, 1.0, decided, p, 0, 0.0, 60.0, 0.5)
>>> second_opinion(req(2.5, 1, 0.5), -1, rule, max_weight=100.0)  # |2.5| - 1 >= 1, and no
'contradicts'
>>> second_opinion(req(2.5, 1, 0.5), 1, rule, max_weight=100.0) is None  # it agrees
True
>>> second_opinion(req(0.2, 0, 0.04), 1, rule, max_weight=100.0)  # weight 25
'weight'
>>> second_opinion(req(0.2, 0, 0.04), 1, rule, max_weight=10.0) is None  # capped at 10
True
>>> second_opinion(req(0.2, 0, 0.5), 1, rule.model_copy(update={"share": 1.0}),
...                max_weight=100.0)
'share'
"""

from __future__ import annotations

import hashlib
from typing import Final, Literal

from service.config import SecondOpinions
from service.records import LabelRequest

__all__ = ["REASONS", "Reason", "contradicts", "importance_weight", "second_opinion", "share_coin"]

Reason = Literal["contradicts", "weight", "share"]
#: why a second opinion is asked, in the order they are checked
REASONS: Final[tuple[Reason, ...]] = ("contradicts", "weight", "share")


def share_coin(request_id: str) -> float:
    """A uniform number in [0, 1) drawn from a hash of the request id (its own purpose: it
    is independent of the query and audit coins).

    >>> share_coin("r1") == share_coin("r1") != share_coin("r2")
    True
    >>> 0.0 <= share_coin("r1") < 1.0
    True
    """
    digest = hashlib.blake2b(f"second-opinion\x1f{request_id}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / float(1 << 53)


def importance_weight(request: LabelRequest, *, max_weight: float) -> float:
    r"""The weight the answer trains with: :math:`1/\max(p, 1/W)`, as the learner applies it.

    >>> r = LabelRequest("r", "e", "m", [0.0], 0.0, 1.0, 0, 0.001, 0, 0.0, 1.0, 0.5)
    >>> importance_weight(r, max_weight=100.0)
    100.0
    """
    return 1.0 / max(request.query_probability, 1.0 / max_weight)


def contradicts(request: LabelRequest, label: int, *, margin: float) -> bool:
    r"""True when the model decided ``request`` (did not reject it) with
    :math:`|f(x)| - \rho \ge` ``margin`` and ``label`` is the other answer.

    >>> r = LabelRequest("r", "e", "m", [0.0], -3.0, 1.0, -1, 0.5, 0, 0.0, 1.0, 0.5)
    >>> contradicts(r, 1, margin=1.0), contradicts(r, 1, margin=2.5), contradicts(r, -1, margin=0)
    (True, False, False)
    """
    if request.decided_label == 0 or label == request.decided_label:
        return False
    return abs(request.score) - request.rho >= margin


def second_opinion(
    request: LabelRequest, label: int, rule: SecondOpinions, *, max_weight: float
) -> Reason | None:
    """Why answer ``label`` to ``request`` is shown to a second person, or None (module
    docstring; ``rule.enabled = false``: never). ``max_weight`` is the settings'
    ``max_importance_weight``."""
    if not rule.enabled:
        return None
    if contradicts(request, label, margin=rule.confident_margin):
        return "contradicts"
    if importance_weight(request, max_weight=max_weight) >= rule.min_weight:
        return "weight"
    if share_coin(request.request_id) < rule.share:
        return "share"
    return None
