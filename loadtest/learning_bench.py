"""The learning benchmark: the model a worker serves, the bare learner and their peers, on
stationary sets in random orders, real drifting streams in their own order and generated
drift.

Usage: ``python loadtest/learning_bench.py [--groups short,long,replay,elec2,agrawal]
[--runs 10] [--out loadtest/results/learning] [--jobs 1]`` (River, scikit-learn and
scikit-activeml come with the ``bench`` extra). Prints one table per group and writes
``<group>.json`` (every run's risk and labels, the settings) to ``--out``.

Streams (``d = 0.25`` everywhere):

* ``short``: 500-1,000 events, stationary, a random order per run: scikit-learn's
  breast-cancer set (569 events) and its digits (0-4 against 5-9; the first 900 events of
  the order);
* ``long``: stationary sets bundled with River and scikit-learn, the first 5,000 events of a
  random order per run: River's Phishing (1,250), Bananas (5,300), image segments (2,310;
  brickface, sky and foliage against the rest), Shuttle (class 1 against the rest), Yeast
  (2,417 rows, 103 features; its first label);
* ``replay``: the shared Phishing and svmguide1 files, the replay's own trials (10,000
  drawn with replacement, ``plan_trials(n, runs, 10_000, seed=0)``, as ``loadtest/peers.py``);
* ``elec2``: the electricity stream (``elec2/elec.csv`` of the data folder, which
  ``python -m service data fetch`` fills; 45,312 events in time order); every run the same
  events, only the query coins change;
* ``agrawal``: River's Agrawal generator, function 6 for 5,000 events then function 8
  (an abrupt change; 15,000 events; generator seed = run).

Models:

* ``served``: the learner a stream worker serves for a model of the default configuration
  (:func:`service.replay.options.served_options` and
  :func:`service.learning.serving_pipeline`: preprocessing and learner as the worker builds
  them; DSAL held to a :class:`~service.learning.QueryBudget` at each budget, DSOL with
  every label), labels learnt with the probability they were asked with, as the label path
  does, and the standardiser of every event fed at each label with the moments of the events
  scored since the last one, as the scorers send them;
* ``bare``: the paper's learners: no wrapper, the paper's update, and a standardiser of the
  labelled rows (a worker's before);
* River's ``LogisticRegression`` behind a ``StandardScaler`` with every label, at a
  constant step picked on each run's first 10 % from 0.01-1 (``River LR (best step)``) and
  at 0.1; River's ``active.EntropySampler`` (discount 3) around the LR at 0.1, held to each
  budget (a label only while labels <= budget x events); scikit-activeml's
  ``VariableUncertainty``, ``Split`` and ``StreamProbabilisticAL`` (PAL, kernel frequencies
  from the labelled events) deciding which labels the same LR gets (``short`` only: they
  are slow), held to the budget the same way (their own budget managers reach the rate
  only in the long run: on the 569 events of breast cancer they asked 15-27 % more labels
  than the budget before this cap, ``loadtest/results/learning/short-before.json``). The
  peers' scaler learns from every event (River's ``learn_during_predict``).
  Their decisions: Chow's rule, reject iff the top class probability is below ``1 - d``.

Measures: risk (mean 0-d-1 loss per event) and labels used, per run; tables show the median
over runs [min-max].
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from service.datasets import load_dataset, resolve_dataset_path  # noqa: E402
from service.learning import default_pipeline, serving_pipeline  # noqa: E402
from service.learning.schedules import DEFAULT_TAU, default_ds_eta  # noqa: E402
from service.replay.options import ReplayOptions, served_options  # noqa: E402
from service.replay.prequential import Trace, run_stream  # noqa: E402
from service.replay.protocol import plan_trials  # noqa: E402
from service.replay.results import Variant  # noqa: E402
from service.replay.sequential import variant_learner  # noqa: E402

COST = 0.25
BUDGETS: tuple[float | None, ...] = (0.05, 0.1, 0.2, None)
STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
GROUPS = ("short", "long", "replay", "elec2", "agrawal")


# -- streams ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    """One run of one stream: raw rows, labels (+1/-1) and the coins abstain asks with."""

    name: str
    run: int
    X: np.ndarray
    y: np.ndarray
    coins: np.ndarray


def _rng(run: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(0, spawn_key=(run,)))


def _signs(labels: Any) -> np.ndarray:
    return np.where(np.asarray(labels, dtype=bool), 1, -1).astype(np.int64)


def _river_rows(dataset: Any, label: Callable[[Any], bool]) -> tuple[np.ndarray, np.ndarray]:
    rows = list(dataset)
    keys = list(rows[0][0])
    X = np.array([[float(x[k]) for k in keys] for x, _ in rows])
    return X, _signs([label(y) for _, y in rows])


def _sklearn(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets  # noqa: PLC0415 - bench extra

    if name == "breast-cancer":
        data = datasets.load_breast_cancer()
        return np.asarray(data.data, dtype=np.float64), _signs(data.target == 1)
    data = datasets.load_digits()
    return np.asarray(data.data, dtype=np.float64), _signs(data.target >= 5)


def _river(name: str) -> tuple[np.ndarray, np.ndarray]:
    from river import datasets  # noqa: PLC0415 - bench extra

    if name == "river-phishing":
        return _river_rows(datasets.Phishing(), bool)
    if name == "bananas":
        return _river_rows(datasets.Bananas(), bool)
    if name == "segment":
        return _river_rows(datasets.ImageSegments(), lambda y: y in ("brickface", "sky", "foliage"))
    if name == "shuttle":
        return _river_rows(datasets.Shuttle(), lambda y: str(y) == "1")
    return _river_rows(datasets.Yeast(), lambda y: bool(y["Class1"]))


#: stream name -> (loader, events per run: None for all)
SETS: dict[str, tuple[Callable[[str], tuple[np.ndarray, np.ndarray]], int | None]] = {
    "breast-cancer": (_sklearn, None),
    "digits": (_sklearn, 900),
    "river-phishing": (_river, 5000),
    "bananas": (_river, 5000),
    "segment": (_river, 5000),
    "shuttle": (_river, 5000),
    "yeast": (_river, 5000),
}
MEMBERS = {
    "short": ("breast-cancer", "digits"),
    "long": ("river-phishing", "bananas", "segment", "shuttle", "yeast"),
    "replay": ("phishing", "svmguide1"),
    "elec2": ("elec2",),
    "agrawal": ("agrawal",),
}


def shuffled(name: str, runs: int) -> Iterator[Run]:
    """A stationary set in a random order per run (its first ``SETS[name][1]`` events)."""
    load, events = SETS[name]
    X, y = load(name)
    for r in range(runs):
        rng = _rng(r)
        order = rng.permutation(y.shape[0])[:events]
        yield Run(name, r, X[order], y[order], rng.random(order.shape[0]))


def replayed(name: str, runs: int, trials: int = 10_000) -> Iterator[Run]:
    """The replay's own trials of a shared file (as ``abstain replay`` and peers.py)."""
    X, y = load_dataset(resolve_dataset_path(name))
    plan = plan_trials(X.shape[0], runs, trials, seed=0)
    for r in range(runs):
        rows = plan.indices[r]
        yield Run(name, r, X[rows], y[rows], plan.coins[r])


def elec2(runs: int) -> Iterator[Run]:
    """The electricity stream in its own order; the coins change with the run."""
    X, y = load_dataset(resolve_dataset_path("elec2/elec.csv"))
    for r in range(runs):
        yield Run("elec2", r, X, y, _rng(r).random(y.shape[0]))


def agrawal(runs: int, n: int = 15_000, change: int = 5_000) -> Iterator[Run]:
    """River's Agrawal, function 6 then 8 from event ``change`` (abrupt)."""
    from river.datasets import synth  # noqa: PLC0415 - bench extra

    for r in range(runs):
        before = itertools.islice(synth.Agrawal(classification_function=6, seed=r), change)
        after = itertools.islice(
            synth.Agrawal(classification_function=8, seed=10_000 + r), n - change
        )
        rows = list(before) + list(after)
        keys = list(rows[0][0])
        X = np.array([[float(x[k]) for k in keys] for x, _ in rows])
        yield Run("agrawal", r, X, _signs([bool(v) for _, v in rows]), _rng(r).random(n))


def runs_of(name: str, runs: int) -> Iterator[Run]:
    if name in SETS:
        return shuffled(name, runs)
    if name in ("phishing", "svmguide1"):
        return replayed(name, runs)
    if name == "elec2":
        return elec2(runs)
    return agrawal(runs)


# -- abstain ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Abstain:
    """abstain's model. ``served``: what a stream worker serves for a model of the default
    configuration (:func:`service.replay.options.served_options`: the adaptive wrapper, the
    served update rule, :func:`service.learning.serving_pipeline` fed by every event's
    moments at each label, as the scorers send them); otherwise the paper's learner bare,
    with a standardiser of the labelled rows (what a worker's was before). ``params``: the
    learner's hyperparameters (``eta_scale=K``: the default first step times K, decaying
    over ``eta_tau`` labels, 1000 by default); ``scaler`` (None: the model's own) one of
    ``"served"`` (the
    serving pipeline), ``"labels"`` (a standardiser of the labelled rows), ``"events"``
    (one of every event) or ``"none"``."""

    served: bool = True
    params: tuple[tuple[str, Any], ...] = ()
    scaler: str | None = None

    @property
    def preprocessing(self) -> str:
        if self.scaler is not None:
            return self.scaler
        return "served" if self.served else "labels"

    def name(self) -> str:
        base = "abstain served" if self.served else "abstain bare"
        extra = [f"{k}={json.dumps(v)}" for k, v in self.params]
        if self.scaler is not None:
            extra.append(f"scaler={self.scaler}")
        return f"{base} ({', '.join(extra)})" if extra else base

    def __call__(self, run: Run, budget: float | None) -> Trace:
        variant = Variant("dsal", budget, "budget") if budget else Variant("dsol")
        params = dict(self.params)
        scale, tau = params.pop("eta_scale", None), params.pop("eta_tau", DEFAULT_TAU)
        if scale is not None:  # the default first step times eta_scale, decaying over eta_tau
            first = default_ds_eta(run.X.shape[1] + 1).eta0 * float(scale)
            params["eta"] = {"kind": "inverse-time", "eta0": first, "tau": float(tau)}
        fields: dict[str, Any] = {
            "algorithms": (variant.algorithm,),
            "costs": (COST,),
            "seed": 0,
            "params": params,
        }
        options = served_options(**fields) if self.served else ReplayOptions(**fields)
        model = variant_learner(variant, COST, run.X.shape[1] + 1, options)
        kind = self.preprocessing
        if kind in ("labels", "served"):
            d = run.X.shape[1]
            pipe = default_pipeline(d) if kind == "labels" else serving_pipeline(d)
            return run_stream(model, run.X, run.y, run.coins, COST, pipeline=pipe)
        X = run.X
        if kind == "events":
            X = _standardised(X)
        X = np.hstack([X, np.ones((X.shape[0], 1))])
        return run_stream(model, X, run.y, run.coins, COST)


def _standardised(X: np.ndarray) -> np.ndarray:
    """Each row standardised with the mean and std of the rows up to and including it."""
    n = np.arange(1, X.shape[0] + 1)[:, None]
    mean = np.cumsum(X, axis=0) / n
    var = np.maximum(np.cumsum(X * X, axis=0) / n - mean * mean, 0.0)
    std = np.sqrt(var)
    return np.where(std > 1e-9, (X - mean) / np.where(std > 1e-9, std, 1.0), X - mean)


# -- peers -----------------------------------------------------------------------------
def _logistic(step: float) -> Any:
    from river import linear_model, optim, preprocessing  # noqa: PLC0415 - bench extra

    lr = linear_model.LogisticRegression(optimizer=optim.SGD(step), intercept_lr=step)
    return preprocessing.StandardScaler() | lr


def _chow(p: float) -> tuple[int, float]:
    """(decision, p) by Chow's rule at cost d: reject iff max(p, 1 - p) < 1 - d."""
    if max(p, 1.0 - p) < 1.0 - COST:
        return 0, p
    return (1 if p >= 0.5 else -1), p


def _loss(decision: int, y: int) -> float:
    return COST if decision == 0 else float(decision != y)


def river_run(run: Run, budget: float | None, *, step: float, sampler: bool) -> Trace:
    """River's LR (``sampler``: inside the entropy sampler) with the scaler learning every
    event, labels within the budget."""
    from river import active, compose  # noqa: PLC0415 - bench extra

    model = _logistic(step)
    if sampler:
        model = active.EntropySampler(model, discount_factor=3, seed=run.run)
    n = run.y.shape[0]
    loss, decision = np.empty(n), np.empty(n, dtype=np.int8)
    asked = np.zeros(n, dtype=np.bool_)
    used = 0
    for t, (row, yt) in enumerate(zip(run.X.tolist(), run.y.tolist(), strict=True)):
        x = dict(enumerate(row))
        with compose.learn_during_predict():
            if sampler:
                proba, ask = model.predict_proba_one(x)
            else:
                proba, ask = model.predict_proba_one(x), True
        p = float(proba.get(True, 0.5)) if proba else 0.5
        decision[t], _ = _chow(p)
        loss[t] = _loss(int(decision[t]), yt)
        if budget is not None and used + 1 > budget * (t + 1):
            ask = False
        if ask:
            used += 1
            asked[t] = True
            model.learn_one(x, yt > 0)
    return Trace(loss, decision, asked, asked.astype(np.float64), COST)


def best_step(run: Run) -> float:
    """River LR's constant step with the lowest risk on the run's first 10 % (every label)."""
    head = max(run.y.shape[0] // 10, 1)
    part = Run(run.name, run.run, run.X[:head], run.y[:head], run.coins[:head])
    risks = {s: river_run(part, None, step=s, sampler=False).risk for s in STEPS}
    return min(risks, key=lambda s: (risks[s], s))


def skactiveml_run(run: Run, budget: float, strategy: str) -> Trace:
    """A scikit-activeml stream strategy choosing the labels of River's LR (step 0.1,
    scaler learning every event)."""
    from river import compose  # noqa: PLC0415 - bench extra
    from skactiveml.base import SkactivemlClassifier  # noqa: PLC0415
    from skactiveml.stream import (  # noqa: PLC0415
        Split,
        StreamProbabilisticAL,
        VariableUncertainty,
    )

    warnings.filterwarnings("ignore", module="skactiveml")  # its kernel's bandwidth notes
    model = _logistic(0.1)

    class Proba(SkactivemlClassifier):  # type: ignore[misc]
        """The LR's probabilities of scaled rows for scikit-activeml (it learns elsewhere)."""

        def __init__(self) -> None:
            super().__init__(classes=[-1, 1], missing_label=0)

        def fit(self, X: Any, y: Any, sample_weight: Any = None) -> Any:
            return self

        def predict_proba(self, X: Any) -> np.ndarray:
            out = []
            for row in np.atleast_2d(X).tolist():
                proba = model["LogisticRegression"].predict_proba_one(dict(enumerate(row)))
                p = float(proba.get(True, 0.5)) if proba else 0.5
                out.append([1.0 - p, p])
            return np.array(out)

    kinds = {
        "VariableUncertainty": VariableUncertainty,
        "Split": Split,
        "PAL": StreamProbabilisticAL,
    }
    extra = {"metric": "rbf"} if strategy == "PAL" else {}
    query = kinds[strategy](budget=budget, random_state=run.run, **extra)
    clf = Proba()
    n = run.y.shape[0]
    loss, decision = np.empty(n), np.empty(n, dtype=np.int8)
    asked = np.zeros(n, dtype=np.bool_)
    seen_X: list[list[float]] = []
    seen_y: list[int] = []
    used = 0
    for t, (row, yt) in enumerate(zip(run.X.tolist(), run.y.tolist(), strict=True)):
        x = dict(enumerate(row))
        with compose.learn_during_predict():
            proba = model.predict_proba_one(x)
        p = float(proba.get(True, 0.5)) if proba else 0.5
        decision[t], _ = _chow(p)
        loss[t] = _loss(int(decision[t]), yt)
        candidate = np.array([_scaled(model, x)])
        if strategy == "PAL":  # its kernel frequencies: the labelled rows, scaled as now
            X_l = np.array([_scaled(model, dict(enumerate(r))) for r in seen_X] or candidate)
            y_l = np.array(seen_y or [0])
            picked, u = query.query(candidate, clf, X=X_l, y=y_l, return_utilities=True)
        else:
            picked, u = query.query(candidate, clf, return_utilities=True)
        if len(picked) and used + 1 > budget * (t + 1):  # held to the budget, as River's
            picked = picked[:0]
        query.update(candidate, picked, budget_manager_param_dict={"utilities": u})
        if len(picked):
            used += 1
            asked[t] = True
            seen_X.append(row)
            seen_y.append(yt)
            model.learn_one(x, yt > 0)
    return Trace(loss, decision, asked, asked.astype(np.float64), COST)


def _scaled(model: Any, x: dict[int, float]) -> list[float]:
    """``x`` through the pipeline's scaler (PAL's kernel frequencies need scaled rows)."""
    scaler = model.steps["StandardScaler"]
    z = scaler.transform_one(x)
    return [float(z[k]) for k in sorted(z)]


# -- arms ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arm:
    """A model at one budget (``None``: every label)."""

    name: str
    budget: float | None
    kind: str  # abstain | river-lr | river-best | river-es | VariableUncertainty | Split | PAL
    abstain: Abstain | None = None

    @property
    def label(self) -> str:
        return f"{self.name} @{self.budget:.0%}" if self.budget else f"{self.name}, all labels"

    def __call__(self, run: Run) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.kind == "abstain":
            assert self.abstain is not None
            trace = self.abstain(run, self.budget)
        elif self.kind == "river-lr":
            trace = river_run(run, None, step=0.1, sampler=False)
        elif self.kind == "river-best":
            extra["step"] = step = best_step(run)
            trace = river_run(run, None, step=step, sampler=False)
        elif self.kind == "river-es":
            trace = river_run(run, self.budget, step=0.1, sampler=True)
        else:
            assert self.budget is not None
            trace = skactiveml_run(run, self.budget, self.kind)
        rejected = float((trace.decision == 0).mean())
        return {"risk": trace.risk, "labels": trace.labels, "rejected": rejected, **extra}


def arms(group: str, args: argparse.Namespace) -> list[Arm]:
    out: list[Arm] = []
    budgets = args.budgets
    for model in args.abstain:
        out += [Arm(model.name(), b, "abstain", model) for b in budgets]
    if "peers" not in args.models:
        return out
    for b in budgets:
        if b is None:
            out += [
                Arm("River LR (best step)", None, "river-best"),
                Arm("River LR (step 0.1)", None, "river-lr"),
            ]
            continue
        out.append(Arm("River entropy sampler", b, "river-es"))
        if group == "short":
            out += [Arm(f"skactiveml {s}", b, s) for s in ("VariableUncertainty", "Split", "PAL")]
    return out


def _job(job: tuple[str, int, int, list[Arm]]) -> list[tuple[str, str, dict[str, Any]]]:
    name, r, runs, todo = job
    run = next(itertools.islice(runs_of(name, runs), r, None))
    return [(arm.label, name, arm(run)) for arm in todo]


def run_group(group: str, args: argparse.Namespace) -> dict[str, dict[str, list[Any]]]:
    """``{arm label: {stream: [measures of each run]}}``."""
    todo = arms(group, args)
    runs = args.runs if group != "elec2" else args.elec2_runs
    jobs = [(name, r, runs, todo) for name in MEMBERS[group] for r in range(runs)]
    results: dict[str, dict[str, list[Any]]] = {a.label: {} for a in todo}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for done in pool.map(_job, jobs):
            for label, name, measures in done:
                results[label].setdefault(name, []).append(measures)
    return results


def cell(values: list[float], fmt: str = ".4f") -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def table(results: dict[str, dict[str, list[Any]]]) -> str:
    names = list(dict.fromkeys(n for by in results.values() for n in by))
    lines = ["| model | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, by in results.items():
        cells = [cell([m["risk"] for m in by[n]]) if n in by else "" for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _setting(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key.strip(), json.loads(raw)
    except json.JSONDecodeError:
        return key.strip(), raw


def _abstain(text: str) -> Abstain:
    """``served`` or ``bare``, then ``:KEY=VALUE,...`` (``scaler=labels|events|none``, any
    other key a learner hyperparameter)."""
    kind, _, rest = text.partition(":")
    if kind not in ("served", "bare"):
        raise argparse.ArgumentTypeError(f"expected served or bare, got {kind!r}")
    settings = dict(_setting(item) for item in rest.split(";") if item)
    scaler = settings.pop("scaler", None)
    return Abstain(kind == "served", tuple(sorted(settings.items())), scaler)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--groups", type=lambda t: t.split(","), default=list(GROUPS))
    p.add_argument("--runs", type=int, default=10, help="runs per stream (default 10)")
    p.add_argument("--elec2-runs", type=int, default=5, help="coin seeds of elec2 (default 5)")
    p.add_argument(
        "--budgets",
        type=lambda t: [None if v == "all" else float(v) for v in t.split(",")],
        default=list(BUDGETS),
        help="label budgets, 'all' for every label (default 0.05,0.1,0.2,all)",
    )
    p.add_argument(
        "--abstain",
        action="append",
        type=_abstain,
        default=[],
        metavar="SPEC",
        help="abstain's models: served or bare, then :KEY=VALUE;... (default: served, bare)",
    )
    p.add_argument("--models", type=lambda t: t.split(","), default=["abstain", "peers"])
    p.add_argument("--out", type=Path, default=HERE / "results" / "learning")
    p.add_argument("--tag", default="", help="suffix of the result files")
    p.add_argument("--jobs", type=int, default=1, help="processes (default 1)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.abstain and "abstain" in args.models:
        args.abstain = [Abstain(True), Abstain(False)]
    if "abstain" not in args.models:
        args.abstain = []
    args.out.mkdir(parents=True, exist_ok=True)
    for group in args.groups:
        tic = time.perf_counter()
        results = run_group(group, args)
        text = table(results)
        print(f"## {group}\n\n{text}\n", flush=True)
        settings = {
            "runs": args.runs,
            "elec2_runs": args.elec2_runs,
            "cost": COST,
            "budgets": args.budgets,
            "seconds": round(time.perf_counter() - tic, 1),
        }
        record = {"group": group, "settings": settings, "results": results}
        path = args.out / f"{group}{args.tag}.json"
        path.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
