"""Where the microseconds of one event go: py-spy samples of ``throughput.py --profile`` as a
table by stage and a flame graph per kind of run.

    python loadtest/flame.py DIR [--markdown]

``DIR`` holds what ``loadtest/throughput.py --profile DIR`` wrote: one collapsed-stacks file
per sampled process (py-spy ``--format raw``: ``frame;frame;... count`` per line, sampled
only while the process ran Python code) and ``runs.jsonl`` (each run's kind, file and CPU
per event over the sampled interval).

Every sample is given to one stage. A sample taken in the learner's loop (a frame of
``service/stream/labels/``) is ``learner``; any other goes to the stage of the innermost
frame that a rule of :data:`RULES` names (the scoring path's own functions, aiokafka's
producer and consumer, prometheus_client), ``other`` when none does (the event loop,
faust's timers and web server). A sample in the event loop's ``select`` is no stage: py-spy
samples a process that is runnable, and on a busy machine a process that ``epoll``
woke waits there for a core (the call itself costs next to nothing); the table gives their
share of the samples apart (``waiting``). A stage's microseconds per event are its share of
a run's other samples times the run's CPU per event; the table gives the median over the
runs of each kind. ``DIR/<kind>.svg`` is the flame graph of all runs of that kind (root at the
bottom; a frame is coloured by the stage of its samples, grey when they are of several;
its title says how many samples it holds).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

#: the stages of the table, in the order of an event's way through a worker
STAGES = (
    "fetch",
    "parse",
    "route",
    "coin",
    "decide",
    "encode",
    "produce",
    "commit",
    "metrics",
    "learner",
    "other",
)

#: (pattern on a frame ``function (file:line)``, stage), tried on each frame from the
#: innermost out: the first frame that one names gives its stage (within a frame, the first
#: rule that matches)
RULES: tuple[tuple[str, str], ...] = (
    (r"prometheus_client/", "metrics"),
    (r"^Scorer\.(_count|_watch|_remember) ", "metrics"),
    (r"^CollapseWatch\.", "metrics"),
    (r"^(coin|request_id|coins|audit_coins) \(", "coin"),
    (r"^(raw_message|plain_feature_row|_parse_all|parse_event|parse_feature_event) \(", "parse"),
    (r"scoring/(parse|batch)\.py", "parse"),
    (r"^(_by_model|score_batch) \(", "route"),
    (r"^Champions\.", "route"),
    (r"scoring/route\.py", "route"),
    (r"^(_decide|_budgeted|_audited|_event_times|_decide_rows|_shadow_decide) \(", "decide"),
    (r"service/learning/", "decide"),
    (r"^(to_json|_emit|_priority)", "encode"),
    (r"^[A-Za-z]+\.to_json ", "encode"),
    (r"^Outputs\.", "encode"),
    (r"^Scorer\.decide ", "encode"),
    (r"scoring/encode\.py", "encode"),
    (r"^(BatchProducer|OutRecord)", "produce"),
    (r"kafka/produce\.py", "produce"),
    (r"aiokafka/producer/", "produce"),
    (r"^(fetched_ends|commit) \(", "commit"),
    (r"^ScoreLoop\.(_commit|_commit_forever|_take_acknowledged|_queue) ", "commit"),
    (r"aiokafka/consumer/group_coordinator", "commit"),
    (r"^Reader\.", "fetch"),
    (r"aiokafka/consumer/", "fetch"),
)
_RULES = [(re.compile(pattern), stage) for pattern, stage in RULES]
_LEARNER = re.compile(r"service/stream/labels/|^(LearnLoop|LabelJoiner|PendingStore)\.")
_LINE = re.compile(r":\d+\)$")
_WAITING = re.compile(r"^(EpollSelector|PollSelector|SelectSelector)\.select ")

#: fill colour of each stage in the flame graph
COLOURS = {
    "fetch": "#8fb8de",
    "parse": "#f4a259",
    "route": "#bc4b51",
    "coin": "#e9c46a",
    "decide": "#5b8e7d",
    "encode": "#f28482",
    "produce": "#84a59d",
    "commit": "#a8dadc",
    "metrics": "#b5838d",
    "learner": "#9d8189",
    "other": "#d8d8d8",
    "waiting": "#f5f5f5",
    "mixed": "#eeeeee",
}


def stage_of(frames: list[str]) -> str:
    """The stage of one sample, its frames root first.

    >>> stage_of(["<module> (x.py:1)", "Scorer.decide (service/stream/scoring/scorer.py:9)",
    ...           "coin (service/records/ids.py:3)"])
    'coin'
    >>> stage_of(["LearnLoop._round (service/stream/labels/loop.py:1)", "coin (ids.py:3)"])
    'learner'
    >>> stage_of(["run_forever (asyncio/base_events.py:1)"])
    'other'
    >>> stage_of(["_run_once (asyncio/base_events.py:1)", "EpollSelector.select (selectors.py:4)"])
    'waiting'
    """
    if frames and _WAITING.search(frames[-1]):
        return "waiting"
    if any(_LEARNER.search(f) for f in frames):
        return "learner"
    for frame in reversed(frames):
        for pattern, stage in _RULES:
            if pattern.search(frame):
                return stage
    return "other"


def read_stacks(path: Path) -> Counter[tuple[str, ...]]:
    """A py-spy raw file: samples per stack (frames root first)."""
    out: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out[tuple(stack.split(";"))] += int(count)
    return out


@dataclass
class Kind:
    """The runs of one kind (worker, passthrough...): µs per event by stage, per run."""

    name: str
    runs: list[dict[str, float]] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)  # share of the samples
    stacks: Counter[tuple[str, ...]] = field(default_factory=Counter)

    def median(self, stage: str) -> float:
        return statistics.median(run[stage] for run in self.runs)


def load(directory: Path) -> dict[str, Kind]:
    kinds: dict[str, Kind] = {}
    for line in (directory / "runs.jsonl").read_text().splitlines():
        run = json.loads(line)
        stacks = read_stacks(directory / run["samples"])
        total = sum(stacks.values())
        if not total:
            continue
        by_stage: Counter[str] = Counter()
        for stack, n in stacks.items():
            by_stage[stage_of(list(stack))] += n
        busy = max(1, total - by_stage["waiting"])
        kind = kinds.setdefault(run["kind"], Kind(run["kind"]))
        kind.runs.append({s: by_stage[s] / busy * run["cpu_us"] for s in STAGES})
        kind.cpu.append(run["cpu_us"])
        kind.waiting.append(by_stage["waiting"] / total)
        kind.stacks.update(stacks)
    return kinds


def table(kinds: dict[str, Kind]) -> str:
    """Markdown: a row per stage, a column per kind (median µs per event over its runs)."""
    names = list(kinds)
    head = "| stage | " + " | ".join(f"{n} (µs/event)" for n in names) + " |"
    rule = "|---|" + "---:|" * len(names)
    rows = [head, rule]
    for stage in STAGES:
        cells = [f"{kinds[n].median(stage):.1f}" for n in names]
        rows.append(f"| {stage} | " + " | ".join(cells) + " |")
    cpu = [f"**{statistics.median(kinds[n].cpu):.1f}**" for n in names]
    rows.append("| **CPU per event** | " + " | ".join(cpu) + " |")
    waiting = [f"{100 * statistics.median(kinds[n].waiting):.0f} %" for n in names]
    rows.append("| waiting in select (share of samples, not CPU) | " + " | ".join(waiting) + " |")
    runs = [str(len(kinds[n].runs)) for n in names]
    rows.append("| runs (median of) | " + " | ".join(runs) + " |")
    return "\n".join(rows)


@dataclass
class _Node:
    name: str
    count: int = 0
    children: dict[str, _Node] = field(default_factory=dict)
    stages: Counter[str] = field(default_factory=Counter)

    @property
    def stage(self) -> str:
        """The stage of (nearly) all the samples under this frame; ``mixed`` otherwise."""
        stage, n = self.stages.most_common(1)[0]
        return stage if n >= 0.9 * self.count else "mixed"


def _tree(stacks: Counter[tuple[str, ...]]) -> _Node:
    root = _Node("all")
    for stack, n in stacks.items():
        stage = stage_of(list(stack))
        root.count += n
        root.stages[stage] += n
        node = root
        for frame in stack:
            frame = _LINE.sub(")", frame)  # one frame per function, whatever its line
            node = node.children.setdefault(frame, _Node(frame))
            node.count += n
            node.stages[stage] += n
    return root


def flame_svg(stacks: Counter[tuple[str, ...]], title: str, width: int = 1600) -> str:
    """A flame graph (root at the bottom, a frame as wide as its samples)."""
    root = _tree(stacks)
    height, rows = 17, []

    def depth(node: _Node) -> int:
        return 1 + max((depth(c) for c in node.children.values()), default=0)

    levels = depth(root)
    total = max(1, root.count)
    scale = (width - 20) / total

    def draw(node: _Node, x: float, level: int) -> None:
        w = node.count * scale
        if w < 0.3:
            return
        y = 30 + (levels - level - 1) * height
        share = 100.0 * node.count / total
        label = html.escape(f"{node.name} ({node.count} samples, {share:.1f} %; {node.stage})")
        colour = COLOURS[node.stage]
        text = node.name if w > 60 else ""
        text = html.escape(text[: int(w / 6.5)])
        rows.append(
            f'<g><title>{label}</title><rect x="{x + 10:.1f}" y="{y}" width="{w:.1f}" '
            f'height="{height - 1}" fill="{colour}"/><text x="{x + 12:.1f}" '
            f'y="{y + 12}">{text}</text></g>'
        )
        for child in sorted(node.children.values(), key=lambda c: c.name):
            draw(child, x, level + 1)
            x += child.count * scale

    draw(root, 0.0, 0)
    legend = " ".join(
        f'<rect x="{10 + i * 110}" y="8" width="12" height="12" fill="{COLOURS[s]}" '
        f'stroke="#999"/><text x="{26 + i * 110}" y="18">{s}</text>'
        for i, s in enumerate((*STAGES, "waiting", "mixed"))
    )
    full = 40 + levels * height
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{full}" '
        f'font-family="monospace" font-size="11"><desc>{html.escape(title)}</desc>'
        f"{legend}{''.join(rows)}</svg>\n"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory", type=Path)
    p.add_argument("--svg", type=Path, help="where the flame graphs go (default: DIRECTORY)")
    args = p.parse_args()
    kinds = load(args.directory)
    print(table(kinds))
    out = args.svg or args.directory
    out.mkdir(parents=True, exist_ok=True)
    for name, kind in kinds.items():
        path = out / f"{name.replace(' ', '-').replace('+', '-')}.svg"
        path.write_text(flame_svg(kind.stacks, f"{name}: {sum(kind.stacks.values())} samples"))
        print(f"{path}: {len(kind.runs)} runs, {sum(kind.stacks.values())} samples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
