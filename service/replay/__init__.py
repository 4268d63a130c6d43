"""Prequential replay of labelled datasets through :mod:`service.learning` (the paper's
experimental protocol), its figures, and the learners' micro-benchmarks.

* :mod:`.protocol` — trial plans (seeds, sampling) and the batched lockstep loop;
* :mod:`.options` — what a replay computes; routing of hyperparameters to learners;
* :mod:`.features` — the learners' inputs (online standardiser, intercept) per run;
* :mod:`.runner` — :func:`replay`: linear learners batched, the rest through
  :mod:`.sequential` (kernel learners, or the stream service's labelled-only standardiser);
* :mod:`.results` — what a replay measured; ``summary.json`` and the curves CSV;
* :mod:`.shadows` — ``replay --shadow``: a champion and shadow models on the same
  trials, the shadows learning from the champion's labels; :mod:`.shadow_results` — their
  estimated and true risk, coverage, ``shadow.json`` and ``shadow.csv``;
* :mod:`.plot` — the five-column figure, the kernel budget figure and the shadow figure
  (matplotlib, Agg);
* :mod:`.cli` — ``abstain replay``; :mod:`.bench` — ``abstain bench``.

Exception tree (dataset errors come from :class:`service.datasets.DatasetError`, learner
errors from :class:`service.learning.LearningError`; all three derive from
:class:`service.errors.AbstainError` and ``ValueError``)::

    AbstainError, ValueError
     └── ReplayError             anything raised on purpose by service.replay
          └── ReplayConfigError  an invalid option (algorithm, cost, runs, --param, ...)

>>> from service.replay import ReplayOptions
>>> ReplayOptions(costs=(0.5,))
Traceback (most recent call last):
...
service.replay.errors.ReplayConfigError: cost must be in (0, 0.5), got 0.5
"""

from service.replay.errors import ReplayConfigError, ReplayError
from service.replay.options import ReplayOptions
from service.replay.protocol import TrialPlan, plan_trials
from service.replay.results import ReplayResult, Series
from service.replay.runner import replay

__all__ = [
    "ReplayConfigError",
    "ReplayError",
    "ReplayOptions",
    "ReplayResult",
    "Series",
    "TrialPlan",
    "plan_trials",
    "replay",
]
