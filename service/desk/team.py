"""The team view's numbers, from the desk's backlog and lease book.

>>> from service.desk.backlog import DeskQueue
>>> from service.desk.leases import LeaseBook
>>> stats = team_stats(DeskQueue(clock=lambda: 0.0), LeaseBook(), ["m"], now=0.0)
>>> stats.models[0].open, stats.people
(0, [])
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from service.desk.backlog import DeskQueue
from service.desk.leases import LeaseBook

__all__ = ["ModelRow", "PersonRow", "TeamStats", "team_stats"]

HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class ModelRow:
    model: str
    open: int
    oldest_age: float | None
    answers_last_hour: int
    expired_last_hour: int
    held: int


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


def team_stats(queue: DeskQueue, leases: LeaseBook, models: Iterable[str], *, now: float
               ) -> TeamStats:  # fmt: skip
    """Per model and per person (answers seen on the labels topic: the desk's and others')."""
    open_, oldest = queue.open_counts(now=now), queue.oldest_age(now=now)
    expired = queue.expired_last_hour(now=now)
    hour = [a for a in queue.answers if a.at > now - HOUR]
    per_model_hour = Counter(a.model for a in hour)
    held: Counter[str] = Counter()
    for rid, lease in leases.leases.items():
        request = queue.requests.get(rid)
        if request is not None and lease.live(now):
            held[request.model] += 1
    rows = [ModelRow(m, open_[m], oldest.get(m), per_model_hour[m], expired[m], held[m])
            for m in models]  # fmt: skip
    day: dict[str, list[float]] = defaultdict(list)
    last_hour: Counter[str] = Counter()
    times: dict[str, list[float]] = defaultdict(list)
    for a in queue.answers:
        if not a.by:
            continue
        day[a.by].append(a.at)
        if a.at > now - HOUR:
            last_hour[a.by] += 1
        timing = leases.answers.get(a.request_id)
        if timing is not None and timing.holder == a.by:
            times[a.by].append(timing.seconds)
    people = [PersonRow(p, last_hour[p], len(day[p]),
                        statistics.median(times[p]) if times[p] else None)
              for p in sorted(day)]  # fmt: skip
    return TeamStats(rows, people, len(hour))
