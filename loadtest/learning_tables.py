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

``--tuned TAG`` reads one file per group, ``<group><TAG>.json``, with every model of
``loadtest/learning_bench.py`` in it (its peers tuned on a separate order): a summary, one
row per stream and budget, of the served stack against the best tuned peer (the lowest
median risk) and the paper's learner, then a table per stream with each peer's tuning in its
cells and the served stack's ratio to each of them. Ratios are taken run by run (the same
order and coins) and shown as the median [min-max] over runs.
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


# -- one run of every model, the peers tuned (learning_bench.py since the peers' tuning) ---
#: the tuned peers each budget is compared with (their rows' names without the budget)
TUNED_BUDGET_PEERS = (
    "River entropy sampler (tuned)",
    "VW active (tuned)",
    "skactiveml VariableUncertainty (tuned)",
    "skactiveml Split (tuned)",
    "skactiveml PAL (tuned)",
)
TUNED_FULL_PEERS = ("River LR (tuned)", "VW logistic (tuned)")


def ratios(num: list[dict[str, Any]], den: list[dict[str, Any]]) -> list[float]:
    """Risk of ``num`` over risk of ``den``, run by run (the same orders and coins)."""
    return [
        a["risk"] / b["risk"] if b["risk"] > 0 else float("inf")
        for a, b in zip(num, den, strict=True)
    ]


def spread(values: list[float], fmt: str = ".2f") -> str:
    """``median [min-max]``."""
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def tuned_peers(results: dict[str, Any], stream: str, budget: str) -> list[tuple[str, float]]:
    """The tuned peers at ``budget`` on ``stream`` with their median risks, best first."""
    names = TUNED_FULL_PEERS if budget == ", all labels" else TUNED_BUDGET_PEERS
    found = [
        (p, median(results[p + budget][stream]))
        for p in names
        if stream in results.get(p + budget, {})
    ]
    return sorted(found, key=lambda f: f[1])


def _describe(knobs: dict[str, Any]) -> str:
    sys.path.insert(0, str(HERE))
    from learning_bench import describe  # noqa: PLC0415 - the bench's own words

    return str(describe(knobs))


def tuned_table(stream: str, results: dict[str, Any]) -> str:
    """A stream's table: a row per model (a peer's cell ends with its tuning), a column per
    budget, then the served stack's ratio to the paper's learner, to each tuned peer and to
    the best tuned peer, each the median [min-max] over runs of the run-by-run ratio."""
    present = [i for i, b in enumerate(BUDGETS) if stream in results.get(SERVED + b, {})]
    lines = [
        "| model | " + " | ".join(HEADS[i] for i in present) + " |",
        "|---|" + "---|" * len(present),
    ]
    for name in models(results):
        cells = []
        for i in present:
            runs = results.get(name + BUDGETS[i], {}).get(stream)
            text = cell(runs)
            if runs and "tuning" in runs[0]:
                text += f" ({_describe(runs[0]['tuning'])})"
            cells.append(text)
        if any(cells):
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    served = {i: results[SERVED + BUDGETS[i]][stream] for i in present}
    against = [BARE, *TUNED_FULL_PEERS, *TUNED_BUDGET_PEERS]
    for other in against:
        cells = [
            spread(ratios(served[i], results[other + BUDGETS[i]][stream]))
            if stream in results.get(other + BUDGETS[i], {})
            else ""
            for i in present
        ]
        if any(cells):
            lines.append(
                f"| *served / {other}* | " + " | ".join(f"*{c}*" if c else "" for c in cells) + " |"
            )
    best = []
    for i in present:
        peers = tuned_peers(results, stream, BUDGETS[i])
        if not peers:
            best.append("")
            continue
        name = peers[0][0]
        best.append(f"**{spread(ratios(served[i], results[name + BUDGETS[i]][stream]))}** ({name})")
    lines.append("| *served / best tuned peer* | " + " | ".join(best) + " |")
    return f"#### {stream}\n\n" + "\n".join(lines)


def summary(group_results: list[tuple[str, dict[str, Any]]]) -> str:
    """One row per stream and budget: the served stack's median risk, the best tuned peer
    (lowest median risk) and its tuning, the run-by-run ratios to it and to the paper's
    learner (median [min-max])."""
    lines = [
        "| stream | labels | served | best tuned peer | its tuning | served / best peer "
        "| served / bare |",
        "|---|---|---|---|---|---|---|",
    ]
    for group, results in group_results:
        streams = list(dict.fromkeys(s for by in results.values() for s in by))
        for stream in streams:
            for i, b in enumerate(BUDGETS):
                runs = results.get(SERVED + b, {}).get(stream)
                if not runs:
                    continue
                peers = tuned_peers(results, stream, b)
                if not peers:
                    continue
                name = peers[0][0]
                other = results[name + b][stream]
                bare = results.get(BARE + b, {}).get(stream)
                lines.append(
                    f"| {stream} ({group}) | {HEADS[i]} | {median(runs):.4f} | {name} "
                    f"{peers[0][1]:.4f} | {_describe(other[0].get('tuning', {}))} | "
                    f"{spread(ratios(runs, other))} | "
                    + (spread(ratios(runs, bare)) if bare else "")
                    + " |"
                )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--results", type=Path, default=HERE / "results" / "learning")
    p.add_argument(
        "--groups",
        type=lambda t: t.split(","),
        default=["short", "mid", "onehot", "fields", "long", "replay", "elec2", "agrawal"],
    )
    p.add_argument("--now", default="-after", help="tag of the served stack now")
    p.add_argument(
        "--previous",
        action="append",
        default=[],
        help="TAG[:NAME] of an earlier round's served stack (repeatable; NAME: round 1)",
    )
    p.add_argument("--peers", default=None, help="tag of the peers held to the budget")
    p.add_argument(
        "--tuned",
        default=None,
        help="tag of a run of every model with the peers tuned (learning_bench.py --tag): "
        "a summary of the served stack against the best tuned peer, then a table per stream",
    )
    args = p.parse_args(argv)
    if args.tuned is not None:
        found = [(g, load(args.results, g, args.tuned)) for g in args.groups]
        found = [(g, r) for g, r in found if r]
        print(summary(found), end="\n\n")
        for _, results in found:
            for stream in dict.fromkeys(s for by in results.values() for s in by):
                print(tuned_table(stream, results), end="\n\n")
        return 0
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
