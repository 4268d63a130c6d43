"""The learner's history of applied labels, and corrections re-derived from it.

- :mod:`.index`: :class:`History`, a group's steps and checkpoints over a table, indexed;
  what is read back is used only whole, and only once checked;
- :mod:`.derive`: :func:`rederive`, the labels applied again, and :func:`run_job`, the same
  over encoded records (what runs in the learner's derivation process);
- :mod:`.corrections`: a correction checked, noted, derived and finished (the learner and
  ``abstain rebuild`` alike);
- :mod:`.trust`: what a history read back must agree with (the labels topic; without a
  key, its own re-derivation);
- :mod:`.runner`: where derivations run (this process, or one of their own).

All of it is pure but :mod:`.runner`; the learner's shell around it is
:class:`~service.stream.labels.corrector.Corrector`.
"""

from service.stream.labels.history.corrections import (
    Kind,
    Noted,
    correction_refusal,
    finish,
    job,
    kind_of,
    note,
)
from service.stream.labels.history.derive import Derived, Job, Rederived, rederive, run_job
from service.stream.labels.history.index import History, Plan, checkpoint_key, step_key
from service.stream.labels.history.trust import refuted, same_state

__all__ = [
    "Derived",
    "History",
    "Job",
    "Kind",
    "Noted",
    "Plan",
    "Rederived",
    "checkpoint_key",
    "correction_refusal",
    "finish",
    "job",
    "kind_of",
    "note",
    "rederive",
    "refuted",
    "run_job",
    "same_state",
    "step_key",
]
