"""``abstain bench`` prints its tables, with or without River installed."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from service.replay import bench


def tiny(dataset: Path) -> list[str]:
    """Arguments of a bench run that takes a fraction of a second on ``dataset``."""
    return [
        "--dataset",
        str(dataset),
        "--repeat",
        "1",
        "--events",
        "50",
        "--batches",
        "100",
        "--budgets",
        "4,8",
        "--kernel-events",
        "20",
        "--skip-protocol",
    ]


def test_bench_prints_every_section(
    guide_like_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(tiny(guide_like_path)) == 0
    out = capsys.readouterr().out
    assert f"dataset {guide_like_path}: 600 rows x 4 features" in out
    assert "single events, 4 features" in out
    assert "decide_many throughput" in out
    rules = out.split("update rules, 4 features")[1].split("decide_many")[0]
    rows = [line.split() for line in rules.splitlines() if line.startswith(("dral", "dsal"))]
    assert {(r[0], r[1]) for r in rows} >= {("dsal", "1"), ("dsal", "100"), ("dral", "100")}
    assert all(float(r[4]) > 0 for r in rows)  # a ratio of two timings, both measured
    assert "kernel-dsal, polynomial kernel (degree 2)" in out
    for name in ("dral", "dsal", "dsol"):
        assert any(line.split()[:2] == [name, "decide+update"] for line in out.splitlines())
    assert "full protocol" not in out
    kernel_rows = [line.split() for line in out.split("kernel-dsal, polynomial")[1].splitlines()]
    # budget, support: the support set is full when timed
    assert [row[:2] for row in kernel_rows if row and row[0].isdigit()] == [
        ["4", "4"],
        ["8", "8"],
    ]


def test_bench_without_river_says_so_and_goes_on(
    guide_like_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.import_module

    def no_river(name: str, package: str | None = None) -> ModuleType:
        if name.startswith("river"):
            raise ImportError("No module named 'river'")
        return real(name, package)

    monkeypatch.setattr(bench.importlib, "import_module", no_river)
    assert bench.main(tiny(guide_like_path)) == 0
    out = capsys.readouterr().out
    assert "river not installed" in out
    assert "kernel-dsal" in out


def test_timed_reports_median_not_above_max_and_min_not_above_median() -> None:
    calls: list[int] = []
    median, best = bench.timed(lambda: calls.append(1), repeat=5)
    assert len(calls) == 5
    assert 0.0 <= best <= median


def test_bench_bad_dataset_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--dataset", "no-such-thing"]) == 2
    assert "not found" in capsys.readouterr().err
