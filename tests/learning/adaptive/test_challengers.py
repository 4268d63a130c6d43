"""The takeover test's record: a paired gain whose standard error allows for gains that
come in runs, and records written before it kept the products of successive gains."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

from service.learning import DRAL, DSAL, StateError
from service.learning.adaptive import Adaptive
from service.learning.adaptive.challengers import (
    MAX_AUTOCORRELATION,
    TAIL,
    Challenger,
    Paired,
    base_of,
    challenger_for,
)


def record(gains: list[float]) -> Paired:
    out = Paired()
    for g in gains:
        out.add(g, 1.0)
    return out


def test_gains_in_random_order_are_tested_as_before() -> None:
    rng = np.random.default_rng(0)
    gains = rng.choice([-1.0, 0.0, 1.0], p=[0.2, 0.3, 0.5], size=400).tolist()
    paired = record(gains)
    assert abs(paired.autocorrelation()) < 0.1
    mean = float(np.mean(gains))
    plain_se = float(np.std(gains)) / math.sqrt(len(gains))
    assert paired.winning(10, 2.0, "plain") == (mean > 2.0 * plain_se)


def test_a_run_of_gains_needs_more_evidence_than_the_same_gains_mixed() -> None:
    runs = record([1.0] * 12 + [-1.0] * 4 + [1.0] * 12 + [-1.0] * 4)
    mixed = record([1.0, 1.0, 1.0, -1.0] * 8)
    assert runs.mean == mixed.mean
    assert runs.autocorrelation() > 0.4
    assert mixed.winning(10, 2.0, "plain")
    assert not runs.winning(10, 2.0, "plain")


@pytest.mark.parametrize(
    "gains", [[1.0] * 20, [1.0, -1.0] * 10, [0.0] * 5 + [1.0] * 15, [1.0, 1.0], []]
)
def test_the_autocorrelation_is_clipped(gains: list[float]) -> None:
    r = record(gains).autocorrelation()
    assert 0.0 <= r <= MAX_AUTOCORRELATION


def test_gains_that_never_vary_win_at_once() -> None:
    assert record([1.0] * 10).winning(10, 2.0, "both")


def test_the_products_round_trip_through_the_state() -> None:
    paired = record([1.0, 1.0, -1.0, 1.0, 0.0, 1.0])
    copy = Paired.from_state(json.loads(json.dumps(paired.to_state())))
    assert copy.to_state() == paired.to_state()
    assert copy.autocorrelation() == paired.autocorrelation()


def test_a_record_without_the_products_keeps_the_plain_test() -> None:
    runs = record([1.0] * 12 + [-1.0] * 4 + [1.0] * 12 + [-1.0] * 4)
    old = runs.to_state()
    del old["cross"], old["last"]
    restored = Paired.from_state(old)
    assert restored.autocorrelation() == 0.0
    assert restored.winning(10, 2.0, "plain")  # as the record's writer tested it
    restored.add(1.0, 1.0)  # and it goes on counting without the products
    assert "cross" not in restored.to_state()


def test_a_model_written_before_the_products_loads_and_goes_on() -> None:
    rng = np.random.default_rng(0)
    X = np.c_[rng.normal(size=(1200, 2)), np.ones(1200)]
    y = np.where(X[:, 0] > 0, 1, -1) * np.where(np.arange(1200) < 600, 1, -1)
    model = Adaptive(DSAL(n_features=3, cost=0.25), min_labels=50)
    fed = 0
    while not model.running:
        model.update(X[fed], int(y[fed]))
        fed += 1
    old = model.to_state()
    for record in old["contest"]["challengers"] + old["contest"]["duels"]:
        del record["cross"], record["last"]
    restored = Adaptive.from_state(json.loads(json.dumps(old)))
    for x, label in zip(X[fed:], y[fed:], strict=True):
        restored.update(x, int(label))
    assert restored.champion_origin == "mirror"


def test_a_tail_challenger_is_the_champion_at_the_change_with_the_other_loss() -> None:
    champion = DSAL(n_features=2, cost=0.25, w=[1.0, -2.0], rho=0.5)
    other = challenger_for(champion, "tail", w=[3.0, 0.5], rho=0.7)
    assert other.w.tolist() == [3.0, 0.5]  # as at the change, not negated
    assert (other.rho, other.tail, champion.tail) == (0.7, TAIL, 0.0)
    back = challenger_for(other, "tail")
    assert back.tail == 0.0
    assert back.w.tolist() == other.w.tolist()
    assert "tail" not in back.to_state()["params"]  # the paper's loss: its record as before


def test_no_tail_challenger_for_a_double_ramp_learner() -> None:
    assert challenger_for(DRAL(n_features=2, cost=0.25), "tail") is None


def _wide(n: int = 600, seed: int = 3) -> tuple[Adaptive, np.ndarray, np.ndarray, int]:
    """A model of ``n`` inputs whose rows set three of the first 100 (and the last, an
    intercept), whose labels flip halfway: fed until its challengers run, and 20 more."""
    rng = np.random.default_rng(seed)
    X = np.zeros((1200, n))
    for row in X:
        row[rng.choice(100, size=3, replace=False)] = rng.normal(size=3)
    X[:, -1] = 1.0
    y = np.where(X[:, :50].sum(axis=1) > 0, 1, -1) * np.where(np.arange(1200) < 600, 1, -1)
    model = Adaptive(DSAL(n_features=n, cost=0.25, update_rule="normalized"), min_labels=50)
    fed = 0
    while not model.running:
        model.update(X[fed], int(y[fed]))
        fed += 1
    for x, label in zip(X[fed : fed + 20], y[fed : fed + 20], strict=True):
        model.update(x, int(label))
    assert model.running  # min_labels: none has taken over yet
    return model, X, y, fed + 20


def test_a_challenger_is_written_as_what_differs_from_the_champion_and_read_back() -> None:
    model, X, y, fed = _wide()
    state = model.to_state()
    written = {c["kind"]: c["learner"]["learned"] for c in state["contest"]["challengers"]}
    assert set(written) == {"mirror", "fresh", "tail"}
    for kind in ("mirror", "tail"):  # both started from the champion at the change
        assert "w" not in written[kind]
        assert 0 < len(written[kind]["w_at"]) <= 101
        assert len(written[kind]["normalizer"]["grads_at"]) <= 101
    assert "w_at" in written["fresh"]  # from zero: where either learned, of the first 100
    text = json.dumps(state)
    back = Adaptive.from_state(json.loads(text))
    assert json.dumps(back.to_state()) == text
    for (kind, c), twin in zip(
        [(c.kind, c.learner) for c in model._contest.running], back._contest.running, strict=True
    ):
        assert twin.kind == kind
        assert twin.learner.w.tobytes() == c.w.tobytes()
    for x, label in zip(X[fed : fed + 50], y[fed : fed + 50], strict=True):
        model.update(x, int(label))
        back.update(x, int(label))
    assert json.dumps(back.to_state()) == json.dumps(model.to_state())


@pytest.mark.parametrize("n", [8, 600])
@pytest.mark.parametrize("rule", ["sgd", "normalized"])
def test_a_linear_challenger_written_from_its_arrays_is_its_record_written_from_its_state(
    n: int, rule: str
) -> None:
    """A linear challenger's record is made from the learner's arrays (no record of its own
    weights is made first, only to be replaced by what differs from the champion's). It is
    the record the general way makes from the learner's own state, key for key and bit for
    bit: every kind, against the champion, against none, narrow and wide, while learning."""
    rng = np.random.default_rng(n)
    model = Adaptive(DSAL(n_features=n, cost=0.25, update_rule=rule), min_labels=10_000)
    X = np.where(rng.random((400, n)) < 0.2, rng.normal(size=(400, n)), 0.0)
    X[:, min(n, 100) :] = 0.0  # a wide model's stream sets some of its inputs
    X[:, -1] = 1.0
    y = np.where(X[:, 0] + X[:, 1] > 0, 1, -1) * np.where(np.arange(400) < 150, 1, -1)
    checked = 0
    for x, label in zip(X, y, strict=True):
        model.update(x, int(label))
        base = base_of(model.champion.to_state())
        for c in model._contest.running:
            for against in (base, (None, None)):
                fast, general = c.to_state(against), c._from_record(against)
                assert json.dumps(fast) == json.dumps(general)
                assert packed_bytes(fast) == packed_bytes(general)
                checked += 1
    assert checked > 100  # the contest ran


def packed_bytes(record: dict[str, object]) -> bytes:
    from service.records.packed import pack  # noqa: PLC0415

    return pack(record)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"w": [0.0] * 600}, "whole or as changes"),
        ({"w_at": [5, 2]}, "increasing indices below 600"),
        ({"w_at": [600], "w_to": [1.0]}, "increasing indices below 600"),
        ({"w_at": [True], "w_to": [1.0]}, "list of indices"),
        ({"w_at": [1, 2], "w_to": [1.0]}, "w_to"),
        ({"w_at": [1], "w_to": [float("inf")]}, "w_to"),
    ],
)
def test_a_hostile_challenger_record_is_refused(change: dict[str, object], match: str) -> None:
    model, *_ = _wide()
    state = json.loads(json.dumps(model.to_state()))
    state["contest"]["challengers"][0]["learner"]["learned"].update(change)
    with pytest.raises(StateError, match=match):
        Adaptive.from_state(state)


def test_a_challenger_written_against_a_champion_of_another_width_is_refused() -> None:
    model, *_ = _wide()
    state = json.loads(json.dumps(model.to_state()))
    learned = state["champion"]["learned"]
    assert "w_at" in learned  # a wide champion's weights, as their entries
    learned["w_at"] = [*learned["w_at"], 600]  # one past its width
    learned["w_to"] = [*learned["w_to"], 1.0]
    with pytest.raises(StateError, match="below 600"):
        Adaptive.from_state(state)
    del learned["w_at"], learned["w_to"]
    learned["w"] = [0.0] * 599  # whole, one short
    with pytest.raises(StateError):
        Adaptive.from_state(state)
    grads = json.loads(json.dumps(model.to_state()))
    grads["contest"]["challengers"][0]["learner"]["learned"]["normalizer"]["grads_at"] = [999]
    with pytest.raises(StateError, match="grads_at"):
        Adaptive.from_state(grads)


def test_a_mirror_that_kept_its_negated_zeros_is_written_against_the_negated_weights() -> None:
    champion = DSAL(n_features=400, cost=0.25, update_rule="normalized")
    x = np.zeros(400)
    x[[3, 9]] = 1.0, -2.0
    champion.update(x, 1)
    mirror = challenger_for(champion, "mirror")
    zeros = mirror.w == 0.0
    assert np.signbit(mirror.w[zeros]).all()  # each 0.0 of the champion is -0.0 in it
    base = base_of(champion.to_state())
    record = json.loads(json.dumps(Challenger("mirror", mirror).to_state(base)))
    learned = record["learner"]["learned"]
    assert learned["against"] == "negated"
    assert learned["w_at"] == []  # 0 - w would differ at every untouched weight
    back = Challenger.from_state(record, base)
    assert back.learner.w.tobytes() == mirror.w.tobytes()
    for bad, kind in (("negated", "tail"), ("sideways", "mirror")):
        twisted = json.loads(json.dumps(record))
        twisted["kind"] = kind
        twisted["learner"]["learned"]["against"] = bad
        with pytest.raises(StateError, match="negated"):
            Challenger.from_state(twisted, base)


def _through_record(learner: object, kind: str, *, rho: float | None, w: object) -> object:
    """A mirror or tail challenger built as every learner's is: through the champion's
    whole state record, its weights as lists of floats (the general way)."""
    from service.learning import state as st  # noqa: PLC0415
    from service.learning.registry import learner_from_state  # noqa: PLC0415

    record = learner.to_state()  # type: ignore[attr-defined]
    learned = dict(record["learned"])
    learned.pop("w_at", None), learned.pop("w_to", None)
    base = learner.w if w is None else w  # type: ignore[attr-defined]
    learned["w"] = st.float_list(np.array(base, dtype=np.float64))
    if rho is not None:
        learned["rho"] = rho
    if kind == "tail":
        params = {**record["params"], "tail": 0.0 if learner.tail else TAIL}  # type: ignore[attr-defined]
        return learner_from_state({**record, "params": params, "learned": learned})
    learned["w"] = st.float_list(-np.asarray(learned["w"], dtype=np.float64))
    return learner_from_state({**record, "learned": learned})


def _bits(learner: object) -> bytes:
    return json.dumps(learner.to_state(), sort_keys=True).encode()  # type: ignore[attr-defined]


@settings(max_examples=80, deadline=None)
@given(
    width=st_.sampled_from([3, 9, 1100]),
    algorithm=st_.sampled_from(["dsal", "dsol", "dral"]),
    rule=st_.sampled_from(["sgd", "normalized"]),
    tail=st_.booleans(),
    kind=st_.sampled_from(["mirror", "tail", "fresh"]),
    labels=st_.integers(0, 12),
    given_w=st_.booleans(),
    rho=st_.none() | st_.floats(0.0, 3.0),
    seed=st_.integers(0, 2**16),
)
def test_a_linear_challenger_is_the_one_its_record_gives_bit_for_bit(
    width: int,
    algorithm: str,
    rule: str,
    tail: bool,
    kind: str,
    labels: int,
    given_w: bool,
    rho: float | None,
    seed: int,
) -> None:
    """Built from the champion's arrays (a wide model's without a float object each), or
    made anew (a fresh one), a challenger is the learner the record path gives: the same
    state, bit for bit (zeros of a mirror negated to -0.0), the same decisions and the
    same next steps."""
    from service.learning import DSOL  # noqa: PLC0415
    from service.learning.sparse import SparseRow  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    cls = {"dsal": DSAL, "dsol": DSOL, "dral": DRAL}[algorithm]
    extra = {"tail": TAIL} if tail and algorithm != "dral" else {}
    champion = cls(n_features=width, cost=0.25, update_rule=rule, seed=seed, **extra)
    rows = []
    for _ in range(labels + 3):
        at = np.sort(rng.choice(width, size=min(width, 3), replace=False))
        rows.append(SparseRow(at, rng.normal(size=at.size), width))
    for row in rows[:labels]:
        champion.update(row if width >= 1024 else row.toarray(), 1 if rng.random() < 0.5 else -1)
    w = None
    if given_w:
        w = champion.w.copy()
        w[rng.integers(width)] = -0.0
        w[rng.integers(width)] = float(rng.normal())
    got = challenger_for(champion, kind, rho=rho, w=w)
    if kind == "tail" and algorithm == "dral":
        assert got is None
        return
    if kind == "fresh":
        from service.learning.adaptive.challengers import _fresh_record  # noqa: PLC0415
        from service.learning.registry import learner_from_state  # noqa: PLC0415

        want = learner_from_state(_fresh_record(champion))
    else:
        want = _through_record(champion, kind, rho=rho, w=w)
    assert type(got) is type(want)
    assert _bits(got) == _bits(want)
    assert got.w.tobytes() == want.w.tobytes()
    for row in rows[labels:]:
        x = row if width >= 1024 else row.toarray()
        assert got.decide(x, 0.5) == want.decide(x, 0.5)
        got.update(x, 1)
        want.update(x, 1)
    assert _bits(got) == _bits(want)


def test_a_linear_challenger_refuses_weights_of_another_width_or_not_finite() -> None:
    champion = DSAL(n_features=3, cost=0.25)
    with pytest.raises(StateError, match="3 finite numbers"):
        challenger_for(champion, "mirror", w=[1.0, 2.0])
    with pytest.raises(StateError, match="3 finite numbers"):
        challenger_for(champion, "tail", w=[1.0, float("nan"), 0.0])


def test_a_learner_given_its_arrays_refuses_what_a_record_would_not_hold() -> None:
    from service.learning import DSOL  # noqa: PLC0415

    learner = DSOL(n_features=3, cost=0.25, update_rule="normalized")
    bare = learner.to_state(arrays=False)
    w, sums = np.zeros(3), np.ones(3)
    assert DSOL.from_arrays(bare, w, sums).sums.tolist() == [1.0, 1.0, 1.0]
    for bad in (np.ones(2), np.array([1.0, -1.0, 1.0]), np.array([1.0, np.nan, 1.0])):
        with pytest.raises(StateError, match="sums must be 3 numbers >= 0"):
            DSOL.from_arrays(bare, w, bad)
    with pytest.raises(StateError, match="3 finite numbers"):
        DSOL.from_arrays(bare, np.zeros(3, dtype=np.float32), sums)
    with pytest.raises(StateError, match="written without them"):
        DSOL.from_arrays(learner.to_state(), w, sums)
