"""The replay on a generated Guide-like dataset and on Phishing: shape of the results,
consistency, and agreement of the batched engine with the single learners run one trial at
a time."""

from __future__ import annotations

import numpy as np
import pytest

from service.learning import default_pipeline, make_learner
from service.replay.errors import ReplayConfigError
from service.replay.features import RunFeatures
from service.replay.options import ReplayOptions, params_for, parse_algorithms, parse_params
from service.replay.protocol import plan_trials
from service.replay.results import ReplayResult, Series
from service.replay.runner import replay

Dataset = tuple[np.ndarray, np.ndarray]


def find(result: ReplayResult, algorithm: str, cost: float) -> Series:
    (series,) = [s for s in result.series if s.algorithm == algorithm and s.cost == cost]
    return series


@pytest.fixture(scope="module")
def small_result(guide_like: Dataset) -> ReplayResult:
    X, y = guide_like
    return replay(X, y, ReplayOptions(runs=3, trials=500, seed=11), dataset="guide-like")


def test_every_algorithm_and_cost_is_reported(small_result: ReplayResult) -> None:
    summary = small_result.summary()
    assert (summary["dataset"], summary["runs"], summary["trials"]) == ("guide-like", 3, 500)
    pairs = {(r["algorithm"], r["cost"]) for r in summary["results"]}
    assert pairs == {(a, c) for a in ("dral", "dsal", "dsol") for c in (0.1, 0.25, 0.4)}


def test_rates_are_fractions_and_risk_is_misclassified_plus_d_rejected(
    small_result: ReplayResult,
) -> None:
    for s in small_result.series:
        for name in ("loss", "asked", "misclassified", "rejected"):
            rates = s.rate(name)
            assert ((rates >= 0.0) & (rates <= 1.0)).all(), (s.algorithm, name)
        # the loss is charged from (score, rho); the counts from the returned labels
        np.testing.assert_allclose(
            s.final("loss"), s.final("misclassified") + s.cost * s.final("rejected")
        )
        assert s.final("misclassified").sum() + s.final("rejected").sum() > 0.0
        assert (s.rho >= 0.0).all()


def test_dsol_asks_every_label_and_active_learners_ask_fewer(
    small_result: ReplayResult,
) -> None:
    for cost in (0.1, 0.25, 0.4):
        assert (find(small_result, "dsol", cost).final("asked") == 1.0).all()
        assert (find(small_result, "dsal", cost).final("asked") < 1.0).all()
        assert (find(small_result, "dral", cost).final("asked") < 1.0).all()


def test_learning_beats_the_trivial_reject_everything_risk(
    small_result: ReplayResult,
) -> None:
    # rejecting everything costs d; the data are linearly separable up to 2 % noise
    for s in small_result.series:
        assert s.final("loss").mean() < s.cost, (s.algorithm, s.cost)


@pytest.mark.parametrize("standardize", [True, False])
def test_batched_replay_matches_single_learners_trial_by_trial(
    guide_like: Dataset, standardize: bool
) -> None:
    X, y = guide_like
    options = ReplayOptions(runs=2, trials=400, costs=(0.1, 0.4), seed=5, standardize=standardize)
    result = replay(X, y, options)
    plan = plan_trials(X.shape[0], 2, 400, 5)
    inputs = RunFeatures(X, plan, standardize=standardize, intercept=True)
    for r in range(2):
        z = inputs.run(r)
        for algorithm in ("dral", "dsal", "dsol"):
            for cost in (0.1, 0.4):
                learner = make_learner(algorithm, n_features=z.shape[1], cost=cost)
                loss = asked = wrong = rejected = 0.0
                for t in range(400):
                    yt = int(y[plan.indices[r, t]])
                    decision = learner.decide(z[t], coin=float(plan.coins[r, t]))
                    if decision.label == 0:
                        rejected += 1
                        loss += cost
                    elif decision.label != yt:
                        wrong += 1
                        loss += 1.0
                    if decision.query:
                        asked += 1
                        learner.update(z[t], yt)
                s = find(result, algorithm, cost)
                key = (algorithm, cost, r)
                assert s.counts["asked"][-1, r] == asked, key
                assert s.counts["misclassified"][-1, r] == wrong, key
                assert s.counts["rejected"][-1, r] == rejected, key
                assert s.counts["loss"][-1, r] == pytest.approx(loss), key
                assert s.rho[r] == pytest.approx(learner.rho, rel=1e-9, abs=1e-12), key


def test_standardised_inputs_equal_the_service_pipeline(guide_like: Dataset) -> None:
    X, _ = guide_like
    plan = plan_trials(X.shape[0], 3, 50, 2)
    inputs = RunFeatures(X, plan, standardize=True, intercept=True)
    batched = np.stack([inputs(t) for t in range(50)], axis=1)
    for r in range(3):
        pipe = inputs.pipeline()
        for t in range(50):
            x = X[plan.indices[r, t]]
            pipe.learn(x)
            np.testing.assert_array_equal(batched[r, t], pipe.transform(x))
    assert batched.shape == (3, 50, X.shape[1] + 1)
    assert (batched[..., -1] == 1.0).all()


def test_standardised_inputs_must_be_read_in_order(guide_like: Dataset) -> None:
    X, _ = guide_like
    inputs = RunFeatures(X, plan_trials(X.shape[0], 1, 5, 0), standardize=True, intercept=False)
    inputs(0)
    with pytest.raises(ReplayConfigError, match="in order"):
        inputs(2)


def test_same_seed_same_result_and_runs_do_not_depend_on_r(guide_like: Dataset) -> None:
    X, y = guide_like
    one = replay(X, y, ReplayOptions(runs=1, trials=300, seed=4, costs=(0.25,)))
    two = replay(X, y, ReplayOptions(runs=2, trials=300, seed=4, costs=(0.25,)))
    again = replay(X, y, ReplayOptions(runs=2, trials=300, seed=4, costs=(0.25,)))
    for a, b, c in zip(one.series, two.series, again.series, strict=True):
        for name in ("loss", "asked"):
            np.testing.assert_array_equal(a.counts[name][:, 0], b.counts[name][:, 0])
            np.testing.assert_array_equal(b.counts[name], c.counts[name])


def test_hyperparameters_reach_the_learners(guide_like: Dataset) -> None:
    X, y = guide_like
    base = ReplayOptions(algorithms=("dsal",), runs=1, trials=300, costs=(0.25,))
    slow = ReplayOptions(
        algorithms=("dsal",), runs=1, trials=300, costs=(0.25,), params={"eta": 1e-4}
    )
    a = replay(X, y, base).series[0]
    b = replay(X, y, slow).series[0]
    # with a tiny step the model barely moves away from w = 0: it keeps rejecting
    assert b.final("rejected")[0] > a.final("rejected")[0]
    assert b.rho[0] == pytest.approx(1.0, abs=0.05)


def test_phishing_replay_runs_at_68_features_plus_intercept(phishing: Dataset) -> None:
    X, y = phishing
    result = replay(X, y, ReplayOptions(runs=2, trials=300, costs=(0.4,)), dataset="phishing")
    assert len(result.series) == 3
    for s in result.series:
        assert s.final("loss").mean() < 0.4


def test_kernel_replay_with_linear_kernel_matches_the_linear_learner(guide_like: Dataset) -> None:
    X, y = guide_like
    # the same step size for both (their defaults differ: kernel values are larger)
    eta = {"kind": "inverse-time", "eta0": 0.2, "tau": 1000.0}
    common = {"runs": 1, "trials": 300, "costs": (0.25,), "seed": 9, "params": {"eta": eta}}
    linear = replay(X, y, ReplayOptions(algorithms=("dsal",), **common))  # type: ignore[arg-type]
    # without the rho cap: the appendix algorithm, which is the linear one for a linear kernel
    common["params"] = {"eta": eta, "kernel-dsal.rho_cap": None}
    kernel = replay(
        X,
        y,
        ReplayOptions(
            algorithms=("kernel-dsal",), kernel={"kind": "linear"}, budget=1000, **common
        ),  # type: ignore[arg-type]
    )
    a, b = linear.series[0], kernel.series[0]
    assert b.algorithm == "kernel-dsal"
    for name in ("asked", "misclassified", "rejected"):
        np.testing.assert_array_equal(a.counts[name], b.counts[name])
    assert b.rho[0] == pytest.approx(a.rho[0], rel=1e-9)
    assert b.seconds > 0.0


def test_kernel_replay_polynomial_budget_runs(guide_like: Dataset) -> None:
    X, y = guide_like
    result = replay(
        X,
        y,
        ReplayOptions(
            algorithms=("kernel-dral", "kernel-dsal"),
            runs=1,
            trials=200,
            costs=(0.4,),
            kernel={"kind": "polynomial", "degree": 2},
            budget=20,
        ),
    )
    for s in result.series:
        np.testing.assert_allclose(
            s.final("loss"), s.final("misclassified") + 0.4 * s.final("rejected")
        )


def test_parse_algorithms_refuses_unknown_and_duplicate_names() -> None:
    with pytest.raises(ReplayConfigError, match="unknown algorithm"):
        parse_algorithms("dral,perceptron")
    with pytest.raises(ReplayConfigError, match="duplicate"):
        parse_algorithms("dral,kernel-dral", kernel=True)


def test_params_are_routed_per_algorithm() -> None:
    params = parse_params(["gamma=2", "dsal.eta=0.5", "rho=1.5"])
    assert params_for("dral", params) == {"rho": 1.5}  # DRAL has no gamma
    assert params_for("dsal", params) == {"gamma": 2, "eta": 0.5, "rho": 1.5}
    with pytest.raises(ReplayConfigError, match="takes no hyperparameter"):
        params_for("dral", {"dral.gamma": 2})
    with pytest.raises(ReplayConfigError, match="KEY=VALUE"):
        parse_params(["gamma"])


def test_unknown_hyperparameter_is_refused(guide_like: Dataset) -> None:
    X, y = guide_like
    with pytest.raises(ReplayConfigError, match="etaa"):
        replay(X, y, ReplayOptions(runs=1, trials=10, params={"etaa": 1.0}))


@pytest.mark.parametrize(
    "kwargs",
    [{"runs": 0}, {"trials": 0}, {"costs": (0.5,)}, {"algorithms": ("svm",)}, {"budget": 0}],
)
def test_invalid_options_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ReplayConfigError):
        ReplayOptions(**kwargs)  # type: ignore[arg-type]


def test_labelled_only_standardiser_follows_the_stream_service(guide_like: Dataset) -> None:
    X, y = guide_like
    options = ReplayOptions(
        algorithms=("dral", "dsal"),
        runs=1,
        trials=300,
        costs=(0.25,),
        seed=2,
        scaler_fit="labels",
    )
    result = replay(X, y, options)
    events = replay(X, y, ReplayOptions(**{**options.__dict__, "scaler_fit": "events"}))
    plan = plan_trials(X.shape[0], 1, 300, 2)
    for algorithm in ("dral", "dsal"):
        # what a stream worker does: decide on transform(x) with the statistics so far;
        # on a label, the standardiser learns x, then the learner updates on transform(x)
        learner = make_learner(algorithm, n_features=X.shape[1] + 1, cost=0.25)
        pipe = default_pipeline(X.shape[1])
        asked = rejected = 0
        for t in range(300):
            x, yt = X[plan.indices[0, t]], int(y[plan.indices[0, t]])
            decision = learner.decide(pipe.transform(x), coin=float(plan.coins[0, t]))
            rejected += decision.label == 0
            if decision.query:
                asked += 1
                pipe.learn(x)
                learner.update(pipe.transform(x), yt)
        s = find(result, algorithm, 0.25)
        assert s.counts["asked"][-1, 0] == asked
        assert s.counts["rejected"][-1, 0] == rejected
        assert s.rho[0] == pytest.approx(learner.rho)
        other = find(events, algorithm, 0.25)
        assert (other.counts["asked"][-1, 0], other.rho[0]) != (asked, learner.rho)


def test_learners_with_step_bounds_run_one_at_a_time(guide_like: Dataset) -> None:
    from service.learning import DSAL, HyperparameterError
    from service.learning.batch import BatchLearner
    from service.replay import runner

    X, y = guide_like
    bounded = ReplayOptions(
        algorithms=("dsal", "dsol"),
        runs=1,
        trials=200,
        costs=(0.25,),
        params={"dsal.rho_eta_max": 0.2},
    )
    assert [v.algorithm for v in runner._batched(bounded)] == ["dsol"]  # noqa: SLF001
    free = ReplayOptions(algorithms=("dsal",), runs=1, trials=200, costs=(0.25,))
    (dsal,) = [s for s in replay(X, y, bounded).series if s.algorithm == "dsal"]
    assert dsal.rho[0] != replay(X, y, free).series[0].rho[0]  # the bound reached it
    with pytest.raises(HyperparameterError, match="rho_eta_max"):
        BatchLearner.from_learners([DSAL(n_features=2, cost=0.25, rho_eta_max=0.2)])
