"""One answered request as the desk follows it: the label that answered it (the first, the
one the learner applies), the label as it stands after corrections, and what happened to
it: a withdrawal or a change by its author, a second opinion, a request for review, a
reviewer's decision.

>>> item = Item("r1", "m", "ann", 1, at=100.0, partition=0, offset=7)
>>> item.current, item.corrected, item.disputed
(1, False, False)
>>> item.opinion = Step("opinion", "bob", -1, 130.0); item.agrees = False
>>> item.disputed, item.opinion_by
(True, 'bob')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from service.records import LabelRequest

__all__ = ["Item", "Step", "StepKind"]

StepKind = Literal[
    "label",  # the first answer
    "withdrew",  # its author withdrew it (undo)
    "changed",  # its author gave the other answer
    "again",  # its author answered again after withdrawing
    "kept",  # its author confirmed the answer it had (nothing changed)
    "opinion",  # a second person's blind answer
    "flag",  # its author asked for a review
    "confirmed",  # a reviewer gave the answer it had (final)
    "corrected",  # a reviewer gave another answer, or withdrew it (final)
]


@dataclass(frozen=True, slots=True)
class Step:
    """One thing that happened to an answer: who, which answer (None: withdrawn), when."""

    kind: StepKind
    by: str
    label: int | None
    at: float


@dataclass(slots=True, eq=False)
class Item:
    """An answered request (module docstring). ``at`` is the label's time, ``partition``
    and ``offset`` where it is on the labels topic; ``request`` the label request once the
    desk read it (features, the model's decision); ``ask`` why a second opinion is asked
    (:func:`service.stream.labels.review.second_opinion`; None: not asked)."""

    request_id: str
    model: str
    by: str
    first: int
    at: float
    partition: int
    offset: int
    request: LabelRequest | None = None
    current: int | None = 0  # the label as it stands (None: withdrawn); 0 = first
    author_at: float = 0.0  # the author's last answer to it (the grace period runs from it)
    ask: str | None = None
    opinion: Step | None = None
    agrees: bool | None = None  # the second opinion agreed with the label it checked
    flag: Step | None = None
    decision: Step | None = None  # a reviewer's (final)
    confirmed: bool | None = None  # the decision kept the label it reviewed
    out_of_reach: bool = False  # the model can no longer correct it (it left the queues)
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.current == 0:
            self.current = self.first
        self.author_at = self.author_at or self.at
        if not self.steps:
            self.steps.append(Step("label", self.by, self.first, self.at))

    @property
    def corrected(self) -> bool:
        """The label stands otherwise than given: withdrawn, or the other answer."""
        return self.current != self.first

    @property
    def opinion_by(self) -> str:
        return self.opinion.by if self.opinion is not None else ""

    @property
    def disputed(self) -> bool:
        """Waiting for a reviewer: a second opinion disagreed, or its author asked, and no
        reviewer decided yet (a withdrawn label has nothing left to review)."""
        asked = self.agrees is False or self.flag is not None
        return asked and self.decision is None and self.current is not None
