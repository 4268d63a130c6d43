"""``sampling="sequential"``: the file in its own order, once, in every run and for every
seed (seeds and runs change only the coins); the windowed risk over time it is drawn with;
the changes a learner reports, recorded per run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.learning import DSAL
from service.learning.adaptive import Adaptive
from service.replay import sequential
from service.replay.cli import main
from service.replay.errors import ReplayConfigError
from service.replay.features import RunFeatures
from service.replay.options import ReplayOptions
from service.replay.prequential import run_stream, window_risk
from service.replay.protocol import plan_trials
from service.replay.runner import replay
from service.replay.streams import label_flip


def test_the_plan_is_the_files_order_in_every_run_and_seed_and_only_coins_differ() -> None:
    a = plan_trials(50, runs=3, trials=50, seed=1, sampling="sequential")
    b = plan_trials(50, runs=3, trials=40, seed=2, sampling="sequential")
    assert (a.indices == np.arange(50)).all()
    assert (b.indices == np.arange(40)).all()
    assert not np.allclose(a.coins[:, :40], b.coins)  # other seed: other coins
    assert not np.allclose(a.coins[0], a.coins[1])  # other run: other coins
    with pytest.raises(ReplayConfigError, match="trials must be <= 50"):
        plan_trials(50, runs=1, trials=51, seed=0, sampling="sequential")


def _stream() -> tuple[np.ndarray, np.ndarray]:
    s = label_flip(n=3000, change=1500, seed=4, noise=0.05)
    return s.X, s.y


def _options(**kw: object) -> ReplayOptions:
    base: dict[str, object] = {
        "algorithms": ("dsal", "dsol"),
        "costs": (0.25,),
        "runs": 3,
        "trials": 3000,
        "sampling": "sequential",
        "window": 200,
    }
    return ReplayOptions(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("scaler_fit", ["events", "labels"])
def test_seeds_change_the_coins_only(scaler_fit: str) -> None:
    X, y = _stream()
    first = replay(X, y, _options(seed=1, scaler_fit=scaler_fit))
    other = replay(X, y, _options(seed=2, scaler_fit=scaler_fit))
    dsol = [r.series[1] for r in (first, other)]
    assert dsol[0].algorithm == "dsol"
    # DSOL asks every label, it flips no coin: every run of every seed is the same stream
    for s in dsol:
        assert np.allclose(s.counts["loss"], s.counts["loss"][:, :1])
    assert np.allclose(dsol[0].counts["loss"], dsol[1].counts["loss"])
    # DSAL's coins differ between runs and seeds, so its runs do
    dsal = [r.series[0] for r in (first, other)]
    assert dsal[0].algorithm == "dsal"
    assert not np.allclose(dsal[0].counts["loss"][:, 0], dsal[0].counts["loss"][:, 1])
    assert not np.allclose(dsal[0].counts["loss"], dsal[1].counts["loss"])


def test_a_run_is_the_file_in_order_with_its_coins() -> None:
    """The sequential path's first run equals run_stream over the rows in file order with
    the plan's coins, event for event on the grid (and its windowed risk)."""
    X, y = _stream()
    options = _options(algorithms=("dsal",), runs=1, scaler_fit="labels")
    series = replay(X, y, options).series[0]
    plan = plan_trials(len(y), 1, len(y), options.seed, "sequential")
    features = RunFeatures(X, plan, standardize=True, intercept=True)
    learner = sequential.variant_learner(series.variant, 0.25, features.n_features, options)
    trace = run_stream(learner, X, y, plan.coins[0], 0.25, pipeline=features.pipeline())
    cumulative = np.cumsum(trace.loss)
    assert np.allclose(series.counts["loss"][:, 0], cumulative[series.grid - 1])
    t, risk = series.window_risk(200)
    assert np.allclose(risk, window_risk(trace.loss, 200)[t - 1])
    assert (t % 20 == 0).sum() >= len(y) // 20 - 1  # every step of the window's grid


def test_changes_a_learner_detects_are_recorded_per_run(monkeypatch: pytest.MonkeyPatch) -> None:
    X, y = _stream()

    def adaptive(variant: object, cost: float, n_features: int, options: object) -> Adaptive:
        return Adaptive(DSAL(n_features=n_features, cost=cost, seed=0))

    monkeypatch.setattr(sequential, "variant_learner", adaptive)
    options = _options(algorithms=("dsal",), scaler_fit="labels")
    series = replay(X, y, options).series[0]
    assert len(series.changes) == 3
    assert all(series.changes), "a label flip is detected in every run"
    for run in series.changes:
        assert all(1500 < c <= 3000 for c in run[:1]), run  # after the flip
    assert series.summary()["changes"] == [list(c) for c in series.changes]
    # a learner that reports nothing leaves nothing
    monkeypatch.undo()
    assert replay(X, y, _options(scaler_fit="labels")).series[0].changes == ((), (), ())


def test_the_command_runs_the_file_once_in_order_and_draws_the_window(tmp_path: Path) -> None:
    X, y = _stream()
    data = tmp_path / "flip.csv"
    rows = [
        ",".join([*(f"{v:.5f}" for v in x), str(int(label))]) for x, label in zip(X, y, strict=True)
    ]
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    code = main(
        [
            str(data),
            "--sampling",
            "sequential",
            "--algorithms",
            "dsal",
            "--costs",
            "0.25",
            "--runs",
            "2",
            "--window",
            "300",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    summary = (out / "summary.json").read_text()
    assert '"trials": 3000' in summary  # every row once, by default
    assert '"window": 300' in summary
    png = (out / "window.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert (
        main(
            [
                str(data),
                "--sampling",
                "sequential",
                "--trials",
                "3001",
                "--out",
                str(out),
                "--no-progress",
                "--no-plot",
            ]
        )
        == 2
    )
