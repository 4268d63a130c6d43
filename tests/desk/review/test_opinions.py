"""Second opinions: offered to someone else than the first person, never with the first
answer, once; agreement closes them, a disagreement goes to the reviewers; skipped ones are
not offered to that person again; none past their time or the model's reach."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from service.desk.auth.accounts import Person
from service.desk.errors import Refused
from service.records import Opinion
from service.records.labels import parse_labels_record

from .harness import ANN, BOB, CAT, RITA, Replica, Topics, answered, deployment, ids, req

WEIGHTY = {"p": 0.02}  # trains with weight 50: a second opinion is asked


def opinions(topics: Topics) -> list[Opinion]:
    return [
        rec
        for r in topics.records
        if r.topic == topics.settings.topics.labels
        and isinstance(rec := parse_labels_record(r.value), Opinion)
    ]


async def test_an_answer_that_weighs_much_is_offered_to_someone_else_and_never_to_its_author() -> (
    None
):
    topics, (r0, r1) = deployment(2)
    heavy, light = req("heavy", **WEIGHTY), req("light")
    await answered(topics, r0.desk, ANN, heavy, 1)
    await answered(topics, r0.desk, ANN, light, 1)
    assert ids(r1.book.opinion_queue("m")) == [heavy.request_id]  # the light one: not asked
    assert await r0.desk.next(ANN) is None  # not to her: she gave the first answer
    got = await r1.desk.next(BOB)
    assert got is not None
    assert (got.request.request_id, got.opinion) == (heavy.request_id, True)
    again = await r0.desk.next(BOB)  # a reload on another replica: the same one, his lease
    assert again is not None
    assert again.request.request_id == heavy.request_id
    assert await r0.desk.next(CAT) is None  # held by bob
    with pytest.raises(Refused) as taken:
        await r0.opinions.answer(CAT, heavy.request_id, 1)
    assert taken.value.code == "not_yours"
    with pytest.raises(Refused) as own:
        await r0.opinions.answer(ANN, heavy.request_id, 1)
    assert (own.value.code, own.value.status) == ("own_answer", 403)
    assert opinions(topics) == []


async def test_agreement_closes_it_and_disagreement_goes_to_the_reviewers() -> None:
    topics, (r0, r1) = deployment(2)
    agree, differ = req("agree", **WEIGHTY), req("differ", **WEIGHTY)
    await answered(topics, r0.desk, ANN, agree, -1)
    await answered(topics, r0.desk, ANN, differ, -1)
    first = await r1.desk.next(BOB)
    assert first is not None
    assert first.request.request_id == agree.request_id  # the oldest first
    assert await r1.opinions.answer(BOB, agree.request_id, -1) == (True, True)
    second = await r1.desk.next(BOB)
    assert second is not None
    assert await r1.opinions.answer(BOB, differ.request_id, 1) == (False, True)
    assert [(o.request_id, o.by, o.label) for o in opinions(topics)] == [
        (agree.request_id, "bob", -1),
        (differ.request_id, "bob", 1),
    ]
    for replica in (r0, r1):
        assert replica.book.opinion_queue("m") == []
        assert ids(list(replica.book.review_queue("m"))) == [differ.request_id]
        assert replica.book.people["ann"].checked == 2
        assert replica.book.people["ann"].agreed == 1
        assert replica.book.people["bob"].opinions == 2
    assert ids(r0.review.review_queue(RITA)) == [differ.request_id]
    assert r0.review.review_queue(BOB) == []  # his own second opinion: another reviewer's
    assert [a["status"] for a in r0.review.mine(ANN)] == [
        "A second opinion differs: under review",
        "A second opinion agreed",
    ]
    assert r1.sample("abstain_desk_second_opinions_total", model="m", outcome="agree") == 1
    assert r1.sample("abstain_desk_second_opinions_total", model="m", outcome="disagree") == 1
    with pytest.raises(Refused) as twice:
        await r0.opinions.answer(CAT, agree.request_id, 1)
    assert twice.value.code == "already_opinion"
    # the reviewer decides: the queue empties everywhere
    assert await r0.review.decide(RITA, differ.request_id, 1) == "corrected"
    assert [list(r.book.review_queue("m")) for r in (r0, r1)] == [[], []]


async def test_a_contradicted_confident_model_is_checked_and_an_agreeing_answer_is_not() -> None:
    topics, (desk,) = deployment(1)
    confident = {"score": 3.0, "decided": 1}  # |3| - 1 >= the margin 1
    against, along = req("against", **confident), req("along", **confident)
    await answered(topics, desk.desk, ANN, against, -1)
    await answered(topics, desk.desk, ANN, along, 1)
    assert ids(desk.book.opinion_queue("m")) == [against.request_id]
    assert desk.book.items[against.request_id].ask == "contradicts"


async def test_a_skipped_second_opinion_goes_to_others_and_never_back_to_the_skipper() -> None:
    topics, (desk,) = deployment(1)
    r = req("e1", **WEIGHTY)
    await answered(topics, desk.desk, ANN, r, 1)
    assert await desk.desk.next(BOB) is not None
    await desk.opinions.give_back(BOB, r.request_id, "skip")
    assert await desk.desk.next(BOB) is None
    got = await desk.desk.next(CAT)
    assert got is not None
    assert got.opinion
    assert desk.sample("abstain_desk_give_backs_total", model="m", why="skip") == 1


async def test_no_second_opinion_after_its_time_a_withdrawal_or_out_of_reach() -> None:
    topics, (desk,) = deployment(1, second_opinions={"within_seconds": 100})
    late, gone, old = (req(e, **WEIGHTY) for e in ("late", "gone", "old"))
    for r in (late, gone, old):
        await answered(topics, desk.desk, ANN, r, 1)
    await desk.review.correct(ANN, gone.request_id, None)  # withdrawn: nothing to check
    items = desk.book.items
    served = desk.models["m"]
    desk.models["m"] = dataclasses.replace(
        served,
        envelope=served.envelope.replace(
            labels_partition=items[old.request_id].partition,
            labels_offset=items[old.request_id].offset,
            corrections_from=items[old.request_id].offset,
        ),
    )  # late and gone are older than the model can correct
    got = await desk.desk.next(BOB)
    assert got is not None
    assert got.request.request_id == old.request_id
    await desk.opinions.give_back(BOB, old.request_id, "skip")
    desk.desk.tick()
    assert ids(desk.book.opinion_queue("m")) == [old.request_id]  # late: out of reach
    topics.clock.now += 101
    desk.desk.tick()
    assert desk.book.opinion_queue("m") == []
    assert await desk.desk.next(CAT) is None
    with pytest.raises(Refused) as expired:
        await desk.opinions.answer(CAT, old.request_id, 1)
    assert expired.value.code == "expired"
    assert opinions(topics) == []


async def test_two_people_on_two_replicas_at_once_give_one_second_opinion() -> None:
    topics, (r0, r1) = deployment(2)
    r = req("e1", **WEIGHTY)
    await answered(topics, r0.desk, ANN, r, 1)
    got = await asyncio.gather(r0.desk.next(BOB), r1.desk.next(CAT))
    assert sorted(g is not None for g in got) == [False, True]
    who = BOB if got[0] is not None else CAT
    other = CAT if who is BOB else BOB
    assert await (r0 if who is BOB else r1).opinions.answer(who, r.request_id, 1) == (True, True)
    with pytest.raises(Refused) as refused:
        await r0.opinions.answer(other, r.request_id, -1)
    assert refused.value.code == "already_opinion"
    assert len(opinions(topics)) == 1


async def test_second_opinions_come_before_new_requests_and_keep_to_the_model_filter() -> None:
    topics, (desk,) = deployment(1)
    heavy = req("heavy", **WEIGHTY)
    await answered(topics, desk.desk, ANN, heavy, 1)
    waiting = req("waiting", priority=0.9)
    topics.request(waiting)
    assert await desk.desk.next(BOB, "z") is None  # a filter on another model: neither
    first = await desk.desk.next(BOB, "m")
    assert first is not None
    assert (first.request.request_id, first.opinion) == (heavy.request_id, True)
    await desk.opinions.answer(BOB, heavy.request_id, 1)
    second = await desk.desk.next(BOB)
    assert second is not None
    assert (second.request.request_id, second.opinion) == (waiting.request_id, False)


async def test_a_newcomer_answers_requests_first_and_gets_second_opinions_after_some() -> None:
    topics, (desk,) = deployment(1, second_opinions={"after_answers": 2})
    heavy = req("heavy", **WEIGHTY)
    await answered(topics, desk.desk, ANN, heavy, 1)  # ann's answer waits for an opinion
    for i in range(2):  # bob has given no answer: free requests come first
        topics.request(req(f"mine{i}", priority=0.9))
        got = await desk.desk.next(BOB)
        assert got is not None
        assert (got.request.request_id, got.opinion) == (req(f"mine{i}").request_id, False)
        await desk.desk.answer(BOB, got.request.request_id, 1)
    assert desk.book.people["bob"].answers == 2
    heavier = req("heavier", **WEIGHTY)
    await answered(topics, desk.desk, ANN, heavier, 1)
    topics.request(req("later", priority=0.9))
    got = await desk.desk.next(BOB)  # two answers given: second opinions first again
    assert got is not None
    assert (got.request.request_id, got.opinion) == (heavy.request_id, True)
    cat = await desk.desk.next(CAT)  # a newcomer: the free request, not "heavier"
    assert cat is not None
    assert (cat.request.request_id, cat.opinion) == (req("later").request_id, False)
    await desk.desk.answer(CAT, cat.request.request_id, 1)
    cat = await desk.desk.next(CAT)  # no request free: the second opinion, not nothing
    assert cat is not None
    assert (cat.request.request_id, cat.opinion) == (heavier.request_id, True)


async def _answers(
    topics: Topics, desk: Replica, person: Person, names: list[str], every: float
) -> None:
    """``person`` answers a fresh request of ``m`` per name, ``every`` seconds apart."""
    for name in names:
        topics.clock.now += every
        await answered(topics, desk.desk, person, req(name, at=topics.clock.now), 1)


async def test_an_answer_about_to_leave_the_model_s_reach_is_not_offered() -> None:
    topics, (desk,) = deployment(1, reach=30)  # min_time_left_seconds: 15
    edge, room = req("edge", **WEIGHTY), req("room", **WEIGHTY, at=1020.0)
    await answered(topics, desk.desk, ANN, edge, 1)
    await _answers(topics, desk, ANN, [f"a{i}" for i in range(20)], every=0.5)  # 2 labels/s
    topics.clock.now = 1020.0
    await answered(topics, desk.desk, ANN, room, 1)
    # edge: 30 - 1 - 21 labels after it = 8 left, at 22 labels in 20 s: 7.3 s < 15 s
    assert desk.review.reach_left(desk.book.items[edge.request_id]) == pytest.approx(8 / 1.1)
    got = await desk.desk.next(BOB)
    assert got is not None
    assert (got.request.request_id, got.opinion) == (room.request_id, True)
    # room: 29 labels left at 1.1 a second: the time left the page counts down
    assert got.until is not None
    assert got.until - topics.clock.now == pytest.approx(29 / 1.1)
    await desk.opinions.give_back(BOB, room.request_id, "skip")
    assert await desk.desk.next(BOB) is None  # edge is never offered


async def test_an_opinion_given_after_the_reach_passed_is_taken_for_agreement_only() -> None:
    topics, (desk,) = deployment(1, reach=30)
    r = req("e1", **WEIGHTY)
    await answered(topics, desk.desk, ANN, r, 1)
    got = await desk.desk.next(BOB)
    assert got is not None
    item = desk.book.items[r.request_id]
    served = desk.models["m"]
    desk.models["m"] = dataclasses.replace(
        served,
        envelope=served.envelope.replace(
            labels_partition=item.partition,
            labels_offset=item.offset + 5,
            corrections_from=item.offset + 1,
        ),
    )  # it learned fast meanwhile
    assert await desk.opinions.answer(BOB, r.request_id, -1) == (False, False)
    assert [(o.by, o.label) for o in opinions(topics)] == [("bob", -1)]
    assert desk.book.people["ann"].checked == 1
    assert desk.book.people["ann"].agreed == 0
    desk.desk.tick()
    assert list(desk.book.review_queue("m")) == []  # a reviewer could change nothing
