"""The summary table every fault test prints: what was sent, decided, dead-lettered and
applied, how many duplicates the crashes caused and how long recovery took.

``emit`` prints the table to the terminal (past pytest's capture, so a passing test
shows it too), writes it as JSON next to the test's other files and, when the environment
names a results directory (``ABSTAIN_FAULTS_RESULTS``), there as well for the runner
``loadtest/faults.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["COLUMNS", "RESULTS_ENV", "Summary", "emit", "format_table"]

RESULTS_ENV = "ABSTAIN_FAULTS_RESULTS"


@dataclass
class Summary:
    """One row of the table (one run of one scenario)."""

    scenario: str
    size: str
    events_sent: int = 0
    bad_sent: int = 0
    labels_sent: int = 0  # label messages the oracle / test produced (resends included)
    decided: int = 0  # distinct good events with a decision
    decision_records: int = 0
    duplicates: int = 0  # decision records beyond the first per event
    contradictions: int = 0
    dead_lettered: int = 0
    labels_applied: int = 0  # model versions = distinct labels applied
    labels_lost: int = 0  # valid labels that never changed the model
    applied_twice: int = 0
    requests: int = 0  # distinct label requests
    requests_pending: int = 0
    requests_expired: int = 0
    faults: int = 0  # kills / outages / joins+leaves / stalls injected
    recovery_s: list[float] = field(default_factory=list)
    runtime_s: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        rec = ", ".join(f"{r:.1f}" for r in self.recovery_s) or "-"
        return {
            "scenario": self.scenario,
            "size": self.size,
            "events": self.events_sent,
            "bad": self.bad_sent,
            "labels sent": self.labels_sent,
            "decided": self.decided,
            "dup. decisions": self.duplicates,
            "contradictions": self.contradictions,
            "dead-lettered": self.dead_lettered,
            "applied": self.labels_applied,
            "lost": self.labels_lost,
            "applied twice": self.applied_twice,
            "requests (pending)": f"{self.requests} ({self.requests_pending})",
            "faults": self.faults,
            "recovery s": rec,
            "runtime s": f"{self.runtime_s:.0f}",
        }


COLUMNS = list(Summary("", "").row())


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table of ``rows`` (dicts with the keys of :data:`COLUMNS`)."""
    head = "| " + " | ".join(COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    body = ["| " + " | ".join(str(r.get(c, "")) for c in COLUMNS) + " |" for r in rows]
    return "\n".join([head, rule, *body])


def emit(summary: Summary, tmp: Path, capsys: pytest.CaptureFixture[str] | None = None) -> str:
    """Print the one-row table and notes; write ``summary-<scenario>-<size>.json``."""
    table = format_table([summary.row()])
    notes = "\n".join(f"  {k}: {v}" for k, v in summary.notes.items())
    text = f"\n{summary.scenario} ({summary.size})\n{table}\n{notes}\n"
    payload = json.dumps({"row": summary.row(), "summary": asdict(summary)}, indent=2)
    name = f"summary-{summary.scenario}-{summary.size}.json"
    (tmp / name).write_text(payload)
    results = os.environ.get(RESULTS_ENV)
    if results:
        Path(results).mkdir(parents=True, exist_ok=True)
        (Path(results) / name).write_text(payload)
    if capsys is not None:
        with capsys.disabled():
            print(text)
    print(text)
    return text
