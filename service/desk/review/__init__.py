"""Answers after they are given (docs/operate/desk.md, "Undo, second opinions and review"):

- :mod:`.item`: one answered request and what happened to it since;
- :mod:`.rules`: the rules of corrections, second opinions and requests for review (the
  learner's and the desk's), as checks that refuse with a reason;
- :mod:`.book`: the fold of the labels and leases topics into answers, the queues of second
  opinions and reviews, and the tallies of agreement;
- :mod:`.actions`: undo, change, ask for review, a reviewer's decision (behind two ports);
  :mod:`.opinions`: second opinions offered, held and answered;
- :mod:`.stats`: the team view's agreement numbers; :mod:`.views`, :mod:`.pages`: what
  people see.
"""

from service.desk.review.actions import LabelsLog, Offered, Review
from service.desk.review.book import ReviewBook
from service.desk.review.item import Item, Step
from service.desk.review.opinions import Opinions

__all__ = ["Item", "LabelsLog", "Offered", "Opinions", "Review", "ReviewBook", "Step"]
