r"""The learner a model serves: any learner inside :class:`~.learner.Adaptive` by default,
with each of its parts turned on or off by the model's configuration.

:class:`Parts` names the parts (change detection, challengers, exploration, tracking steps);
:func:`serving_learner` builds version 0 of a model from its algorithm and
:func:`learner_for` rebuilds a model from its state record, *conformed* to the parts: a plain
learner's record (written before the wrapper existed) is wrapped, an adaptive record whose
parts differ from the configuration's is switched to them, and with ``parts=None`` a model
serves its bare learner (an adaptive record's champion). The stream worker (its scorer, its
label path, ``abstain rebuild``) and the replay call these same two functions, so a
configuration means the same stack in both.

>>> from service.learning import DSAL
>>> model = learner_for(DSAL(n_features=2, cost=0.25).to_state(), Parts())
>>> type(model).__name__, model.detector is not None, model.challengers
('Adaptive', True, ('mirror', 'fresh', 'tail'))
>>> quiet = learner_for(model.to_state(), Parts(detector=False, challengers=False))
>>> quiet.detector, quiet.challengers, quiet.after_floor
(None, (), 1.0)
>>> type(learner_for(model.to_state(), None)).__name__
'DSAL'
>>> model.champion.rho_eta_max, model.champion.intercept_eta_min   # the tracking steps
(0.2, 1.6666666666666667)
>>> learner_for(model.to_state(), Parts(steps=False)).champion.rho_eta_max is None
True

**Tracking steps** (``Parts.steps``, :func:`tracking_steps`). A double sigmoid learner
(DSAL, DSOL) serves with two bounds on its step (:mod:`service.learning.linear.learner`):

* $\rho$'s step is at most $0.2/\gamma^2$. $|\partial L_{ds}/\partial\rho| < \gamma/2$, so
  one label moves $\rho$ by less than $0.1/\gamma$, a tenth of the sigmoid's width. The
  default step $5/(\gamma^2(n+1))$ is below the cap from 24 features up (Phishing's 69:
  unchanged); on a few features it is near 1 and one label could move $\rho$ by a third of
  its size, so $\rho$ jitters, and after a shift of the boundary it grows with the first
  wrong labels (the model rejects the moved region) and shrinks slowly.
* The intercept (the last weight, when the inputs end with an
  :class:`~service.learning.preprocessing.Intercept`) keeps its first step $\eta_0$ while
  the other weights' step decays: a decaying step lets a stationary boundary settle, but
  after $t$ labels it moves the boundary ever more slowly; with standardised inputs the
  other weights hold the boundary's direction, the intercept its position, which a shift of
  a threshold or of the class balance moves.

``docs/results/replay/peers.md`` has the measurements behind both (SEA shift, label flip,
rotating hyperplane, Phishing and svmguide1 at three costs and four budgets).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from .. import state as st
from ..linear.dsal import DSAL
from ..registry import learner_from_state, make_learner
from ..risk.collapse import CollapseWatch
from .challengers import CHALLENGER_KINDS, PREVIOUS, Contest
from .learner import ADAPTIVE_FORMAT, Adaptive, default_detector

__all__ = [
    "RHO_STEP",
    "Parts",
    "is_adaptive_state",
    "learner_for",
    "serving_learner",
    "serving_state",
    "tracking_steps",
]

# the wrapper's defaults for the parts that can be turned off (Adaptive's own defaults)
_COLLAPSE_WINDOW = 50
_EXPLORE_FLOOR = 0.5
_AFTER_FLOOR = 1.0
_BOUNDS = ("rho_eta_max", "intercept_eta_min")

RHO_STEP: Final = 0.2
r"""The cap of $\rho$'s step is ``RHO_STEP / gamma**2`` (module docstring)."""


@dataclass(frozen=True, slots=True)
class Parts:
    r"""Which parts of :class:`~.learner.Adaptive` run.

    ``detector``: change detection (ADWIN on the champion's margin errors, and a collapse
    counted as a change); without it nothing starts the challengers or the exploration
    after a change. ``challengers``: the mirror, fresh and tail challengers started at a
    change, which may take over (a record written before a kind existed gets it).
    ``explore``: the uniform query floors (the first labels, and the labels after a
    change). ``steps``: the champion's tracking steps (module docstring). ``take_back``:
    after a takeover, the champion it replaced runs as the sole challenger for a while and
    takes the model back when the labels after prove the takeover wrong.
    ``intercept``: not a part but what the steps need to know, whether the inputs end with
    an intercept (the model's ``intercept`` setting; without one only $\rho$'s cap applies).
    """

    detector: bool = True
    challengers: bool = True
    explore: bool = True
    steps: bool = True
    intercept: bool = True
    take_back: bool = True


def tracking_steps(learner: Any, *, intercept: bool = True) -> dict[str, float]:
    """The step bounds :class:`Parts` ``steps`` gives ``learner``: for a double sigmoid
    linear learner (DSAL, DSOL) ``rho_eta_max`` and, with an intercept, ``intercept_eta_min``
    (its schedule's first step); nothing for any other learner.

    >>> tracking_steps(DSAL(n_features=4, cost=0.25, gamma=2.0))
    {'rho_eta_max': 0.05, 'intercept_eta_min': 0.25}
    >>> tracking_steps(DSAL(n_features=4, cost=0.25), intercept=False)
    {'rho_eta_max': 0.2}
    """
    if not isinstance(learner, DSAL):  # DSOL is one too
        return {}
    out = {"rho_eta_max": RHO_STEP / learner.gamma**2}
    if intercept:
        out["intercept_eta_min"] = float(learner.eta(0))
    return out


def is_adaptive_state(state: Any) -> bool:
    """Whether ``state`` is an :class:`~.learner.Adaptive` record (by its format)."""
    return isinstance(state, Mapping) and state.get("format") == ADAPTIVE_FORMAT


def serving_learner(
    algorithm: str,
    *,
    n_features: int,
    cost: float,
    seed: int,
    hyperparameters: Mapping[str, Any] | None = None,
    parts: Parts | None = None,
) -> Any:
    """Version 0 of a model: ``make_learner(algorithm, ...)``, inside an
    :class:`~.learner.Adaptive` with ``parts`` (``None``: the bare learner)."""
    learner = make_learner(
        algorithm, n_features=n_features, cost=cost, **{"seed": seed, **(hyperparameters or {})}
    )
    if parts is None:
        return learner
    return _wrap(learner, parts, seed=seed)


def learner_for(state: Any, parts: Parts | None, *, serving: bool = False) -> Any:
    """The learner a model serves from its state record, conformed to ``parts``
    (module docstring). Raises :class:`~service.learning.StateError` for a record this
    release cannot read. ``serving``: an adaptive learner read to decide alone
    (:meth:`~.learner.Adaptive.from_state`)."""
    if not is_adaptive_state(state):
        learner = learner_from_state(state)
        return learner if parts is None else _wrap(learner, parts, seed=0)
    record = st.read_record(state, ADAPTIVE_FORMAT)
    if parts is None:
        return learner_from_state(record.get("champion"))
    return Adaptive.from_state(_conformed(dict(record), parts), serving=serving)


def serving_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """What a scorer reads of a learner's state record: what deciding needs, and no more.

    An adaptive record keeps its champion, its detectors, exploration and counts; its
    contest names the challengers running (``{"running": [kinds]}``) without their
    learners, and its recall is empty. A linear learner (bare, or the champion) leaves out
    its normaliser's sums, which only its updates read. The record decides as the whole one
    does (:func:`learner_for` with ``serving=True``) and cannot be learned on: an adaptive
    one is refused, and a bare one is told apart by the record that holds it
    (:class:`service.records.ModelEnvelope`'s ``serving``).

    >>> from service.learning import DSAL
    >>> dsal = DSAL(n_features=2, cost=0.25, update_rule="normalized")
    >>> model = learner_for(dsal.to_state(), Parts())
    >>> for i in range(40):
    ...     _ = model.update([1.0, float(i % 3) - 1.0], 1 if i % 3 else -1)
    >>> whole = model.to_state()
    >>> served = serving_state(whole)
    >>> "normalizer" in whole["champion"]["learned"], "normalizer" in served["champion"]["learned"]
    (True, False)
    >>> served["contest"], served["recall"]
    ({'running': []}, {})
    >>> learner_for(served, Parts(), serving=True).decide([0.5, 1.0], coin=0.5) == model.decide(
    ...     [0.5, 1.0], coin=0.5)
    True
    """
    if not is_adaptive_state(state):
        return dict(_without_sums(state))
    contest = state.get("contest")
    challengers = contest.get("challengers") if isinstance(contest, Mapping) else None
    running = [c.get("kind") for c in challengers or () if isinstance(c, Mapping)]
    return {
        **state,
        "champion": _without_sums(state.get("champion")),
        "contest": {"running": running},
        "recall": {},
    }


def _without_sums(state: Any) -> Any:
    """A learner record without its normaliser's sums (any other record as it is)."""
    learned = state.get("learned") if isinstance(state, Mapping) else None
    if not isinstance(learned, Mapping) or "normalizer" not in learned:
        return state
    return {**state, "learned": {k: v for k, v in learned.items() if k != "normalizer"}}


def _wrap(learner: Any, parts: Parts, *, seed: int) -> Adaptive:
    """A learner inside the wrapper (with its tracking steps); one that has learned already
    skips the start's exploration (it is not starting)."""
    learner = learner_from_state(_stepped(learner.to_state(), parts))
    return Adaptive(
        learner,
        detector="default" if parts.detector else None,
        collapse_window=_COLLAPSE_WINDOW if parts.detector else 0,
        challengers=CHALLENGER_KINDS if parts.challengers else (),
        explore_floor=_EXPLORE_FLOOR if parts.explore else 0.0,
        after_floor=_AFTER_FLOOR if parts.explore else 0.0,
        explore_start=10 if int(learner.steps) == 0 else 0,
        take_back=parts.take_back,
        seed=seed,
    )


def _conformed(record: dict[str, Any], parts: Parts) -> dict[str, Any]:
    """An adaptive record with its parts switched to ``parts`` (unchanged when they are)."""
    params = dict(st.read_mapping(record, "params"))
    learned = dict(st.read_mapping(record, "learned"))
    has_detector = record.get("detector") is not None or params.get("collapse_window", 0) != 0
    if parts.detector != has_detector:
        record["detector"] = default_detector().to_state() if parts.detector else None
        record["weighted_detector"] = None  # a fresh one with the detector, or none
        params["collapse_window"] = _COLLAPSE_WINDOW if parts.detector else 0
        record["collapse_watch"] = (
            CollapseWatch(window=_COLLAPSE_WINDOW).to_state() if parts.detector else None
        )
    if parts.challengers != bool(params.get("challengers")):
        params["challengers"] = list(CHALLENGER_KINDS) if parts.challengers else []
        record["contest"] = Contest().to_state()
    elif parts.challengers and _fewer_kinds(params.get("challengers")):
        # a record from before a kind existed gets it for the next change (a contest that
        # runs keeps its challengers: each names its kind); anything else is left for the
        # wrapper's reader to judge
        params["challengers"] = list(CHALLENGER_KINDS)
    if params.get("take_back", True) is not parts.take_back:
        params["take_back"] = parts.take_back
        contest = record.get("contest")
        running = contest.get("challengers") if isinstance(contest, Mapping) else None
        if (
            not parts.take_back
            and isinstance(running, list)
            and running
            and all(isinstance(c, Mapping) and c.get("kind") == PREVIOUS for c in running)
        ):  # a take-back contest ends with the part
            record["contest"] = Contest().to_state()
    explores = params.get("explore_floor", 0.0) != 0.0 or params.get("after_floor", 0.0) != 0.0
    if parts.explore != explores:
        params["explore_floor"] = _EXPLORE_FLOOR if parts.explore else 0.0
        params["after_floor"] = _AFTER_FLOOR if parts.explore else 0.0
        after = learned.get("last_change") is not None
        learned["floor"] = params["after_floor"] if after else params["explore_floor"]
    record["params"], record["learned"] = params, learned
    record["champion"] = _stepped(record.get("champion"), parts)
    contest = record.get("contest")
    if isinstance(contest, Mapping) and isinstance(contest.get("challengers"), list):
        challengers = [
            {**c, "learner": _stepped(c.get("learner"), parts)} if isinstance(c, Mapping) else c
            for c in contest["challengers"]
        ]
        record["contest"] = {**contest, "challengers": challengers}
    return record


def _fewer_kinds(kinds: Any) -> bool:
    """Whether ``kinds`` is a list of distinct known challenger kinds that lacks some."""
    if not isinstance(kinds, list) or not all(k in CHALLENGER_KINDS for k in kinds):
        return False
    return len(set(kinds)) == len(kinds) < len(CHALLENGER_KINDS)


def _stepped(record: Any, parts: Parts) -> Any:
    """A learner record with the tracking steps ``parts`` asks for: the missing bounds set
    (``steps`` on) or both removed (off); unchanged when they fit, or for a learner that
    takes none (anything but DSAL and DSOL)."""
    if not isinstance(record, Mapping) or record.get("algorithm") not in ("dsal", "dsol"):
        return record
    params = record.get("params")
    if not isinstance(params, Mapping):
        return record  # the learner's own reader says what is wrong with it
    if not parts.steps:
        if not set(_BOUNDS) & set(params):
            return record
        return {**record, "params": {k: v for k, v in params.items() if k not in _BOUNDS}}
    if set(_BOUNDS if parts.intercept else _BOUNDS[:1]) <= set(params):
        return record  # set already (the common case: no learner is built)
    wanted = tracking_steps(learner_from_state(record), intercept=parts.intercept)
    missing = {k: v for k, v in wanted.items() if k not in params}
    return {**record, "params": {**params, **missing}}
