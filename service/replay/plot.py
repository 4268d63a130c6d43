"""Figures of a replay (matplotlib, Agg backend: no display needed).

:func:`plot_replay` draws the paper's five columns, one row per rejection cost ``d``:
risk vs number of labels asked, average risk vs ``t``, fraction of labels asked vs ``t``,
fraction misclassified vs ``t`` and fraction rejected vs ``t``; one line per algorithm
(mean over runs) with a band of plus/minus one standard deviation over runs. These show
the algorithms on their own query rules. When the replay ran label budgets a sixth column
shows final risk against labels asked: one line per algorithm held to the budgets (solid)
and per random-sampling baseline (dotted), one marker per algorithm on its own rule.

:func:`plot_budget` draws risk and fraction asked against the support-set budget of the
kernel learners; :func:`plot_shadow` a shadow replay's estimated against true risk and
the coverage of the intervals.

:func:`plot_window` draws a sequential replay (the file in its own order) as the risk over
the last ``window`` events against time, one panel per cost, one line per variant (mean
over runs), with each change a learner detected marked by a vertical line in its colour.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from service.replay.results import ReplayResult, Series  # noqa: E402
from service.replay.shadow_results import ShadowResult  # noqa: E402

__all__ = ["plot_budget", "plot_replay", "plot_shadow", "plot_window"]

_COLOURS = {"dral": "tab:blue", "dsal": "tab:orange", "dsol": "tab:green"}
_COLUMNS = (
    ("loss", "risk vs labels asked", "labels asked (mean)", "average risk"),
    ("loss", "average risk", "t", "average risk"),
    ("asked", "fraction of labels asked", "t", "fraction asked"),
    ("misclassified", "fraction misclassified", "t", "fraction misclassified"),
    ("rejected", "fraction rejected", "t", "fraction rejected"),
)


def _style(algorithm: str) -> dict[str, Any]:
    base = algorithm.removeprefix("kernel-")
    return {
        "color": _COLOURS.get(base, "tab:gray"),
        "linestyle": "--" if algorithm.startswith("kernel-") else "-",
        "label": algorithm.upper(),
    }


def _draw_budgets(ax: Any, chosen: Sequence[Series]) -> None:
    """Final risk (+/- 1 std) against final labels asked, one line per (algorithm, sampling)."""
    groups: dict[tuple[str, str], list[Series]] = {}
    for s in chosen:
        groups.setdefault((s.algorithm, s.sampling), []).append(s)
    for (algorithm, sampling), members in groups.items():
        members.sort(key=lambda s: s.label_budget or 2.0)
        x = [float(s.mean("labels")[-1]) for s in members]
        y = [float(s.mean("loss")[-1]) for s in members]
        err = [float(s.std("loss")[-1]) for s in members]
        style = _style(algorithm)
        if sampling == "own":
            style.update(marker="*", markersize=10, linestyle="none")
        else:
            style.update(marker="o" if sampling == "budget" else "x", markersize=4)
            style["linestyle"] = "-" if sampling == "budget" else ":"
            style["label"] = f"{style['label']} {sampling}"
        ax.errorbar(x, y, yerr=err, capsize=2, linewidth=1.2, **style)


def _draw(ax: Any, series: Series, column: int, skip: int) -> None:
    key = _COLUMNS[column][0]
    x = series.mean("labels") if column == 0 else series.grid.astype(float)
    mean, std = series.mean(key), series.std(key)
    x, mean, std = x[skip:], mean[skip:], std[skip:]
    style = _style(series.algorithm)
    ax.plot(x, mean, linewidth=1.4, **style)
    ax.fill_between(x, mean - std, mean + std, color=style["color"], alpha=0.18, linewidth=0)


def plot_replay(result: ReplayResult, path: Path, *, title: str | None = None) -> None:
    """Write the five-column figure of ``result`` to ``path`` (PNG)."""
    costs = sorted({s.cost for s in result.series})
    budgets = any(s.sampling != "own" for s in result.series)
    n_cols = len(_COLUMNS) + int(budgets)
    fig, axes = plt.subplots(
        len(costs),
        n_cols,
        figsize=(4.0 * n_cols, 3.0 * len(costs) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    for row, cost in enumerate(costs):
        chosen = [s for s in result.series if s.cost == cost and s.sampling == "own"]
        if budgets:
            ax = axes[row][-1]
            _draw_budgets(ax, [s for s in result.series if s.cost == cost])
            ax.set_title(f"final risk vs labels (budgets), d = {cost:g}", fontsize=10)
            ax.set_xlabel("labels asked (mean)", fontsize=9)
            ax.set_ylabel("final average risk", fontsize=9)
            ax.set_xscale("log")
            ax.set_ylim(bottom=0.0)
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize=8)
            ax.legend(fontsize=7, loc="upper right")
        for col, (_, name, xlabel, ylabel) in enumerate(_COLUMNS):
            ax = axes[row][col]
            for series in chosen:
                # the first few trials are averages of one or two losses: all noise
                skip = int((series.grid < min(10, result.trials)).sum())
                _draw(ax, series, col, skip)
            ax.set_title(f"{name}, d = {cost:g}", fontsize=10)
            ax.set_xlabel(xlabel, fontsize=9)
            ax.set_ylabel(ylabel, fontsize=9)
            ax.tick_params(labelsize=8)
            ax.grid(True, alpha=0.3)
            if col == 0:
                ax.set_xscale("log")
            ax.set_ylim(bottom=0.0)
        axes[row][0].legend(fontsize=8, loc="upper right")
    heading = title or f"{result.dataset}: {result.runs} runs x {result.trials} trials"
    fig.suptitle(heading + "  (mean over runs, band = +/- 1 std)", fontsize=12)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _label(series: Series) -> str:
    name = series.algorithm.upper()
    if series.sampling != "own":
        name += f" {series.sampling}@{series.label_budget:g}"
    return name


def plot_window(result: ReplayResult, path: Path, *, window: int, title: str | None = None) -> None:
    """Write the windowed risk over time of a sequential replay to ``path`` (PNG): per
    cost, each variant's mean over runs of the risk of its last ``window`` decisions, and
    a dotted vertical line at every change its learner detected (in any run; the legend
    counts them)."""
    costs = sorted({s.cost for s in result.series})
    fig, axes = plt.subplots(
        len(costs), 1, figsize=(10.0, 3.2 * len(costs) + 0.8), squeeze=False, layout="constrained"
    )
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, cost in enumerate(costs):
        ax = axes[row][0]
        chosen = [s for s in result.series if s.cost == cost]
        for i, series in enumerate(chosen):
            colour = cycle[i % len(cycle)]
            t, risk = series.window_risk(window)
            points = sorted({c for run in series.changes for c in run})
            label = _label(series)
            if points:
                label += f" ({sum(len(run) for run in series.changes)} changes detected)"
            ax.plot(t, risk, color=colour, linewidth=1.3, label=label)
            for point in points:
                ax.axvline(point, color=colour, linestyle=":", linewidth=1.0, alpha=0.8)
        ax.axhline(
            cost,
            color="black",
            linewidth=0.8,
            alpha=0.5,
            linestyle="--",
            label=f"d = {cost:g} (rejecting everything)",
        )
        ax.set_title(f"risk over the last {window} events, d = {cost:g}", fontsize=10)
        ax.set_xlabel("event (file order)", fontsize=9)
        ax.set_ylabel(f"{window}-event window risk", fontsize=9)
        ax.set_xlim(0, result.trials)
        ax.set_ylim(bottom=0.0)
        ax.grid(True, alpha=0.3)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=8, loc="upper right")
    heading = title or f"{result.dataset}: file order, {result.runs} runs (coins differ)"
    marked = any(any(s.changes) for s in result.series)
    note = "mean over runs; dotted: detected changes" if marked else "mean over runs"
    fig.suptitle(f"{heading}  ({note})", fontsize=12)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_budget(
    rows: Sequence[dict[str, Any]], path: Path, *, title: str = "risk vs kernel budget"
) -> None:
    """Write risk (with +/- 1 std bars) and fraction asked against the budget, one column
    per cost and one line per algorithm.

    ``rows`` are dicts with keys ``algorithm``, ``cost``, ``budget``, ``risk_mean``,
    ``risk_std`` and ``asked`` (the rows of ``budget.json``).
    """
    costs = sorted({float(r["cost"]) for r in rows})
    algorithms = list(dict.fromkeys(str(r["algorithm"]) for r in rows))
    budgets = sorted({int(r["budget"]) for r in rows})
    fig, axes = plt.subplots(
        2, len(costs), figsize=(4.2 * len(costs), 6.4), squeeze=False, layout="constrained"
    )
    for col, cost in enumerate(costs):
        ax_risk, ax_asked = axes[0][col], axes[1][col]
        for algorithm in algorithms:
            chosen = sorted(
                (r for r in rows if r["algorithm"] == algorithm and float(r["cost"]) == cost),
                key=lambda r: int(r["budget"]),
            )
            x = [int(r["budget"]) for r in chosen]
            style = _style(algorithm)
            ax_risk.errorbar(
                x,
                [float(r["risk_mean"]) for r in chosen],
                yerr=[float(r["risk_std"]) for r in chosen],
                marker="o",
                markersize=4,
                capsize=3,
                **style,
            )
            ax_asked.plot(x, [float(r["asked"]) for r in chosen], marker="o", markersize=4, **style)
        ax_risk.set_title(f"final average risk, d = {cost:g}", fontsize=10)
        ax_asked.set_title(f"fraction of labels asked, d = {cost:g}", fontsize=10)
        for ax in (ax_risk, ax_asked):
            ax.set_xscale("log")
            ax.set_xticks(budgets, [str(b) for b in budgets])
            ax.minorticks_off()
            ax.set_xlabel("budget (support examples)", fontsize=9)
            ax.tick_params(labelsize=8)
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0.0)
        axes[0][col].legend(fontsize=8)
    fig.suptitle(title + "  (mean over runs, bars = +/- 1 std)", fontsize=11)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_shadow(result: ShadowResult, path: Path, *, title: str | None = None) -> None:
    """Write the shadow replay's figure: one column per model (champion first). Top: run 0,
    the estimated risk (Horvitz-Thompson) with its interval against the true risk over time,
    and the ratio estimate (dotted). Bottom: per checkpoint, the fraction of runs whose
    interval holds the true risk, for both estimates, against the nominal level and 90 %."""
    n = len(result.tracks)
    fig, axes = plt.subplots(
        2, n, figsize=(4.6 * n, 6.8), squeeze=False, layout="constrained", sharex=True
    )
    t = result.grid.astype(float)
    pct = f"{result.level:.0%}"
    for col, track in enumerate(result.tracks):
        top, bottom = axes[0][col], axes[1][col]
        colour = _COLOURS.get(track.algorithm.removeprefix("kernel-"), "tab:gray")
        top.fill_between(
            t,
            track.low[:, 0],
            track.high[:, 0],
            color=colour,
            alpha=0.25,
            linewidth=0,
            label=f"{pct} interval",
        )
        top.plot(t, track.estimate[:, 0], color=colour, linewidth=1.4, label="estimated")
        top.plot(
            t,
            track.ratio[:, 0],
            color=colour,
            linewidth=1.0,
            linestyle=":",
            label="ratio estimate (envelope)",
        )
        top.plot(t, track.true[:, 0], color="black", linewidth=1.2, label="true")
        top.set_title(f"{track.name} ({track.role}), d = {track.cost:g}: run 0", fontsize=10)
        top.set_ylabel("running risk", fontsize=9)
        top.set_ylim(0.0, max(0.1, 3.0 * float(track.true[-1, 0])))  # the first events: off the top
        top.legend(fontsize=7, loc="upper right")
        cover = track.coverage_by_checkpoint(result.min_labels)
        ratio_cover = track.coverage_by_checkpoint(result.min_labels, "ratio")
        bottom.plot(t, cover, color=colour, linewidth=1.4, label="estimated (Horvitz-Thompson)")
        bottom.plot(
            t,
            ratio_cover,
            color=colour,
            linewidth=1.0,
            linestyle=":",
            label="ratio estimate (envelope)",
        )
        bottom.axhline(
            result.level, color="gray", linestyle="--", linewidth=1.0, label=f"nominal {pct}"
        )
        bottom.axhline(0.9, color="tab:red", linestyle=":", linewidth=1.0, label="90 %")
        overall = track.coverage(result.min_labels)
        bottom.set_title(
            f"runs whose interval holds the true risk (overall {overall:.3f})", fontsize=10
        )
        bottom.set_xlabel("t (events)", fontsize=9)
        bottom.set_ylim(0.0, 1.02)
        bottom.legend(fontsize=7, loc="lower right")
        for ax in (top, bottom):
            ax.grid(True, alpha=0.3)
            ax.tick_params(labelsize=8)
    heading = title or (
        f"{result.dataset}: champion and shadows, {result.runs} runs x {result.trials} events"
    )
    fig.suptitle(heading, fontsize=12)
    fig.savefig(path, dpi=80)
    plt.close(fig)
