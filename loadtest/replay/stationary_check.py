"""Does stationary data pay for the adaptive wrapper? The paper's protocol, before/after.

Usage::

    python loadtest/replay/stationary_check.py [--runs 100] [--costs 0.25] [--fit events] \\
        [--out loadtest/results/replay/peers/stationary.md]

For Phishing and svmguide1, ``R`` runs of 10,000 trials drawn with replacement (the
replay's own plan, seed 0: the trials and coins of ``abstain replay``), DSAL held to label
budgets of 5, 10 and 20 % and DSOL with every label, each learner alone (the bare learner)
and as a stream worker serves it by default (``serving_learner`` with every part of
:class:`service.learning.adaptive.Adaptive` on, tracking steps included; ``--parts`` names
the parts on), on the same trials and coins. ``--fit events``: the online standardiser
of ``docs/results/replay/index.md``'s tables; ``--fit labels``: the one a stream worker uses
(labelled examples only). Prints a markdown
table of the mean final risk (std over runs), the ratio after / before, and the changes the
wrapper detected and acted on over all runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.datasets import load_dataset, resolve_dataset_path  # noqa: E402
from service.learning import Budgeted, Parts  # noqa: E402
from service.replay.features import RunFeatures  # noqa: E402
from service.replay.options import ReplayOptions  # noqa: E402
from service.replay.prequential import run_stream  # noqa: E402
from service.replay.protocol import plan_trials  # noqa: E402
from service.replay.results import Variant  # noqa: E402
from service.replay.sequential import variant_learner  # noqa: E402

SETTINGS: tuple[float | None, ...] = (0.05, 0.1, 0.2, None)


def model(variant: Variant, cost: float, n: int, parts: Parts | None) -> Any:
    options = ReplayOptions(algorithms=(variant.algorithm,), costs=(cost,), seed=0, adaptive=parts)
    return variant_learner(variant, cost, n, options)


def check(name: str, runs: int, cost: float, fit: str, parts: Parts) -> list[str]:
    X, y = load_dataset(resolve_dataset_path(name))
    plan = plan_trials(X.shape[0], runs, 10_000, seed=0)
    features = RunFeatures(X, plan, standardize=True, intercept=True)
    rows = []
    for budget in SETTINGS:
        variant = Variant("dsal", budget, "budget") if budget else Variant("dsol")
        risks: dict[bool, list[float]] = {False: [], True: []}
        changes = takeovers = 0
        for r in range(runs):
            idx = plan.indices[r]
            for adaptive in (False, True):
                m = model(variant, cost, features.n_features, parts if adaptive else None)
                if fit == "labels":
                    trace = run_stream(
                        m, X[idx], y[idx], plan.coins[r], cost, pipeline=features.pipeline()
                    )
                else:
                    trace = run_stream(m, features.run(r), y[idx], plan.coins[r], cost)
                risks[adaptive].append(trace.risk)
                inner = m.learner if isinstance(m, Budgeted) else m
                if adaptive:
                    changes += inner.changes_detected
                    takeovers += inner.takeovers
        before, after = np.array(risks[False]), np.array(risks[True])
        setting = f"DSAL @{budget:.0%}" if budget else "DSOL, all labels"
        rows.append(
            f"| {name} | {setting} | {cost:g} | {before.mean():.4f} ± {before.std():.4f} | "
            f"{after.mean():.4f} ± {after.std():.4f} | {after.mean() / before.mean():.4f} | "
            f"{changes} / {takeovers} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--costs", default="0.25", help="comma-separated rejection costs")
    parser.add_argument("--fit", choices=("events", "labels"), default="events")
    parser.add_argument("--datasets", default="phishing,svmguide1")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument(
        "--parts",
        default="detector,challengers,explore,steps",
        help="the wrapper's parts on (comma-separated; default all)",
    )
    args = parser.parse_args()
    names = {p.strip() for p in args.parts.split(",") if p.strip()}
    parts = Parts(**{p: p in names for p in ("detector", "challengers", "explore", "steps")})
    started = time.perf_counter()
    head = [
        f"Standardiser fitted on {args.fit}; {args.runs} runs x 10,000 trials, seed 0; "
        f"parts on: {args.parts}.",
        "",
        "| dataset | learner | d | today: risk ± std | adaptive: risk ± std | ratio | "
        "changes / takeovers (all runs) |",
        "|---|---|---|---|---|---|---|",
    ]
    print("\n".join(head), flush=True)
    rows = []
    for name in args.datasets.split(","):
        for cost in (float(c) for c in args.costs.split(",")):
            rows += check(name, args.runs, cost, args.fit, parts)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(head + rows) + "\n")
    print(f"({time.perf_counter() - started:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
