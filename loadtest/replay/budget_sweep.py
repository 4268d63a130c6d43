"""Sweep of the QueryBudget settings behind the defaults (``docs/results/replay/index.md``,
"Label budgets"): sharpness k and horizon H, on the paper's protocol.

Usage::

    python loadtest/replay/budget_sweep.py phishing \\
        --out loadtest/results/replay/phishing/budget-sweep.csv

One replay per setting (20 runs x 10,000 trials, seed 0, DRAL and DSAL, d in {0.1, 0.25,
0.4}, label budgets 2 / 10 / 20 %); writes one CSV row per (setting, algorithm, budget,
cost) with the final risk and the fraction asked of the budgeted learner.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from service.datasets import load_dataset, resolve_dataset_path  # noqa: E402
from service.replay import ReplayOptions, replay  # noqa: E402

SETTINGS = [{"sharpness": k, "horizon": 200} for k in (1.0, 2.0, 4.0, 8.0)] + [
    {"sharpness": 4.0, "horizon": h} for h in (100, 500, 1000)
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    X, y = load_dataset(resolve_dataset_path(args.dataset))
    rows = []
    for setting in SETTINGS:
        options = ReplayOptions(
            algorithms=("dral", "dsal"),
            runs=args.runs,
            label_budgets=(0.02, 0.1, 0.2),
            budget_params=setting,
        )
        for s in replay(X, y, options).series:
            if s.sampling == "budget":
                summary = s.summary()
                rows.append(
                    {
                        **setting,
                        "algorithm": s.algorithm,
                        "label_budget": s.label_budget,
                        "cost": s.cost,
                        "risk_mean": round(summary["risk_mean"], 5),
                        "risk_std": round(summary["risk_std"], 5),
                        "asked": round(summary["asked"], 4),
                    }
                )
        print(setting, file=sys.stderr)
    with args.out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
