"""Step-size / slope sweep behind the learners' default steps (docs/results/replay/index.md).

Runs the paper's protocol (3 costs, R runs x T trials, online standardiser + intercept)
for every combination of an inverse-time step ``eta_t = eta0 / (1 + t / tau)`` and, for
DSAL/DSOL, the sigmoid slope ``gamma``; DRAL ignores ``gamma`` and runs at ``gamma = 1``
only. Writes one CSV row per (configuration, algorithm, cost) and prints, per algorithm,
the configurations ranked by risk averaged over the three costs.

    python loadtest/replay/sweep.py phishing --eta0 0.02,0.05,0.07,0.1,0.2,0.5 \\
        --out loadtest/results/replay/phishing/sweep.csv
"""

from __future__ import annotations

import argparse
import csv
import itertools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.datasets import load_dataset, resolve_dataset_path  # noqa: E402
from service.replay import ReplayOptions, replay  # noqa: E402


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("dataset")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--trials", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eta0", required=True)
    p.add_argument("--tau", default="100,1000,10000")
    p.add_argument("--gamma", default="0.5,1,2")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--top", type=int, default=6)
    args = p.parse_args(argv)
    X, y = load_dataset(resolve_dataset_path(args.dataset))
    grid = itertools.product(
        [float(v) for v in args.eta0.split(",")],
        [float(v) for v in args.tau.split(",")],
        [float(v) for v in args.gamma.split(",")],
    )
    rows: list[dict[str, Any]] = []
    for eta0, tau, gamma in grid:
        algorithms = ("dral", "dsal", "dsol") if gamma == 1.0 else ("dsal", "dsol")
        eta = {"kind": "inverse-time", "eta0": eta0, "tau": tau}
        options = ReplayOptions(
            algorithms=algorithms,
            runs=args.runs,
            trials=args.trials,
            seed=args.seed,
            params={"eta": eta, "gamma": gamma},
        )
        result = replay(X, y, options, dataset=args.dataset)
        for series in result.series:
            entry = series.summary()
            rows.append({"eta0": eta0, "tau": tau, "gamma": gamma, **entry})
        print(f"eta0={eta0:g} tau={tau:g} gamma={gamma:g}: {result.seconds:.1f} s", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{v:.5g}" if isinstance(v, float) else v for k, v in row.items()})
    by_config: dict[tuple[str, float, float, float], list[dict[str, Any]]] = {}
    for row in rows:
        key = (str(row["algorithm"]), float(row["eta0"]), float(row["tau"]), float(row["gamma"]))
        by_config.setdefault(key, []).append(row)
    for algorithm in ("dral", "dsal", "dsol"):
        ranked = sorted(
            (k for k in by_config if k[0] == algorithm),
            key=lambda k: sum(float(r["risk_mean"]) for r in by_config[k]),
        )
        print(f"\n{algorithm}: eta0 tau gamma | mean risk | mean asked | risk at d = 0.1/0.25/0.4")
        for key in ranked[: args.top]:
            entries = by_config[key]
            risk = [float(r["risk_mean"]) for r in entries]
            asked = [float(r["asked"]) for r in entries]
            print(
                f"  {key[1]:<7g} {key[2]:<6g} {key[3]:<4g} | {sum(risk) / 3:.4f} | "
                f"{sum(asked) / 3:.3f} | " + " / ".join(f"{v:.4f}" for v in risk)
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
