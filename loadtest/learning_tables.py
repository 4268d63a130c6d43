"""Markdown tables of the learning benchmark's results, before and after, with the ratios
the goals are read from (``docs/results/learning.md`` is made of them).

Usage: ``python loadtest/learning_tables.py [--results loadtest/results/learning]``. Reads
``<group>-before.json`` (the served stack and the bare learner of the code before, and the
peers) and ``<group>-after.json`` (the served stack now) written by
``loadtest/learning_bench.py --tag=-before`` / ``--tag=-after``; prints one table per
stream: a row per model, a column per budget, cells the median risk over runs [min-max],
then the ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BUDGETS = (" @5%", " @10%", " @20%", ", all labels")
HEADS = ("5 %", "10 %", "20 %", "every label")
SERVED, BARE = "abstain served", "abstain bare"
#: the peers each budget is compared with (the best of them, per stream and budget)
BUDGET_PEERS = (
    "River entropy sampler",
    "skactiveml VariableUncertainty",
    "skactiveml Split",
    "skactiveml PAL",
)
FULL_PEERS = ("River LR (best step)", "River LR (step 0.1)")


def load(results: Path, group: str) -> tuple[dict[str, Any], dict[str, Any]]:
    before = json.loads((results / f"{group}-before.json").read_text())["results"]
    after = json.loads((results / f"{group}-after.json").read_text())["results"]
    return before, after


def median(runs: list[dict[str, Any]]) -> float:
    return float(statistics.median(r["risk"] for r in runs))


def cell(runs: list[dict[str, Any]] | None) -> str:
    if not runs:
        return ""
    risks = [r["risk"] for r in runs]
    return f"{statistics.median(risks):.4f} [{min(risks):.4f}-{max(risks):.4f}]"


def models(before: dict[str, Any]) -> list[str]:
    """The model names of a results file, in its order, without the budget."""
    names: list[str] = []
    for label in before:
        name = next((label[: -len(b)] for b in BUDGETS if label.endswith(b)), label)
        if name not in names:
            names.append(name)
    return names


def best_peer(before: dict[str, Any], stream: str, budget: str) -> tuple[str, float] | None:
    peers = FULL_PEERS if budget == ", all labels" else BUDGET_PEERS
    found = [
        (p, median(before[p + budget][stream]))
        for p in peers
        if stream in before.get(p + budget, {})
    ]
    return min(found, key=lambda f: f[1]) if found else None


def table(group: str, stream: str, before: dict[str, Any], after: dict[str, Any]) -> str:
    rows = [
        ("abstain served, now", after, SERVED),
        ("abstain served, before", before, SERVED),
        ("abstain bare (the paper's learner)", before, BARE),
    ]
    rows += [(p, before, p) for p in models(before) if p not in (SERVED, BARE)]
    present = [i for i, b in enumerate(BUDGETS) if stream in after.get(SERVED + b, {})]
    lines = [
        "| model | " + " | ".join(HEADS[i] for i in present) + " |",
        "|---|" + "---|" * len(present),
    ]
    for title, source, name in rows:
        cells = [cell(source.get(name + BUDGETS[i], {}).get(stream)) for i in present]
        if any(cells):
            lines.append(f"| {title} | " + " | ".join(cells) + " |")
    now = [median(after[SERVED + BUDGETS[i]][stream]) for i in present]
    then = [median(before[SERVED + BUDGETS[i]][stream]) for i in present]
    lines.append(
        "| *now / before* | "
        + " | ".join(f"*{a / b:.3f}*" for a, b in zip(now, then, strict=True))
        + " |"
    )
    ratios = []
    for i, a in zip(present, now, strict=True):
        peer = best_peer(before, stream, BUDGETS[i])
        ratios.append("" if peer is None else f"*{a / peer[1]:.2f} ({peer[0]})*")
    if any(ratios):
        lines.append("| *now / best peer* | " + " | ".join(ratios) + " |")
    return f"#### {stream} ({group})\n\n" + "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--results", type=Path, default=HERE / "results" / "learning")
    p.add_argument(
        "--groups",
        type=lambda t: t.split(","),
        default=["short", "long", "replay", "elec2", "agrawal"],
    )
    args = p.parse_args(argv)
    for group in args.groups:
        before, after = load(args.results, group)
        streams = list(dict.fromkeys(s for by in after.values() for s in by))
        for stream in streams:
            print(table(group, stream, before, after), end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
