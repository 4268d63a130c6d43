"""The team view's numbers, from the desk's backlog and lease book.

>>> from service.desk.backlog import DeskQueue
>>> from service.desk.leases import LeaseBook
>>> stats = team_stats(DeskQueue(clock=lambda: 0.0), LeaseBook(lease_seconds=120.0), ["m"],
...                     now=0.0)
>>> stats.models[0].open, stats.people
(0, [])
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from service.desk.backlog import DeskQueue
from service.desk.leases import LeaseBook

__all__ = ["ModelRow", "PersonRow", "TeamStats", "team_stats"]


@dataclass(frozen=True, slots=True)
class ModelRow:
    model: str
    open: int
    oldest_age: float | None
    answers_last_hour: int
    expired_last_hour: int
    held: int
    depth: tuple[float, ...] = ()  # open requests at the end of each bucket (charts.py)
    answered: tuple[float, ...] = ()  # answers in each bucket


@dataclass(frozen=True, slots=True)
class PersonRow:
    person: str
    answers_last_hour: int
    answers_last_day: int
    median_answer_seconds: float | None


@dataclass(frozen=True, slots=True)
class TeamStats:
    models: list[ModelRow]
    people: list[PersonRow]
    answers_last_hour: int


def team_stats(
    queue: DeskQueue, leases: LeaseBook, models: Iterable[str], *, now: float
) -> TeamStats:
    """Per model and per person (answers seen on the labels topic: the desk's and others').

    Reads counts the queue keeps as records arrive: the cost grows with the number of
    models, people and requests held right now, never with the open requests or the
    answers of the day (the desk still computes this once a second and serves that)."""
    open_, oldest = queue.open_counts(now=now), queue.oldest_age(now=now)
    expired = queue.expired_last_hour(now=now)
    answers = queue.answer_counts(now=now)
    held: Counter[str] = Counter()
    for rid, _ in leases.live(now):
        request = queue.requests.get(rid)
        if request is not None:
            held[request.model] += 1
    rows = [
        ModelRow(
            m,
            open_[m],
            oldest.get(m),
            answers.hour_by_model[m],
            expired[m],
            held[m],
            *map(tuple, queue.charts(m, now=now)),
        )
        for m in models
    ]
    people = [
        PersonRow(p, answers.hour_by_person[p], n, answers.median_seconds.get(p))
        for p, n in sorted(answers.day_by_person.items())
    ]
    return TeamStats(rows, people, answers.hour_total)
