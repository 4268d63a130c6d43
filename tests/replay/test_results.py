"""Rates, summaries and the curves CSV derived from cumulative counts."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from service.replay.results import ReplayResult, Series


def two_run_series() -> Series:
    # grid t = 1, 2, 4; two runs. Run 0: reject, wrong, right, right at d = 0.25.
    # Run 1: right, reject, reject, wrong. Labels asked at t = 1, 2 (run 0), t = 4 (run 1).
    grid = np.array([1, 2, 4])
    counts = {
        "loss": np.array([[0.25, 0.0], [1.25, 0.25], [1.25, 1.5]]),
        "asked": np.array([[1.0, 0.0], [2.0, 0.0], [2.0, 1.0]]),
        "misclassified": np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]),
        "rejected": np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]]),
    }
    return Series("dsal", 0.25, grid, counts, rho=np.array([0.5, 1.5]))


def test_rates_divide_cumulative_counts_by_t() -> None:
    s = two_run_series()
    np.testing.assert_allclose(s.rate("loss")[:, 0], [0.25, 0.625, 0.3125])
    np.testing.assert_allclose(s.final("rejected"), [0.25, 0.5])


def test_labels_are_cumulative_counts_not_rates() -> None:
    s = two_run_series()
    np.testing.assert_allclose(s.mean("labels"), [0.5, 1.0, 1.5])


def test_mean_and_std_are_over_runs() -> None:
    s = two_run_series()
    final_loss = np.array([1.25 / 4, 1.5 / 4])
    assert s.mean("loss")[-1] == pytest.approx(final_loss.mean())
    assert s.std("loss")[-1] == pytest.approx(final_loss.std())


def test_summary_entry_has_the_documented_fields() -> None:
    entry = two_run_series().summary()
    assert set(entry) == {
        "algorithm",
        "label_budget",
        "sampling",
        "cost",
        "risk_mean",
        "risk_std",
        "asked",
        "misclassified",
        "rejected",
        "rho",
    }
    assert (entry["label_budget"], entry["sampling"]) == (None, "own")
    assert entry["risk_mean"] == pytest.approx((1.25 + 1.5) / 8)
    assert entry["asked"] == pytest.approx((0.5 + 0.25) / 2)
    assert entry["rho"] == pytest.approx(1.0)
    assert entry["risk_mean"] == pytest.approx(entry["misclassified"] + 0.25 * entry["rejected"])


def test_files_are_written_in_the_documented_shape(tmp_path: Path) -> None:
    result = ReplayResult("toy", runs=2, trials=4, series=[two_run_series()])
    result.write_summary(tmp_path / "summary.json")
    result.write_curves(tmp_path / "curves.csv")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["dataset"], summary["runs"], summary["trials"]) == ("toy", 2, 4)
    assert len(summary["results"]) == 1
    with (tmp_path / "curves.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["t"]) for r in rows] == [1, 2, 4]
    assert rows[0]["algorithm"] == "dsal"
    assert float(rows[-1]["risk_mean"]) == pytest.approx((1.25 + 1.5) / 8)
    assert float(rows[-1]["labels_mean"]) == pytest.approx(1.5)
    assert {"asked_std", "misclassified_mean", "rejected_std"} <= set(rows[0])
