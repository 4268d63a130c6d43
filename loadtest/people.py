"""The replay with noisy people: what second opinions, a reviewer and undo buy, at what work.

Usage: ``python loadtest/people.py [--runs 5] [--labellers noise=0.05,0.2]
[--second-opinions share=0.05,min_weight=20,confident_margin=1] [--reviewer delay=20]
[--undo share=0.5,delay=5] [--out loadtest/results/replay/people] [--figures DIR] [--jobs 2]``.
Prints one table and writes ``people.md`` (the table and the command), ``people.json``
(every run's measures and the settings) and ``people.png`` to ``--out``.

Each run of each stream goes through the stack a stream worker runs for one model
(:mod:`service.replay.people`: the scorer's budgeted decision, the learner's
``LabelJoiner`` in memory, corrections through its own path), labelled by a team of
people (:class:`service.replay.people.People`). Arms, on the same events, query coins and
people's draws (common random numbers):

* ``perfect labels``: every answer right (the floor);
* ``noise R``: each labeller answers wrong with probability R, nobody checks;
* ``+ second opinions``: the label desk's rule (``desk.second_opinions``; by default the
  desk's defaults) shows an answer to a second labeller (never the first); a disagreement
  goes to the reviewer, who errs at a quarter of the labellers' rate and decides
  ``--reviewer delay`` labels later with a correction (role reviewer);
* ``+ every answer checked``: the same with ``share = 1``: every answer gets a second
  opinion (what review can buy at most);
* ``+ authors undo``: no second opinions; an author notices a share of their own wrong
  answers and changes them ``--undo delay`` labels later (role author).

Streams (``d = 0.25``; the model: DSAL held to a ``--budget`` of 10 % of the events,
inside the adaptive wrapper, the worker's defaults; run ``r`` of ``--runs``): Phishing and
svmguide1 (``python -m service data fetch``) through the replay's own trials (``plan_trials(n, runs,
trials, seed=0)``, drawn with replacement; 5,000 a run), and the label flip
(:mod:`service.replay.streams`: 6,000 events, every label negated at 2,000, stream seed
``r``, no label noise of its own: the people are the only noise). "risk after N": the
risk of the events after the first ``--after`` (2,000: on the label flip, after the
change). The runs are shorter than the peers benchmark's because every label takes the
learner's whole path (on Phishing about 10 ms: the model state is read, taught and encoded
again) and a correction applies up to ``review_delay`` + 20 labels again. The people's
draws are ``Draws.draw(events, seed=0, run=r)``. Table cells: median over runs [min-max].
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.config import LabelBudget, ModelConfig, SecondOpinions  # noqa: E402
from service.datasets import load_dataset, resolve_dataset_path  # noqa: E402
from service.replay.people import Draws, People, measures, simulate, table  # noqa: E402
from service.replay.protocol import plan_trials  # noqa: E402
from service.replay.streams import DRIFT_STREAMS  # noqa: E402

STREAMS = ("phishing", "svmguide1", "label-flip")
ARMS = ("noisy", "review", "every", "undo")


@dataclass(frozen=True)
class Stream:
    """One run of one stream: raw rows in order, true labels, the query coins."""

    name: str
    run: int
    X: np.ndarray
    y: np.ndarray
    coins: np.ndarray


@dataclass(frozen=True)
class Arm:
    """A row of the table: a name and the people."""

    name: str
    people: People


def streams(args: argparse.Namespace) -> Iterator[Stream]:
    """Every (stream, run) of the benchmark."""
    for name in args.streams:
        if name in DRIFT_STREAMS:
            for r in range(args.runs):
                s = DRIFT_STREAMS[name](n=args.events, change=args.change, seed=r, noise=0.0)
                rng = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(r,)))
                yield Stream(name, r, s.X, s.y, rng.random(s.n))
            continue
        X, y = load_dataset(resolve_dataset_path(name))
        plan = plan_trials(X.shape[0], args.runs, args.trials, seed=0)
        for r in range(args.runs):
            rows = plan.indices[r]
            yield Stream(Path(name).name, r, X[rows], y[rows], plan.coins[r])


def _percent(rate: float | tuple[float, ...]) -> str:
    if isinstance(rate, tuple):
        return "noise " + "/".join(f"{r:.0%}" for r in rate).replace("%", " %")
    return f"noise {rate:.0%}".replace("%", " %")


def arms(args: argparse.Namespace) -> list[Arm]:
    """The table's rows for one stream, in order."""
    out = [Arm("perfect labels", People(team=args.team))]
    review = {
        "reviewer_noise": args.reviewer.get("noise"),
        "review_delay": int(args.reviewer.get("delay", 20)),
    }
    for level in args.noise:
        name = _percent(level)
        base = People(noise=level, team=args.team)
        if "noisy" in args.arms:
            out.append(Arm(name, base))
        if "review" in args.arms:
            rule = args.second_opinions
            out.append(
                Arm(
                    f"{name} + second opinions",
                    People(noise=level, team=args.team, second_opinions=rule, **review),
                )
            )
        if "every" in args.arms:
            every = args.second_opinions.model_copy(update={"share": 1.0})
            out.append(
                Arm(
                    f"{name} + every answer checked",
                    People(noise=level, team=args.team, second_opinions=every, **review),
                )
            )
        if "undo" in args.arms and args.undo.get("share", 0.0) > 0:
            share, delay = float(args.undo["share"]), int(args.undo.get("delay", 5))
            undo = f"{share:.0%}".replace("%", " %")
            out.append(
                Arm(
                    f"{name} + authors undo {undo}",
                    People(noise=level, team=args.team, undo=share, undo_delay=delay),
                )
            )
    return out


def _config(args: argparse.Namespace, n_features: int) -> ModelConfig:
    return ModelConfig(
        algorithm=args.algorithm,
        cost=args.cost,
        n_features=n_features,
        label_budget=LabelBudget(fraction=args.budget),
        seed=0,
    )


def _one(stream: Stream, arm: Arm, config: ModelConfig, after: int) -> dict[str, Any]:
    team = len(arm.people.rates)  # a level of per-person rates has its own team
    draws = Draws.draw(stream.y.shape[0], seed=0, run=stream.run, team=team)
    run = simulate(stream.X, stream.y, stream.coins, config, arm.people, draws)
    return measures(run, after=after)


class _Inline:
    """An executor that runs each job at once, in this process (``--jobs 1``)."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(fn(*args))
        return done


def run_all(args: argparse.Namespace) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """``{stream: {arm: [measures of each run]}}``, in table order."""
    rows = arms(args)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) if args.jobs > 1 else _Inline() as pool:
        futures = []
        for stream in streams(args):
            by_arm = results.setdefault(stream.name, {a.name: [] for a in rows})
            config = _config(args, stream.X.shape[1])
            for arm in rows:
                job = pool.submit(_one, stream, arm, config, args.after)
                futures.append((stream, arm, by_arm[arm.name], job))
        for stream, arm, into, job in futures:
            into.append(job.result())
            if args.progress:
                print(
                    f"{stream.name} run {stream.run}, {arm.name}: {into[-1]['seconds']:.1f} s",
                    file=sys.stderr,
                )
    return results


def figure(results: dict[str, dict[str, list[dict[str, Any]]]], path: Path, after: int) -> None:
    """Per stream: the risk after ``after`` events against the people's extra work, one
    point per arm (median, with the range over runs), one colour per noise level."""
    import matplotlib  # noqa: PLC0415 - only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.4), squeeze=False)
    markers = {"second opinions": "s", "every answer": "D", "undo": "^"}
    colours: dict[str, str] = {}
    for ax, (stream, by_arm) in zip(axes[0], results.items(), strict=True):
        for arm, runs in by_arm.items():
            risk = [r["risk_after"] for r in runs]
            mid = statistics.median(risk)
            if arm == "perfect labels":
                ax.axhline(mid, color="black", ls=":", lw=1, label=arm)
                continue
            level = arm.split(" + ")[0]
            colour = colours.setdefault(level, f"C{len(colours)}")
            marker = next((m for k, m in markers.items() if k in arm), "o")
            work = statistics.median(r["extra_work"] for r in runs)
            ax.errorbar(
                [work],
                [mid],
                yerr=[[mid - min(risk)], [max(risk) - mid]],
                fmt=marker,
                color=colour,
                capsize=3,
                label=arm,
            )
        ax.set_title(f"{stream}: risk after {after:,} events")
        ax.set_xlabel("people's extra answers per label asked")
        ax.set_ylabel("risk (0-d-1, d = 0.25)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _spec(text: str) -> dict[str, list[str]]:
    """``"noise=0.05,0.2,team=4"`` -> ``{"noise": ["0.05", "0.2"], "team": ["4"]}``: a
    value without a key continues the key before it."""
    out: dict[str, list[str]] = {}
    key = None
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if sep:
            key = name.strip().replace("-", "_")
            out[key] = [value.strip()]
        elif key is None:
            raise argparse.ArgumentTypeError(f"expected KEY=VALUE first, got {part!r}")
        else:
            out[key].append(part)
    return out


def _numbers(text: str, known: tuple[str, ...]) -> dict[str, float]:
    spec = _spec(text)
    unknown = set(spec) - set(known)
    if unknown or any(len(v) != 1 for v in spec.values()):
        raise argparse.ArgumentTypeError(f"expected one number for each of {known}, got {text!r}")
    try:
        return {k: float(v[0]) for k, v in spec.items()}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def labellers(text: str) -> dict[str, Any]:
    """``--labellers noise=0.05,0.2[,team=4]``: the noise levels compared (a level
    ``0.02/0.3`` gives each labeller a rate: a team of two) and the team's size."""
    spec = _spec(text)
    if set(spec) - {"noise", "team"} or "noise" not in spec:
        raise argparse.ArgumentTypeError(f"expected noise=R1,R2,...[,team=N], got {text!r}")
    try:
        levels = [tuple(float(r) for r in v.split("/")) for v in spec["noise"]]
        team = int(spec.get("team", ["4"])[0])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    noise = [lv[0] if len(lv) == 1 else lv for lv in levels]
    return {"noise": noise, "team": team}


def second_opinions(text: str) -> SecondOpinions:
    """``--second-opinions share=...,min_weight=...,confident_margin=...``."""
    values = _numbers(text, ("share", "min_weight", "confident_margin"))
    try:
        return SecondOpinions(**values)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs per stream (default 5)")
    p.add_argument("--out", type=Path, default=Path("loadtest/results/replay/people"))
    p.add_argument(
        "--figures", type=Path, default=None, help="directory of people.png (default: --out)"
    )
    p.add_argument(
        "--streams",
        type=lambda t: t.split(","),
        default=list(STREAMS),
        help="datasets (a path or a name under ABSTAIN_DATA_DIR) and drift "
        f"streams ({', '.join(DRIFT_STREAMS)}); default {','.join(STREAMS)}",
    )
    p.add_argument(
        "--labellers",
        type=labellers,
        default=labellers("noise=0.05,0.2"),
        metavar="noise=R1,R2,...[,team=N]",
        help="the labellers' error rates compared (default 0.05,0.2; team 4)",
    )
    p.add_argument(
        "--second-opinions",
        type=second_opinions,
        default=SecondOpinions(),
        metavar="share=S,min_weight=W,confident_margin=M",
        help="the desk's rule (default: the desk's defaults)",
    )
    p.add_argument(
        "--reviewer",
        type=lambda t: _numbers(t, ("noise", "delay")),
        default={},
        metavar="noise=R,delay=L",
        help="the reviewer's error rate (default: a quarter of the labellers') "
        "and the labels learned before a review lands (20)",
    )
    p.add_argument(
        "--undo",
        type=lambda t: _numbers(t, ("share", "delay")),
        default={"share": 0.5, "delay": 5.0},
        metavar="share=S,delay=L",
        help="share of their wrong answers authors change, labels later (0.5, 5)",
    )
    p.add_argument(
        "--arms",
        type=lambda t: t.split(","),
        default=list(ARMS),
        help=f"rows besides perfect labels: some of {','.join(ARMS)}",
    )
    p.add_argument("--budget", type=float, default=0.1, help="label budget (of the events)")
    p.add_argument("--algorithm", default="dsal")
    p.add_argument("--cost", type=float, default=0.25)
    p.add_argument("--trials", type=int, default=5_000, help="events of a dataset run")
    p.add_argument("--events", type=int, default=6_000, help="drift stream length")
    p.add_argument("--change", type=int, default=2_000, help="event of the drift's change")
    p.add_argument("--after", type=int, default=2_000, help="risk after N: this N")
    p.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    p.add_argument("--no-figure", dest="plot", action="store_false")
    p.add_argument("--replot", action="store_true", help="redraw from --out's people.json")
    p.add_argument("--quiet", dest="progress", action="store_false", help="no progress lines")
    return p


def _rows(results: dict[str, dict[str, list[dict[str, Any]]]]) -> list[Any]:
    return [(s, a, runs) for s, by_arm in results.items() for a, runs in by_arm.items()]


def _figures(args: argparse.Namespace) -> Path:
    """Where the figure goes (created): ``--figures``, or ``--out``."""
    figures: Path = args.out if args.figures is None else args.figures
    figures.mkdir(parents=True, exist_ok=True)
    return figures


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    args.noise, args.team = args.labellers["noise"], args.labellers["team"]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        saved = json.loads((out / "people.json").read_text(encoding="utf-8"))
        figure(saved["results"], _figures(args) / "people.png", saved["settings"]["after"])
        return 0
    tic = time.perf_counter()
    results = run_all(args)
    seconds = time.perf_counter() - tic
    text = table(_rows(results)).replace("risk after N", f"risk after {args.after:,}")
    command = "python loadtest/people.py " + " ".join(argv)
    print(text)
    settings = {k: v for k, v in vars(args).items() if k not in ("labellers", "out")}
    settings["second_opinions"] = args.second_opinions.model_dump()
    settings["people"] = {a.name: a.people.settings() for a in arms(args)}
    (out / "people.json").write_text(
        json.dumps(
            {
                "command": command.strip(),
                "seconds": round(seconds, 1),
                "settings": settings,
                "results": results,
            },
            indent=1,
            default=str,
        )
        + "\n",
        encoding="utf-8",
    )
    (out / "people.md").write_text(
        f"`{command.strip()}` ({seconds / 60:.0f} min on this "
        f"machine, {args.jobs} processes)\n\n{text}\n",
        encoding="utf-8",
    )
    if args.plot:
        figure(results, _figures(args) / "people.png", args.after)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
