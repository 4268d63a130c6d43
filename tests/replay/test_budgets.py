"""Replays with label budgets (``--label-budget``): variants, rates, agreement of the batched
engine with budgeted single learners, and the files written."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from service.learning import Budgeted, make_learner
from service.replay.cli import main
from service.replay.errors import ReplayConfigError
from service.replay.features import RunFeatures
from service.replay.options import ReplayOptions
from service.replay.protocol import plan_trials
from service.replay.results import ReplayResult, Series, Variant
from service.replay.runner import replay

Dataset = tuple[np.ndarray, np.ndarray]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def find(result: ReplayResult, variant: Variant, cost: float) -> Series:
    (series,) = [s for s in result.series if s.variant == variant and s.cost == cost]
    return series


@pytest.fixture(scope="module")
def budgeted(guide_like: Dataset) -> ReplayResult:
    X, y = guide_like
    options = ReplayOptions(runs=3, trials=600, seed=3, label_budgets=(0.05, 0.2))
    return replay(X, y, options, dataset="guide-like")


def test_variants_are_the_own_rules_then_budget_and_random_per_active_algorithm() -> None:
    options = ReplayOptions(label_budgets=(0.1,))
    assert [v.name for v in options.variants()] == [
        "dral",
        "dsal",
        "dsol",
        "dral budget@0.1",
        "dral random@0.1",
        "dsal budget@0.1",
        "dsal random@0.1",
    ]
    kernel = ReplayOptions(algorithms=("kernel-dsal", "kernel-dsol"), label_budgets=(0.2,))
    assert [v.name for v in kernel.variants()][2:] == [
        "kernel-dsal budget@0.2",
        "kernel-dsal random@0.2",
    ]


def test_budgeted_variants_spend_their_budget_and_never_much_more(
    budgeted: ReplayResult,
) -> None:
    for s in budgeted.series:
        if s.label_budget is None:
            continue
        asked = s.final("asked")  # per run; the credit feedback keeps it on the allowance
        tolerance = 0.25 * s.label_budget + 10 / 600
        assert asked.max() <= s.label_budget + tolerance, s.variant
        if s.sampling == "budget":
            # a budget is a ceiling: once a learner is sure of most events (this set is
            # separable) its utilities vanish and it asks less, never below the floor v * b
            assert asked.min() >= 0.1 * s.label_budget, s.variant
        else:
            assert asked.min() >= s.label_budget - tolerance, s.variant


def test_budgeted_dsal_beats_random_sampling_at_the_same_budget(
    budgeted: ReplayResult,
) -> None:
    for cost in (0.1, 0.25, 0.4):
        own = find(budgeted, Variant("dsal", 0.2, "budget"), cost).final("loss").mean()
        rnd = find(budgeted, Variant("dsal", 0.2, "random"), cost).final("loss").mean()
        assert own < rnd, cost


def test_adding_budgets_leaves_the_own_rule_series_unchanged(
    guide_like: Dataset, budgeted: ReplayResult
) -> None:
    X, y = guide_like
    plain = replay(X, y, ReplayOptions(runs=3, trials=600, seed=3))
    for s in plain.series:
        other = find(budgeted, s.variant, s.cost)
        for name in ("loss", "asked", "rejected"):
            np.testing.assert_array_equal(s.counts[name], other.counts[name])


@pytest.mark.parametrize("sampling", ["budget", "random"])
def test_batched_budget_rows_match_budgeted_single_learners(
    guide_like: Dataset, sampling: str
) -> None:
    X, y = guide_like
    options = ReplayOptions(
        algorithms=("dral", "dsal"),
        runs=2,
        trials=500,
        costs=(0.25,),
        seed=6,
        label_budgets=(0.1,),
        budget_params={"horizon": 100},
    )
    result = replay(X, y, options)
    plan = plan_trials(X.shape[0], 2, 500, 6)
    inputs = RunFeatures(X, plan, standardize=True, intercept=True)
    for algorithm in ("dral", "dsal"):
        variant = Variant(algorithm, 0.1, sampling)  # type: ignore[arg-type]
        s = find(result, variant, 0.25)
        for r in range(2):
            z = inputs.run(r)
            budget = variant.query_budget(options.budget_params, options.seed)
            model = Budgeted(make_learner(algorithm, n_features=z.shape[1], cost=0.25), budget)
            asked = rejected = 0
            for t in range(500):
                yt = int(y[plan.indices[r, t]])
                d = model.decide(z[t], coin=float(plan.coins[r, t]))
                rejected += d.label == 0
                if d.query:
                    asked += 1
                    model.update(z[t], yt)
            assert (s.counts["asked"][-1, r], s.counts["rejected"][-1, r]) == (asked, rejected)
            assert s.rho[r] == pytest.approx(model.rho, rel=1e-9, abs=1e-12)


def test_kernel_learners_run_budgets_one_at_a_time(guide_like: Dataset) -> None:
    X, y = guide_like
    options = ReplayOptions(
        algorithms=("kernel-dsal",),
        runs=1,
        trials=400,
        costs=(0.25,),
        budget=50,
        label_budgets=(0.1,),
    )
    result = replay(X, y, options)
    assert [s.variant.name for s in result.series] == [
        "kernel-dsal",
        "kernel-dsal budget@0.1",
        "kernel-dsal random@0.1",
    ]
    for s in result.series[1:]:
        assert s.final("asked")[0] == pytest.approx(0.1, abs=0.03)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"label_budgets": (0.0,)}, r"\(0, 1\]"),
        ({"label_budgets": (0.1, 0.1)}, "duplicate"),
        ({"label_budgets": (0.1,), "algorithms": ("dsol",)}, "active"),
        ({"label_budgets": (0.1,), "budget_params": {"speed": 1}}, "speed"),
    ],
)
def test_bad_budget_options_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ReplayConfigError, match=match):
        ReplayOptions(**kwargs)  # type: ignore[arg-type]


def test_cli_label_budget_writes_rows_curves_and_a_sixth_column(
    guide_like_path: Path, tmp_path: Path
) -> None:
    code = main(
        [
            str(guide_like_path),
            "--runs",
            "2",
            "--trials",
            "300",
            "--costs",
            "0.25",
            "--label-budget",
            "0.05,0.2",
            "--budget-param",
            "sharpness=1",
            "--no-progress",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = summary["results"]
    assert len(rows) == 3 + 2 * 2 * 2
    assert {(r["algorithm"], r["label_budget"], r["sampling"]) for r in rows} >= {
        ("dsol", None, "own"),
        ("dsal", 0.05, "budget"),
        ("dral", 0.2, "random"),
    }
    assert summary["settings"]["label_budgets"] == [0.05, 0.2]
    assert summary["settings"]["budget_params"] == {"sharpness": 1}
    with (tmp_path / "curves.csv").open() as handle:
        curves = list(csv.DictReader(handle))
    assert {r["sampling"] for r in curves} == {"own", "budget", "random"}
    assert {r["label_budget"] for r in curves} == {"", "0.05", "0.2"}
    png = (tmp_path / "guide-like.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
