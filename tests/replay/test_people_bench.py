"""``loadtest/people.py`` runs with one command, prints one table and writes its results
(here on a small dataset and a short label flip, one run)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import ModuleType

import pytest

from .scripts import load_script


def _load() -> ModuleType:
    return load_script("people.py", "people_benchmark")


def test_the_benchmark_prints_one_table_and_writes_its_results(
    tmp_path: Path, guide_like_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _load()
    argv = [
        "--streams",
        f"{guide_like_path},label-flip",
        "--runs",
        "1",
        "--trials",
        "400",
        "--events",
        "600",
        "--change",
        "300",
        "--after",
        "300",
        "--arms",
        "noisy,review",
        "--labellers",
        "noise=0.2",
        "--budget",
        "0.2",
        "--jobs",
        "1",
        "--quiet",
        "--out",
        str(tmp_path),
    ]
    assert bench.main(argv) == 0
    table = capsys.readouterr().out
    rows = [line.split(" | ")[:2] for line in table.splitlines()[2:]]
    assert rows == [
        ["| guide-like", "perfect labels"],
        ["| guide-like", "noise 20 %"],
        ["| guide-like", "noise 20 % + second opinions"],
        ["| label-flip", "perfect labels"],
        ["| label-flip", "noise 20 %"],
        ["| label-flip", "noise 20 % + second opinions"],
    ]
    assert table.strip() in (tmp_path / "people.md").read_text()
    assert "python loadtest/people.py --streams" in (tmp_path / "people.md").read_text()
    record = json.loads((tmp_path / "people.json").read_text())
    flip = record["results"]["label-flip"]
    assert flip["perfect labels"][0]["wrong"] == 0
    assert flip["noise 20 %"][0]["wrong"] > 0
    assert flip["noise 20 % + second opinions"][0]["second_opinions"] > 0
    assert record["settings"]["people"]["noise 20 %"]["rates"] == [0.2] * 4
    assert (tmp_path / "people.png").stat().st_size > 0


def test_the_specs_are_read_as_the_desk_reads_them() -> None:
    bench = _load()
    assert bench.labellers("noise=0.05,0.2") == {"noise": [0.05, 0.2], "team": 4}
    assert bench.labellers("noise=0.02/0.3,0.1,team=3") == {
        "noise": [(0.02, 0.3), 0.1],
        "team": 3,
    }
    rule = bench.second_opinions("share=0.2,min_weight=10")
    assert (rule.share, rule.min_weight, rule.confident_margin) == (0.2, 10.0, 1.0)
    for bad in ("team=3", "noise=x", "0.1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.labellers(bad)
    with pytest.raises(argparse.ArgumentTypeError):
        bench.second_opinions("share=2")
