"""``abstain bench``: micro-benchmarks of the learners, printed as tables.

Every timing is repeated ``--repeat`` times (default 7) and reported as the median and
the minimum. Sections:

Inputs are the dataset's rows standardised once with whole-dataset statistics.

1. single events at the dataset's width (Phishing: 68 features): ``decide`` alone, and
   ``decide`` + ``update`` (every event labelled: the learner's most expensive path);
   then the update rules side by side in the same run (``update_rule`` ``"sgd"``, the
   paper's, and ``"normalized"``): a label of weight 1 and one of weight 100 (a shadow's or
   a challenger's, ``1/p``), with the ratio normalized / sgd;
2. ``decide_many`` throughput in events/s for large batches;
3. the paper's full protocol on the dataset (3 algorithms x 3 costs x 100 runs x 10,000
   trials, batched), with and without the per-run online standardiser;
4. kernel learners: time per event against the support-set budget (the set is filled
   first, so each decide evaluates ``budget`` kernel values; the cost should grow about
   linearly with the budget);
5. a reference: River's ``linear_model.LogisticRegression`` ``predict_proba_one`` and
   ``learn_one`` on the same rows in the same process (skipped, with a note, when River is
   not installed).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from service.datasets import DatasetError, load_dataset, resolve_dataset_path
from service.learning import learner_from_state, make_learner
from service.learning.linear import UPDATES
from service.learning.preprocessing import OnlineStandardizer
from service.learning.registry import LINEAR_ALGORITHMS
from service.replay.errors import ReplayConfigError, ReplayError
from service.replay.options import ReplayOptions
from service.replay.runner import replay

__all__ = ["main", "timed"]

FloatArray = npt.NDArray[np.float64]
LINEAR = LINEAR_ALGORITHMS


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """``(median, min)`` wall time of ``fn()`` over ``repeat`` calls, in seconds."""
    times = []
    for _ in range(repeat):
        tic = time.perf_counter()
        fn()
        times.append(time.perf_counter() - tic)
    return statistics.median(times), min(times)


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "-" * len(title)]
    for k, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.rjust(w) if j else c.ljust(w)
                for j, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _events(X: FloatArray, n: int) -> FloatArray:
    reps = -(-n // X.shape[0])
    out: FloatArray = np.tile(X, (reps, 1))[:n]
    return np.ascontiguousarray(out)


def _learners(
    X: FloatArray, y: npt.NDArray[np.int64], n: int, repeat: int
) -> tuple[list[list[object]], dict[str, float]]:
    Xs, ys = _events(X, n), np.resize(y, n).tolist()
    coins = np.random.default_rng(0).random(n).tolist()
    rows: list[list[object]] = []
    medians: dict[str, float] = {}
    for name in LINEAR:
        learner = make_learner(name, n_features=X.shape[1], cost=0.25)
        events = list(Xs)

        def decide_only(learner: Any = learner, events: list[FloatArray] = events) -> None:
            for x, u in zip(events, coins, strict=True):
                learner.decide(x, coin=u)

        def decide_update(name: str = name, events: list[FloatArray] = events) -> None:
            fresh = make_learner(name, n_features=X.shape[1], cost=0.25)
            for x, u, yt in zip(events, coins, ys, strict=True):
                fresh.decide(x, coin=u)
                fresh.update(x, yt)

        for label, fn in (("decide", decide_only), ("decide+update", decide_update)):
            med, best = timed(fn, repeat)
            medians[f"{name} {label}"] = med / n * 1e6
            rows.append([name, label, f"{med / n * 1e6:.2f}", f"{best / n * 1e6:.2f}"])
    return rows, medians


def _rules(X: FloatArray, y: npt.NDArray[np.int64], n: int, repeat: int) -> list[list[object]]:
    """Microseconds per label of each update rule, at weight 1 and 100 (the same learners,
    events and labels), and the ratio normalized / sgd."""
    Xs, ys = list(_events(X, n)), np.resize(y, n).tolist()
    rows: list[list[object]] = []
    for name in LINEAR:
        for weight in (1.0, 100.0):
            times = {}
            for rule in UPDATES:

                def labels(rule: str = rule, name: str = name, weight: float = weight) -> None:
                    learner = make_learner(name, n_features=X.shape[1], cost=0.25, update_rule=rule)
                    for x, yt in zip(Xs, ys, strict=True):
                        learner.update(x, yt, weight=weight)

                times[rule] = timed(labels, repeat)[0] / n * 1e6
            rows.append(
                [
                    name,
                    f"{weight:g}",
                    f"{times['sgd']:.2f}",
                    f"{times['normalized']:.2f}",
                    f"{times['normalized'] / times['sgd']:.2f}",
                ]
            )
    return rows


def _single_events(X: FloatArray, y: npt.NDArray[np.int64], args: argparse.Namespace) -> None:
    """Print section 1's first tables: the learners alone, and against River's."""
    rows, ours = _learners(X, y, args.events, args.repeat)
    river = _river(X, y, args.events, args.repeat)
    if river is not None:
        rows += river[0]
    header = ["learner", "call", "median", "min"]
    print(_table(f"single events, {X.shape[1]} features (us per event)", header, rows))
    if river is None:
        print("river not installed: no reference (pip install river)")
        return
    theirs = river[1]
    ratios = [
        [
            name,
            f"{ours[f'{name} decide'] / theirs['predict_proba_one']:.2f}",
            f"{ours[f'{name} decide+update'] / theirs['predict_proba_one+learn_one']:.2f}",
        ]
        for name in LINEAR
    ]
    print()
    print(
        _table(
            "time ratio to River LogisticRegression (< 1: faster than River)",
            ["learner", "decide / predict_proba_one", "decide+update / predict+learn"],
            ratios,
        )
    )


def _decide_many(X: FloatArray, sizes: Sequence[int], repeat: int) -> list[list[object]]:
    """Events/s of ``decide_many``; each timing loops over about a million events so
    that one measurement lasts long enough to be stable."""
    rows: list[list[object]] = []
    for name in LINEAR:
        learner = make_learner(name, n_features=X.shape[1], cost=0.25)
        learner = _warm(learner, X)
        for size in sizes:
            batch = _events(X, size)
            coins = np.random.default_rng(1).random(size)
            calls = max(1, 1_000_000 // size)

            def call(
                lrn: Any = learner, b: FloatArray = batch, c: FloatArray = coins, k: int = calls
            ) -> None:
                for _ in range(k):
                    lrn.decide_many(b, c)

            med, best = timed(call, repeat)
            events = size * calls
            rows.append([name, size, f"{events / med:,.0f}", f"{events / best:,.0f}"])
    return rows


def _warm(learner: Any, X: FloatArray) -> Any:
    rng = np.random.default_rng(2)
    for i in rng.integers(0, X.shape[0], size=200).tolist():
        learner.update(X[i], 1 if i % 2 else -1)
    return learner


def _protocol(X: FloatArray, y: npt.NDArray[np.int64], repeat: int) -> list[list[object]]:
    rows: list[list[object]] = []
    for standardize in (True, False):
        options = ReplayOptions(standardize=standardize)
        seconds: list[float] = []
        engine: list[float] = []
        for _ in range(repeat):
            result = replay(X, y, options)
            seconds.append(result.seconds)
            engine.append(result.series[0].seconds)
        rows.append(
            [
                "online standardiser + intercept" if standardize else "raw features + intercept",
                f"{statistics.median(seconds):.2f}",
                f"{min(seconds):.2f}",
                f"{statistics.median(engine):.2f}",
            ]
        )
    return rows


def _kernels(X: FloatArray, budgets: Sequence[int], n: int, repeat: int) -> list[list[object]]:
    """Kernel DSAL with a full support set of each budget: decide, and decide + update.

    Kernel: polynomial of degree 2 with ``gamma = 1 / n_features`` (kernel values of order
    one on standardised rows). The set is filled with labelled examples first; each timed
    update then adds one and drops the oldest, so the set stays full and every decide
    evaluates ``budget`` kernel values.
    """
    rows: list[list[object]] = []
    events = list(_events(X, n))
    labels = [1 if i % 3 else -1 for i in range(n)]
    kernel = {"kind": "polynomial", "degree": 2, "gamma": 1.0 / X.shape[1], "coef0": 1.0}
    fill = _events(X[::-1], 20 * max(budgets))
    for budget in budgets:
        base = make_learner(
            "kernel-dsal", n_features=X.shape[1], cost=0.25, kernel=kernel, budget=budget
        )
        for i in range(fill.shape[0]):
            if base.n_support >= budget:
                break
            base.update(fill[i], 1 if i % 2 else -1)
        state = base.to_state()

        def decide_only(lrn: Any = base) -> None:
            for x in events:
                lrn.decide(x, coin=0.5)

        def decide_update(state: dict[str, Any] = state) -> None:
            lrn = learner_from_state(state)
            for x, yt in zip(events, labels, strict=True):
                lrn.decide(x, coin=0.5)
                lrn.update(x, yt)

        cells: list[object] = [budget, base.n_support]
        for fn in (decide_only, decide_update):
            med, best = timed(fn, repeat)
            cells += [f"{med / n * 1e6:.1f}", f"{best / n * 1e6:.1f}"]
        rows.append(cells)
    return rows


def _river(
    X: FloatArray, y: npt.NDArray[np.int64], n: int, repeat: int
) -> tuple[list[list[object]], dict[str, float]] | None:
    try:
        linear_model: Any = importlib.import_module("river.linear_model")
    except ImportError:
        return None
    Xs, ys = _events(X, n), np.resize(y, n).tolist()
    dicts = [{j: float(v) for j, v in enumerate(row)} for row in Xs]
    labels = [yt == 1 for yt in ys]
    model = linear_model.LogisticRegression()
    for x, yt in zip(dicts[:200], labels[:200], strict=True):
        model.learn_one(x, yt)

    def predict() -> None:
        for x in dicts:
            model.predict_proba_one(x)

    def predict_learn() -> None:
        fresh = linear_model.LogisticRegression()
        for x, yt in zip(dicts, labels, strict=True):
            fresh.predict_proba_one(x)
            fresh.learn_one(x, yt)

    rows: list[list[object]] = []
    medians: dict[str, float] = {}
    for label, fn in (
        ("predict_proba_one", predict),
        ("predict_proba_one+learn_one", predict_learn),
    ):
        med, best = timed(fn, repeat)
        medians[label] = med / n * 1e6
        rows.append(
            ["river LogisticRegression", label, f"{med / n * 1e6:.2f}", f"{best / n * 1e6:.2f}"]
        )
    return rows, medians


def _standardized(
    X: FloatArray, y: npt.NDArray[np.int64]
) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    """Rows standardised with statistics of the whole dataset (unit-scale inputs, as the
    learners see them in the service; the width stays the dataset's)."""
    scaler = OnlineStandardizer(X.shape[1])
    for row in X:
        scaler.learn(row)
    return scaler.transform_many(X), y


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="abstain bench", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--dataset", default="phishing", help="path or name under ABSTAIN_DATA_DIR")
    p.add_argument("--repeat", type=int, default=7, help="repetitions per timing")
    p.add_argument("--events", type=int, default=20_000, help="events per single-event timing")
    p.add_argument("--batches", default="10000,100000", help="decide_many batch sizes")
    p.add_argument("--budgets", default="100,200,400,800,1600", help="kernel budgets")
    p.add_argument("--kernel-events", type=int, default=2_000, help="events per kernel timing")
    p.add_argument("--protocol-repeat", type=int, default=3, help="full-protocol repetitions")
    p.add_argument("--skip-protocol", action="store_true", help="skip the full protocol")
    return p


def main(argv: list[str]) -> int:
    """Entry point of ``abstain bench``; prints the tables, returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        if min(args.repeat, args.events, args.kernel_events, args.protocol_repeat) < 1:
            raise ReplayConfigError("--repeat, --events and --*-events must be >= 1")
        sizes = [int(v) for v in args.batches.split(",") if v.strip()]
        budgets = [int(v) for v in args.budgets.split(",") if v.strip()]
        X, y = _standardized(*load_dataset(resolve_dataset_path(args.dataset)))
    except (DatasetError, ReplayError, ValueError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    d = X.shape[1]
    print(
        f"dataset {args.dataset}: {X.shape[0]} rows x {d} features; repeat {args.repeat} "
        "(median, min)\n"
    )
    _single_events(X, y, args)
    print()
    print(
        _table(
            f"update rules, {d} features (us per label, median; weight: importance weight)",
            ["learner", "weight", "sgd", "normalized", "normalized / sgd"],
            _rules(X, y, args.events, args.repeat),
        )
    )
    print()
    print(
        _table(
            "decide_many throughput (events/s)",
            ["learner", "batch", "median", "best"],
            _decide_many(X, sizes, args.repeat),
        )
    )
    if not args.skip_protocol:
        print()
        print(
            _table(
                "full protocol: 3 algorithms x 3 costs x 100 runs x 10,000 trials (s)",
                ["features", "median", "min", "engine only"],
                _protocol(X, y, args.protocol_repeat),
            )
        )
    print()
    kernel_rows = _kernels(X, budgets, args.kernel_events, args.repeat)
    print(
        _table(
            f"kernel-dsal, polynomial kernel (degree 2), {d} features, full support set "
            "(us per event)",
            ["budget", "support", "decide median", "min", "decide+update median", "min"],
            kernel_rows,
        )
    )
    return 0
