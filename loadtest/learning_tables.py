"""Markdown tables of the learning benchmark's results, before and after, with the ratios
the goals are read from (``docs/results/learning.md`` is made of them).

Usage: ``python loadtest/learning_tables.py [--results loadtest/results/learning]
[--now -after] [--previous TAG[:NAME]]... [--peers TAG]``. Reads ``<group>-before.json``
(the served stack and the bare learner of the code before, and the peers) and
``<group><now>.json`` (the served stack now) written by ``loadtest/learning_bench.py
--tag=-before`` / ``--tag=-after``; with each ``--previous``, ``<group><TAG>.json`` (the
served stack of an earlier round, a row and a ratio of its own, named ``NAME``, "round 1"
by default); with ``--peers``, ``<group><peers>.json`` (the peers run again, the
scikit-activeml ones held to the budget as River's entropy sampler is: rows of their own
and the ratio to the best of them). Prints one table per stream: a row per model, a column
per budget, cells the median risk over runs [min-max], then the ratios.
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


def load(results: Path, group: str, tag: str) -> dict[str, Any]:
    """The results of ``<group><tag>.json`` (empty when there is none)."""
    path = results / f"{group}{tag}.json"
    return json.loads(path.read_text())["results"] if path.exists() else {}


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
    """The peer with the lowest median risk at ``budget`` on ``stream``."""
    peers = FULL_PEERS if budget == ", all labels" else BUDGET_PEERS
    found = [
        (p, median(before[p + budget][stream]))
        for p in peers
        if stream in before.get(p + budget, {})
    ]
    return min(found, key=lambda f: f[1]) if found else None


def table(
    group: str,
    stream: str,
    before: dict[str, Any],
    after: dict[str, Any],
    previous: list[tuple[str, dict[str, Any]]] | None = None,
    peers: dict[str, Any] | None = None,
) -> str:
    rows = [("abstain served, now", after, SERVED)]
    rows += [(f"abstain served, {name}", data, SERVED) for name, data in previous or []]
    rows += [
        ("abstain served, before", before, SERVED),
        ("abstain bare (the paper's learner)", before, BARE),
    ]
    rows += [(p, before, p) for p in models(before) if p not in (SERVED, BARE)]
    held = [p for p in models(peers or {}) if p.startswith("skactiveml")]
    rows += [(f"{p}, held to the budget", peers or {}, p) for p in held]
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
    earlier = [("before", before), *(previous or [])]
    for name, source in earlier:
        then = [median(source[SERVED + BUDGETS[i]][stream]) for i in present]
        lines.append(
            f"| *now / {name}* | "
            + " | ".join(f"*{a / b:.3f}*" for a, b in zip(now, then, strict=True))
            + " |"
        )
    against = [("best peer", before)]
    if peers:
        against.append(("best peer held to the budget", peers))
    for name, source in against:
        ratios = []
        for i, a in zip(present, now, strict=True):
            peer = best_peer(source, stream, BUDGETS[i])
            ratios.append("" if peer is None else f"*{a / peer[1]:.2f} ({peer[0]})*")
        if any(ratios):
            lines.append(f"| *now / {name}* | " + " | ".join(ratios) + " |")
    return f"#### {stream} ({group})\n\n" + "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--results", type=Path, default=HERE / "results" / "learning")
    p.add_argument(
        "--groups",
        type=lambda t: t.split(","),
        default=["short", "long", "replay", "elec2", "agrawal"],
    )
    p.add_argument("--now", default="-after", help="tag of the served stack now")
    p.add_argument(
        "--previous",
        action="append",
        default=[],
        help="TAG[:NAME] of an earlier round's served stack (repeatable; NAME: round 1)",
    )
    p.add_argument("--peers", default=None, help="tag of the peers held to the budget")
    args = p.parse_args(argv)
    for group in args.groups:
        before, after = load(args.results, group, "-before"), load(args.results, group, args.now)
        previous = []
        for spec in args.previous:
            tag, _, name = spec.partition(":")
            previous.append((name or "round 1", load(args.results, group, tag)))
        peers = load(args.results, group, args.peers) if args.peers else None
        streams = list(dict.fromkeys(s for by in after.values() for s in by))
        for stream in streams:
            print(table(group, stream, before, after, previous, peers), end="\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
