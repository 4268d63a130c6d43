"""``loadtest/peers.py`` runs with one command, prints one table and writes its results
(here on short drift streams, one run, River's learners included)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from .scripts import load_script


def _load() -> ModuleType:
    return load_script("peers.py", "peers_benchmark")


def test_the_benchmark_prints_one_table_and_writes_its_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    peers = _load()
    argv = [
        "--seeds",
        "1",
        "--events",
        "2400",
        "--change",
        "1200",
        "--stationary",
        "--no-short",
        "--budgets",
        "0.2,all",
        "--no-figure",
        "--quiet",
        "--out",
        str(tmp_path),
    ]
    assert peers.main(argv) == 0
    table = capsys.readouterr().out
    main, _, tuning = table.partition("The River contenders' tuning")
    rows = [line for line in main.splitlines() if line.startswith("| ")]
    labels = [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]]
    assert labels == [
        "abstain served @20%",
        "abstain bare @20%",
        "abstain served, all labels",
        "abstain bare, all labels",
        "River entropy sampler (tuned) @20%",
        "River LR (tuned), all labels",
        "River LR (tuned) + ADWIN reset, all labels",
        "oracle (the concept in force)",
    ]
    assert (tmp_path / "peers.md").read_text().strip() == table.strip()
    record = json.loads((tmp_path / "peers.json").read_text())
    results = record["results"]
    assert set(results["abstain bare @20%"]) == {"label-flip", "sea-shift", "rotating-hyperplane"}
    flip = {k: v["label-flip"][0] for k, v in results.items()}
    # the paper's DSOL ends rejecting everything after the flip; the served one does not
    assert flip["abstain bare, all labels"]["ends_rejecting"]
    assert not flip["abstain served, all labels"]["ends_rejecting"]
    assert flip["abstain served, all labels"]["changes"]  # the change was detected
    # a model that rejects everything stops asking: the budget is a ceiling, not a quota
    assert flip["abstain served @20%"]["labels"] == pytest.approx(0.2 * 2400, rel=0.1)
    assert flip["abstain bare @20%"]["labels"] < flip["abstain served @20%"]["labels"]
    assert flip["oracle (the concept in force)"]["risk"] == pytest.approx(0.1, abs=0.03)
    # River's contenders were tuned on a run of their own, their tuning written beside them
    tuned = record["tuning"]
    assert set(tuned) == {"label-flip", "sea-shift", "rotating-hyperplane"}
    es = tuned["label-flip"]["entropy sampler @0.2"]
    assert es["asked"] == pytest.approx(0.2, rel=0.15)
    assert flip["River entropy sampler (tuned) @20%"]["tuning"] == es
    assert flip["River LR (tuned), all labels"]["tuning"] == tuned["label-flip"]["lr"]
    assert "| label-flip |" in tuning
