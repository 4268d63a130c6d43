"""The peers benchmark: abstain against River on the same streams, budgets and coins.

Usage: ``python loadtest/peers.py [--seeds 5] [--out loadtest/results/peers] [--figures DIR]
[--arf]``
(River and scikit-learn come with the ``bench`` extra: ``pip install -e '.[bench]'``).
Prints one table and writes ``peers.md`` (the table), ``peers.json`` (every run's
measures and the settings) and ``window-risk.png`` to ``--out``.

Streams (``d = 0.25`` everywhere; run ``r`` of ``--seeds``):

* the project's drift streams (:mod:`service.replay.streams`): label flip, SEA shift
  (variant 0 to 3), rotating hyperplane; 15,000 events, change at 5,000, stream seed ``r``;
* stationary Phishing and svmguide1 (``python -m service data fetch``): the replay's own trials
  (``plan_trials(n, runs, 10_000, seed=0)``, drawn with replacement), so abstain's rows
  are those of ``abstain replay`` on the same runs;
* a short stream: scikit-learn's copy of the breast-cancer data (569 events), in a random
  order per run.

Models (River's pipelines learn their standardisation from the labelled examples only):

* ``abstain served`` (first in the table): the learner a stream worker serves for a model of
  the default configuration, built by the worker's own functions
  (:func:`service.replay.options.served_options`, :func:`service.learning.serving_learner`
  through ``variant_learner``, :func:`service.learning.serving_pipeline`): inside
  :class:`service.learning.adaptive.Adaptive` (change detection, challengers, exploration,
  tracking steps), the normalized update, a standardiser of every event's moments (merged
  at each label, as the scorers send them) then one of the labelled rows; DSAL held to a
  :class:`~service.learning.QueryBudget` at 5/10/20 %, DSOL with every label;
  ``--adaptive KEY=VALUE`` runs it with one setting changed (a part, e.g. ``steps=false``,
  or a keyword of ``Adaptive``);
* ``abstain served before`` (``--models before``): what a worker served before, the same
  wrapper with the paper's update and a standardiser of the labelled rows;
* ``abstain bare``: the paper's learner through the replay's own code
  (:func:`service.replay.sequential.variant_learner`) with a standardiser of the labelled
  rows;
* River's ``LogisticRegression`` with every label at its best constant step, alone and
  reset by ``drift.ADWIN`` (``drift.DriftRetrainingClassifier``);
* River's ``active.EntropySampler`` around that LR, held to the same budgets (a label only
  while ``labels <= budget x events``);
* an oracle on the drift streams: the Bayes decision of the concept in force (it knows
  both concepts and when the change happens): the floor of what the measures can show.

Every River contender runs at its best, tuned once per stream as a user would, on a run of
its own (:data:`TUNE`: a stream seed, trials or order none of the evaluated runs has): the
LR's constant step from 0.01-1, then its intercept's at that step, by risk with every label
(:data:`STEPS`); for each budget the entropy sampler's discount factor, searched
geometrically until, free of the cap, it asks the budget on that run
(``learning_bench.search_knob``). ``peers.md`` lists each one's tuning under the table;
``peers.json`` keeps it (``tuning``) and beside each run's measures.

Decisions of River's models by Chow's rule: reject iff the top class probability is
below ``1 - d``. Measures (:mod:`service.replay.prequential`): risk (mean 0-d-1 loss),
events after the change until the 500-event window risk is back within 1.1 x the
pre-change level (observed losses; and, on the drift streams, the losses expected under
the known label noise, which the noise of the labels does not blur), whether the model
ends rejecting everything, labels used. Table cells: median over runs [min-max].
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from learning_bench import pick, search_knob  # noqa: E402

from service.datasets import load_dataset, resolve_dataset_path  # noqa: E402
from service.learning import Budgeted, Parts, default_pipeline, serving_pipeline  # noqa: E402
from service.learning.adaptive import Adaptive  # noqa: E402
from service.learning.drift import ADWIN  # noqa: E402
from service.replay.options import ReplayOptions, served_options  # noqa: E402
from service.replay.prequential import (  # noqa: E402
    Trace,
    ends_rejecting,
    pre_change_level,
    recovery,
    run_stream,
    window_risk,
)
from service.replay.protocol import plan_trials  # noqa: E402
from service.replay.results import Variant  # noqa: E402
from service.replay.sequential import variant_learner  # noqa: E402
from service.replay.streams import DRIFT_STREAMS, DriftStream  # noqa: E402

COST = 0.25
BUDGETS: tuple[float | None, ...] = (0.05, 0.1, 0.2, None)
STATIONARY = ("phishing", "svmguide1")
SHORT = "breast-cancer"
#: the run index of the tuning run: River's steps and the entropy sampler's discount are
#: chosen on a stream seed, trials or order of its own, never on an evaluated run
TUNE = 1_000_000
#: the constant steps River's LR is tuned over (its weights' and its intercept's)
STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


# -- streams ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Stream:
    """One run of one stream: raw rows, labels, the coins abstain asks with."""

    name: str
    run: int
    X: np.ndarray
    y: np.ndarray
    coins: np.ndarray
    drift: DriftStream | None = None

    @property
    def change(self) -> int | None:
        return None if self.drift is None else self.drift.change


def _rng(run: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(0, spawn_key=(run,)))


def _short_data() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer  # noqa: PLC0415 - bench extra only

    data = load_breast_cancer()
    return np.asarray(data.data, dtype=np.float64), np.where(data.target == 1, 1, -1)


def stream_run(name: str, r: int, args: argparse.Namespace) -> Stream:
    """Run ``r`` of stream ``name`` (:data:`TUNE`: the run its peers are tuned on)."""
    if name in DRIFT_STREAMS:
        s = DRIFT_STREAMS[name](n=args.events, change=args.change, seed=r)
        return Stream(name, r, s.X, s.y, _rng(r).random(s.n), s)
    if name == SHORT:
        X, y = _short_data()
        rng = _rng(r)
        order = rng.permutation(y.shape[0])
        return Stream(SHORT, r, X[order], y[order], rng.random(y.shape[0]))
    X, y = load_dataset(resolve_dataset_path(name))
    if r == TUNE:
        plan, i = plan_trials(X.shape[0], 1, args.trials, seed=TUNE), 0
    else:
        plan, i = plan_trials(X.shape[0], args.seeds, args.trials, seed=0), r
    rows = plan.indices[i]
    return Stream(name, r, X[rows], y[rows], plan.coins[i])


def streams(args: argparse.Namespace) -> Iterator[Stream]:
    """Every (stream, run) of the benchmark, drift streams first."""
    names = [*args.drift, *args.stationary, *([SHORT] if args.short else [])]
    for name in names:
        for r in range(args.seeds):
            yield stream_run(name, r, args)


# -- models ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Arm:
    """A model configuration: a name, a label budget (``None``: every label), a runner."""

    name: str
    budget: float | None
    run: Callable[[Stream], Trace]
    drift_only: bool = False
    learns: bool = True

    @property
    def label(self) -> str:
        if not self.learns:
            return self.name
        return f"{self.name} @{self.budget:.0%}" if self.budget else f"{self.name}, all labels"


#: ``--adaptive`` keys that name a part of the served wrapper (:class:`Parts`)
PART_NAMES = ("detector", "challengers", "explore", "steps")


def _adaptive_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """``--adaptive KEY=VALUE`` settings as keywords of ``Adaptive`` (``delta=D``: the
    default detector at another confidence; ``detector=null``: none)."""
    kwargs = dict(params)
    if "delta" in kwargs:
        kwargs["detector"] = ADWIN(delta=float(kwargs.pop("delta")), clock=1)
    return kwargs


def _abstain_model(
    stream: Stream,
    budget: float | None,
    kind: str,
    adaptive: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
) -> Any:
    """abstain's model for ``stream`` (:data:`ABSTAIN_KINDS`): ``"served"``, what a worker
    serves for a model of the default configuration (``served_options``, built by
    ``serving_learner`` through ``variant_learner``); ``"before"``, what it served before
    (the wrapper, the paper's update; its pipeline is :func:`abstain_arm`'s); ``"bare"``, the
    paper's learner alone. The wrapped ones take the ``--adaptive`` settings: a part named
    with a boolean (``steps=false``) turned on or off, any other an ``Adaptive`` keyword
    (``challengers=["fresh"]``) on top of the served wrapper's own; ``params``: the learner's
    hyperparameters (``--param``, as ``abstain replay --param``)."""
    variant = Variant("dsal", budget, "budget") if budget else Variant("dsol")
    settings = {} if kind == "bare" else dict(adaptive or {})
    named = [k for k in PART_NAMES if isinstance(settings.get(k), bool)]
    parts = None if kind == "bare" else Parts(**{k: settings.pop(k) for k in named})
    fields: dict[str, Any] = {
        "algorithms": (variant.algorithm,),
        "costs": (COST,),
        "seed": 0,
        "params": dict(params or {}),
    }
    if kind == "served":
        options = served_options(**fields, adaptive=parts)
    else:
        options = ReplayOptions(**fields, adaptive=parts)
    model = variant_learner(variant, COST, stream.X.shape[1] + 1, options)
    if not settings:
        return model
    served = model.learner if isinstance(model, Budgeted) else model
    kwargs = {"detector": served.detector, **served.get_params(), **_adaptive_kwargs(settings)}
    wrapper = Adaptive(served.champion, **kwargs)
    return Budgeted(wrapper, model.budget) if isinstance(model, Budgeted) else wrapper


#: abstain's models: what a worker serves, what it served before (the paper's update and a
#: standardiser of the labelled rows), the paper's learner bare
ABSTAIN_KINDS = ("served", "before", "bare")
_NAMES = {"served": "abstain served", "before": "abstain served before", "bare": "abstain bare"}


def abstain_arm(
    budget: float | None,
    kind: str,
    *,
    adaptive: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
) -> Arm:
    def run(stream: Stream) -> Trace:
        model = _abstain_model(stream, budget, kind, adaptive, params)
        d = stream.X.shape[1]
        pipe = serving_pipeline(d) if kind == "served" else default_pipeline(d)
        return run_stream(model, stream.X, stream.y, stream.coins, COST, pipeline=pipe)

    named = {**({} if kind == "bare" else adaptive or {}), **(params or {})}
    settings = ", ".join(f"{k}={json.dumps(v)}" for k, v in named.items())
    name = _NAMES[kind]
    return Arm(f"{name} ({settings})" if settings else name, budget, run)


#: each stream's tuning of the River contenders (:func:`tune_river`), filled as streams come
TUNED: dict[str, dict[str, dict[str, Any]]] = {}


class RiverRunner:
    """A River classifier on a stream: Chow's rule, labels within the budget (``cap=False``:
    as many as the sampler asks). ``make(run, knobs)`` builds it with its tuning
    (``TUNED[stream][key]``; ``knobs`` given: those)."""

    def __init__(
        self,
        make: Callable[[int, dict[str, Any]], Any],
        budget: float | None,
        sampler: bool,
        key: str = "lr",
        knobs: dict[str, Any] | None = None,
        cap: bool = True,
    ) -> None:
        self.make, self.budget, self.sampler = make, budget, sampler
        self.key, self.knobs, self.cap = key, knobs, cap

    def __call__(self, stream: Stream) -> Trace:
        knobs = self.knobs if self.knobs is not None else TUNED[stream.name][self.key]
        model = self.make(stream.run, knobs)
        n = stream.y.shape[0]
        loss, decision = np.empty(n), np.empty(n, dtype=np.int8)
        asked = np.zeros(n, dtype=np.bool_)
        used = 0
        for t, (row, yt) in enumerate(zip(stream.X.tolist(), stream.y.tolist(), strict=True)):
            x = dict(enumerate(row))
            if self.sampler:
                proba, ask = model.predict_proba_one(x)
            else:
                proba, ask = model.predict_proba_one(x), True
            p = float(proba.get(True, 0.5)) if proba else 0.5
            if max(p, 1.0 - p) < 1.0 - COST:
                decision[t], loss[t] = 0, COST
            else:
                decision[t] = 1 if p >= 0.5 else -1
                loss[t] = float(decision[t] != yt)
            if self.cap and self.budget is not None and used + 1 > self.budget * (t + 1):
                ask = False
            if ask:
                used += 1
                asked[t] = True
                model.learn_one(x, yt > 0)
        return Trace(loss, decision, asked, asked.astype(np.float64), COST)


def _logistic(step: float, intercept_step: float | None = None) -> Any:
    from river import linear_model, optim, preprocessing  # noqa: PLC0415 - bench extra

    intercept = step if intercept_step is None else intercept_step
    lr = linear_model.LogisticRegression(optimizer=optim.SGD(step), intercept_lr=intercept)
    return preprocessing.StandardScaler() | lr


def _lr(r: int, knobs: dict[str, Any]) -> Any:
    return _logistic(knobs["step"], knobs["intercept_step"])


def _sampler(r: int, knobs: dict[str, Any]) -> Any:
    from river import active  # noqa: PLC0415 - bench extra

    return active.EntropySampler(_lr(r, knobs), discount_factor=knobs["discount_factor"], seed=r)


def _lr_adwin(r: int, knobs: dict[str, Any]) -> Any:
    from river import drift  # noqa: PLC0415 - bench extra

    return drift.DriftRetrainingClassifier(_lr(r, knobs), drift.ADWIN(), train_in_background=False)


def es_key(budget: float) -> str:
    return f"entropy sampler @{budget:g}"


def tune_river(stream: Stream, budgets: tuple[float | None, ...]) -> dict[str, dict[str, Any]]:
    """River's contenders tuned on ``stream`` (the tuning run): the LR's step from
    :data:`STEPS` with the intercept at the same step, then the intercept's step, by risk
    with every label; per budget, the entropy sampler's discount searched until it asks the
    budget free of the cap. ``{"lr": knobs, es_key(budget): knobs, ...}``."""

    def risk(step: float, intercept: float) -> float:
        knobs = {"step": step, "intercept_step": intercept}
        return RiverRunner(_lr, None, False, knobs=knobs)(stream).risk

    risks = {s: risk(s, s) for s in STEPS}
    step = pick(risks)
    inter = {s: risks[step] if s == step else risk(step, s) for s in STEPS}
    lr = {"step": step, "intercept_step": pick(inter)}
    out: dict[str, dict[str, Any]] = {"lr": {**lr, "risk": inter[lr["intercept_step"]]}}
    n = stream.y.shape[0]
    for b in budgets:
        if b is None:
            continue

        def asked(discount: float, b: float = b) -> float:
            knobs = {**lr, "discount_factor": discount}
            return RiverRunner(_sampler, b, True, knobs=knobs, cap=False)(stream).labels / n

        discount, fraction = search_knob(asked, b, 1e-2, 1e5, rising=False)
        out[es_key(b)] = {**lr, "discount_factor": discount, "asked": fraction}
    return out


def river_arms(budgets: tuple[float | None, ...], arf: bool) -> list[Arm]:
    from river import forest, preprocessing  # noqa: PLC0415 - bench extra

    arms = []
    for b in budgets:
        if b is None:
            arms += [
                Arm("River LR (tuned)", None, RiverRunner(_lr, None, False)),
                Arm("River LR (tuned) + ADWIN reset", None, RiverRunner(_lr_adwin, None, False)),
            ]
            if arf:

                def make_arf(r: int, knobs: dict[str, Any]) -> Any:
                    return preprocessing.StandardScaler() | forest.ARFClassifier(seed=r)

                arms.append(Arm("River ARF", None, RiverRunner(make_arf, None, False), True))
        else:
            runner = RiverRunner(_sampler, b, True, key=es_key(b))
            arms.append(Arm("River entropy sampler (tuned)", b, runner))
    return arms


def tuning_lines(tuned: dict[str, dict[str, dict[str, Any]]]) -> str:
    """The tuning of River's contenders on each stream, as a markdown table."""
    lines = ["| stream | River LR (step / intercept step) | entropy sampler: discount (asked) |"]
    lines.append("|---|---|---|")
    for name, knobs in tuned.items():
        lr = knobs["lr"]
        es = [
            f"{k.split('@')[1]}: {v['discount_factor']:.3g} ({v['asked']:.3f})"
            for k, v in knobs.items()
            if k != "lr"
        ]
        lines.append(f"| {name} | {lr['step']:g} / {lr['intercept_step']:g} | {'; '.join(es)} |")
    return "\n".join(lines)


def oracle_arm() -> Arm:
    def run(stream: Stream) -> Trace:
        assert stream.drift is not None
        clean = stream.drift.clean.astype(np.int8)
        loss = (clean != stream.y).astype(np.float64)
        none = np.zeros(stream.y.shape[0], dtype=np.bool_)
        return Trace(loss, clean, none, none.astype(np.float64), COST)

    return Arm("oracle (the concept in force)", None, run, drift_only=True, learns=False)


# -- measures --------------------------------------------------------------------------
def measure(trace: Trace, stream: Stream) -> dict[str, Any]:
    """What one run of one model shows (JSON-safe)."""
    out: dict[str, Any] = {
        "risk": trace.risk,
        "labels": trace.labels,
        "ends_rejecting": ends_rejecting(trace),
        "changes": list(trace.changes),
    }
    if stream.drift is not None:
        c = stream.drift.change
        expected = stream.drift.expected_loss(trace.decision, COST)
        out |= {
            "pre_change": pre_change_level(trace.loss, c),
            "after_change": float(trace.loss[c:].mean()),
            "first_500": float(trace.loss[c : c + 500].mean()),
            "recovery": recovery(trace.loss, c),
            "recovery_expected": recovery(expected, c),
            "window": window_risk(trace.loss)[99::100].round(3).tolist(),
        }
    return out


def _median(values: list[float | None]) -> float | None:
    """Median with ``None`` (never recovered) counted as the worst."""
    if not values:
        return None
    finite = [np.inf if v is None else float(v) for v in values]
    m = statistics.median(finite)
    return None if np.isinf(m) else m


def cell(runs: list[dict[str, Any]], key: str, fmt: str) -> str:
    """``median [min-max]`` of ``key`` over runs (``never``: not back before the end)."""
    values = [r[key] for r in runs]
    finite = [v for v in values if v is not None]
    low = min(finite) if finite else None
    high = max(finite) if len(finite) == len(values) else None

    def show(v: float | None) -> str:
        return "never" if v is None else format(v, fmt)

    return f"{show(_median(values))} [{show(low)}-{show(high)}]"


def count(runs: list[dict[str, Any]], key: str) -> str:
    return f"{sum(bool(r[key]) for r in runs)}/{len(runs)}"


COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("label-flip", "recovery", ".0f", "label flip: events to recover"),
    ("label-flip", "risk", ".4f", "label flip: risk"),
    ("label-flip", "ends_rejecting", "count", "label flip: ends rejecting all"),
    ("sea-shift", "recovery", ".0f", "SEA shift: events to recover"),
    ("sea-shift", "recovery_expected", ".0f", "SEA shift: same, expected losses"),
    ("sea-shift", "risk", ".4f", "SEA shift: risk"),
    ("rotating-hyperplane", "after_change", ".4f", "hyperplane: risk after the change"),
    ("phishing", "risk", ".4f", "Phishing: risk"),
    ("svmguide1", "risk", ".4f", "svmguide1: risk"),
    (SHORT, "risk", ".4f", "breast cancer (569): risk"),
)


def table(results: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """The markdown table: one row per model, the columns of :data:`COLUMNS`."""
    present = [c for c in COLUMNS if any(c[0] in by_stream for by_stream in results.values())]
    head = "| model | labels (drift streams) | " + " | ".join(c[3] for c in present) + " |"
    lines = [head, "|" + "---|" * (len(present) + 2)]
    for label, by_stream in results.items():
        drift_runs = [r for s in DRIFT_STREAMS if s in by_stream for r in by_stream[s]]
        labels = str(int(statistics.median(r["labels"] for r in drift_runs))) if drift_runs else ""
        cells = []
        for stream, key, fmt, _ in present:
            runs = by_stream.get(stream)
            if not runs:
                cells.append("")
            elif fmt == "count":
                cells.append(count(runs, key))
            else:
                cells.append(cell(runs, key, fmt))
        lines.append(f"| {label} | {labels} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- running ---------------------------------------------------------------------------
MODEL_KINDS = (*ABSTAIN_KINDS, "river", "oracle")
#: the names the kinds had before (``abstain``: the bare learner, ``adaptive``: the wrapper)
ALIASES = {"abstain": "bare", "adaptive": "served"}


def arms(args: argparse.Namespace) -> list[Arm]:
    out: list[Arm] = []
    kinds = [ALIASES.get(k, k) for k in args.models]
    for b in args.budgets:
        for kind in ABSTAIN_KINDS:  # the served stack first
            if kind in kinds:
                out.append(abstain_arm(b, kind, adaptive=args.adaptive, params=args.param))
    if "river" in kinds:
        out += river_arms(tuple(args.budgets), args.arf)
    if "oracle" in kinds:
        out.append(oracle_arm())
    return out


def run_all(args: argparse.Namespace) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """``{model label: {stream: [measures of each run]}}``, models in table order."""
    models = arms(args)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {a.label: {} for a in models}
    TUNED.clear()
    for stream in streams(args):
        tic = time.perf_counter()
        if "river" in args.models and stream.name not in TUNED:
            tuning = stream_run(stream.name, TUNE, args)
            TUNED[stream.name] = tune_river(tuning, tuple(args.budgets))
        for arm in models:
            if arm.drift_only and stream.drift is None:
                continue
            m = measure(arm.run(stream), stream)
            if isinstance(arm.run, RiverRunner) and stream.name in TUNED:
                m["tuning"] = TUNED[stream.name][arm.run.key]
            results[arm.label].setdefault(stream.name, []).append(m)
        if args.progress:
            print(
                f"{stream.name} run {stream.run}: {time.perf_counter() - tic:.1f} s",
                file=sys.stderr,
            )
    return results


def figure(results: dict[str, dict[str, list[dict[str, Any]]]], path: Path, args: Any) -> None:
    """Median 500-event window risk over time on the label flip and the SEA shift."""
    import matplotlib  # noqa: PLC0415 - only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    shown = [k for k in results if "@10%" in k or k.startswith(("oracle", "River LR (tuned),"))]
    names = [n for n in ("label-flip", "sea-shift", "rotating-hyperplane") if n in args.drift]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for label in shown:
            runs = results[label].get(name)
            if not runs:
                continue
            curve = np.median(np.array([r["window"] for r in runs]), axis=0)
            t = np.arange(1, curve.shape[0] + 1) * 100
            ax.plot(t, curve, label=label, lw=1.2)
        ax.axvline(args.change, color="grey", ls=":", lw=1)
        ax.set_title(f"{name}: 500-event window risk (median of {args.seeds} runs)")
        ax.set_xlabel("event")
        ax.set_ylabel("window risk")
        ax.set_ylim(0, 0.8 if name == "label-flip" else 0.3)
    axes[0][0].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="runs per stream (default 5)")
    p.add_argument("--out", type=Path, default=Path("loadtest/results/peers"))
    p.add_argument(
        "--figures", type=Path, default=None, help="directory of window-risk.png (default: --out)"
    )
    p.add_argument("--events", type=int, default=15_000, help="drift stream length")
    p.add_argument("--change", type=int, default=5_000, help="event of the change")
    p.add_argument("--trials", type=int, default=10_000, help="events of a stationary run")
    p.add_argument("--drift", nargs="*", default=list(DRIFT_STREAMS), choices=list(DRIFT_STREAMS))
    p.add_argument("--stationary", nargs="*", default=list(STATIONARY))
    p.add_argument("--no-short", dest="short", action="store_false", help="skip breast cancer")
    p.add_argument(
        "--budgets",
        type=lambda t: [None if v == "all" else float(v) for v in t.split(",")],
        default=list(BUDGETS),
        help="label budgets, 'all' for every label (default 0.05,0.1,0.2,all)",
    )
    p.add_argument("--arf", action="store_true", help="add River's ARF (every label; slow)")
    p.add_argument(
        "--adaptive",
        action="append",
        type=_setting,
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the adaptive wrapper (JSON value; delta=D: ADWIN's confidence)",
    )
    p.add_argument(
        "--param",
        action="append",
        type=_setting,
        default=[],
        metavar="KEY=VALUE",
        help="a hyperparameter of abstain's learners (JSON value), as abstain replay --param",
    )
    p.add_argument(
        "--models",
        type=lambda t: t.split(","),
        default=["served", "bare", "river", "oracle"],
        help="which models: some of served, before (what a worker served before), bare, "
        "river, oracle (default served,bare,river,oracle; 'adaptive' and 'abstain' name "
        "served and bare)",
    )
    p.add_argument("--no-figure", dest="plot", action="store_false")
    p.add_argument(
        "--replot", action="store_true", help="only redraw the figure from --out's peers.json"
    )
    p.add_argument("--quiet", dest="progress", action="store_false", help="no progress lines")
    return p


def _setting(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), json.loads(raw)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{key}: not a JSON value: {raw!r}") from exc


def _figures(args: argparse.Namespace) -> Path:
    """Where the figure goes (created): ``--figures``, or ``--out``."""
    figures: Path = args.out if args.figures is None else args.figures
    figures.mkdir(parents=True, exist_ok=True)
    return figures


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.adaptive = dict(args.adaptive)
    args.param = dict(args.param)
    if args.replot:
        record = json.loads((args.out / "peers.json").read_text())
        saved = argparse.Namespace(**{**vars(args), **record["settings"]})
        figure(record["results"], _figures(args) / "window-risk.png", saved)
        return 0
    started = time.perf_counter()
    results = run_all(args)
    text = table(results)
    if TUNED:
        text += "\n\nThe River contenders' tuning (on a run of each stream of its own):\n\n"
        text += tuning_lines(TUNED)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    record = {"settings": settings, "cost": COST, "seconds": time.perf_counter() - started}
    record["tuning"] = TUNED
    record["results"] = results
    (args.out / "peers.json").write_text(json.dumps(record, separators=(",", ":")) + "\n")
    (args.out / "peers.md").write_text(text + "\n")
    if args.plot and args.drift:
        figure(results, _figures(args) / "window-risk.png", args)
    print(f"written to {args.out} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
