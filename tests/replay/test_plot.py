"""Figures are written as PNG files from synthetic results (no display needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from service.replay.plot import plot_budget, plot_replay, plot_window
from service.replay.results import ReplayResult, Series, time_grid

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def synthetic(algorithm: str, cost: float, runs: int = 4, trials: int = 1000) -> Series:
    rng = np.random.default_rng(0)
    grid = time_grid(trials, 40)
    t = grid[:, None].astype(float)
    wrong = np.floor(0.05 * t * rng.uniform(0.8, 1.2, size=(1, runs)))
    rejected = np.floor(0.1 * t)
    counts = {
        "misclassified": wrong,
        "rejected": rejected * np.ones((1, runs)),
        "asked": np.floor(0.3 * t) * np.ones((1, runs)),
    }
    counts["loss"] = counts["misclassified"] + cost * counts["rejected"]
    return Series(algorithm, cost, grid, counts, rho=np.ones(runs))


def test_replay_figure_is_a_png(tmp_path: Path) -> None:
    series = [synthetic(a, c) for a in ("dral", "dsal", "kernel-dsol") for c in (0.1, 0.4)]
    path = tmp_path / "toy.png"
    plot_replay(ReplayResult("toy", runs=4, trials=1000, series=series), path)
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert 10_000 < len(data) < 600_000


def test_budget_figure_is_a_png(tmp_path: Path) -> None:
    rows = [
        {
            "algorithm": a,
            "cost": c,
            "budget": b,
            "risk_mean": 0.1 / b,
            "risk_std": 0.01,
            "asked": 0.2,
        }
        for a in ("kernel-dral", "kernel-dsal")
        for c in (0.1, 0.25)
        for b in (25, 50, 100)
    ]
    path = tmp_path / "budget.png"
    plot_budget(rows, path)
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_window_figure_is_a_png_with_or_without_changes(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    grid = time_grid(3000, 40, every=50)
    losses = rng.uniform(0.0, 0.5, size=(3000, 2))
    cumulative = np.cumsum(losses, axis=0)[grid - 1]
    plain = Series("dsal", 0.25, grid, {"loss": cumulative}, rho=np.ones(2))
    detected = dataclasses.replace(plain, algorithm="dsol", changes=((1200,), (1300, 2000)))
    sizes = []
    for name, series in (("plain", [plain]), ("marked", [plain, detected])):
        path = tmp_path / f"{name}.png"
        plot_window(ReplayResult(name, runs=2, trials=3000, series=series), path, window=500)
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC)
        sizes.append(len(data))
    assert sizes[1] != sizes[0]
