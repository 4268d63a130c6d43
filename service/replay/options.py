"""Options of a replay, the variants it runs, and the routing of hyperparameters.

A replay runs one :class:`Variant` per algorithm as the paper does (``sampling="own"``: the
learner asks by its own rule) and, for each label budget ``b`` of
``ReplayOptions.label_budgets``, two more per *active* algorithm (DRAL, DSAL and their
kernel versions): ``"budget"``, the learner held to a
:class:`~service.learning.QueryBudget` of ``b`` (its own utilities, scaled), and
``"random"``, the same learner asking uniformly chosen events at the same rate (a budget
with sharpness 0). DSOL asks every label; at a budget it would be random sampling with the
DS update, which is exactly the DSAL ``"random"`` variant, so DSOL gets no budget variants.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from service.config import ModelConfig
from service.learning import Parts
from service.learning.linear import UPDATES
from service.learning.registry import ALGORITHMS as LEARNER_CLASSES
from service.replay.errors import ReplayConfigError
from service.replay.protocol import (
    ALGORITHMS,
    KERNEL_ALGORITHMS,
    PAPER_ALGORITHMS,
    Sampling,
    validate_costs,
)
from service.replay.results import (
    BUDGET_PARAMS,
    FULL_LABEL_ALGORITHMS,
    SAMPLINGS,
    Variant,
    window_step,
)

__all__ = [
    "FULL_LABEL_ALGORITHMS",
    "KERNEL_NAMES",
    "SAMPLINGS",
    "SCALER_FITS",
    "ReplayOptions",
    "Variant",
    "accepted_params",
    "check_params",
    "learner_kwargs",
    "parse_algorithms",
    "parse_params",
    "params_for",
    "served_options",
]

ScalerFit = Literal["events", "labels", "moments"]
#: what the online standardiser learns from: every event of a run (the paper's protocol,
#: batched), only the labelled examples of each learner (a stream worker before), or the
#: moments of every event merged at each label and then the labelled rows (a stream worker
#: now: :func:`service.learning.serving_pipeline`).
SCALER_FITS: tuple[ScalerFit, ...] = ("events", "labels", "moments")

#: command-line kernel names -> kernel kinds of :mod:`service.learning.kernel.kernels`.
KERNEL_NAMES = {
    "linear": "linear",
    "poly": "polynomial",
    "polynomial": "polynomial",
    "rbf": "rbf",
    "rbf-scale": "rbf-scale",
}


@dataclass(frozen=True)
class ReplayOptions:
    """Everything that decides what a replay computes (not where it writes)."""

    algorithms: tuple[str, ...] = PAPER_ALGORITHMS
    costs: tuple[float, ...] = (0.1, 0.25, 0.4)
    runs: int = 100
    trials: int = 10_000
    seed: int = 0
    sampling: Sampling = "replacement"
    standardize: bool = True
    intercept: bool = True
    params: Mapping[str, Any] = field(default_factory=dict)
    kernel: Mapping[str, Any] | None = None
    budget: int | None = None
    grid_points: int = 100
    scaler_fit: ScalerFit = "events"
    label_budgets: tuple[float, ...] = ()
    budget_params: Mapping[str, Any] = field(default_factory=dict)
    adaptive: Parts | None = None  # the learners inside Adaptive with these parts (sequential)
    #: the linear learners' update rule (None: the learner's default, the papers' "sgd"; a
    #: ``params`` entry wins over it)
    update_rule: str | None = None
    #: events of the windowed risk drawn for a sequential run (``sampling="sequential"``)
    window: int = 500
    #: the first hashed input of events read under a model's declaration (the served
    #: preprocessing never centres the buckets: ``serving_pipeline(hashed_from=...)``)
    hashed_from: int | None = None

    def __post_init__(self) -> None:
        validate_costs(self.costs)
        if self.window < 1:
            raise ReplayConfigError(f"window must be >= 1, got {self.window}")
        _check_label_budgets(self.label_budgets, self.algorithms, self.budget_params)
        if self.runs < 1 or self.trials < 1:
            raise ReplayConfigError(
                f"runs and trials must be >= 1, got {self.runs} and {self.trials}"
            )
        if self.scaler_fit not in SCALER_FITS:
            raise ReplayConfigError(
                f"scaler_fit must be one of {SCALER_FITS}, got {self.scaler_fit!r}"
            )
        if self.update_rule is not None and self.update_rule not in UPDATES:
            raise ReplayConfigError(
                f"update_rule must be one of {UPDATES}, got {self.update_rule!r}"
            )
        if self.budget is not None and self.budget < 1:
            raise ReplayConfigError(f"budget must be >= 1, got {self.budget}")
        unknown = [a for a in self.algorithms if a not in (*ALGORITHMS, *KERNEL_ALGORITHMS)]
        if unknown or not self.algorithms:
            raise ReplayConfigError(
                f"unknown algorithm(s) {unknown}; expected some of "
                f"{', '.join((*ALGORITHMS, *KERNEL_ALGORITHMS))}"
            )

    def settings(self) -> dict[str, Any]:
        """JSON-safe record of the options (stored in ``summary.json``)."""
        return {
            "algorithms": list(self.algorithms),
            "costs": list(self.costs),
            "seed": self.seed,
            "sampling": self.sampling,
            "standardize": self.standardize,
            "scaler_fit": self.scaler_fit,
            "intercept": self.intercept,
            "params": {k: _jsonable(v) for k, v in self.params.items()},
            "kernel": None if self.kernel is None else dict(self.kernel),
            "budget": self.budget,
            "label_budgets": list(self.label_budgets),
            "update_rule": self.update_rule,
            "budget_params": dict(self.budget_params),
            "adaptive": None
            if self.adaptive is None
            else {
                "detector": self.adaptive.detector,
                "challengers": self.adaptive.challengers,
                "explore": self.adaptive.explore,
                "steps": self.adaptive.steps,
            },
            **({"window": self.window} if self.sampling == "sequential" else {}),
            **({"hashed_from": self.hashed_from} if self.hashed_from is not None else {}),
        }

    @property
    def grid_every(self) -> int | None:
        """The step every curve is also sampled at: in a sequential run, so that its
        windowed risk is known exactly (:func:`~service.replay.results.window_step`)."""
        return window_step(self.window) if self.sampling == "sequential" else None

    def variants(self) -> list[Variant]:
        """Every variant the replay runs, in report order: each algorithm on its own rule,
        then, per label budget, each active algorithm held to it and at random."""
        out = [Variant(a) for a in self.algorithms]
        for b in self.label_budgets:
            for a in self.algorithms:
                if a not in FULL_LABEL_ALGORITHMS:
                    out += [Variant(a, b, "budget"), Variant(a, b, "random")]
        return out


def served_options(**overrides: Any) -> ReplayOptions:
    """The options that replay what a stream worker serves for a model of the default
    configuration (:class:`~service.config.ModelConfig`'s defaults, so the two cannot part):
    the learners inside :class:`~service.learning.Adaptive` with every part on, the linear
    learners' update rule, and the preprocessing of :func:`~service.learning.serving_pipeline`
    (``scaler_fit="moments"``); ``overrides`` are other fields (an explicit ``adaptive``,
    ``update_rule`` or ``scaler_fit`` among them).

    >>> o = served_options(costs=(0.25,))
    >>> o.adaptive is not None, o.update_rule, o.scaler_fit
    (True, 'normalized', 'moments')
    """
    config = ModelConfig(n_features=1)
    base: dict[str, Any] = {
        "adaptive": config.adaptive.parts(intercept=overrides.get("intercept", config.intercept)),
        "update_rule": config.update_rule,
        "scaler_fit": "moments" if config.standardize else "events",
    }
    return ReplayOptions(**{**base, **overrides})


def _check_label_budgets(
    budgets: Sequence[float], algorithms: Sequence[str], params: Mapping[str, Any]
) -> None:
    for b in budgets:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 < b <= 1.0:
            raise ReplayConfigError(f"a label budget must be a fraction in (0, 1], got {b!r}")
    if len(set(budgets)) != len(budgets):
        raise ReplayConfigError(f"duplicate label budgets in {list(budgets)}")
    if budgets and all(a in FULL_LABEL_ALGORITHMS for a in algorithms):
        raise ReplayConfigError(
            "label budgets apply to active learners (dral, dsal); add one to --algorithms"
        )
    unknown = set(params) - set(BUDGET_PARAMS)
    if unknown:
        raise ReplayConfigError(
            f"unknown --budget-param {sorted(unknown)}; expected some of {list(BUDGET_PARAMS)}"
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    to_config = getattr(value, "to_config", None)
    return to_config() if callable(to_config) else value


def parse_algorithms(text: str, *, kernel: bool = False) -> tuple[str, ...]:
    """``"dral,dsal"`` -> names; with ``kernel`` plain names become ``kernel-*``.

    >>> parse_algorithms("DSAL, dral")
    ('dsal', 'dral')
    >>> parse_algorithms("dral,kernel-dsol", kernel=True)
    ('kernel-dral', 'kernel-dsol')
    """
    names = [n.strip().lower().replace("_", "-") for n in text.split(",") if n.strip()]
    if not names:
        raise ReplayConfigError("no algorithm given")
    known = (*ALGORITHMS, *KERNEL_ALGORITHMS)
    bad = [n for n in names if n not in known]
    if bad:
        raise ReplayConfigError(f"unknown algorithm(s) {bad}; expected some of {', '.join(known)}")
    if kernel:
        names = [n if n.startswith("kernel-") else f"kernel-{n}" for n in names]
    if len(set(names)) != len(names):
        raise ReplayConfigError(f"duplicate algorithms in {names}")
    return tuple(names)


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """``["eta=0.5", "dsal.gamma=2"]`` -> ``{"eta": 0.5, "dsal.gamma": 2}``.

    Values are read as JSON (numbers, objects such as a step-size schedule config), else
    kept as strings. A ``ALGO.`` prefix limits a value to one algorithm.

    >>> parse_params(['eta={"kind": "constant", "eta": 0.1}', "dsal.gamma=2"])
    {'eta': {'kind': 'constant', 'eta': 0.1}, 'dsal.gamma': 2}
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ReplayConfigError(f"--param expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw.strip()
    return out


def accepted_params(algorithm: str) -> dict[str, inspect.Parameter]:
    """Keyword hyperparameters of ``algorithm``'s class (name -> signature parameter)."""
    params = inspect.signature(LEARNER_CLASSES[algorithm]).parameters
    skip = {"n_features", "cost", "w", "seed", "self"}
    return {name: p for name, p in params.items() if name not in skip}


def params_for(algorithm: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """Hyperparameters of ``algorithm``: ``ALGO.key`` entries override plain ``key`` ones.

    Plain keys the algorithm does not take are skipped (``gamma`` means nothing to DRAL);
    an ``ALGO.key`` it does not take is an error.
    """
    accepted = accepted_params(algorithm)
    out: dict[str, Any] = {}
    for key, value in params.items():
        if "." not in key and key in accepted:
            out[key] = value
    for key, value in params.items():
        prefix, _, name = key.partition(".")
        if name and prefix == algorithm:
            if name not in accepted:
                raise ReplayConfigError(
                    f"{algorithm} takes no hyperparameter {name!r} (it takes {sorted(accepted)})"
                )
            out[name] = value
    return out


def check_params(algorithms: Sequence[str], params: Mapping[str, Any]) -> None:
    known = set().union(*(accepted_params(a) for a in algorithms))
    for key in params:
        prefix, _, name = key.partition(".")
        if name:
            if prefix not in (*ALGORITHMS, *KERNEL_ALGORITHMS):
                raise ReplayConfigError(f"unknown algorithm prefix in --param {key!r}")
            continue
        if key not in known:
            raise ReplayConfigError(
                f"no selected algorithm takes hyperparameter {key!r} (known: {sorted(known)})"
            )


def learner_kwargs(algorithm: str, options: ReplayOptions) -> dict[str, Any]:
    """Keyword hyperparameters for ``make_learner(algorithm, ...)``: the routed
    ``params`` plus the update rule of a linear learner and, for kernel learners, the kernel
    and the budget."""
    kwargs = params_for(algorithm, options.params)
    accepted = accepted_params(algorithm)
    if options.update_rule is not None and "update_rule" in accepted:
        kwargs.setdefault("update_rule", options.update_rule)
    if options.kernel is not None and "kernel" in accepted:
        kwargs.setdefault("kernel", dict(options.kernel))
    if options.budget is not None and "budget" in accepted:
        kwargs["budget"] = options.budget
    return kwargs
