"""``replay --shadow``: the specs, the champion-and-shadows loop against a plain loop, a
shadow twin of the champion, coverage bookkeeping, the files and the errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from service.config import ModelConfig
from service.learning import DRAL, DSAL, QueryBudget
from service.replay import ReplayOptions
from service.replay.cli import main
from service.replay.errors import ReplayConfigError
from service.replay.features import RunFeatures
from service.replay.protocol import plan_trials
from service.replay.shadow_results import ShadowResult, Track, checkpoints
from service.replay.shadows import champion_weight_cap, parse_shadow, replay_shadows

from .conftest import Dataset

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _options(**kw: object) -> ReplayOptions:
    base: dict[str, object] = {
        "algorithms": ("dsal",),
        "costs": (0.25,),
        "runs": 2,
        "trials": 400,
        "seed": 3,
    }
    return ReplayOptions(**{**base, **kw})  # type: ignore[arg-type]


# -- specs -------------------------------------------------------------------------------
def test_specs_name_an_algorithm_and_optional_keys() -> None:
    spec = parse_shadow(' DSAL : cost=0.1, eta={"kind": "constant", "eta": 0.05}, gamma=2 ')
    assert (spec.algorithm, spec.cost, spec.weighting) == ("dsal", 0.1, "importance")
    assert spec.params == {"eta": {"kind": "constant", "eta": 0.05}, "gamma": 2}
    assert spec.name == 'dsal:cost=0.1,eta={"kind": "constant", "eta": 0.05},gamma=2'
    assert parse_shadow("dral:weighting=none").weighting == "none"
    assert parse_shadow("kernel-dral:weighting=none,budget=50").params == {"budget": 50}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("svm", "unknown algorithm 'svm'"),
        ("", "unknown algorithm ''"),
        ("dral:", "expected KEY=VALUE"),
        ("dral:eta", "expected KEY=VALUE after ':', got 'eta'"),
        ("dral:speed=3", "dral takes no 'speed'"),
        ("dral:gamma=2", "dral takes no 'gamma'"),
        ("dral:cost=0.5", "(0, 0.5)"),
        ("dral:cost=cheap", "cost"),
        ("dral:weighting=half", "weighting must be one of importance, none"),
        ("dral:eta=0.1,eta=0.2", "'eta' given twice"),
        ("dral:eta=-1", "--shadow 'dral:eta=-1'"),
        ("kernel-dral", "add weighting=none"),
    ],
)
def test_bad_specs_are_refused_with_a_message_naming_the_spec(text: str, fragment: str) -> None:
    with pytest.raises(ReplayConfigError) as info:
        parse_shadow(text)
    assert fragment in str(info.value)
    assert f"--shadow {text!r}" in str(info.value)


# -- the loop ----------------------------------------------------------------------------
def test_the_replay_equals_a_plain_loop_of_decisions_weighted_updates_and_sums(
    guide_like: Dataset,
) -> None:
    X, y = guide_like
    options = _options(runs=1)
    result = replay_shadows(X, y, options, [parse_shadow("dral")], max_weight=20.0, points=4)
    plan = plan_trials(X.shape[0], 1, 400, 3)
    z = RunFeatures(X, plan, standardize=True, intercept=True).run(0)
    ys, coins = y[plan.indices[0]].tolist(), plan.coins[0].tolist()
    champion, shadow = DSAL(n_features=5, cost=0.25, seed=3), DRAL(n_features=5, cost=0.25)
    true, rejected = np.zeros(2), np.zeros(2)
    charged: list[list[tuple[float, float]]] = [[], []]
    for t in range(400):
        dc, ds = champion.decide(z[t], coin=coins[t]), shadow.decide(z[t], coin=coins[t])
        losses = [0.25 if d.label == 0 else float(d.label != ys[t]) for d in (dc, ds)]
        true += losses
        rejected += [dc.label == 0, ds.label == 0]
        if dc.query:
            p = max(dc.query_probability, 1 / 20)
            for i in (0, 1):
                charged[i].append((losses[i], p))
            champion.update(z[t], ys[t])
            shadow.update(z[t], ys[t], weight=1 / p)
    for i, track in enumerate(result.tracks):
        assert track.true[-1, 0] == pytest.approx(true[i] / 400, abs=1e-12)
        assert track.labels[-1, 0] == len(charged[i])
        ht = sum(loss / p for loss, p in charged[i]) / 400
        ratio = sum(loss / p for loss, p in charged[i]) / sum(1 / p for _, p in charged[i])
        assert track.estimate[-1, 0] == pytest.approx(ht, rel=1e-12)
        assert track.ratio[-1, 0] == pytest.approx(ratio, rel=1e-12)
        assert track.rejected[-1, 0] == rejected[i] / 400
    assert result.settings["weight_cap"] == 20.0


@pytest.mark.parametrize("scaler_fit", ["events", "labels"])
def test_an_unweighted_twin_of_the_champion_decides_exactly_as_the_champion(
    guide_like: Dataset, scaler_fit: str
) -> None:
    X, y = guide_like
    options = _options(scaler_fit=scaler_fit)
    result = replay_shadows(X, y, options, [parse_shadow("dsal:weighting=none")], points=5)
    champion, twin = result.tracks
    for name in ("true", "estimate", "low", "high", "labels", "rejected"):
        np.testing.assert_array_equal(getattr(twin, name), getattr(champion, name))
    assert (champion.role, twin.role, twin.weighting) == ("champion", "shadow", "none")


def test_a_weighted_shadow_learns_from_the_same_labels_differently(guide_like: Dataset) -> None:
    X, y = guide_like
    result = replay_shadows(X, y, _options(), [parse_shadow("dsal")], points=5)
    champion, shadow = result.tracks
    np.testing.assert_array_equal(shadow.labels, champion.labels)  # the champion's labels
    assert not np.array_equal(shadow.true, champion.true)


def test_a_budgeted_champion_asks_at_its_rate_and_raises_the_weight_cap_as_the_stream(
    guide_like: Dataset,
) -> None:
    X, y = guide_like
    options = _options(label_budgets=(0.05,), trials=600)
    result = replay_shadows(X, y, options, [parse_shadow("dral")], points=3)
    assert result.tracks[0].name == "dsal budget@0.05"
    assert 0.02 < result.tracks[0].labels[-1].mean() / 600 < 0.1
    assert result.settings["weight_cap"] == pytest.approx(200.0)


@pytest.mark.parametrize(("fraction", "explore"), [(0.05, 0.1), (0.5, 0.1), (0.01, 0.0)])
def test_the_weight_cap_is_the_stream_models_weight_cap(fraction: float, explore: float) -> None:
    config = ModelConfig(n_features=2, label_budget={"fraction": fraction, "explore": explore})
    budget = QueryBudget(fraction, explore=explore)
    assert champion_weight_cap(100.0, budget) == pytest.approx(config.weight_cap(100.0))
    assert champion_weight_cap(100.0, None) == ModelConfig(n_features=2).weight_cap(100.0)


def test_one_champion_at_one_cost() -> None:
    X, y = np.zeros((5, 2)), np.ones(5, dtype=np.int64)
    for options, fragment in [
        (_options(algorithms=("dsal", "dral")), "exactly one"),
        (_options(costs=(0.1, 0.25)), "exactly one"),
        (_options(label_budgets=(0.1, 0.2)), "one budget"),
    ]:
        with pytest.raises(ReplayConfigError, match=fragment):
            replay_shadows(X, y, options, [parse_shadow("dral")])
    with pytest.raises(ReplayConfigError, match="duplicate"):
        replay_shadows(X, y, _options(), [parse_shadow("dral"), parse_shadow(" DRAL")])
    with pytest.raises(ReplayConfigError, match="at least one"):
        replay_shadows(X, y, _options(), [])


# -- results -----------------------------------------------------------------------------
def test_coverage_counts_pairs_whose_interval_holds_the_true_risk() -> None:
    nan = np.nan
    shape = (3, 2)
    true = np.array([[0.10, 0.10], [0.20, 0.05], [0.10, 0.10]])
    low = np.array([[nan, 0.00], [0.10, 0.10], [0.05, 0.05]])
    high = np.array([[nan, 0.20], [0.30, 0.20], [0.15, 0.08]])
    labels = np.array([[0, 5], [5, 50], [50, 50]], dtype=float)
    track = Track(
        "m",
        "shadow",
        "dral",
        0.25,
        "importance",
        true,
        true,
        low,
        high,
        true,
        low,
        high,
        labels,
        np.zeros(shape),
    )
    # pairs with a label: (0,1) yes, (1,0) yes, (1,1) no, (2,0) yes, (2,1) no
    assert track.coverage() == pytest.approx(3 / 5)
    assert track.coverage(min_labels=50) == pytest.approx(1 / 3)
    # per run: run 0 covers 2 of 2 checkpoints with a label, run 1 one of 3
    per_run = np.array([1.0, 1 / 3])
    assert track.coverage_se() == pytest.approx(per_run.std(ddof=1) / np.sqrt(2))
    by_checkpoint = track.coverage_by_checkpoint()
    assert by_checkpoint.tolist() == [1.0, 0.5, 0.5]
    assert np.isnan(track.coverage_by_checkpoint(min_labels=10)[0])
    assert checkpoints(10_000, 100)[[0, -1]].tolist() == [100, 10_000]


def test_summary_and_curves_are_json_and_csv_with_nan_left_out(tmp_path: Path) -> None:
    g, r = 2, 1
    nan_track = np.full((g, r), np.nan)
    ones = np.ones((g, r))
    track = Track(
        "dral",
        "shadow",
        "dral",
        0.25,
        "importance",
        ones * 0.1,
        nan_track,
        nan_track,
        nan_track,
        nan_track,
        nan_track,
        nan_track,
        np.zeros((g, r)),
        ones * 0.5,
    )
    result = ShadowResult("toy", r, 10, np.array([5, 10]), 0.95, 0, [track], np.zeros(r))
    result.write_summary(tmp_path / "s.json")
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["models"][0]["estimate_mean"] is None
    assert summary["models"][0]["coverage"] is None  # no checkpoint with a label
    result.write_curves(tmp_path / "c.csv")
    rows = list(csv.DictReader((tmp_path / "c.csv").read_text().splitlines()))
    assert [row["t"] for row in rows] == ["5", "10"]
    assert rows[0]["estimate_mean"] == ""
    assert rows[0]["true_mean"] == "0.1"


# -- the command -------------------------------------------------------------------------
def test_the_command_writes_the_shadow_files(
    guide_like_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = [
        str(guide_like_path),
        "--algorithms",
        "dsal",
        "--costs",
        "0.25",
        "--shadow",
        "dral",
        "--shadow",
        "dsal:gamma=2,weighting=none",
        "--runs",
        "2",
        "--trials",
        "300",
        "--level",
        "0.9",
        "--checkpoints",
        "10",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    summary = json.loads((out / "shadow.json").read_text())
    assert [m["name"] for m in summary["models"]] == ["dsal", "dral", "dsal:gamma=2,weighting=none"]
    assert [m["role"] for m in summary["models"]] == ["champion", "shadow", "shadow"]
    assert (summary["level"], summary["checkpoints"], summary["runs"]) == (0.9, 10, 2)
    for model in summary["models"]:
        assert 0.0 <= model["coverage"] <= 1.0
        assert 0.0 <= model["true_risk_mean"] <= 1.0
    rows = list(csv.DictReader((out / "shadow.csv").read_text().splitlines()))
    assert len(rows) == 30
    assert (out / "shadow.png").read_bytes().startswith(PNG_MAGIC)
    assert not (out / "summary.json").exists()
    printed = capsys.readouterr()
    assert str(out / "shadow.json") in printed.out
    assert "dral (shadow): true risk" in printed.err


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--shadow", "svm"], "--shadow 'svm': unknown algorithm"),
        (["--shadow", "dral:eta"], "expected KEY=VALUE"),
        (["--shadow", "dral", "--algorithms", "dsal,dral"], "exactly one algorithm"),
        (["--shadow", "dral", "--costs", "0.1,0.2"], "one cost"),
        (["--shadow", "dral", "--shadow", "dral"], "duplicate"),
        (["--level", "0.9"], "--level: only with --shadow"),
        (["--shadow", "dral", "--level", "1.5"], "level must be in (0, 1)"),
        (["--shadow", "dral", "--max-weight", "0.5"], "max weight >= 1"),
        (["--shadow", "dral", "--checkpoints", "0"], "--checkpoints must be >= 1"),
        (["--shadow", "dral", "--level", "high"], "invalid float"),
    ],
)
def test_bad_shadow_arguments_exit_2_with_a_message(
    guide_like_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    fragment: str,
) -> None:
    base = ["--algorithms", "dsal", "--costs", "0.25"]
    code = main(
        [
            str(guide_like_path),
            *base,
            *args,
            "--runs",
            "1",
            "--trials",
            "20",
            "--no-progress",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert fragment in err
    assert "Traceback" not in err
    assert not (tmp_path / "o" / "shadow.json").exists()
