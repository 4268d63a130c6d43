"""The people of a replay: their rates, and draws common to every arm of a run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.config import SecondOpinions
from service.replay.errors import ReplayConfigError
from service.replay.people import Draws, People


def test_one_rate_is_everyones_and_a_tuple_is_one_per_person() -> None:
    assert People(noise=0.1, team=3).rates == (0.1, 0.1, 0.1)
    two = People(noise=(0.02, 0.3))
    assert two.rates == (0.02, 0.3)
    assert two.reviewer_rate == pytest.approx(0.16 / 4)
    assert People(noise=0.2, reviewer_noise=0.0).reviewer_rate == 0.0
    assert not People(noise=0.2).reviewed
    assert People(noise=0.2, second_opinions=SecondOpinions()).reviewed
    assert not People(second_opinions=SecondOpinions(enabled=False)).reviewed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise": 1.5}, "noise"),
        ({"noise": (0.1, -0.1)}, "noise"),
        ({"noise": (), "team": 0}, "at least one"),
        ({"noise": (0.1,), "second_opinions": SecondOpinions()}, "at least 2"),
        ({"reviewer_noise": 2.0}, "reviewer_noise"),
        ({"undo": -0.5}, "undo"),
        ({"review_delay": -1}, "review_delay"),
    ],
)
def test_bad_people_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ReplayConfigError, match=message):
        People(**kwargs)  # type: ignore[arg-type]


@given(team=st.integers(2, 7), seed=st.integers(0, 2**32 - 1), run=st.integers(0, 50))
def test_the_second_labeller_is_never_the_first(team: int, seed: int, run: int) -> None:
    d = Draws.draw(300, seed=seed, run=run, team=team)
    assert not (d.second == d.first).any()
    assert ((d.first >= 0) & (d.first < team) & (d.second >= 0) & (d.second < team)).all()


def test_draws_are_the_same_for_a_seed_and_run_and_differ_across_runs() -> None:
    a, b = Draws.draw(100, seed=3, run=1), Draws.draw(100, seed=3, run=1)
    for name in ("first", "second", "answer", "opinion", "review", "undo"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.answer, Draws.draw(100, seed=3, run=2).answer)
