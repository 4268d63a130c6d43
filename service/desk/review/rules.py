"""The rules of corrections, second opinions and requests for review, as pure checks that
raise :class:`~service.desk.errors.Refused` (an HTTP status, a stable code, the reason).

The same checks serve twice: the desk's fold of the topics refuses a record that breaks
them (a forged correction, opinion or flag: skipped and counted, as the learner refuses
it), and the desk refuses a person's action up front, writing nothing. The learner's rules
for a correction (``service.records.labels``): a request nobody answered
(``unknown_request``, ``not_answered``), an author's correction by someone else or after a
reviewer decided (``not_author``), a label the model can no longer reach
(``beyond_reach``: :func:`beyond_reach`). The desk adds its own for people: the grace
period of an author (``grace_over``), the reviewer role (``not_reviewer``), never one's own
answer twice (``own_answer``), nothing that changes nothing (``unchanged``).

>>> from service.desk.review.item import Item
>>> item = Item("r1", "m", "ann", 1, at=100.0, partition=0, offset=7)
>>> check_author(item, "bob")
Traceback (most recent call last):
...
service.desk.errors.Refused: this is someone else's answer: only they, within the grace period, or a reviewer can correct it
>>> check_opinion(item, "ann")
Traceback (most recent call last):
...
service.desk.errors.Refused: you gave the first answer to this request: a second opinion comes from someone else
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from service.desk.errors import Refused
from service.desk.review.item import Item

__all__ = [
    "Envelope",
    "beyond_reach",
    "check_author",
    "check_flag",
    "check_opinion",
    "check_reviewer",
    "missing",
]


class Envelope(Protocol):
    """What :func:`beyond_reach` reads of a model snapshot (``records.ModelEnvelope``)."""

    @property
    def labels_partition(self) -> int: ...
    @property
    def labels_offset(self) -> int: ...
    @property
    def corrections_from(self) -> int: ...


def beyond_reach(envelopes: Iterable[Envelope], partition: int, offset: int) -> bool:
    """True when some snapshot of the label's group has learned the label at ``offset`` of
    labels ``partition`` and can no longer correct it: its ``corrections_from`` is -1
    (none) or after the label. A snapshot that has not learned the label yet can: the
    learner applies it first, then the correction (the same partition, later).

    >>> from service.records import ModelEnvelope
    >>> env = ModelEnvelope("m", 3, {}, {}, labels_offset=9, labels_partition=0,
    ...                     corrections_from=5)
    >>> beyond_reach([env], 0, 4), beyond_reach([env], 0, 5), beyond_reach([env], 0, 10)
    (True, False, False)
    >>> beyond_reach([env.replace(corrections_from=-1)], 0, 7)  # it keeps no history
    True
    """
    for env in envelopes:
        if env.labels_partition < 0:
            continue  # it has learned no label yet
        if env.labels_partition != partition:
            return True  # the group's labels moved to another partition since
        if env.labels_offset < offset:
            continue  # not learned yet
        if env.corrections_from < 0 or offset < env.corrections_from:
            return True
    return False


def missing(request_id: str, *, open_now: bool) -> Refused:
    """The refusal for a request the desk has no answer of: open (``not_answered``) or
    unknown (``unknown_request``, also one whose answer is older than the desk keeps)."""
    if open_now:
        return Refused(
            409,
            "not_answered",
            "this request has not been answered yet: there is nothing to correct",
        )
    return Refused(
        404,
        "unknown_request",
        f"no answer to request {request_id[:12]!r} that "
        "the desk knows of (unknown, or older than it keeps)",
    )


def check_author(item: Item, by: str) -> None:
    """An author's correction (the learner's rule): ``by`` gave the label, and no reviewer
    has decided it yet."""
    if by != item.by or not by:
        raise Refused(
            403,
            "not_author",
            "this is someone else's answer: only they, within "
            "the grace period, or a reviewer can correct it",
        )
    if item.decision is not None:
        raise Refused(409, "not_author", "a reviewer has decided this answer: it is final")


def check_reviewer(item: Item, by: str, *, reviewer: bool) -> None:
    """A reviewer's decision at the desk: the role, and never an answer ``by`` gave (the
    label or its second opinion)."""
    if not reviewer:
        raise Refused(
            403,
            "not_reviewer",
            "only reviewers decide others' answers "
            "(desk.reviewers, or reviewer = true in the users file)",
        )
    if by in (item.by, item.opinion_by):
        raise Refused(
            403, "own_answer", "you answered this request yourself: another reviewer decides it"
        )


def check_opinion(item: Item, by: str) -> None:
    """A second opinion: by someone else than the author, once, on a label that stands and
    was chosen for one, before a reviewer decided."""
    if by == item.by:
        raise Refused(
            403,
            "own_answer",
            "you gave the first answer to this request: a second opinion comes from someone else",
        )
    if item.opinion is not None:
        raise Refused(409, "already_opinion", "this answer already has a second opinion")
    if item.current is None:
        raise Refused(409, "withdrawn", "this answer was withdrawn: there is nothing to check")
    if item.decision is not None:
        raise Refused(409, "reviewed", "a reviewer has decided this answer")
    if item.request is not None and item.ask is None:
        raise Refused(409, "not_asked", "this answer is not one the desk asks a second opinion on")


def check_flag(item: Item, by: str) -> None:
    """A request for review: by the author, of a label that stands, not decided yet."""
    if by != item.by:
        raise Refused(
            403, "not_author", "only the person who answered can ask for a review of their answer"
        )
    if item.current is None:
        raise Refused(409, "withdrawn", "this answer was withdrawn: there is nothing to review")
    if item.decision is not None:
        raise Refused(409, "reviewed", "a reviewer has decided this answer")
