"""Corrections on the learn protocol, with in-memory tables and producer (no broker): a
corrected or withdrawn label leaves every member of the group exactly as if the corrected
label had been the one given; refusals change nothing; crashes between the writes are redone
once; ``abstain rebuild`` of the same log ends with the same model."""

from __future__ import annotations

import orjson
import pytest

from service.config import CorrectionsConfig
from service.records import Correction, Opinion, Signer, request_id
from service.records.codec import dumps
from service.records.labels import Rollback
from service.stream.labels.rebuild import summary

from ..memory import CFG, MemoryKafka
from .correcting import KEY, SHADOW, Crash, Learner, learned, stream


@pytest.mark.parametrize("members", [("m",), ("m", "m-dral")])
async def test_a_corrected_label_leaves_every_member_as_if_it_had_been_given(
    members: tuple[str, ...],
) -> None:
    models = {"m": CFG, "m-dral": SHADOW} if len(members) == 2 else {"m": CFG}
    corrected = Learner.start(models=models)
    await stream(corrected, {})
    as_given = {m: corrected.model(m) for m in members}
    await corrected.correct("e3", 30, 1)  # e3 was answered -1
    given = Learner.start(models=models)
    await stream(given, {3: 1})
    for m in members:
        assert learned(corrected.model(m)) == learned(given.model(m))
        assert learned(corrected.model(m)) != learned(as_given[m])
        assert corrected.model(m).version == as_given[m].version + 1
        assert corrected.model(m).labels_offset == 30
    assert corrected.dead() == []
    after = {m: corrected.model(m) for m in members}
    await corrected.correct("e4", 31, 1)  # e4 was answered 1 already: nothing changes
    assert {m: corrected.model(m) for m in members} == after
    value = corrected.registry.get_sample_value(
        "abstain_corrections_total", {"model": "m", "outcome": "unchanged"}
    )
    assert value == 1.0
    assert corrected.rebuilt().replace(updated_at=0.0) == corrected.model().replace(updated_at=0.0)


async def test_a_withdrawn_label_leaves_the_model_as_if_it_had_never_been_given() -> None:
    learner = Learner.start()
    await stream(learner, {})
    await learner.correct("e6", 30, None)
    without = Learner.start()
    for i in range(30):
        await without.request(f"e{i}", i)
    for i in range(30):
        if i == 6:
            without.clock.now += 1.0  # the same clock as the learner's, label by label
            continue
        await without.label(f"e{i}", i, 1 if i % 3 else -1)
    for m in ("m", "m-dral"):
        assert learned(learner.model(m)) == learned(without.model(m))
    assert learner.model().labels_applied == 29
    # the author changes their mind again: the withdrawn label comes back with a value
    await learner.correct("e6", 31, 1)
    changed = Learner.start()
    await stream(changed, {6: 1})
    assert learned(learner.model()) == learned(changed.model())
    assert learner.rebuilt().replace(updated_at=0.0) == learner.model().replace(updated_at=0.0)
    counts = {
        o: learner.registry.get_sample_value(
            "abstain_corrections_total", {"model": "m", "outcome": o}
        )
        for o in ("changed", "withdrawn", "unchanged")
    }
    assert counts == {"changed": 1.0, "withdrawn": 1.0, "unchanged": 0.0}


async def test_refused_corrections_are_dead_lettered_with_a_reason_and_change_nothing() -> None:
    learner = Learner.start(
        models={"m": CFG.model_copy(update={"corrections": CorrectionsConfig(reach=5)})}
    )
    await stream(learner, {}, requests=12)
    await learner.request("open", 12)  # asked, never answered
    before = learner.model()
    await learner.correct("nobody-asked", 40, 1)  # unknown request
    await learner.correct("open", 41, 1)  # not answered
    await learner.correct("e1", 42, -1)  # older than the last 5 labels the model keeps
    await learner.correct("e11", 43, -1, by="mallory")  # another person's answer, as author
    await learner.feed(b'{"kind": "correction", "request_id": "x"}', 44)  # no model
    assert learner.dead() == [
        ("unknown_request", 40),
        ("not_answered", 41),
        ("beyond_reach", 42),
        ("not_author", 43),
        ("schema", 44),
    ]
    assert learner.model() == before
    await learner.correct("e11", 45, -1, by="carol", role="reviewer")  # a reviewer may
    assert learner.model().version == before.version + 1
    await learner.correct("e11", 46, 1)  # and after a reviewer, the author may not
    assert learner.dead()[-1] == ("not_author", 46)
    rebuilt = learner.rebuild()  # refuses the same, and says so
    assert rebuilt.model.replace(updated_at=0.0) == learner.model().replace(updated_at=0.0)
    assert orjson.loads(dumps(summary(rebuilt)))["skipped"] == {
        "beyond_reach": 1,
        "not_answered": 1,
        "not_author": 2,
        "schema": 1,
        "unknown_request": 1,
    }


async def test_with_a_key_an_unsigned_or_mis_signed_correction_changes_nothing() -> None:
    learner = Learner.start(snapshot_key=KEY)
    await stream(learner, {}, requests=6)
    before = learner.model()
    await learner.correct("e2", 10, -1, sign=False)
    body = Correction(request_id("m", "e2"), "m", -1, "alice", "author", 1.0).to_json()
    forged = Signer(b"z" * 40).sign(b"m", body)
    await learner.feed(body, 11, signature=forged)
    assert learner.dead() == [("unsigned", 10), ("bad_signature", 11)]
    assert learner.model() == before
    await learner.correct("e2", 12, -1)  # signed with the key
    assert learner.model().version == before.version + 1
    assert learner.rebuilt().replace(updated_at=0.0) == learner.model().replace(updated_at=0.0)


async def test_a_redelivered_correction_is_a_no_op() -> None:
    learner = Learner.start()
    await stream(learner, {}, requests=8)
    await learner.correct("e2", 20, 1)
    after, published = learner.model(), learner.published()
    await learner.correct("e2", 20, 1)  # the same record again
    assert learner.model() == after
    assert learner.published() == published
    assert learner.dead() == []


@pytest.mark.parametrize("champion_written", [False, True])
async def test_a_crash_in_the_middle_of_a_correction_is_redone_once(champion_written: bool) -> None:
    kafka, log = MemoryKafka(), []  # type: ignore[var-annotated]
    learner = Learner.start(kafka, log=log)
    await stream(learner, {}, requests=25)
    await kafka.flush()
    # dies at the champion's write, or at the shadow's once the champion's was acknowledged
    crashing = Learner.start(kafka, crash_after=int(champion_written), log=log)
    crashing.clock.now = learner.clock.now
    with pytest.raises(Crash):
        await crashing.correct("e5", 40, None)
    if champion_written:
        await kafka.flush()
    else:
        kafka.crash()  # what was not acknowledged is lost
    restarted = Learner.start(kafka, log=log)
    restarted.clock.now = crashing.clock.now
    await restarted.correct("e5", 40, None)  # redelivered
    await restarted.correct("e5", 40, None)  # and again: a no-op
    clean = Learner.start()
    await stream(clean, {}, requests=25)
    clean.clock.now = crashing.clock.now - 1.0
    await clean.correct("e5", 40, None)
    for m in ("m", "m-dral"):
        got, want = restarted.model(m), clean.model(m)
        assert got.replace(updated_at=0.0) == want.replace(updated_at=0.0)
    assert restarted.rebuilt().replace(updated_at=0.0) == clean.model().replace(updated_at=0.0)


async def test_the_reach_moves_on_with_the_labels_and_each_version_says_where() -> None:
    cfg = CFG.model_copy(
        update={"corrections": CorrectionsConfig(reach=10)}
    )  # a checkpoint every label
    learner = Learner.start(models={"m": cfg})
    await stream(learner, {}, requests=40)
    model = learner.model()
    assert model.corrections_from == 30  # the last 10 labels: offsets 30..39
    steps = [k for k in learner.kafka.table("history").data if b"@" in k]
    assert len(steps) == 10
    await learner.correct("e29", 50, 1)
    assert learner.dead() == [("beyond_reach", 50)]
    await learner.correct("e30", 51, 1)
    assert learner.model().version == model.version + 1
    assert learner.model().corrections_from == 30


async def test_a_rollback_starts_the_history_again() -> None:
    learner = Learner.start()
    await stream(learner, {}, requests=10)
    order = Rollback("m", "m", 5, "ops", None).to_json()
    await learner.feed(order, 20)
    assert learner.model().corrections_from == -1
    await learner.correct("e8", 21, 1)
    assert learner.dead() == [("beyond_reach", 21)]
    await learner.request("after", 22)
    await learner.label("after", 23, 1)
    assert learner.model().corrections_from == 23
    await learner.correct("after", 24, -1)
    assert learner.model().labels_offset == 24


async def test_the_history_is_recovered_from_its_changelog_after_a_restart() -> None:
    kafka = MemoryKafka()
    learner = Learner.start(kafka)
    await stream(learner, {}, requests=12)
    await kafka.flush()
    restarted = Learner.start(kafka, log=learner.log)
    restarted.clock.now = learner.clock.now
    await restarted.correct("e3", 30, 1)
    fresh = Learner.start()
    await stream(fresh, {3: 1}, requests=12)
    assert learned(restarted.model()) == learned(fresh.model())


async def test_a_step_forged_on_the_history_changelog_is_not_part_of_the_history() -> None:
    kafka = MemoryKafka()
    learner = Learner.start(kafka)
    await stream(learner, {}, requests=6)
    await kafka.flush()
    table = kafka.table("history")
    key = next(k for k in table.data if b"@" in k)
    forged = table.data[key].replace(request_id("m", "e0").encode(), b"f" * 32)
    table.data[key] = forged  # a request id the service would not derive
    await kafka.send("history-changelog", key, forged)
    await kafka.flush()
    restarted = Learner.start(kafka, log=learner.log)
    restarted.clock.now = learner.clock.now
    assert restarted.joiner.history.step("m", "f" * 32) is None


async def test_a_second_opinion_teaches_nothing() -> None:
    learner = Learner.start()
    await stream(learner, {}, requests=4)
    before = learner.model()
    opinion = Opinion(request_id("m", "e1"), "m", -1, "bob", 5.0).to_json()
    await learner.feed(opinion, 10)
    assert learner.model() == before
    assert learner.dead() == []
    await learner.feed(
        b'{"kind": "opinion", "request_id": "r", "model": "m", "label": 0, "labelled_by": "bob"}',
        11,
    )
    assert learner.dead() == [("bad_label", 11)]
