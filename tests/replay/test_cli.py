"""``abstain replay``: files written, their shape, and exit codes on errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.replay.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_replay_writes_summary_curves_and_figure(
    guide_like_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the dataset given by name, as with the shared ones: DIR/NAME/NAME under ABSTAIN_DATA_DIR
    monkeypatch.setenv("ABSTAIN_DATA_DIR", str(guide_like_path.parent.parent))
    out = tmp_path / "out"
    code = main(["guide-like", "--runs", "3", "--trials", "500", "--seed", "1", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= {"dataset", "runs", "trials", "results"}
    assert (summary["dataset"], summary["runs"], summary["trials"]) == ("guide-like", 3, 500)
    assert len(summary["results"]) == 9
    for entry in summary["results"]:
        for key in ("risk_mean", "asked", "misclassified", "rejected"):
            assert 0.0 <= entry[key] <= 1.0
        assert entry["risk_std"] >= 0.0
        assert entry["rho"] >= 0.0
        assert entry["risk_mean"] == pytest.approx(
            entry["misclassified"] + entry["cost"] * entry["rejected"]
        )
    with (out / "curves.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["algorithm"] for r in rows} == {"dral", "dsal", "dsol"}
    assert {float(r["cost"]) for r in rows} == {0.1, 0.25, 0.4}
    assert max(int(r["t"]) for r in rows) == 500
    png = (out / "guide-like.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    assert len(png) < 600_000
    printed = capsys.readouterr()
    assert str(out / "summary.json") in printed.out


def test_subset_of_algorithms_and_costs_without_plot(guide_like_path: Path, tmp_path: Path) -> None:
    code = main(
        [
            str(guide_like_path),
            "--algorithms",
            "dsal",
            "--costs",
            "0.2",
            "--runs",
            "2",
            "--trials",
            "100",
            "--no-plot",
            "--no-progress",
            "--param",
            "gamma=2",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["algorithm"], r["cost"]) for r in summary["results"]] == [("dsal", 0.2)]
    assert summary["settings"]["params"] == {"gamma": 2}
    assert not list(tmp_path.glob("*.png"))


def test_csv_dataset_is_accepted(tmp_path: Path) -> None:
    data = tmp_path / "toy.csv"
    lines = ["a,b,label"] + [f"{i % 7},{(i * 3) % 5},{int(i % 7 > 3)}" for i in range(60)]
    data.write_text("\n".join(lines) + "\n")
    code = main(
        [str(data), "--runs", "1", "--trials", "50", "--no-plot", "--out", str(tmp_path / "o")]
    )
    assert code == 0
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["dataset"] == "toy"


def test_kernel_budget_study_writes_table_and_figure(guide_like_path: Path, tmp_path: Path) -> None:
    code = main(
        [
            str(guide_like_path),
            "--kernel",
            "poly",
            "--algorithms",
            "dral,dsal",
            "--costs",
            "0.25",
            "--budgets",
            "5,20",
            "--runs",
            "1",
            "--trials",
            "150",
            "--no-progress",
            "--out",
            str(tmp_path),
            "--figures",
            str(tmp_path / "figures"),
        ]
    )
    assert code == 0
    table = json.loads((tmp_path / "budget.json").read_text())
    rows = table["results"]
    assert {(r["algorithm"], r["budget"]) for r in rows} == {
        (a, b) for a in ("kernel-dral", "kernel-dsal") for b in (5, 20)
    }
    assert all(r["us_per_event"] > 0 for r in rows)
    assert table["settings"]["kernel"]["kind"] == "polynomial"
    assert (tmp_path / "figures" / "budget.png").read_bytes().startswith(PNG_MAGIC)
    assert not list(tmp_path.glob("*.png"))  # the figures go only where --figures says
    assert (tmp_path / "budget.csv").read_text().startswith("budget,algorithm,label_budget,")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["no-such-dataset"], "not found"),
        (["DATA", "--algorithms", "dral,svm"], "unknown algorithm"),
        (["DATA", "--costs", "0.1,0.5"], "(0, 0.5)"),
        (["DATA", "--costs", "0"], "(0, 0.5)"),
        (["DATA", "--costs", "abc"], "numbers"),
        (["DATA", "--runs", "0"], ">= 1"),
        (["DATA", "--runs", "many"], "invalid int"),
        (["DATA", "--param", "etaa=1"], "etaa"),
        (["DATA", "--budgets", "10"], "kernel"),
        (["DATA", "--label-budget", "0.1,1.5"], "(0, 1]"),
        (["DATA", "--label-budget", "0.1,0.1"], "duplicate"),
        (["DATA", "--label-budget", "abc"], "numbers"),
        (["DATA", "--label-budget", "0.1", "--algorithms", "dsol"], "active learners"),
        (["DATA", "--label-budget", "0.1", "--budget-param", "speed=2"], "speed"),
        (["DATA", "--label-budget", "0.1", "--budget-param", "sharpness=-1"], "sharpness"),
        (["DATA", "--kernel", "poly", "--budgets", "5", "--label-budget", "0.1"], "separately"),
        (["DATA", "--format", "arff"], "invalid choice"),
    ],
)
def test_errors_exit_2_with_a_message(
    guide_like_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    fragment: str,
) -> None:
    """Each bad argument is refused on its own: ``DATA`` is a dataset that loads."""
    args = [str(guide_like_path) if a == "DATA" else a for a in args]
    code = main([*args, "--trials", "20", "--no-progress", "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert "Traceback" not in err
    assert not (tmp_path / "o" / "summary.json").exists()


def test_malformed_dataset_exits_2_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.svm"
    bad.write_text("1 1:0.5\n0 1:oops\n")
    assert main([str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "bad.svm:2" in capsys.readouterr().err


def test_missing_out_is_a_usage_error(
    guide_like_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(guide_like_path)]) == 2
    assert "--out" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "--algorithms" in capsys.readouterr().out


def test_module_entry_point_dispatches_to_replay(guide_like_path: Path, tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "service",
            "replay",
            str(guide_like_path),
            "--costs",
            "0.7",
            "--out",
            str(tmp_path),
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "cost must be in (0, 0.5)" in proc.stderr


def test_unwritable_output_exits_2(
    guide_like_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    args = [str(guide_like_path), "--runs", "1", "--trials", "20", "--no-plot", "--no-progress"]
    assert main([*args, "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert "error" in err
    assert str(blocker) in err  # the output directory is what failed, not the dataset


def test_a_replay_of_events_preprocesses_them_as_the_worker_serves_their_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events read under a model's declaration are replayed with the worker's pipeline for
    it: the declaration's hashed buckets are never centred (``hashed_from`` in the
    settings the summary records), a dataset's features as before."""
    from service.learning.preprocessing import OnlineStandardizer
    from service.replay.options import served_options
    from service.replay.sequential import scaler_for

    config = tmp_path / "abstain.toml"
    config.write_text(
        'default_model = "fraud"\n\n[models.fraud]\nalgorithm = "dsal"\n\n'
        "[models.fraud.fields]\nhash_bits = 6\n\n"
        '[models.fraud.fields.fields]\namount = "number"\nage = "number"\n'
        'country = "category"\ntext = "tokens"\n'
    )
    monkeypatch.delenv("ABSTAIN_CONFIG", raising=False)
    events = tmp_path / "events.jsonl"
    lines = []
    for i in range(120):
        words = [f"w{(i * 7 + k) % 40}" for k in range(i % 5)]
        features = {"amount": float(i % 13), "age": float(i % 7), "country": f"c{i % 4}"}
        lines.append({"features": {**features, "text": words}, "label": 1 if i % 3 else -1})
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    args = [str(events), "--config", str(config), "--model", "fraud", "--algorithms", "dsal"]
    args += ["--costs", "0.2", "--runs", "1", "--sampling", "sequential", "--out", str(out)]
    assert main([*args, "--no-plot", "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["hashed_from"] == 2  # two numbers, then 2^6 buckets
    options = served_options(hashed_from=2)
    first, second = scaler_for_pipeline(scaler_for, options, n=66).steps[:2]
    assert isinstance(first, OnlineStandardizer)
    assert isinstance(second, OnlineStandardizer)
    assert (first.passes_from, second.squares_from) == (2, 2)
    plain = scaler_for_pipeline(scaler_for, served_options(), n=66).steps[:2]
    assert all(isinstance(s, OnlineStandardizer) for s in plain)
    assert [(s.passes_from, s.squares_from) for s in plain] == [(None, None), (None, None)]


def scaler_for_pipeline(scaler_for: Any, options: Any, *, n: int) -> Any:
    """The pipeline the replay's served stack preprocesses ``n`` features with."""
    from service.replay.features import RunFeatures
    from service.replay.protocol import TrialPlan

    X = np.zeros((4, n))
    plan = TrialPlan(np.zeros((1, 4), dtype=np.int64), np.zeros((1, 4)))
    return scaler_for(RunFeatures(X, plan, standardize=True, intercept=True), options).pipeline
