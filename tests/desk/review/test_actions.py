"""Undo, change, ask for review and a reviewer's decision, on replicas reading the same
topics: what is written, what every replica then holds, and what is refused (with its
reason, nothing written)."""

from __future__ import annotations

import dataclasses

import pytest

from service.desk.errors import Refused
from service.desk.leases import LeaseRecord
from service.records import Correction, Label
from service.records.labels import parse_labels_record

from .harness import ANN, BOB, RITA, Replica, Topics, answered, deployment, ids, req


def written(topics: Topics, kind: type) -> list:
    return [
        rec
        for r in topics.records
        if r.topic == topics.settings.topics.labels
        and isinstance(rec := parse_labels_record(r.value), kind)
    ]


def reach(replica: Replica, model: str, *, offset: int, corrections_from: int) -> None:
    """The model's snapshot: it has learned the labels of partition 2 up to ``offset`` and
    can correct them from ``corrections_from`` (-1: none)."""
    served = replica.models[model]
    partition = replica.book.items[next(iter(replica.book.items))].partition
    envelope = served.envelope.replace(
        labels_partition=partition, labels_offset=offset, corrections_from=corrections_from
    )
    replica.models[model] = dataclasses.replace(served, envelope=envelope)


async def test_an_undo_withdraws_the_label_everywhere_and_the_request_does_not_reopen() -> None:
    topics, (r0, r1) = deployment(2)
    r = req("e1")
    await answered(topics, r0.desk, ANN, r)
    topics.clock.now += 5
    item = await r0.review.correct(ANN, r.request_id, None)
    (undo,) = written(topics, Correction)
    assert (undo.label, undo.by, undo.role, undo.request_id) == (
        None,
        "ann",
        "author",
        r.request_id,
    )
    for replica in (r0, r1):
        assert replica.book.items[r.request_id].current is None
        assert r.request_id not in replica.desk.queue.requests  # not open again
        assert await replica.desk.next(BOB) is None
    assert item.steps[-1].kind == "withdrew"
    assert r0.sample("abstain_desk_corrections_total", model="m", kind="undo") == 1
    # answering again is an author's correction with the value
    await r1.review.correct(ANN, r.request_id, -1)
    assert [c.label for c in written(topics, Correction)] == [None, -1]
    assert r0.book.items[r.request_id].steps[-1].kind == "again"
    assert r0.book.models["m"].corrected == 1  # -1 is not what she first answered
    await r0.review.correct(ANN, r.request_id, 1)  # and back
    assert r1.book.models["m"].corrected == 0
    assert [lab.label for lab in written(topics, Label)] == [1]  # one label, ever


async def test_a_change_within_the_grace_period_and_none_after_it() -> None:
    topics, (desk,) = deployment(1, undo_seconds=60)
    r = req("e1")
    await answered(topics, desk.desk, ANN, r)
    await desk.review.correct(ANN, r.request_id, -1)
    assert desk.book.items[r.request_id].current == -1
    with pytest.raises(Refused, match="already") as same:
        await desk.review.correct(ANN, r.request_id, -1)
    assert same.value.code == "unchanged"
    topics.clock.now += 61  # (from her last answer to it)
    with pytest.raises(Refused, match="ask for a review") as late:
        await desk.review.correct(ANN, r.request_id, 1)
    assert (late.value.code, late.value.status) == ("grace_over", 409)
    assert len(written(topics, Correction)) == 1  # the refused ones wrote nothing


async def test_someone_elses_answer_cannot_be_corrected_without_the_reviewer_role() -> None:
    topics, (desk,) = deployment(1)
    r = req("e1")
    await answered(topics, desk.desk, ANN, r)
    for action in (
        desk.review.correct(BOB, r.request_id, -1),
        desk.review.correct(BOB, r.request_id, None),
        desk.review.ask_review(BOB, r.request_id),
        desk.review.decide(BOB, r.request_id, -1),
    ):
        with pytest.raises(Refused) as refused:
            await action
        assert refused.value.code in ("not_author", "not_reviewer")
        assert refused.value.status == 403
    assert written(topics, Correction) == []
    assert not [
        r
        for r in topics.records
        if r.topic == topics.settings.desk.leases_topic and b'"flag"' in (r.value or b"")
    ]


async def test_unknown_and_unanswered_requests_are_refused_with_their_reason() -> None:
    topics, (desk,) = deployment(1)
    z1 = req("z1", model="z")
    await answered(topics, desk.desk, ANN, z1)
    open_ = req("open")
    topics.request(open_)
    with pytest.raises(Refused) as unanswered:
        await desk.review.correct(ANN, open_.request_id, None)
    assert (unanswered.value.code, unanswered.value.status) == ("not_answered", 409)
    with pytest.raises(Refused) as unknown:
        await desk.review.correct(ANN, "f" * 32, None)
    assert (unknown.value.code, unknown.value.status) == ("unknown_request", 404)
    with pytest.raises(Refused) as scope:  # her answer, to a model she no longer answers
        await desk.review.correct(
            dataclasses.replace(ANN, models=frozenset({"m"})), z1.request_id, None
        )
    assert scope.value.code == "out_of_scope"
    assert written(topics, Correction) == []


async def test_a_label_the_model_can_no_longer_reach_is_refused_beyond_reach() -> None:
    topics, (desk,) = deployment(1)
    old, new = req("old"), req("new")
    await answered(topics, desk.desk, ANN, old)
    await answered(topics, desk.desk, ANN, new)
    offsets = {rid: item.offset for rid, item in desk.book.items.items()}
    # the model learned both; it keeps versions from the second label on
    reach(desk, "m", offset=offsets[new.request_id], corrections_from=offsets[new.request_id])
    with pytest.raises(Refused, match="can no longer change it") as refused:
        await desk.review.correct(ANN, old.request_id, None)
    assert (refused.value.code, refused.value.status) == ("beyond_reach", 410)
    await desk.review.correct(ANN, new.request_id, None)  # within reach
    # a shadow of the group that keeps no history makes the label unreachable too
    reach(desk, "sh", offset=offsets[new.request_id], corrections_from=-1)
    with pytest.raises(Refused) as shadow:
        await desk.review.correct(ANN, new.request_id, 1)
    assert shadow.value.code == "beyond_reach"
    assert [c.request_id for c in written(topics, Correction)] == [new.request_id]
    assert [i["actions"] for i in desk.review.mine(ANN)] == [[], []]
    assert desk.review.mine(ANN)[0]["status"].endswith("too old to change")


async def test_after_the_grace_period_an_author_asks_for_a_review_and_every_replica_queues_it() -> (
    None
):
    topics, (r0, r1) = deployment(2, undo_seconds=60)
    r = req("e1")
    await answered(topics, r0.desk, ANN, r)
    assert r0.review.mine(ANN)[0]["actions"] == ["undo", "change"]
    topics.clock.now += 61
    assert r0.review.mine(ANN)[0]["actions"] == ["review"]
    await r0.review.ask_review(ANN, r.request_id)
    flags = [
        LeaseRecord(**__import__("json").loads(x.value))
        for x in topics.records
        if x.topic == topics.settings.desk.leases_topic and b'"flag"' in x.value
    ]
    assert [(f.request_id, f.holder) for f in flags] == [(r.request_id, "ann")]
    for replica in (r0, r1):
        assert ids(list(replica.book.review_queue("m"))) == [r.request_id]
        assert ids(replica.review.review_queue(RITA)) == [r.request_id]
    assert r1.review.mine(ANN)[0]["status"] == "Under review (you asked)"
    assert r0.sample("abstain_desk_review_requests_total", model="m") == 1
    await r0.review.ask_review(ANN, r.request_id)  # asked already: nothing more written
    assert sum(b'"flag"' in (x.value or b"") for x in topics.records) == 1


async def test_a_reviewers_decision_is_final_and_never_on_their_own_answer() -> None:
    topics, (r0, r1) = deployment(2)
    a, b = req("a"), req("b")
    await answered(topics, r0.desk, ANN, a, 1)
    await answered(topics, r0.desk, RITA, b, 1)
    assert await r1.review.decide(RITA, a.request_id, -1) == "corrected"
    (decision,) = written(topics, Correction)
    assert (decision.role, decision.by, decision.label) == ("reviewer", "rita", -1)
    for replica in (r0, r1):
        item = replica.book.items[a.request_id]
        assert (item.current, item.decision.by) == (-1, "rita")  # type: ignore[union-attr]
    with pytest.raises(Refused) as final:
        await r0.review.correct(ANN, a.request_id, 1)  # her grace period runs, but no
    assert final.value.code == "not_author"
    with pytest.raises(Refused) as again:
        await r0.review.decide(RITA, a.request_id, 1)
    assert again.value.code == "reviewed"
    with pytest.raises(Refused) as own:
        await r0.review.decide(RITA, b.request_id, -1)
    assert (own.value.code, own.value.status) == ("own_answer", 403)
    assert r0.review.mine(ANN)[0]["status"] == ("Corrected by a reviewer to legitimate")
    assert r1.sample("abstain_desk_reviews_total", model="m", outcome="corrected") == 1
    assert len(written(topics, Correction)) == 1


async def test_a_confirmation_is_a_reviewers_correction_equal_to_the_label() -> None:
    topics, (desk,) = deployment(1)
    r = req("e1")
    await answered(topics, desk.desk, ANN, r, -1)
    assert await desk.review.decide(RITA, r.request_id, -1) == "confirmed"
    (c,) = written(topics, Correction)
    assert (c.role, c.label) == ("reviewer", -1)
    assert desk.book.people["ann"].confirmed == desk.book.people["ann"].reviewed == 1
    assert desk.book.models["m"].corrected == 0


async def test_when_an_author_and_a_reviewer_race_the_topics_order_decides_for_all() -> None:
    topics, (r0, r1) = deployment(2)
    r = req("e1")
    await answered(topics, r0.desk, ANN, r, 1)
    # the reviewer's correction comes first on the topic; her undo on the other replica,
    # checked against a book that had not folded it yet, is written after it
    await r1.review.decide(RITA, r.request_id, -1)
    undo = Correction(r.request_id, "m", None, "ann", "author", topics.clock.now)
    record = topics.signed(undo)
    refused = r0.book.result(record.partition, record.offset)
    assert refused[0] is True
    assert refused[1] is not None
    assert refused[1].code == "not_author"
    for replica in (r0, r1):
        assert replica.book.items[r.request_id].current == -1
        assert replica.skipped("labels") == 1
