"""The learning benchmark: the model a worker serves, the bare learner and their peers, on
stationary sets in random orders, real drifting streams in their own order and generated
drift.

Usage: ``python loadtest/learning_bench.py [--groups short,mid,onehot,fields,long,...]
[--runs 10] [--out loadtest/results/learning] [--jobs 1]`` (River, scikit-learn,
scikit-activeml and Vowpal Wabbit come with the ``bench`` extra). Prints one table per group
and writes ``<group>.json`` (every run's risk and labels, each peer's tuning, the settings)
to ``--out``.

Streams (``d = 0.25`` everywhere):

* ``short``: 150-1,000 events, stationary, a random order per run: scikit-learn's
  breast-cancer set (569 events), its digits (0-4 against 5-9; the first 900 events of
  the order), wine (cultivar 2 against the rest, 178), iris (virginica against the rest,
  150) and diabetes (progression above its median, 442);
* ``mid``: 800 events of a random order per run of River's Phishing (1,250) and image
  segments (2,310; brickface, sky and foliage against the rest), two more streams of the
  500-1,000 events the short sets' goal names;
* ``onehot``: one-hot and sparse binary features, generated (10,000 events each, the first
  3,000 of a random order per run): 12 categorical attributes one-hot, 300 sparse binary
  features, and River's Agrawal (function 4) with every attribute one-hot (the numeric ones
  cut at their deciles); see ``_generated``;
* ``fields``: events as producers write them (numbers, strings, booleans, nulls, lists of
  tokens), each encoded under a model's ``fields`` declaration into 2^10 hashed buckets as a
  worker encodes it, every model given those inputs (10,000 events each, the first 3,000 of
  a random order per run): River's Agrawal with its categorical attributes as strings, and
  generated events of 30 tokens; see :func:`declared_events`;
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
* the peers, each at its best, tuned once per stream as a user would on a run of its own
  (:func:`tuning_run`: an order, trials, generator seed or coins none of the evaluated runs
  has; elec2 has one order, so there only the coins and seeds differ and the full-label
  peers' tuning is the best in hindsight): River's ``LogisticRegression`` behind a
  ``StandardScaler`` with every label, its constant step then its intercept's step chosen
  from 0.01-1 (:data:`STEPS`) by risk on that run; River's ``active.EntropySampler``
  around that LR; Vowpal Wabbit's logistic regression (``--loss_function logistic``, its
  learning rate from 0.01-10 on raw or standardised features, chosen the same way) with
  every label, and its active learner (``--active``); scikit-activeml's
  ``VariableUncertainty``, ``Split`` and ``StreamProbabilisticAL`` (PAL, kernel
  frequencies from the labelled events) deciding which labels the tuned LR gets (``short``
  and ``mid`` only: they are slow). Each budgeted peer's knob (the discount factor, the mellowness,
  scikit-activeml's budget) is searched geometrically on the tuning run until, free of
  the cap, it asks the budget (:func:`search_knob`); then every budgeted peer is held to
  the budget (a label only while labels <= budget x events). The River peers' scaler
  learns from every event (River's ``learn_during_predict``). Their decisions: Chow's
  rule, reject iff the top class probability is below ``1 - d``. Each peer's tuning is
  written in its cells and in the JSON (``tuning``, and beside each run's measures).

Measures: risk (mean 0-d-1 loss per event) and labels used, per run; tables show the median
over runs [min-max].
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
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
GROUPS = ("short", "mid", "onehot", "fields", "long", "replay", "elec2", "agrawal")


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
    if name == "wine":  # cultivar 2 against the other two (71 of 178)
        data = datasets.load_wine()
        return np.asarray(data.data, dtype=np.float64), _signs(data.target == 1)
    if name == "iris":  # virginica against the rest (50 of 150)
        data = datasets.load_iris()
        return np.asarray(data.data, dtype=np.float64), _signs(data.target == 2)
    if name == "diabetes":  # disease progression above its median (442 events)
        data = datasets.load_diabetes()
        target = np.asarray(data.target)
        return np.asarray(data.data, dtype=np.float64), _signs(target > np.median(target))
    data = datasets.load_digits()
    return np.asarray(data.data, dtype=np.float64), _signs(data.target >= 5)


def _one_hot(codes: np.ndarray) -> np.ndarray:
    """Columns of integer codes (one column per attribute) as one-hot blocks."""
    blocks = []
    for column in codes.T:
        levels = np.unique(column)
        blocks.append((column[:, None] == levels[None, :]).astype(np.float64))
    return np.hstack(blocks)


def _generated(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The generated one-hot and sparse binary sets (10,000 events; fixed seeds).

    * ``onehot``: 12 categorical attributes of 3-20 levels, one-hot (101 columns, 12 ones a
      row); the label drawn from a logistic model of a random effect per level;
    * ``sparse-binary``: 300 binary features present with probabilities 0.2 / (j + 1)^0.5
      (about 7 ones a row), the label drawn from a logistic model whose weights are zero on 70 %
      of the features;
    * ``agrawal-onehot``: River's Agrawal (function 4, 5 % perturbation, seed 0), its
      categorical attributes (education level, car, zip code) one-hot and its numeric ones
      cut at their deciles, one-hot (87 columns, 9 ones a row).
    """
    rng = np.random.default_rng(np.random.SeedSequence(7, spawn_key=(len(name),)))
    n = 10_000
    if name == "onehot":
        levels = (3, 4, 5, 6, 8, 10, 12, 15, 20, 3, 5, 10)
        codes = np.stack([rng.integers(0, k, n) for k in levels], axis=1)
        effects = [rng.normal(0.0, 0.8, k) for k in levels]
        score = sum(e[codes[:, i]] for i, e in enumerate(effects)) - 0.3
        return _one_hot(codes), _signs(rng.random(n) < 1.0 / (1.0 + np.exp(-score)))
    if name == "sparse-binary":
        d = 300
        presence = 0.2 / np.sqrt(np.arange(1, d + 1))
        X = (rng.random((n, d)) < presence).astype(np.float64)
        w = rng.normal(0.0, 1.5, d) * (rng.random(d) < 0.3)
        score = X @ w + 0.2
        return X, _signs(rng.random(n) < 1.0 / (1.0 + np.exp(-score)))
    from river.datasets import synth  # noqa: PLC0415 - bench extra

    rows = list(itertools.islice(synth.Agrawal(4, seed=0, perturbation=0.05), n))
    keys = list(rows[0][0])
    raw = np.array([[float(x[k]) for k in keys] for x, _ in rows])
    codes = np.empty(raw.shape, dtype=np.int64)
    for j, key in enumerate(keys):
        column = raw[:, j]
        if key in ("elevel", "car", "zipcode"):
            codes[:, j] = column.astype(np.int64)
        else:
            edges = np.unique(np.quantile(column, np.linspace(0.1, 0.9, 9)))
            codes[:, j] = np.searchsorted(edges, column, side="right")
    return _one_hot(codes), _signs([bool(v) for _, v in rows])


#: the declarations of the ``fields`` group (a model's ``fields`` block, 2^10 buckets)
DECLARED: dict[str, dict[str, Any]] = {
    "agrawal-fields": {
        "hash_bits": 10,
        "fields": {
            **{k: "number" for k in ("salary", "commission", "age", "hvalue", "hyears", "loan")},
            **{k: "category" for k in ("elevel", "car", "zipcode")},
        },
    },
    "text-fields": {
        "hash_bits": 10,
        "fields": {
            "amount": "number",
            "channel": "category",
            "country": {"kind": "category", "missing": "indicator"},
            "new_device": "boolean",
            "text": "tokens",
        },
    },
}


TEXT_SHARPNESS = 2.5  # the text stream's score scale: its Bayes risk well below d


def declared_events(name: str, n: int = 10_000) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The events of a ``fields`` stream as a producer writes them, and their labels.

    * ``agrawal-fields``: River's Agrawal (function 4, 5 % perturbation, seed 0): its six
      numbers, and its education level, car and zip code as strings (``"car7"``);
    * ``text-fields``: generated (seed 11): 30 tokens of a 3,000-word vocabulary drawn by
      Zipf's law (s = 1.1), a channel of 8, a country of 40 (``null`` in 5 % of the events),
      a boolean, an amount (log-normal); the label drawn from a logistic model of a weight
      per word (zero for 80 % of the words), per channel and country, the boolean and the
      log of the amount.
    """
    if name == "agrawal-fields":
        from river.datasets import synth  # noqa: PLC0415 - bench extra

        rows = list(itertools.islice(synth.Agrawal(4, seed=0, perturbation=0.05), n))
        events = []
        for x, _ in rows:
            event: dict[str, Any] = {k: float(v) for k, v in x.items()}
            for key in ("elevel", "car", "zipcode"):
                event[key] = f"{key}{int(x[key])}"
            events.append(event)
        return events, _signs([bool(v) for _, v in rows])
    rng = np.random.default_rng(11)
    words = 3000
    freq = 1.0 / np.arange(1, words + 1) ** 1.1
    freq /= freq.sum()
    word_w = rng.normal(0.0, 1.5, words) * (rng.random(words) < 0.2)
    channel_w, country_w = rng.normal(0.0, 0.8, 8), rng.normal(0.0, 0.6, 40)
    events, score, coins = [], np.empty(n), np.empty(n)
    for i in range(n):
        tokens = rng.choice(words, size=30, p=freq)
        channel, country = int(rng.integers(8)), int(rng.integers(40))
        missing = bool(rng.random() < 0.05)
        device = bool(rng.random() < 0.3)
        amount = float(np.exp(rng.normal(3.0, 1.0)))
        coins[i] = rng.random()
        events.append(
            {
                "amount": round(amount, 2),
                "channel": f"c{channel}",
                "country": None if missing else f"k{country}",
                "new_device": device,
                "text": [f"w{t}" for t in tokens],
            }
        )
        score[i] = (
            word_w[tokens].sum() / math.sqrt(30.0)
            + channel_w[channel]
            + (0.0 if missing else country_w[country])
            + (0.7 if device else 0.0)
            + 0.4 * (math.log(amount) - 3.0)
        )
    return events, _signs(coins < 1.0 / (1.0 + np.exp(-TEXT_SHARPNESS * score)))


def hashed_from(name: str) -> int | None:
    """The first hashed input of a ``fields`` stream's declaration (None for other sets)."""
    from service.features.declaration import FieldsConfig  # noqa: PLC0415

    spec = DECLARED.get(name)
    return None if spec is None else FieldsConfig.model_validate(spec).hashed_from


def _declared(name: str) -> tuple[np.ndarray, np.ndarray]:
    """A ``fields`` stream encoded under its declaration, as a worker encodes each event:
    the numbers, then the 2^10 hashed buckets (MurmurHash3) of the strings, booleans,
    missing values and tokens (:mod:`service.features`). Every model gets these inputs."""
    from service.features import encoder_of  # noqa: PLC0415
    from service.features.declaration import FieldsConfig  # noqa: PLC0415

    encoder = encoder_of(FieldsConfig.model_validate(DECLARED[name]))
    events, y = declared_events(name)
    return np.array([encoder.dense(e) for e in events]), y


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


def _river_cut(name: str) -> tuple[np.ndarray, np.ndarray]:
    """A River set of the ``long`` group, of which a run takes 800 events (``-800``)."""
    return _river(name.removesuffix("-800"))


#: stream name -> (loader, events per run: None for all)
SETS: dict[str, tuple[Callable[[str], tuple[np.ndarray, np.ndarray]], int | None]] = {
    "breast-cancer": (_sklearn, None),
    "digits": (_sklearn, 900),
    "wine": (_sklearn, None),
    "iris": (_sklearn, None),
    "diabetes": (_sklearn, None),
    "onehot": (_generated, 3000),
    "sparse-binary": (_generated, 3000),
    "agrawal-onehot": (_generated, 3000),
    "agrawal-fields": (_declared, 3000),
    "text-fields": (_declared, 3000),
    "river-phishing-800": (_river_cut, 800),
    "segment-800": (_river_cut, 800),
    "river-phishing": (_river, 5000),
    "bananas": (_river, 5000),
    "segment": (_river, 5000),
    "shuttle": (_river, 5000),
    "yeast": (_river, 5000),
}
MEMBERS = {
    "short": ("breast-cancer", "digits", "wine", "iris", "diabetes"),
    "onehot": ("onehot", "sparse-binary", "agrawal-onehot"),
    "fields": ("agrawal-fields", "text-fields"),
    "mid": ("river-phishing-800", "segment-800"),
    "long": ("river-phishing", "bananas", "segment", "shuttle", "yeast"),
    "replay": ("phishing", "svmguide1"),
    "elec2": ("elec2",),
    "agrawal": ("agrawal",),
}
#: the run index of the tuning order: every peer's knobs are chosen on this order (a
#: permutation, trials, coins or generator seed of its own), never on an evaluated one
TUNE = 1_000_000


def shuffled(name: str, runs: Iterable[int]) -> Iterator[Run]:
    """A stationary set in a random order per run (its first ``SETS[name][1]`` events)."""
    load, events = SETS[name]
    X, y = load(name)
    for r in runs:
        rng = _rng(r)
        order = rng.permutation(y.shape[0])[:events]
        yield Run(name, r, X[order], y[order], rng.random(order.shape[0]))


def replayed(name: str, runs: Iterable[int], trials: int = 10_000) -> Iterator[Run]:
    """The replay's own trials of a shared file (as ``abstain replay`` and peers.py); the
    tuning run: one trial planned with a seed of its own."""
    X, y = load_dataset(resolve_dataset_path(name))
    wanted = list(runs)
    evaluated = [r for r in wanted if r != TUNE]
    plan = plan_trials(X.shape[0], max(evaluated, default=0) + 1, trials, seed=0)
    tune = plan_trials(X.shape[0], 1, trials, seed=TUNE)
    for r in wanted:
        trials_of, i = (tune, 0) if r == TUNE else (plan, r)
        rows = trials_of.indices[i]
        yield Run(name, r, X[rows], y[rows], trials_of.coins[i])


def elec2(runs: Iterable[int]) -> Iterator[Run]:
    """The electricity stream in its own order; the coins change with the run. It has one
    order: the tuning run differs by its coins and seeds only."""
    X, y = load_dataset(resolve_dataset_path("elec2/elec.csv"))
    for r in runs:
        yield Run("elec2", r, X, y, _rng(r).random(y.shape[0]))


def agrawal(runs: Iterable[int], n: int = 15_000, change: int = 5_000) -> Iterator[Run]:
    """River's Agrawal, function 6 then 8 from event ``change`` (abrupt)."""
    from river.datasets import synth  # noqa: PLC0415 - bench extra

    for r in runs:
        before = itertools.islice(synth.Agrawal(classification_function=6, seed=r), change)
        after = itertools.islice(
            synth.Agrawal(classification_function=8, seed=10_000 + r), n - change
        )
        rows = list(before) + list(after)
        keys = list(rows[0][0])
        X = np.array([[float(x[k]) for k in keys] for x, _ in rows])
        yield Run("agrawal", r, X, _signs([bool(v) for _, v in rows]), _rng(r).random(n))


def runs_of(name: str, runs: int | Iterable[int]) -> Iterator[Run]:
    """The runs ``0 .. runs - 1`` of a stream (or the run indices given; :data:`TUNE`: the
    tuning run)."""
    which = range(runs) if isinstance(runs, int) else runs
    if name in SETS:
        return shuffled(name, which)
    if name in ("phishing", "svmguide1"):
        return replayed(name, which)
    if name == "elec2":
        return elec2(which)
    return agrawal(which)


def tuning_run(name: str) -> Run:
    """The run every peer of ``name`` is tuned on: an order (trials, generator seed, coins)
    of its own, none of the evaluated runs."""
    return next(runs_of(name, [TUNE]))


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
            if kind == "labels":
                pipe = default_pipeline(d)
            else:  # a declared stream's buckets are hashed: the worker's pipeline for them
                pipe = serving_pipeline(d, hashed_from=hashed_from(run.name))
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
#: the constant steps River's LR is tuned over (its weights' and its intercept's)
STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
#: Vowpal Wabbit's learning rates (its updates are adaptive and normalised; 0.5 its default)
VW_RATES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
#: each budgeted peer's knob: its name, the range it is searched over, whether asking rises
#: with it
KNOBS: dict[str, tuple[str, float, float, bool]] = {
    "river-es": ("discount_factor", 1e-2, 1e5, False),
    "vw-active": ("mellowness", 1e-7, 10.0, True),
    "VariableUncertainty": ("budget", 1e-3, 1.0, True),
    "Split": ("budget", 1e-3, 1.0, True),
    "PAL": ("budget", 1e-3, 1.0, True),
}
SKACTIVEML = ("VariableUncertainty", "Split", "PAL")


def _logistic(step: float, intercept_step: float | None = None) -> Any:
    from river import linear_model, optim, preprocessing  # noqa: PLC0415 - bench extra

    intercept = step if intercept_step is None else intercept_step
    lr = linear_model.LogisticRegression(optimizer=optim.SGD(step), intercept_lr=intercept)
    return preprocessing.StandardScaler() | lr


def _chow(p: float) -> tuple[int, float]:
    """(decision, p) by Chow's rule at cost d: reject iff max(p, 1 - p) < 1 - d."""
    if max(p, 1.0 - p) < 1.0 - COST:
        return 0, p
    return (1 if p >= 0.5 else -1), p


def _loss(decision: int, y: int) -> float:
    return COST if decision == 0 else float(decision != y)


def _over(budget: float | None, used: int, t: int) -> bool:
    """Whether one more label would take a peer over its budget after ``t + 1`` events."""
    return budget is not None and used + 1 > budget * (t + 1)


def river_run(
    run: Run,
    budget: float | None,
    *,
    step: float,
    intercept_step: float | None = None,
    discount: float | None = None,
    cap: bool = True,
) -> Trace:
    """River's LR (``discount``: inside the entropy sampler of that discount factor) with
    the scaler learning every event; labels within the budget (``cap=False``: as many as
    the sampler asks, what the tuning counts)."""
    from river import active, compose  # noqa: PLC0415 - bench extra

    model = _logistic(step, intercept_step)
    sampler = discount is not None
    if sampler:
        model = active.EntropySampler(model, discount_factor=discount, seed=run.run)
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
        if cap and _over(budget, used, t):
            ask = False
        if ask:
            used += 1
            asked[t] = True
            model.learn_one(x, yt > 0)
    return Trace(loss, decision, asked, asked.astype(np.float64), COST)


def vw_run(
    run: Run,
    budget: float | None,
    *,
    rate: float,
    scaled: bool = False,
    mellowness: float | None = None,
    cap: bool = True,
) -> Trace:
    """Vowpal Wabbit's logistic regression (``--loss_function logistic``, its adaptive
    normalised updates at learning rate ``rate``) on the raw features (``scaled``: each
    standardised by the mean and deviation of every event so far, as the River peers' scaler
    does); with ``mellowness``,
    its active learner (``--active --simulation``: it sees each label and learns from it
    only if it queries it, with the importance weight it queried with), labels within the
    budget (``cap=False``: as many as it queries). Decisions by Chow's rule on its
    probability (``--link logistic``)."""
    from vowpalwabbit import pyvw  # noqa: PLC0415 - bench extra

    options = f"--loss_function logistic --link logistic -l {rate:g} --quiet"
    options += f" --random_seed {run.run % 2**31}"
    if mellowness is not None:
        options += f" --active --simulation --mellowness {mellowness:.6g}"
    vw = pyvw.Workspace(options)
    n = run.y.shape[0]
    loss, decision = np.empty(n), np.empty(n, dtype=np.int8)
    asked = np.zeros(n, dtype=np.bool_)
    used = 0
    X = _standardised(run.X) if scaled else run.X
    try:
        for t, (row, yt) in enumerate(zip(X.tolist(), run.y.tolist(), strict=True)):
            features = " ".join(f"{j}:{v:.9g}" for j, v in enumerate(row) if v != 0.0)
            example = vw.example(f"{yt} | {features}")
            p = float(vw.predict(example))
            decision[t], _ = _chow(p)
            loss[t] = _loss(int(decision[t]), yt)
            if not (cap and _over(budget, used, t)):
                vw.learn(example)
                # an example the active learner did not query loses its label
                if mellowness is None or abs(example.get_simplelabel_label()) < 1e30:
                    used += 1
                    asked[t] = True
            vw.finish_example(example)
    finally:
        vw.finish()
    return Trace(loss, decision, asked, asked.astype(np.float64), COST)


def skactiveml_run(
    run: Run,
    budget: float,
    strategy: str,
    *,
    step: float = 0.1,
    intercept_step: float | None = None,
    knob: float | None = None,
    cap: bool = True,
) -> Trace:
    """A scikit-activeml stream strategy (its budget parameter ``knob``, ``budget`` by
    default) choosing the labels of River's LR (its steps; scaler learning every event),
    held to ``budget`` (``cap=False``: as many labels as the strategy asks)."""
    from river import compose  # noqa: PLC0415 - bench extra
    from skactiveml.base import SkactivemlClassifier  # noqa: PLC0415
    from skactiveml.stream import (  # noqa: PLC0415
        Split,
        StreamProbabilisticAL,
        VariableUncertainty,
    )

    warnings.filterwarnings("ignore", module="skactiveml")  # its kernel's bandwidth notes
    model = _logistic(step, intercept_step)

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
    asks = budget if knob is None else knob
    query = kinds[strategy](budget=asks, random_state=run.run % 2**31, **extra)
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
        if len(picked) and cap and _over(budget, used, t):  # held to the budget
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


def peer_trace(
    kind: str, run: Run, budget: float | None, knobs: dict[str, Any], *, cap: bool = True
) -> Trace:
    """One peer (``river-lr``, ``river-es``, ``vw``, ``vw-active`` or a scikit-activeml
    strategy) on ``run`` with its tuned ``knobs`` (:func:`tune`)."""
    steps = {"step": knobs.get("step", 0.1), "intercept_step": knobs.get("intercept_step")}
    if kind == "river-lr":
        return river_run(run, None, **steps)
    if kind == "river-es":
        return river_run(run, budget, **steps, discount=knobs["discount_factor"], cap=cap)
    vw = {"rate": knobs.get("learning_rate", 0.5), "scaled": knobs.get("scaled", False)}
    if kind == "vw":
        return vw_run(run, None, **vw)
    if kind == "vw-active":
        return vw_run(run, budget, **vw, mellowness=knobs["mellowness"], cap=cap)
    assert budget is not None
    return skactiveml_run(run, budget, kind, **steps, knob=knobs["budget"], cap=cap)


# -- tuning ----------------------------------------------------------------------------
def pick(risks: dict[float, float]) -> float:
    """The value of the lowest risk (the smaller value on a tie)."""
    return min(risks, key=lambda v: (risks[v], v))


def tune_steps(run: Run, steps: tuple[float, ...] = STEPS) -> dict[str, float]:
    """River LR's constant step, then its intercept's, from ``steps`` by risk with every
    label on ``run`` (the tuning run): the step with the intercept at the same step first,
    then the intercept's step at that step."""
    risks = {s: river_run(run, None, step=s, intercept_step=s).risk for s in steps}
    step = pick(risks)
    inter = {
        s: risks[step] if s == step else river_run(run, None, step=step, intercept_step=s).risk
        for s in steps
    }
    intercept = pick(inter)
    return {"step": step, "intercept_step": intercept, "risk": inter[intercept]}


def tune_vw(run: Run, rates: tuple[float, ...] = VW_RATES) -> dict[str, Any]:
    """Vowpal Wabbit's learning rate from ``rates``, on raw or standardised features, by
    risk with every label on ``run``."""
    risks = {
        (r, scaled): vw_run(run, None, rate=r, scaled=scaled).risk
        for scaled in (False, True)
        for r in rates
    }
    rate, scaled = min(risks, key=lambda k: (risks[k], k))
    return {"learning_rate": rate, "scaled": scaled, "risk": risks[rate, scaled]}


def search_knob(
    asked: Callable[[float], float],
    target: float,
    low: float,
    high: float,
    *,
    rising: bool,
    tol: float = 0.05,
    iterations: int = 10,
) -> tuple[float, float]:
    """Bisect a knob geometrically in ``[low, high]`` until ``asked(knob)`` (the fraction of
    events a peer asks the label of) is within ``tol`` x ``target`` of ``target``; ``rising``:
    asking rises with the knob. Returns that (knob, fraction); when no knob tried lands
    there (a peer whose asking jumps), the one that asks the least at or above the target
    (the cap then holds it to the budget), else the closest below."""
    seen: list[tuple[float, float]] = []
    for _ in range(iterations):
        mid = math.sqrt(low * high)
        fraction = asked(mid)
        seen.append((mid, fraction))
        if abs(fraction - target) <= tol * target:
            return mid, fraction
        if (fraction < target) == rising:
            low = mid
        else:
            high = mid
    above = [s for s in seen if s[1] >= target]
    if above:
        return min(above, key=lambda s: s[1])
    return min(seen, key=lambda s: target - s[1])


def tune_budgeted(
    kind: str, run: Run, budget: float, base: dict[str, Any], **search: Any
) -> dict[str, float]:
    """``kind``'s knob (:data:`KNOBS`) searched on ``run`` until, free of the cap, it asks
    ``budget`` of the labels; ``base``: its tuned steps or learning rate."""
    name, low, high, rising = KNOBS[kind]
    n = run.y.shape[0]

    def asked(value: float) -> float:
        trace = peer_trace(kind, run, budget, {**base, name: value}, cap=False)
        return float(trace.labels) / n

    value, fraction = search_knob(asked, budget, low, high, rising=rising, **search)
    return {**{k: v for k, v in base.items() if k != "risk"}, name: value, "asked": fraction}


def arm_key(kind: str, budget: float | None) -> str:
    """The key of a peer's tuning: its kind, and its budget if it has one."""
    return kind if budget is None else f"{kind} @{budget:g}"


def tune(name: str, family: str, kinds: list[tuple[str, float | None]]) -> dict[str, Any]:
    """Every peer of ``family`` (``river``: River's LR, its entropy sampler and the
    scikit-activeml strategies around it; ``vw``: Vowpal Wabbit) tuned on the tuning run of
    ``name`` (:func:`tuning_run`): ``{arm_key: knobs}``."""
    run = tuning_run(name)
    base = tune_steps(run) if family == "river" else tune_vw(run)
    out: dict[str, Any] = {}
    for kind, budget in kinds:
        if budget is None:
            out[arm_key(kind, None)] = base
        else:
            out[arm_key(kind, budget)] = tune_budgeted(kind, run, budget, base)
    return out


def describe(knobs: dict[str, Any]) -> str:
    """A peer's tuning in a few words (a table cell's suffix)."""
    words = []
    if "step" in knobs:
        words.append(f"step {knobs['step']:g}/{knobs['intercept_step']:g}")
    if "learning_rate" in knobs:
        words.append(f"rate {knobs['learning_rate']:g}")
        words.append("standardised" if knobs.get("scaled") else "raw")
    for key, word in (("discount_factor", "discount"), ("mellowness", "mellowness")):
        if key in knobs:
            words.append(f"{word} {knobs[key]:.3g}")
    if "budget" in knobs:
        words.append(f"budget {knobs['budget']:.3g}")
    return ", ".join(words)


# -- arms ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Arm:
    """A model at one budget (``None``: every label)."""

    name: str
    budget: float | None
    kind: str  # abstain | river-lr | river-es | vw | vw-active | a scikit-activeml strategy
    abstain: Abstain | None = None

    @property
    def label(self) -> str:
        return f"{self.name} @{self.budget:.0%}" if self.budget else f"{self.name}, all labels"

    @property
    def family(self) -> str | None:
        """Which tuning the peer takes (:func:`tune`); ``None`` for abstain's models."""
        if self.kind == "abstain":
            return None
        return "vw" if self.kind.startswith("vw") else "river"

    def __call__(self, run: Run, tuning: dict[str, Any] | None = None) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.kind == "abstain":
            assert self.abstain is not None
            trace = self.abstain(run, self.budget)
        else:
            knobs = (tuning or {})[arm_key(self.kind, self.budget)]
            extra["tuning"] = knobs
            trace = peer_trace(self.kind, run, self.budget, knobs)
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
                Arm("River LR (tuned)", None, "river-lr"),
                Arm("VW logistic (tuned)", None, "vw"),
            ]
            continue
        out += [
            Arm("River entropy sampler (tuned)", b, "river-es"),
            Arm("VW active (tuned)", b, "vw-active"),
        ]
        if group in ("short", "mid"):
            out += [Arm(f"skactiveml {s} (tuned)", b, s) for s in SKACTIVEML]
    return out


def _tune_job(job: tuple[str, str, list[tuple[str, float | None]]]) -> dict[str, Any]:
    return tune(*job)


def _job(
    job: tuple[str, int, list[Arm], dict[str, Any]],
) -> list[tuple[str, str, dict[str, Any]]]:
    name, r, todo, tuning = job
    run = next(runs_of(name, [r]))
    return [(arm.label, name, arm(run, tuning)) for arm in todo]


def run_group(
    group: str, args: argparse.Namespace
) -> tuple[dict[str, dict[str, list[Any]]], dict[str, dict[str, Any]]]:
    """``{arm label: {stream: [measures of each run]}}`` and each stream's tuning
    (``{stream: {arm label: knobs}}``), the peers tuned first on each stream's tuning run."""
    todo = arms(group, args)
    runs = args.runs if group != "elec2" else args.elec2_runs
    families: dict[str, list[tuple[str, float | None]]] = {}
    for arm in todo:
        if arm.family is not None:
            families.setdefault(arm.family, []).append((arm.kind, arm.budget))
    tune_jobs = [(name, f, k) for name in MEMBERS[group] for f, k in families.items()]
    results: dict[str, dict[str, list[Any]]] = {a.label: {} for a in todo}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        tuned: dict[str, dict[str, Any]] = {name: {} for name in MEMBERS[group]}
        for (name, _, _), knobs in zip(tune_jobs, pool.map(_tune_job, tune_jobs), strict=True):
            tuned[name].update(knobs)
        jobs = [(name, r, todo, tuned[name]) for name in MEMBERS[group] for r in range(runs)]
        for done in pool.map(_job, jobs):
            for label, name, measures in done:
                results[label].setdefault(name, []).append(measures)
    tuning = {
        name: {
            a.label: tuned[name][arm_key(a.kind, a.budget)] for a in todo if a.family is not None
        }
        for name in MEMBERS[group]
    }
    return results, tuning


def cell(values: list[float], fmt: str = ".4f") -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def table(results: dict[str, dict[str, list[Any]]]) -> str:
    """One row per model, a column per stream: median risk [min-max] over runs, and a peer's
    tuning on that stream after it."""
    names = list(dict.fromkeys(n for by in results.values() for n in by))
    lines = ["| model | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, by in results.items():
        cells = []
        for n in names:
            if n not in by:
                cells.append("")
                continue
            text = cell([m["risk"] for m in by[n]])
            if "tuning" in by[n][0]:
                text += f" ({describe(by[n][0]['tuning'])})"
            cells.append(text)
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
        results, tuning = run_group(group, args)
        text = table(results)
        print(f"## {group}\n\n{text}\n", flush=True)
        settings = {
            "runs": args.runs,
            "elec2_runs": args.elec2_runs,
            "cost": COST,
            "budgets": args.budgets,
            "seconds": round(time.perf_counter() - tic, 1),
        }
        record = {"group": group, "settings": settings, "tuning": tuning, "results": results}
        path = args.out / f"{group}{args.tag}.json"
        path.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
