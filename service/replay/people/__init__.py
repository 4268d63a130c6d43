"""The replay with people: labellers who err, second opinions, a reviewer, undo.

Issue 23 ("Labels you can trust") asks what review buys a team. This package answers it
offline: the stack a stream worker runs for one model, in memory, labelled by simulated
people, so "replay runs exactly the stack the service runs" holds for the labels too.

* :mod:`.team` — :class:`People` (the labellers' error rates, the desk's second-opinion
  rule, a reviewer, authors' undo) and :class:`Draws` (every random number they use, per
  trial: common to every arm of a run);
* :mod:`.learner` — :class:`MemoryService`: the scorer's budgeted decision and the
  learner's ``LabelJoiner`` (history and corrections included) over in-memory tables;
* :mod:`.desk` — :class:`Desk`: the label desk's records (labels, second opinions by
  :func:`service.stream.labels.review.second_opinion`, reviewers' and authors'
  corrections) and the people's work;
* :mod:`.simulate` — :func:`simulate`: one run, events in order;
* :mod:`.report` — one run's measures and the table over runs.

The benchmark that uses it is ``loadtest/people.py`` (``docs/results/replay/people.md``).
"""

from service.replay.people.desk import Desk, Work
from service.replay.people.learner import MODEL, MemoryService
from service.replay.people.report import cell, measures, table
from service.replay.people.simulate import PeopleRun, simulate
from service.replay.people.team import Draws, People

__all__ = [
    "MODEL",
    "Desk",
    "Draws",
    "MemoryService",
    "People",
    "PeopleRun",
    "Work",
    "cell",
    "measures",
    "simulate",
    "table",
]
