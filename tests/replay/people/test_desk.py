"""The desk of a replay: the label desk's rule picks the second opinions, a second opinion
never comes from the first labeller, disagreements reach the reviewer after the delay, and
authors undo only their own wrong answers."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from service.config import SecondOpinions
from service.records import LabelRequest, request_id
from service.replay.people import Desk, Draws, People
from service.replay.people.team import REVIEWER, labeller
from service.stream.labels.review import second_opinion

MODEL = "replay"


def _request(t: int, score: float = 0.3, decided: int = 1, p: float = 0.2) -> LabelRequest:
    return LabelRequest(
        request_id(MODEL, f"e{t}"),
        f"e{t}",
        MODEL,
        [0.0],
        score,
        1.0,
        decided,
        p,
        0,
        float(t),
        1e9,
        0.5,
    )


def _draws(n: int, first: int = 0, second: int = 1, **coins: float) -> Draws:
    def c(name: str) -> np.ndarray:
        return np.full(n, coins.get(name, 0.5))

    return Draws(
        np.full(n, first), np.full(n, second), c("answer"), c("opinion"), c("review"), c("undo")
    )


@settings(max_examples=30)
@given(team=st.integers(2, 6), seed=st.integers(0, 10_000))
def test_a_second_opinion_is_never_given_by_the_first_labeller(team: int, seed: int) -> None:
    people = People(noise=0.3, team=team, second_opinions=SecondOpinions(share=1.0))
    desk = Desk(people, Draws.draw(50, seed=seed, run=0, team=team), model=MODEL, max_weight=100.0)
    for t in range(50):
        request = _request(t)
        first = desk.answer(t, request, 1, now=float(t))
        (opinion,) = desk.check(t, request, first, now=float(t))
        assert opinion.by != first.labelled_by
        assert opinion.request_id == first.request_id


@given(
    score=st.floats(-5, 5),
    decided=st.sampled_from([-1, 0, 1]),
    p=st.floats(0.001, 1.0),
    truth=st.sampled_from([-1, 1]),
    share=st.sampled_from([0.0, 0.3]),
)
def test_the_desk_asks_a_second_opinion_exactly_when_the_label_desks_rule_does(
    score: float, decided: int, p: float, truth: int, share: float
) -> None:
    rule = SecondOpinions(share=share)
    desk = Desk(
        People(noise=0.5, second_opinions=rule),
        Draws.draw(1, seed=0, run=0),
        model=MODEL,
        max_weight=100.0,
    )
    request = _request(0, score, decided, p)
    first = desk.answer(0, request, truth, now=0.0)
    asked = desk.check(0, request, first, now=0.0)
    reason = second_opinion(request, first.label, rule, max_weight=100.0)
    assert bool(asked) == (reason is not None)
    assert dict(desk.work.opinions) == ({} if reason is None else {reason: 1})


def test_a_disagreement_reaches_the_reviewer_after_the_delay() -> None:
    people = People(
        noise=(1.0, 0.0),
        second_opinions=SecondOpinions(share=1.0),
        reviewer_noise=0.0,
        review_delay=3,
    )
    desk = Desk(people, _draws(5), model=MODEL, max_weight=100.0)
    request = _request(0)
    first = desk.answer(0, request, -1, now=0.0)  # labeller 0 is always wrong
    assert (first.label, first.labelled_by) == (1, labeller(0))
    (opinion,) = desk.check(0, request, first, now=0.0)
    assert (opinion.label, opinion.by) == (-1, labeller(1))
    assert desk.work.disagreements == 1
    assert desk.due(3, now=1.0) == []  # filed at label 1, due at label 4
    (review,) = desk.due(4, now=2.0)
    assert (review.label, review.by, review.role, review.ts) == (-1, REVIEWER, "reviewer", 2.0)
    assert desk.wrong_in_force() == 1
    desk.landed(review, taken=True)
    assert desk.wrong_in_force() == 0
    assert (desk.work.reviews, desk.work.refused, desk.work.late) == (1, 0, 0)


def test_authors_undo_only_their_own_wrong_answers() -> None:
    people = People(noise=(0.3, 0.3), undo=1.0, undo_delay=2)
    draws = _draws(2, answer=0.1)
    desk = Desk(people, draws, model=MODEL, max_weight=100.0)
    wrong = desk.answer(0, _request(0), 1, now=0.0)
    assert desk.check(0, _request(0), wrong, now=0.0) == []  # no second opinions
    right_draws = _draws(2, answer=0.9)
    right = Desk(people, right_draws, model=MODEL, max_weight=100.0)
    ok = right.answer(0, _request(0), 1, now=0.0)
    right.check(0, _request(0), ok, now=0.0)
    assert right.due(None, now=9.0) == []
    (undo,) = desk.due(None, now=9.0)  # after the last event: late
    assert (undo.label, undo.by, undo.role) == (1, wrong.labelled_by, "author")
    desk.landed(undo, taken=False)  # refused: the wrong label stays
    assert (desk.work.undos, desk.work.refused, desk.work.late) == (1, 1, 1)
    assert desk.wrong_in_force() == 1


def test_a_wrong_answer_at_a_low_rate_is_wrong_at_a_higher_one() -> None:
    draws = Draws.draw(2000, seed=5, run=0)

    def wrong(noise: float) -> set[int]:
        desk = Desk(People(noise=noise), draws, model=MODEL, max_weight=100.0)
        return {t for t in range(2000) if desk.answer(t, _request(t), 1, now=0.0).label != 1}

    low, high = wrong(0.05), wrong(0.2)
    assert low < high
    assert 50 < len(low) < 150
    assert 300 < len(high) < 500
