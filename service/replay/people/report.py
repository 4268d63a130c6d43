"""What a replay with people measured: one run's measures, and the table over runs.

:func:`measures` reads a :class:`~service.replay.people.simulate.PeopleRun` as a JSON-safe
dict. The people's work is counted apart from the model's labels: ``labels`` are the
label requests the model asked (and the first answers they got), the only thing its label
budget holds; a second opinion, a reviewer's decision and an author's change are answers
people give on top (``extra_work``: their number per label asked). ``changed`` and
``confirmed`` are the learner's own count of the corrections it applied
(``abstain_corrections_total{outcome}``); ``wrong_left``: labels the model learns from at
the end that are wrong (a wrong answer nobody caught, or a correction the learner refused);
``ends_rejecting``: the model rejected at least 95 % of the last 500 events (it gave up
deciding, as :func:`service.replay.prequential.ends_rejecting` says of a trace).

:func:`table` draws one markdown row per (stream, arm), each cell the median over runs
with the range: ``median [min-max]``.

>>> cell([0.1, 0.3, 0.2], ".2f")
'0.20 [0.10-0.30]'
>>> cell([3, 3], ".0f")
'3 [3-3]'
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from service.replay.errors import ReplayConfigError
from service.replay.people.simulate import PeopleRun

__all__ = ["COLUMNS", "cell", "measures", "table"]

#: the table's columns: (measure, format, heading)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("risk", ".4f", "risk"),
    ("risk_after", ".4f", "risk after N"),
    ("labels", ".0f", "labels asked"),
    ("wrong", ".0f", "wrong answers"),
    ("second_opinions", ".0f", "second opinions"),
    ("opinion_share", ".1%", "of labels"),
    ("disagreements", ".0f", "disagreements"),
    ("changed", ".0f", "corrections applied"),
    ("confirmed", ".0f", "confirmed"),
    ("wrong_left", ".0f", "wrong labels left"),
    ("extra_work", ".1%", "people's extra work"),
    ("ends_rejecting", "count", "ends rejecting all"),
)
#: the window and share of :func:`~service.replay.prequential.ends_rejecting`
END_WINDOW, END_SHARE = 500, 0.95


def measures(run: PeopleRun, *, after: int) -> dict[str, Any]:
    """One run's measures (module docstring); ``risk_after``: the risk of the events from
    ``after`` on."""
    if not 0 <= after < run.loss.shape[0]:
        raise ReplayConfigError(f"after must be in [0, {run.loss.shape[0]}), got {after}")
    w = run.work
    labels = max(w.labels, 1)
    return {
        "risk": run.risk(),
        "risk_after": run.risk(after),
        "labels": w.labels,
        "wrong": w.wrong,
        "second_opinions": w.second_opinions,
        "opinion_reasons": dict(sorted(w.opinions.items())),
        "opinion_share": w.second_opinions / labels,
        "disagreements": w.disagreements,
        "reviews": w.reviews,
        "undos": w.undos,
        "changed": run.corrections["changed"],
        "confirmed": run.corrections["unchanged"],
        "refused": w.refused,
        "wrong_left": run.wrong_in_force,
        "extra_work": (w.second_opinions + w.reviews + w.undos) / labels,
        "late": w.late,
        "ends_rejecting": bool((run.decided[-END_WINDOW:] == 0).mean() >= END_SHARE),
        "seconds": round(run.seconds, 2),
    }


def _show(value: float, fmt: str) -> str:
    return format(value, fmt).replace("%", " %")


def cell(values: Sequence[float], fmt: str) -> str:
    """``median [min-max]`` of ``values``; with ``fmt="count"``, how many are true.

    >>> cell([True, False, True], "count")
    '2/3'
    """
    if fmt == "count":
        return f"{sum(bool(v) for v in values)}/{len(values)}"
    median = statistics.median(values)
    return f"{_show(median, fmt)} [{_show(min(values), fmt)}-{_show(max(values), fmt)}]"


def table(
    rows: Sequence[tuple[str, str, Sequence[dict[str, Any]]]],
    columns: Sequence[tuple[str, str, str]] = COLUMNS,
) -> str:
    """The markdown table of ``rows`` = (stream, arm, measures of each run)."""
    head = "| stream | people | " + " | ".join(c[2] for c in columns) + " |"
    lines = [head, "|" + "---|" * (len(columns) + 2)]
    for stream, arm, runs in rows:
        cells = [cell([r[key] for r in runs], fmt) for key, fmt, _ in columns]
        lines.append(f"| {stream} | {arm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
