"""The second-opinion rule: the same choice for the same request anywhere, a share close to
the one configured, the reasons in their order, nothing when turned off."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.config import SecondOpinions, load_settings
from service.records import LabelRequest, request_id
from service.stream.labels.review import (
    REASONS,
    contradicts,
    importance_weight,
    second_opinion,
    share_coin,
)


def req(event: str, *, score: float = 0.1, decided: int = 0, p: float = 0.5) -> LabelRequest:
    return LabelRequest(
        request_id("m", event), event, "m", [0.0], score, 1.0, decided, p, 0, 0.0, 60.0, 0.5
    )


RANDOM_ONLY = SecondOpinions(share=0.05, min_weight=1e6, confident_margin=1e6)


def test_the_share_chosen_at_random_is_close_to_the_setting_and_the_same_every_time() -> None:
    requests = [req(f"e{i}") for i in range(20_000)]
    chosen = [r.request_id for r in requests if second_opinion(r, 1, RANDOM_ONLY, max_weight=100)]
    assert 0.045 < len(chosen) / len(requests) < 0.055
    again = [r.request_id for r in requests if second_opinion(r, 1, RANDOM_ONLY, max_weight=100)]
    assert chosen == again
    # the answer given does not change the coin
    assert chosen == [
        r.request_id for r in requests if second_opinion(r, -1, RANDOM_ONLY, max_weight=100)
    ]


def test_the_share_coin_is_not_the_query_coin() -> None:
    from service.records import coin

    rid = request_id("m", "e1")
    assert share_coin(rid) != coin("m", rid, 0)


@given(st.floats(min_value=1e-6, max_value=1.0), st.floats(min_value=1.0, max_value=1e4))
def test_the_weight_is_the_learners_capped_inverse_probability(p: float, cap: float) -> None:
    weight = importance_weight(req("e", p=p), max_weight=cap)
    assert 1.0 <= weight <= cap * (1 + 1e-12)
    assert weight == pytest.approx(min(1.0 / p, cap))


@pytest.mark.parametrize(
    ("score", "decided", "label", "margin", "expected"),
    [
        (2.5, 1, -1, 1.0, True),  # confident +1, answered -1
        (-2.5, -1, 1, 1.0, True),
        (2.5, 1, 1, 1.0, False),  # agrees
        (1.5, 1, -1, 1.0, False),  # |1.5| - 1 < 1: not confident enough
        (2.0, 1, -1, 1.0, True),  # exactly at the margin
        (5.0, 0, -1, 1.0, False),  # rejected: no decision to contradict
    ],
)
def test_a_contradiction_needs_a_decision_with_the_margin_and_the_other_answer(
    score: float, decided: int, label: int, margin: float, expected: bool
) -> None:
    assert contradicts(req("e", score=score, decided=decided), label, margin=margin) is expected


def test_the_reasons_come_in_their_order_and_nothing_when_turned_off() -> None:
    rule = SecondOpinions(share=1.0, min_weight=20.0, confident_margin=1.0)
    both = req("e", score=3.0, decided=1, p=0.01)
    assert second_opinion(both, -1, rule, max_weight=100.0) == "contradicts"
    assert second_opinion(both, 1, rule, max_weight=100.0) == "weight"
    assert second_opinion(req("e", p=0.5), 1, rule, max_weight=100.0) == "share"
    assert REASONS == ("contradicts", "weight", "share")
    off = rule.model_copy(update={"enabled": False})
    assert second_opinion(both, -1, off, max_weight=100.0) is None


def test_the_rule_reads_the_settings_of_the_desk() -> None:
    settings = load_settings(desk={"second_opinions": {"share": 0.0, "min_weight": 5}})
    rule = settings.desk.second_opinions
    assert second_opinion(req("e", p=0.1), 1, rule, max_weight=settings.max_importance_weight)
    assert not second_opinion(req("e", p=0.5), 1, rule, max_weight=settings.max_importance_weight)
