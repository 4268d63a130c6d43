"""The book of answers: the first label is the answer whatever order the topics are read
in, forged records change nothing (and are counted), the tallies kept as records arrive
equal a count from scratch, and a desk restarted on the same topics holds the same book."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.desk.leases import LeaseRecord
from service.desk.review import ReviewBook
from service.records import Correction, Label, Opinion, PendingEntry
from service.records.labels import parse_labels_record
from service.stream.kafka.topics import table_topic

from .harness import ANN, BOB, KEY, Replica, Topics, answered, deployment, ids, req
from .harness import settings as settings_of

WEIGHTY = {"p": 0.02}


def state(book: ReviewBook) -> dict[str, Any]:
    """Everything a person or the team view could see of a book (an answer whose request
    the desk has not read is seen by nobody)."""
    items = {
        rid: (
            i.by,
            i.first,
            i.current,
            i.ask,
            i.opinion,
            i.flag,
            i.decision,
            [(s.kind, s.by, s.label) for s in i.steps],
        )
        for rid, i in book.items.items()
        if i.request is not None
    }
    return {
        "items": items,
        "opinions": {m: ids(book.opinion_queue(m)) for m in ("m", "z")},
        "reviews": {m: ids(list(book.review_queue(m))) for m in ("m", "z")},
        "people": {p: t for p, t in book.people.items() if not t.empty()},
        "models": {m: t for m, t in book.models.items() if t.labels},
    }


def recount(book: ReviewBook) -> tuple[dict[str, Counter[str]], dict[str, Counter[str]]]:
    """The tallies, counted from the answers themselves."""
    people: dict[str, Counter[str]] = {}
    models: dict[str, Counter[str]] = {}
    for i in book.items.values():
        if i.request is None:
            continue
        m = models.setdefault(i.model, Counter())
        m["labels"] += 1
        m["corrected"] += i.corrected
        p = people.setdefault(i.by, Counter())
        p["answers"] += 1
        p["checked"] += i.agrees is not None
        p["agreed"] += bool(i.agrees)
        p["reviewed"] += i.decision is not None
        p["confirmed"] += bool(i.confirmed)
        if i.opinion is not None:
            people.setdefault(i.opinion.by, Counter())["opinions"] += 1
    return people, models


def kept(book: ReviewBook) -> tuple[dict[str, Counter[str]], dict[str, Counter[str]]]:
    fields = ("answers", "checked", "agreed", "reviewed", "confirmed", "opinions")
    people = {
        p: Counter({f: getattr(t, f) for f in fields if getattr(t, f)})
        for p, t in book.people.items()
        if not t.empty()
    }
    models = {
        m: Counter({f: getattr(t, f) for f in ("labels", "corrected") if getattr(t, f)})
        for m, t in book.models.items()
        if t.labels
    }
    return people, models


async def test_the_first_label_is_the_answer_whichever_topic_is_read_first() -> None:
    topics, (desk,) = deployment(1)
    r, early, applied = req("e1"), req("early"), req("applied")
    await answered(topics, desk.desk, ANN, r, 1)
    topics.label(Label(r.request_id, "m", -1, "bob", topics.clock.now))  # a second: nothing
    topics.label(Label(early.request_id, "m", 1, "ann", topics.clock.now))  # before its request
    assert desk.book.items[early.request_id].request is None
    assert desk.review.mine(ANN)[0]["request_id"] == r.request_id  # not shown before joined
    topics.request(early)
    # the learner's applied mark read before the label (the request is closed by it)
    topics.request(applied)
    p = desk.feeds.admission.partitions["m"]
    mark = Label(applied.request_id, "m", 1, "ann", 0.0)
    entry = PendingEntry(applied, p).answered(mark, offset=99, version=3, now=topics.clock.now)
    topics.write(
        table_topic(topics.settings, "pending"),
        applied.request_id.encode(),
        entry.to_json(),
        partition=p,
    )
    assert applied.request_id not in desk.desk.queue.requests
    topics.label(Label(applied.request_id, "m", 1, "ann", topics.clock.now))
    book = desk.book
    assert [
        (book.items[x.request_id].first, book.items[x.request_id].request is not None)
        for x in (r, early, applied)
    ] == [(1, True), (1, True), (1, True)]
    assert book.people["ann"].answers == 3
    assert "bob" not in book.people


async def test_a_label_the_learner_refuses_is_no_answer() -> None:
    topics, (desk,) = deployment(1)
    other, late = req("other"), req("late", ttl=10)
    topics.label(
        Label(other.request_id, "z", 1, "ann", topics.clock.now),
    )  # not its model
    topics.request(other)
    topics.request(late)
    topics.clock.now = late.expires_at + 5
    topics.label(Label(late.request_id, "m", 1, "ann", topics.clock.now))  # after it expired
    assert other.request_id not in desk.book.items
    assert late.request_id not in desk.book.items
    assert desk.book.people == {}


async def test_forged_corrections_opinions_and_flags_change_nothing_and_are_counted() -> None:
    topics, (desk,) = deployment(1, snapshot_key=KEY)
    r, heavy = req("e1"), req("heavy", **WEIGHTY)
    await answered(topics, desk.desk, ANN, r, 1)
    await answered(topics, desk.desk, ANN, heavy, 1)
    before = state(desk.book)
    now = topics.clock.now
    forged: list[tuple[Any, dict[str, Any]]] = [
        (Correction(r.request_id, "m", -1, "ann", "author", now), {"sign": False}),  # unsigned
        (Correction(r.request_id, "m", -1, "ann", "author", now), {"key": "x" * 40}),  # wrong key
        (Correction(r.request_id, "m", -1, "bob", "author", now), {}),  # not hers
        (Correction("f" * 32, "m", None, "ann", "author", now), {}),  # unknown request
        (Correction(r.request_id, "z", None, "ann", "author", now), {}),  # another model
        (Opinion(heavy.request_id, "m", -1, "ann", now), {}),  # the author's own
        (Opinion(r.request_id, "m", -1, "bob", now), {}),  # not one that is asked
        (Opinion(heavy.request_id, "m", -1, "bob", now), {"sign": False}),  # unsigned
    ]
    for record, how in forged:
        topics.signed(record, **how)
    assert desk.skipped("labels") == len(forged)
    # a request for review by someone else, and of an unknown answer (it waits, then goes)
    leases = topics.settings.desk.leases_topic
    for holder, rid in (("bob", r.request_id), ("ann", "f" * 32)):
        flag = LeaseRecord(rid, "flag", holder, at=now)
        topics.write(leases, rid.encode(), flag.to_json(), partition=0)
    assert desk.skipped("leases") == 1
    assert state(desk.book) == before
    topics.clock.now += 3601
    desk.desk.tick()
    assert desk.book.on_flag("f" * 32, "ann", now) is True  # (waits again: nothing known)
    assert state(desk.book) == before


async def test_a_signed_correction_and_opinion_are_taken() -> None:
    topics, (desk,) = deployment(1, snapshot_key=KEY)
    r = req("e1", **WEIGHTY)
    await answered(topics, desk.desk, ANN, r, 1)
    assert await desk.desk.next(BOB) is not None
    await desk.opinions.answer(BOB, r.request_id, -1)
    await desk.review.correct(ANN, r.request_id, -1)
    written = [x for x in topics.records if x.topic == topics.settings.topics.labels][1:]
    assert [type(parse_labels_record(x.value)).__name__ for x in written] == [
        "Opinion",
        "Correction",
    ]
    assert all(x.headers and x.headers[0][0] == "abstain-signature" for x in written)
    assert desk.skipped("labels") == 0
    item = desk.book.items[r.request_id]
    assert (item.current, item.agrees) == (-1, False)  # the opinion checked her first answer


async def test_what_leaves_the_book_after_two_days_leaves_the_tallies() -> None:
    topics, (desk,) = deployment(1)
    await answered(topics, desk.desk, ANN, req("e1", at=topics.clock.now, ttl=3600), 1)
    await desk.review.correct(ANN, req("e1").request_id, -1)
    assert (desk.book.people["ann"].answers, desk.book.models["m"].corrected) == (1, 1)
    topics.clock.now += 2 * 86400 + 1
    desk.desk.tick()
    assert desk.book.items == {}
    assert desk.book.people["ann"].empty()
    assert (desk.book.models["m"].labels, desk.book.models["m"].corrected) == (0, 0)
    assert desk.review.mine(ANN) == []


PEOPLE = ["ann", "bob", "cat", "rita"]


async def play(seed: int, steps: int) -> tuple[Topics, Replica]:
    """A random day at the desk: requests, answers (some twice), corrections by anyone in
    any role, second opinions, requests for review; many of them against the rules."""
    rng = random.Random(seed)
    topics, (desk,) = deployment(1)
    made: list[str] = []
    for step in range(steps):
        topics.clock.now += rng.uniform(0, 30)
        now, who, roll = topics.clock.now, rng.choice(PEOPLE), rng.random()
        if roll < 0.3 or not made:
            r = req(f"e{step}", p=rng.choice([0.5, 0.02]), at=now, ttl=900)
            topics.request(r)
            made.append(r.request_id)
            continue
        rid, model, value = rng.choice(made), "m", rng.choice([1, -1])
        if roll < 0.55:
            topics.label(Label(rid, model, value, who, now))
        elif roll < 0.8:
            label = rng.choice([value, None])
            role = rng.choice(["author", "author", "reviewer"])
            topics.signed(Correction(rid, model, label, who, role, now))  # type: ignore[arg-type]
        elif roll < 0.93:
            topics.signed(Opinion(rid, model, value, who, now))
        else:
            flag = LeaseRecord(rid, "flag", who, at=now)
            topics.write(
                topics.settings.desk.leases_topic, rid.encode(), flag.to_json(), partition=0
            )
        if rng.random() < 0.05:
            desk.desk.tick()
    return topics, desk


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_the_tallies_kept_as_records_arrive_equal_a_count_from_scratch(seed: int) -> None:
    import asyncio

    _, desk = asyncio.run(play(seed, 150))
    assert kept(desk.book) == recount(desk.book)
    opinions, reviews = desk.book.open_counts()
    assert sum(opinions.values()) == len(desk.book.opinion_queue("m"))
    assert all(i.disputed for i in desk.book.review_queue("m"))


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_desk_restarted_on_the_same_topics_holds_the_same_book(seed: int) -> None:
    topics, desk = await play(seed, 300)
    desk.desk.tick()
    again = Replica(topics, "restarted", desk.models)  # reads every topic from the beginning
    again.desk.tick()
    assert state(again.book) == state(desk.book)
    assert again.desk.agreement == desk.desk.agreement
    assert again.review.mine(ANN) == desk.review.mine(ANN)
    assert again.skipped("labels") == desk.skipped("labels")
    # and the team view's numbers of the queue
    assert [(r.model, r.depth, r.answered) for r in again.desk.team_view().models] == [
        (r.model, r.depth, r.answered) for r in desk.desk.team_view().models
    ]


def test_the_state_helper_sees_a_difference() -> None:
    one, two = (ReviewBook(settings_of(), clock=lambda: 0.0) for _ in range(2))
    r = req("e1")
    for book in (one, two):
        book.on_label(
            Label(r.request_id, "m", 1, "ann", 0.0), partition=0, offset=0, at=0.0, request=r
        )
    assert state(one) == state(two)
    one.on_correction(Correction(r.request_id, "m", None, "ann", "author", 1.0), at=1.0)
    assert state(one) != state(two)
