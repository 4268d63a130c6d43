"""Markdown tables of a replay run with ``--label-budget`` (for ``docs/results/replay/index.md``).

Usage: ``python loadtest/replay/budget_tables.py loadtest/results/replay/phishing``

Reads ``summary.json`` and ``curves.csv`` of the directory and prints, per label budget and
cost: the final risk (mean +/- std over runs) and the fraction asked of DSAL and DRAL held
to the budget and of the random-sampling baselines, the ratio of budgeted DSAL's risk to
DSOL's (every label), and the same ratio over the second half of the trials (from the
cumulative curves: risk between the grid point nearest T/2 and T).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any


def _rows(directory: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    summary = json.loads((directory / "summary.json").read_text())
    return summary, summary["results"]


def _late_risk(directory: Path, trials: int) -> dict[tuple[str, str, str, str], float]:
    """Mean risk over trials (t0, T], t0 the grid point nearest T/2, per series."""
    curves: dict[tuple[str, str, str, str], list[tuple[int, float]]] = {}
    with (directory / "curves.csv").open() as handle:
        for r in csv.DictReader(handle):
            key = (r["algorithm"], r["label_budget"], r["sampling"], r["cost"])
            curves.setdefault(key, []).append((int(r["t"]), float(r["risk_mean"])))
    out = {}
    for key, points in curves.items():
        t0, r0 = min(points, key=lambda p: abs(p[0] - trials // 2))
        t1, r1 = points[-1]
        out[key] = (r1 * t1 - r0 * t0) / (t1 - t0)
    return out


def _cell(row: dict[str, Any]) -> str:
    return f"{row['risk_mean']:.4f} ± {row['risk_std']:.4f} ({row['asked']:.3f})"


def main(directory: Path) -> None:
    summary, rows = _rows(directory)
    late = _late_risk(directory, summary["trials"])

    def find(algorithm: str, budget: float | None, sampling: str, cost: float) -> dict[str, Any]:
        (row,) = [
            r
            for r in rows
            if (r["algorithm"], r["label_budget"], r["sampling"], r["cost"])
            == (algorithm, budget, sampling, cost)
        ]
        return row

    def late_of(algorithm: str, budget: float | None, sampling: str, cost: float) -> float:
        return late[(algorithm, "" if budget is None else f"{budget:g}", sampling, f"{cost:g}")]

    costs = summary["settings"]["costs"]
    print(
        "| budget | d | DSAL budgeted | DSAL random | DRAL budgeted | DRAL random "
        "| DSAL budgeted / DSOL | same, 2nd half |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for budget in summary["settings"]["label_budgets"]:
        for cost in costs:
            dsol = find("dsol", None, "own", cost)
            own = find("dsal", budget, "budget", cost)
            cells = [
                _cell(own),
                _cell(find("dsal", budget, "random", cost)),
                _cell(find("dral", budget, "budget", cost)),
                _cell(find("dral", budget, "random", cost)),
            ]
            ratio = own["risk_mean"] / dsol["risk_mean"]
            late_dsol = late_of("dsol", None, "own", cost)
            late_ratio = late_of("dsal", budget, "budget", cost) / late_dsol
            print(
                f"| {budget:.0%} | {cost:g} | "
                + " | ".join(cells)
                + f" | {ratio:.2f} | {late_ratio:.2f} |"
            )
    print()
    print("| d | DSOL (every label) | DSAL (own rule) | DRAL (own rule) | DSOL, 2nd half |")
    print("|---|---|---|---|---|")
    for cost in costs:
        cells = [_cell(find(a, None, "own", cost)) for a in ("dsol", "dsal", "dral")]
        late_dsol = late_of("dsol", None, "own", cost)
        print(f"| {cost:g} | " + " | ".join(cells) + f" | {late_dsol:.4f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
