"""The label desk of a replay: answers, second opinions, a reviewer and undo, as records.

:class:`Desk` plays the people of one run (:class:`~service.replay.people.team.People`,
with the run's :class:`~service.replay.people.team.Draws`) and says what they write to the
labels topic, in the order the desk writes it:

* :meth:`Desk.answer`: the first answer to a label request, a
  :class:`~service.records.Label` by the trial's first labeller, wrong with their rate;
* :meth:`Desk.check`: right after it, when the desk's rule asks for a second opinion
  (:func:`service.stream.labels.review.second_opinion`, the function the label desk calls,
  with the deployment's ``max_importance_weight``), an :class:`~service.records.Opinion`
  by the trial's second labeller (never the first); a disagreement goes to the reviewer,
  whose :class:`~service.records.Correction` (role ``reviewer``: their answer, equal to the
  label as it stands for a confirmation) is due ``review_delay`` labels later. An author
  who notices their own wrong answer (a share ``undo`` of them) changes it with a
  correction (role ``author``) due ``undo_delay`` labels later;
* :meth:`Desk.due`: the corrections due once the model has learned so many labels (all
  that remain, at the end of the run); :meth:`Desk.landed` is told whether the learner took
  each one, so the desk knows the label in force of every request.

The tallies (:class:`Work`) count the people's work and what it found.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field

from service.records import Correction, Label, LabelRequest, Opinion
from service.records.labels import Role
from service.replay.people.team import REVIEWER, Draws, People, labeller
from service.stream.labels.review import second_opinion

__all__ = ["Desk", "Work"]


@dataclass
class Work:
    """What the people of one run did and found (counts)."""

    labels: int = 0  # first answers: the labels the model asked for
    wrong: int = 0  # first answers that were wrong
    opinions: Counter[str] = field(default_factory=Counter)  # second opinions, by reason
    disagreements: int = 0  # second opinions that differed from the first answer
    reviews: int = 0  # reviewer decisions sent (confirmations and changes)
    undos: int = 0  # authors' changes of their own answers sent
    refused: int = 0  # corrections the learner refused (beyond its reach, say)
    late: int = 0  # corrections sent after the last event (no decision could use them)

    @property
    def second_opinions(self) -> int:
        return sum(self.opinions.values())


@dataclass(order=True)
class _Due:
    at: int  # labels learned when it lands
    seq: int  # the order it was filed in
    request_id: str = field(compare=False)
    label: int = field(compare=False)
    by: str = field(compare=False)
    role: Role = field(compare=False)


class Desk:
    """The people of one run at the label desk (module docstring)."""

    def __init__(self, people: People, draws: Draws, *, model: str, max_weight: float) -> None:
        self.people, self.draws, self.model = people, draws, model
        self.max_weight = max_weight
        self.work = Work()
        self._queue: list[_Due] = []
        self._filed = 0
        self._truth: dict[str, int] = {}
        self.in_force: dict[str, int] = {}  # request id -> the label the model learns now

    def _says(self, coin: float, rate: float, truth: int) -> int:
        return -truth if coin < rate else truth

    def answer(self, t: int, request: LabelRequest, truth: int, *, now: float) -> Label:
        """The first answer to ``request`` (trial ``t``, true label ``truth``)."""
        person = int(self.draws.first[t])
        label = self._says(float(self.draws.answer[t]), self.people.rates[person], truth)
        rid = request.request_id
        self._truth[rid], self.in_force[rid] = truth, label
        self.work.labels += 1
        self.work.wrong += int(label != truth)
        return Label(rid, self.model, label, labeller(person), now)

    def check(self, t: int, request: LabelRequest, first: Label, *, now: float) -> list[Opinion]:
        """What follows the first answer ``first`` at once: a second opinion if the rule asks
        for one; the reviewer's and the author's corrections are filed (:meth:`due`)."""
        rid, truth, labels = request.request_id, self._truth[request.request_id], self.work.labels
        people, draws = self.people, self.draws
        if first.label != truth and people.undo and float(draws.undo[t]) < people.undo:
            self._file(labels + people.undo_delay, rid, truth, first.labelled_by, "author")
        rule = people.second_opinions
        if rule is None or not people.reviewed:
            return []
        reason = second_opinion(request, first.label, rule, max_weight=self.max_weight)
        if reason is None:
            return []
        self.work.opinions[reason] += 1
        person = int(draws.second[t])
        opinion = self._says(float(draws.opinion[t]), people.rates[person], truth)
        if opinion != first.label:
            self.work.disagreements += 1
            decided = self._says(float(draws.review[t]), people.reviewer_rate, truth)
            self._file(labels + people.review_delay, rid, decided, REVIEWER, "reviewer")
        return [Opinion(rid, self.model, opinion, labeller(person), now)]

    def _file(self, at: int, rid: str, label: int, by: str, role: Role) -> None:
        heapq.heappush(self._queue, _Due(at, self._filed, rid, label, by, role))
        self._filed += 1

    def due(self, labels: int | None, *, now: float) -> list[Correction]:
        """The corrections due once the model has learned ``labels`` labels, in the order
        they were filed (None: every one left, at the end of the run)."""
        out = []
        while self._queue and (labels is None or self._queue[0].at <= labels):
            d = heapq.heappop(self._queue)
            if d.role == "reviewer":
                self.work.reviews += 1
            else:
                self.work.undos += 1
            self.work.late += labels is None
            out.append(Correction(d.request_id, self.model, d.label, d.by, d.role, now))
        return out

    def landed(self, correction: Correction, *, taken: bool) -> None:
        """The learner took ``correction`` (``taken``) or refused it."""
        if not taken:
            self.work.refused += 1
        elif correction.label is not None:
            self.in_force[correction.request_id] = correction.label

    def wrong_in_force(self) -> int:
        """Labels the model learns from now that are wrong."""
        return sum(1 for rid, label in self.in_force.items() if label != self._truth[rid])
