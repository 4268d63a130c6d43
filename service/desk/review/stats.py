"""The team view's agreement numbers, from the tallies the book of answers keeps as records
arrive (:class:`~.book.ReviewBook`): computed once a second, in time that grows with the
number of people and models, never with the answers.

>>> from service.config import load_settings
>>> from service.desk.review.book import ReviewBook
>>> stats = review_stats(ReviewBook(load_settings(), clock=lambda: 0.0), ["default"])
>>> stats.models[0].labels, stats.models[0].corrected_share, stats.people
(0, None, [])
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from service.desk.review.book import PersonTally, ReviewBook

__all__ = ["ModelReview", "PersonReview", "ReviewStats", "review_stats"]


@dataclass(frozen=True, slots=True)
class PersonReview:
    """One person over the last two days: answers, second opinions given, their answers
    checked by a second opinion (and agreed), reviewed (and confirmed)."""

    person: str
    answers: int
    opinions: int
    checked: int
    agreed: int
    reviewed: int
    confirmed: int


@dataclass(frozen=True, slots=True)
class ModelReview:
    """One model over the last two days: labels, labels later corrected, answers waiting
    for a second opinion and for a reviewer now."""

    model: str
    labels: int
    corrected: int
    opinions_open: int
    reviews_open: int

    @property
    def corrected_share(self) -> float | None:
        return self.corrected / self.labels if self.labels else None


@dataclass(frozen=True, slots=True)
class ReviewStats:
    people: list[PersonReview]
    models: list[ModelReview]


def _person(name: str, t: PersonTally) -> PersonReview:
    return PersonReview(name, t.answers, t.opinions, t.checked, t.agreed, t.reviewed, t.confirmed)


def review_stats(book: ReviewBook, models: Iterable[str]) -> ReviewStats:
    """Per person (who answered or gave a second opinion) and per model (``models``)."""
    opinions, reviews = book.open_counts()
    people = [_person(name, t) for name, t in sorted(book.people.items()) if not t.empty()]
    rows = []
    for model in models:
        tally = book.models.get(model)
        labels, corrected = (tally.labels, tally.corrected) if tally is not None else (0, 0)
        rows.append(
            ModelReview(model, labels, corrected, opinions.get(model, 0), reviews.get(model, 0))
        )
    return ReviewStats(people, rows)
