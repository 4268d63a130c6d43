"""``abstain replay DATASET ...``: the paper's protocol on a dataset, to files.

By default the learners are replayed as a stream worker serves them for a model of the
default configuration (:func:`service.replay.options.served_options`): inside the adaptive
wrapper with every part on (``--adaptive PARTS`` turns some off), the linear learners with
the served update rule, and the standardisers a worker runs (every event's moments merged at
each label, then the labelled rows: ``--scaler-fit moments``), one learner at a time.
``--bare`` replays the paper's learners instead: no wrapper, the paper's update, one
standardiser of every event of the run (batched; ``make replay``), which reproduces the
paper's protocol as before.

Writes into ``--out`` (the figures into ``--figures`` if given):

* ``summary.json`` — ``{"dataset", "runs", "trials", "results": [{"algorithm",
  "label_budget", "sampling", "cost", "risk_mean", "risk_std", "asked", "misclassified",
  "rejected", "rho"}, ...], "settings", "seconds"}``: each rate is the final running
  average over the ``T`` trials, averaged over runs (``risk_std``: std over runs; ``rho``:
  mean final width); ``label_budget`` is ``null`` and ``sampling`` ``"own"`` for the
  algorithms' own query rules;
* ``curves.csv`` — the curves in long format on a grid of ``t``
  (see :meth:`service.replay.results.ReplayResult.write_curves`);
* ``DATASET.png`` — the paper's five columns, one row per cost (unless ``--no-plot``),
  plus, with label budgets, a sixth: final risk against labels asked for every budget;
* with ``--sampling sequential`` (the file in its own order, once: every run sees the same
  events in the same order and the seeds change only the coins), also ``window.png``: the
  risk over the last ``--window`` events (500) against time, detected changes marked.

With ``--label-budget 0.02,0.05,...`` every active algorithm (DRAL, DSAL, kernel versions)
also runs held to each budget (a fraction of the events, through
:class:`service.learning.QueryBudget`; ``--budget-param`` sets its other keywords, e.g.
``sharpness=1``) and, as a baseline, asking uniformly chosen events at the same rate
(``"sampling": "budget"`` and ``"random"`` in ``summary.json``).

With ``--shadow SPEC`` (repeatable) the one algorithm at the one cost of ``--algorithms``
and ``--costs`` is the champion (held to the one ``--label-budget`` if given) and each SPEC
a shadow model that decides the same events and learns only from the champion's labels,
weighted by the champion's query probabilities (:mod:`service.replay.shadows`; SPEC is
``ALGO[:KEY=VALUE,...]``, e.g. ``dral`` or ``dsal:cost=0.1,weighting=none``). It writes
``shadow.json``, ``shadow.csv`` and ``shadow.png`` instead: every model's estimated risk
with its interval (``--level``, weights capped at ``--max-weight``) against its true
risk at ``--checkpoints`` evenly spaced points, and the coverage
(:mod:`service.replay.shadow_results`).

With ``--budgets 25,50,...`` (kernel algorithms only) it runs the protocol once per
support-set budget and writes ``budget.json``, ``budget.csv`` and ``budget.png``
instead (risk, fractions and time per event against the budget).

Exit status: 0 on success, 2 on a usage error, a missing or malformed dataset, or an
invalid option (message on stderr).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from service.config import load_settings
from service.datasets import (
    EVENT_SUFFIXES,
    DatasetError,
    load_dataset,
    load_events,
    resolve_dataset_path,
)
from service.features import encoder_of
from service.learning import LearningError, Parts
from service.learning.risk import DEFAULT_LEVEL, DEFAULT_MAX_WEIGHT
from service.replay.errors import ReplayConfigError, ReplayError
from service.replay.options import (
    KERNEL_NAMES,
    SCALER_FITS,
    ReplayOptions,
    parse_algorithms,
    parse_params,
    served_options,
)
from service.replay.plot import plot_budget, plot_replay, plot_shadow, plot_window
from service.replay.protocol import SAMPLINGS
from service.replay.results import ReplayResult
from service.replay.runner import per_event_microseconds, replay, total_work
from service.replay.shadows import check_shadow_options, parse_shadow, replay_shadows

__all__ = ["build_parser", "main", "run_budget_study", "run_shadow_command"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse's own exits go through main()
        raise ReplayConfigError(message)


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ReplayConfigError(f"expected comma-separated numbers, got {text!r}") from None


def _load(path: Path, args: argparse.Namespace) -> tuple[Any, Any, int | None]:
    """The dataset's rows and labels; events encoded under the named model's declaration,
    with the index of its first hashed input (None for a dataset)."""
    events = args.format == "events" or (
        args.format is None and path.name.lower().removesuffix(".gz").endswith(EVENT_SUFFIXES)
    )
    if not events:
        if args.config is not None or args.model is not None:
            raise ReplayConfigError("--config and --model are for a file of events")
        X, y = load_dataset(path, format=args.format)
        return X, y, None
    try:
        settings = load_settings(args.config)
    except (ValueError, OSError) as exc:
        raise ReplayConfigError(f"the settings: {exc}") from None
    name = args.model or settings.default_model
    model = settings.models.get(name)
    if model is None:
        raise ReplayConfigError(f"no model named {name!r} (one of {sorted(settings.models)})")
    if model.fields is None:
        raise ReplayConfigError(f"model {name!r} declares no fields: events need its fields")
    X, y = load_events(path, encoder_of(model.fields))
    return X, y, model.fields.hashed_from


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ReplayConfigError(f"expected comma-separated integers, got {text!r}") from None


def _source_arguments(p: argparse.ArgumentParser) -> None:
    """How the dataset is read: its format, and for events the model that declares them."""
    p.add_argument(
        "--format",
        choices=["libsvm", "csv", "events"],
        default=None,
        help="default: guess (events: JSON lines of events as producers write them, each "
        "with its label, encoded under --model's fields; guessed from .jsonl / .ndjson)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="with events: the worker's settings file (JSON or TOML; default: ABSTAIN_CONFIG)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="with events: the model whose fields declaration encodes them (default: the "
        "settings' default_model)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``replay`` argument parser."""
    p = _Parser(
        prog="abstain replay",
        description="Prequential replay of a labelled dataset (Shah & Manwani 2020 protocol).",
    )
    p.add_argument("dataset", help="a file path, or a name under ABSTAIN_DATA_DIR (phishing)")
    _source_arguments(p)
    p.add_argument("--algorithms", default="dral,dsal,dsol", help="comma-separated")
    p.add_argument("--costs", default="0.1,0.25,0.4", help="rejection costs d in (0, 0.5)")
    p.add_argument("--runs", type=int, default=100, help="independent runs R")
    p.add_argument("--seed", type=int, default=0, help="run r uses SeedSequence(seed, (r,))")
    p.add_argument("--out", required=True, type=Path, help="output directory (created)")
    p.add_argument(
        "--figures",
        type=Path,
        default=None,
        help="directory of the PNG figures (created; default: --out)",
    )
    _order_arguments(p)
    p.add_argument(
        "--no-standardize",
        dest="standardize",
        action="store_false",
        help="feed raw features (default: online standardiser per run)",
    )
    p.add_argument(
        "--bare",
        action="store_true",
        help="the paper's learners (no adaptive wrapper, the paper's update, one standardiser "
        "of every event of the run; batched) instead of what a stream worker serves",
    )
    p.add_argument(
        "--scaler-fit",
        choices=SCALER_FITS,
        default=None,
        help="what the standardiser learns from: every event of a run (--bare's default, "
        "batched), each learner's labelled examples only (what a worker did before), or the "
        "moments of every event merged at each label, then the labelled rows (a worker now; "
        "the default)",
    )
    p.add_argument(
        "--no-intercept", dest="intercept", action="store_false", help="no constant feature"
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="learner hyperparameter (JSON value), e.g. gamma=2, dsal.eta=0.5, "
        'eta=\'{"kind": "inverse-time", "eta0": 1, "tau": 1000}\'; repeatable',
    )
    p.add_argument(
        "--kernel",
        choices=sorted(KERNEL_NAMES),
        default=None,
        help="run the kernel variants of the algorithms with this kernel",
    )
    p.add_argument(
        "--kernel-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="kernel parameter, e.g. degree=2, gamma=0.5, coef0=1; repeatable",
    )
    p.add_argument("--budget", type=int, default=None, help="support-set budget (kernels)")
    p.add_argument(
        "--budgets", default=None, help="budget study: comma-separated budgets (kernels)"
    )
    _label_budget_arguments(p)
    _adaptive_argument(p)
    _shadow_arguments(p)
    p.add_argument("--grid-points", type=int, default=100, help="points per curve in the CSV")
    p.add_argument("--no-plot", dest="plot", action="store_false", help="skip the PNG")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no bar")
    return p


def _order_arguments(p: argparse.ArgumentParser) -> None:
    """Which rows each run shows, in which order, and the window of a sequential run."""
    p.add_argument(
        "--trials",
        type=int,
        default=None,
        help="trials T per run (10000; with --sampling sequential the file's rows)",
    )
    p.add_argument(
        "--sampling",
        choices=SAMPLINGS,
        default="replacement",
        help="trials drawn with replacement (paper), as random permutations, or the file in "
        "its own order once (sequential: seeds change only the coins)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=500,
        help="with --sampling sequential: events of the windowed risk plotted",
    )


def _shadow_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--shadow",
        action="append",
        default=[],
        metavar="SPEC",
        help="a shadow model beside the champion (the one algorithm and cost given): "
        "ALGO[:KEY=VALUE,...] with cost, weighting (importance|none) and hyperparameters, "
        "e.g. dral or dsal:gamma=2; repeatable",
    )
    p.add_argument("--level", type=float, default=None, help="with --shadow: interval level (0.95)")
    p.add_argument(
        "--max-weight",
        type=float,
        default=None,
        help="with --shadow: cap of the weights 1/p (100, the stream's max_importance_weight)",
    )
    p.add_argument(
        "--min-labels",
        type=int,
        default=None,
        help="with --shadow: checkpoints with fewer labels do not count for coverage (0)",
    )
    p.add_argument(
        "--checkpoints", type=int, default=None, help="with --shadow: evenly spaced (100)"
    )


_SHADOW_ONLY = ("level", "max_weight", "min_labels", "checkpoints")


def run_shadow_command(
    args: argparse.Namespace, options: ReplayOptions, X: Any, y: Any, dataset: str
) -> list[Path]:
    """``replay --shadow``: run, print the coverage, write ``shadow.json``, ``shadow.csv``
    and (unless ``--no-plot``) ``shadow.png`` into ``--out``."""
    shadows = [parse_shadow(text) for text in args.shadow]
    check_shadow_options(options, shadows)
    with tqdm(
        total=options.runs * options.trials * (1 + len(shadows)),
        desc=f"replay {dataset} (shadows)",
        unit="trial",
        disable=not args.progress,
        file=sys.stderr,
        dynamic_ncols=True,
    ) as bar:

        def advance(n: int) -> None:
            bar.update(n)

        result = replay_shadows(
            X,
            y,
            options,
            shadows,
            level=DEFAULT_LEVEL if args.level is None else args.level,
            max_weight=DEFAULT_MAX_WEIGHT if args.max_weight is None else args.max_weight,
            min_labels=args.min_labels or 0,
            points=100 if args.checkpoints is None else args.checkpoints,
            dataset=dataset,
            progress=advance,
        )
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "shadow.json", out / "shadow.csv"]
    result.write_summary(written[0])
    result.write_curves(written[1])
    figures = _figures(args)
    if figures is not None:
        written.append(figures / "shadow.png")
        plot_shadow(result, written[-1])
    for track in result.tracks:
        print(
            f"{track.name} ({track.role}): true risk {track.true[-1].mean():.4f}, coverage "
            f"{track.coverage(result.min_labels):.3f}",
            file=sys.stderr,
        )
    return written


def _check_shadow_flags(args: argparse.Namespace) -> None:
    given = [f"--{n.replace('_', '-')}" for n in _SHADOW_ONLY if getattr(args, n) is not None]
    if given and not args.shadow:
        raise ReplayConfigError(f"{', '.join(given)}: only with --shadow")
    if args.shadow and args.budgets:
        raise ReplayConfigError("--shadow and --budgets (support-set study): run them separately")
    if args.checkpoints is not None and args.checkpoints < 1:
        raise ReplayConfigError(f"--checkpoints must be >= 1, got {args.checkpoints}")
    if args.min_labels is not None and args.min_labels < 0:
        raise ReplayConfigError(f"--min-labels must be >= 0, got {args.min_labels}")


def _options(args: argparse.Namespace, n_rows: int | None = None) -> ReplayOptions:
    kernel_params = parse_params(args.kernel_param)
    if args.kernel is None and kernel_params:
        raise ReplayConfigError("--kernel-param needs --kernel")
    kernel = None
    if args.kernel is not None:
        kernel = {"kind": KERNEL_NAMES[args.kernel], **kernel_params}
    algorithms = parse_algorithms(args.algorithms, kernel=kernel is not None)
    if (args.budget is not None or args.budgets) and not all(
        a.startswith("kernel-") for a in algorithms
    ):
        raise ReplayConfigError("--budget/--budgets apply to kernel algorithms; add --kernel")
    if args.grid_points < 2:
        raise ReplayConfigError(f"--grid-points must be >= 2, got {args.grid_points}")
    if args.bare and args.adaptive is not None:
        raise ReplayConfigError("--adaptive chooses parts of the served wrapper; not with --bare")
    fields: dict[str, Any] = {
        "algorithms": algorithms,
        "costs": tuple(_floats(args.costs)),
        "runs": args.runs,
        "trials": _trials(args, n_rows),
        "seed": args.seed,
        "sampling": args.sampling,
        "standardize": args.standardize,
        "intercept": args.intercept,
        "params": parse_params(args.param),
        "kernel": kernel,
        "budget": args.budget,
        "grid_points": args.grid_points,
        "label_budgets": tuple(_floats(args.label_budget)) if args.label_budget else (),
        "budget_params": parse_params(args.budget_param),
        "window": args.window,
    }
    if args.scaler_fit is not None:
        fields["scaler_fit"] = args.scaler_fit
    if args.bare:
        return ReplayOptions(**fields)
    if args.adaptive is not None:
        fields["adaptive"] = _adaptive_parts(args.adaptive)
    return served_options(**fields)


def _label_budget_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--label-budget",
        default=None,
        metavar="B1,B2,...",
        help="label budgets (fractions of the events in (0, 1]): each active algorithm also "
        "runs held to each budget, and asking random events at the same rate",
    )
    p.add_argument(
        "--budget-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="QueryBudget keyword for the budgeted runs: sharpness, horizon, explore, burst",
    )


def _adaptive_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--adaptive",
        nargs="?",
        const="detector,challengers,explore,steps",
        default=None,
        metavar="PARTS",
        help="the parts of the served adaptive wrapper that are on, comma-separated, of "
        "detector, challengers, explore, steps (default: all; '' for none)",
    )


def _adaptive_parts(value: str | None) -> Parts | None:
    """``--adaptive PARTS`` as :class:`~service.learning.Parts` (``None``: no wrapper)."""
    if value is None:
        return None
    names = {n.strip() for n in value.split(",") if n.strip()}
    known = {"detector", "challengers", "explore", "steps"}
    if not names <= known:
        raise ReplayConfigError(f"--adaptive takes parts of {sorted(known)}, got {value!r}")
    return Parts(**{name: name in names for name in sorted(known)})


def _trials(args: argparse.Namespace, n_rows: int | None) -> int:
    """``--trials``, else 10,000, else (sequential) every row of the file."""
    if args.trials is not None:
        return int(args.trials)
    return n_rows if args.sampling == "sequential" and n_rows is not None else 10_000


def _dataset_name(path: Path) -> str:
    return path.stem if path.suffix.lower() in {".csv", ".svm", ".libsvm", ".txt"} else path.name


def _figures(args: argparse.Namespace) -> Path | None:
    """Where the PNGs go (created), or ``None`` with ``--no-plot``."""
    if not args.plot:
        return None
    figures: Path = args.out if args.figures is None else args.figures
    figures.mkdir(parents=True, exist_ok=True)
    return figures


def write_outputs(
    result: ReplayResult, out: Path, *, figures: Path | None, window: int | None = None
) -> list[Path]:
    """Write ``summary.json`` and ``curves.csv`` into ``out`` and (unless ``figures`` is
    ``None``) ``DATASET.png`` into ``figures``, and with a ``window`` (a sequential run)
    ``window.png``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "summary.json", out / "curves.csv"]
    result.write_summary(written[0])
    result.write_curves(written[1])
    if figures is not None:
        written.append(figures / f"{result.dataset or 'replay'}.png")
        plot_replay(result, written[-1])
        if window is not None:
            written.append(figures / "window.png")
            plot_window(result, written[-1], window=window)
    return written


def run_budget_study(
    X: Any,
    y: Any,
    options: ReplayOptions,
    budgets: Sequence[int],
    *,
    dataset: str,
    progress: Any = None,
) -> list[dict[str, Any]]:
    """One kernel replay per budget; rows of ``budget.json``.

    Each row is a ``summary.json`` result plus ``budget`` and ``us_per_event`` (mean time
    of one ``decide`` + ``update`` when queried, over every trial of every run).
    """
    rows: list[dict[str, Any]] = []
    for budget in budgets:
        opts = ReplayOptions(**{**options.__dict__, "budget": budget})
        result = replay(X, y, opts, dataset=dataset, progress=progress)
        for series in result.series:
            row = {"budget": budget, **series.summary()}
            row["us_per_event"] = round(per_event_microseconds(series, opts.trials), 2)
            rows.append(row)
    return rows


def _write_budget(
    rows: list[dict[str, Any]],
    out: Path,
    options: ReplayOptions,
    *,
    figures: Path | None,
    dataset: str,
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "dataset": dataset,
        "runs": options.runs,
        "trials": options.trials,
        "results": rows,
        "settings": options.settings(),
    }
    paths = [out / "budget.json", out / "budget.csv"]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    with paths[1].open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    if figures is not None:
        paths.append(figures / "budget.png")
        kernel = options.kernel or {}
        plot_budget(
            rows,
            paths[-1],
            title=f"{dataset}: risk vs budget ({kernel.get('kind')} "
            f"kernel, {options.runs} runs x {options.trials} trials)",
        )
    return paths


def main(argv: list[str]) -> int:
    """Entry point of ``abstain replay``; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except ReplayConfigError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        _check_shadow_flags(args)
        options = _options(args)
        if args.shadow:  # the specs are read before the dataset: a typo fails fast
            check_shadow_options(options, [parse_shadow(text) for text in args.shadow])
        budgets = _ints(args.budgets) if args.budgets else []
        if any(b < 1 for b in budgets):
            raise ReplayConfigError(f"budgets must be >= 1, got {budgets}")
        if budgets and options.label_budgets:
            raise ReplayConfigError(
                "--budgets (support-set study) and --label-budget: run them separately"
            )
        path = resolve_dataset_path(args.dataset)
        X, y, hashed_from = _load(path, args)
        if args.sampling == "sequential":  # every row once unless --trials says fewer
            options = _options(args, n_rows=len(y))
        if hashed_from is not None:  # the served preprocessing of the model's declaration
            options = dataclasses.replace(options, hashed_from=hashed_from)
        dataset = _dataset_name(path)
        if args.shadow:
            written = run_shadow_command(args, options, X, y, dataset)
            for out in written:
                print(out)
            return 0
        total = total_work(options) * max(len(budgets), 1)
        with tqdm(
            total=total,
            desc=f"replay {dataset}",
            unit="trial",
            disable=not args.progress,
            file=sys.stderr,
            dynamic_ncols=True,
        ) as bar:

            def advance(n: int) -> None:
                bar.update(n)

            if budgets:
                rows = run_budget_study(X, y, options, budgets, dataset=dataset, progress=advance)
            else:
                result = replay(X, y, options, dataset=dataset, progress=advance)
        if budgets:
            written = _write_budget(
                rows, args.out, options, figures=_figures(args), dataset=dataset
            )
        else:
            window = options.window if options.sampling == "sequential" else None
            written = write_outputs(result, args.out, figures=_figures(args), window=window)
            print(
                f"{dataset}: {options.runs} runs x {options.trials} trials in "
                f"{result.seconds:.1f} s",
                file=sys.stderr,
            )
    except (DatasetError, ReplayError, LearningError, OSError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
