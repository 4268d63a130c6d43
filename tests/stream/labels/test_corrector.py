"""The corrector without a broker: corrections noted at their place in the labels log, derived
elsewhere (a :class:`ManualRunner` the test runs when it wants), applied together, once; a
copy refused; a history read back checked against the labels log (and, without a key,
against its own re-derivation) before a correction uses it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from service.config import CorrectionsConfig
from service.records import Signer
from service.records.labels import Rollback, Seed
from service.records.packed import pack
from service.stream.labels.corrector import MIN_GAP

from ..memory import CFG, MemoryKafka, record_of
from .correcting import SHADOW, Learner, ManualRunner, learned, stream

#: a checkpoint every 20 labels (a reach of 80)
EVERY_20 = {
    "m": CFG.model_copy(update={"corrections": CorrectionsConfig(reach=80)}),
    "m-dral": SHADOW,
}


def _manual(**kw: object) -> tuple[Learner, ManualRunner]:
    runner = ManualRunner(Learner.start().settings)
    learner = Learner.start(runner=runner, **kw)  # type: ignore[arg-type]
    runner.settings = learner.settings
    ticks = iter(range(0, 10**6, 10))  # every look at the clock: ten seconds later
    learner.joiner.corrector.monotonic = lambda: float(next(ticks))
    return learner, runner


async def _landed(learner: Learner, runner: ManualRunner) -> None:
    """Run what was submitted and let the learner take it (a round of its loop), until
    nothing is in flight."""
    for _ in range(20):
        runner.run()
        await learner.joiner.corrector.tick()
        if not learner.joiner.corrector.busy():
            return
    raise AssertionError("the corrections did not settle")


async def test_corrections_noted_during_a_derivation_are_applied_together_with_labels() -> None:
    learner, runner = _manual()
    await stream(learner, {})
    before = learner.model()
    await learner.correct("e21", 40, 1)  # e21 was answered -1: a derivation starts
    assert runner.jobs == 1
    assert learner.model() == before  # noted, not applied yet
    assert learner.joiner.corrector.queued("m") == 1
    await learner.correct("e6", 41, 1)  # earlier than what is being derived
    await learner.correct("e8", 42, -1)
    await learner.request("late", 43)
    await learner.label("late", 44, 1)  # applied meanwhile, to the state the model holds
    assert learner.model().version == before.version + 1
    assert runner.jobs == 1  # one derivation in flight per group
    runner.run()
    await learner.joiner.corrector.tick()  # it covers e21: the label on top of it first
    runner.run()
    await learner.joiner.corrector.tick()  # applied; the two noted meanwhile start
    first = learner.model()
    assert (first.version, first.corrected_to) == (before.version + 2, 40)
    assert learner.joiner.corrector.queued("m") == 2
    await _landed(learner, runner)
    assert runner.jobs == 3  # never thrown away: the first, the label, the two together
    clean = Learner.start()
    await stream(clean, {21: 1, 6: 1, 8: -1})
    await clean.request("late", 43)
    await clean.label("late", 44, 1)
    got = learner.model()
    assert learned(got) == learned(clean.model())
    assert got.version == before.version + 1 + 3  # the label, then one per correction
    assert (got.corrected_to, got.labels_offset) == (42, 44)
    assert learner.joiner.corrector.queued("m") == 0
    assert learner.rebuilt().replace(updated_at=0.0) == got.replace(updated_at=0.0)


async def test_labels_applied_while_a_correction_is_derived_are_derived_on_top() -> None:
    learner, runner = _manual()
    await stream(learner, {})
    await learner.correct("e22", 40, -1)
    for i, event in enumerate(("x", "y", "z")):
        await learner.request(event, 41 + 2 * i)
        await learner.label(event, 42 + 2 * i, 1)
    await _landed(learner, runner)
    assert runner.jobs == 2  # the derivation, then the three labels on top of it
    clean = Learner.start()
    await stream(clean, {22: -1})
    for i, event in enumerate(("x", "y", "z")):
        await clean.request(event, 41 + 2 * i)
        await clean.label(event, 42 + 2 * i, 1)
    assert learned(learner.model()) == learned(clean.model())
    assert learner.rebuilt().replace(updated_at=0.0) == learner.model().replace(updated_at=0.0)


async def test_a_seed_order_waits_for_the_corrections_queued_before_it() -> None:
    learner, runner = _manual()
    await stream(learner, {})
    await learner.correct("e21", 40, 1)
    runner.run()  # derived, not taken yet
    order = Seed(
        "m", "m", learner.model().to_json(), None, "ops", 1.0, base_version=learner.model().version
    )
    await learner.feed(order.to_json(), 41)  # drains the queue first
    assert not learner.joiner.corrector.busy()
    assert learner.model().version == 30 + 1 + 1  # the correction's version, the seed's
    assert learner.model().line_from == learner.model().version
    assert learner.dead() == []


async def test_a_crash_once_a_correction_is_noted_applies_it_once_after_the_restart() -> None:
    kafka, log = MemoryKafka(), []  # type: ignore[var-annotated]
    runner = ManualRunner(Learner.start().settings)
    learner = Learner.start(kafka, log=log, runner=runner)
    await stream(learner, {})
    before = learner.model()
    await learner.correct("e21", 40, 1)
    await kafka.flush()  # the note is durable (the batch's end), the offset committed
    kafka.crash()  # the derivation in flight dies with the worker
    runner = ManualRunner(learner.settings, hold=False)
    restarted = Learner.start(kafka, log=log, runner=runner)
    restarted.clock.now = learner.clock.now
    assert restarted.joiner.corrector.queued("m") == 1  # rebuilt from the note
    await _landed(restarted, runner)
    assert restarted.model().version == before.version + 1
    await restarted.correct("e21", 40, 1)  # the record read again: a no-op
    assert restarted.model().version == before.version + 1
    clean = Learner.start()
    await stream(clean, {21: 1})
    assert learned(restarted.model()) == learned(clean.model())


async def test_a_copy_of_a_correction_is_refused_and_the_later_decision_stands() -> None:
    learner = Learner.start()
    await stream(learner, {})
    bobs = await learner.correct("e4", 40, -1, by="bob", role="reviewer")
    await learner.correct("e4", 41, 1, by="carol", role="reviewer")
    decided = learner.model()
    await learner.feed(bobs, 42)  # the same bytes again, later in the log
    assert learner.dead() == [("replayed", 42)]
    assert learner.model() == decided
    rebuilt = learner.rebuild()
    assert rebuilt.skipped == {"replayed": 1}
    assert rebuilt.model.replace(updated_at=0.0) == decided.replace(updated_at=0.0)


async def test_a_step_the_labels_log_does_not_bear_out_is_dead_lettered_and_left_out() -> None:
    kafka = MemoryKafka()
    learner = Learner.start(kafka, models=EVERY_20)  # a checkpoint between steps 12 and 21
    await stream(learner, {})
    await kafka.flush()
    table = kafka.table("history")
    key = next(k for k in table.data if k.endswith(b"@12"))
    step = orjson.loads(table.data[key])
    step["given"] = -step["given"]  # a label nobody gave
    step["label"] = step["given"]
    await kafka.send("history-changelog", key, orjson.dumps(step))
    await kafka.flush()
    restarted = Learner.start(kafka, log=learner.log, models=EVERY_20)
    restarted.clock.now = learner.clock.now
    before = restarted.model()
    await restarted.correct("e21", 40, 1)  # after the forged step: applied
    dead = [r.json() for r in kafka.sent("abstain.dead-letters")]
    assert [(d["topic"], d["reason"]) for d in dead] == [("history-changelog", "history_untrusted")]
    assert restarted.model().version == before.version + 1
    clean = Learner.start(models=EVERY_20)
    await stream(clean, {21: 1})
    assert learned(restarted.model()) == learned(clean.model())
    await restarted.correct("e3", 41, 1)  # before it: cannot be re-derived from trust
    assert restarted.dead()[-1] == ("history_untrusted", 41)


async def test_without_a_key_a_forged_checkpoint_never_reaches_a_model() -> None:
    kafka = MemoryKafka()
    learner = Learner.start(kafka)
    await stream(learner, {})
    await kafka.flush()
    table = kafka.table("history")
    key = next(k for k in sorted(table.data) if k.startswith(b"m#"))
    state = record_of(table.data[key])
    state["pipeline"]["steps"] = []  # a state the labels did not make
    await kafka.send("history-changelog", key, pack(state))
    await kafka.flush()
    restarted = Learner.start(kafka, log=learner.log)
    restarted.clock.now = learner.clock.now
    before = {m: restarted.model(m) for m in ("m", "m-dral")}
    await restarted.correct("e21", 40, 1)
    assert restarted.dead() == [("history_untrusted", 40)]
    assert {m: restarted.model(m) for m in ("m", "m-dral")} == before
    assert restarted.joiner.history.reach_from("m") == -1  # it starts again
    await restarted.request("after", 41)
    await restarted.label("after", 42, 1)
    await restarted.correct("after", 43, -1)  # corrections reach what came since
    assert restarted.model().version == before["m"].version + 2


async def test_without_a_key_a_genuine_history_read_back_is_re_derived_and_used() -> None:
    kafka = MemoryKafka()
    learner = Learner.start(kafka)
    await stream(learner, {})
    await kafka.flush()
    restarted = Learner.start(kafka, log=learner.log)
    restarted.clock.now = learner.clock.now
    await restarted.correct("e2", 40, -1)
    assert restarted.dead() == []
    clean = Learner.start()
    await stream(clean, {2: -1})
    for m in ("m", "m-dral"):
        assert learned(restarted.model(m)) == learned(clean.model(m))


async def test_a_copy_of_a_rollback_order_is_refused() -> None:
    learner = Learner.start(snapshot_key="k" * 40)
    await stream(learner, {}, requests=6)
    order = Rollback("m", "m", 2, "ops", 1.0, base_version=learner.model().version).to_json()
    signature = Signer(b"k" * 40).sign(b"m", order)
    await learner.feed(order, 20, signature=signature)
    rolled = learner.model()
    assert rolled.version == 7
    assert rolled.line_from == 7
    await learner.request("after", 21)
    await learner.label("after", 22, 1)
    await learner.feed(order, 23, signature=signature)  # the same order, written again
    assert learner.dead() == [("replayed", 23)]
    assert learner.model().version == 8
    legacy = Rollback("m", "m", 2, "ops", 1.0).to_json()  # written before orders named a base
    await learner.feed(legacy, 24, signature=Signer(b"k" * 40).sign(b"m", legacy))
    assert learner.dead()[-1] == ("replayed", 24)


async def test_steps_whose_labels_the_topic_no_longer_holds_are_not_refuted() -> None:
    """The labels topic's retention may have dropped the records the oldest steps name: they
    cannot be checked against it, and are not taken for forgeries (with a key their HMAC
    vouches for them; without one the history is re-derived)."""
    kafka = MemoryKafka()
    learner = Learner.start(kafka)
    await stream(learner, {})
    await kafka.flush()
    restarted = Learner.start(kafka, log=learner.log)
    restarted.clock.now = learner.clock.now

    async def retained(partition: int, offsets: Any) -> dict[int, bytes | None]:
        found = await restarted.read_labels(partition, offsets)
        return {o: (None if o < 10 else found.get(o)) for o in offsets}

    restarted.joiner.corrector.readback.read_labels = retained
    await restarted.correct("e21", 40, 1)
    assert restarted.dead() == []
    clean = Learner.start()
    await stream(clean, {21: 1})
    assert learned(restarted.model()) == learned(clean.model())


async def test_derivations_of_a_group_start_at_most_once_per_min_gap() -> None:
    now = [100.0]
    runner = ManualRunner(Learner.start().settings)
    learner = Learner.start(runner=runner)
    learner.joiner.corrector.monotonic = lambda: now[0]
    await stream(learner, {})
    await learner.correct("e21", 40, 1)  # the first after a quiet while: at once
    assert runner.jobs == 1
    runner.run()
    await learner.joiner.corrector.tick()  # applied
    await learner.correct("e6", 41, 1)
    await learner.correct("e9", 42, 1)
    await learner.joiner.corrector.tick()
    assert runner.jobs == 1  # within MIN_GAP of the last start: they wait, together
    now[0] += MIN_GAP
    await learner.joiner.corrector.tick()
    assert runner.jobs == 2
    runner.run()
    await learner.joiner.corrector.tick()
    assert learner.model().corrected_to == 42
    clean = Learner.start()
    await stream(clean, {21: 1, 6: 1, 9: 1})
    assert learned(learner.model()) == learned(clean.model())


@pytest.mark.parametrize("key", [None, "k" * 40])
async def test_requests_are_learned_again_with_their_moments(key: str | None) -> None:
    """A re-derivation learns each request with the moments it carries, as the label path
    did: the corrected model is the one a clean run of the corrected log learns and the
    rebuild, also from a history read back after a restart (without a key, one that is
    re-derived from its oldest checkpoint)."""
    kafka = MemoryKafka()
    learner = Learner.start(kafka, moments=True, snapshot_key=key)
    await stream(learner, {})
    plain = Learner.start(snapshot_key=key)
    await stream(plain, {})
    assert learned(learner.model()) != learned(plain.model())  # the moments count
    await learner.correct("e21", 40, 1)
    clean = Learner.start(moments=True, snapshot_key=key)
    await stream(clean, {21: 1})
    assert learned(learner.model()) == learned(clean.model())
    assert learner.rebuilt().replace(updated_at=0.0) == learner.model().replace(updated_at=0.0)
    await kafka.flush()
    restarted = Learner.start(kafka, log=learner.log, moments=True, snapshot_key=key)
    restarted.clock.now = learner.clock.now
    await restarted.correct("e6", 41, 1)
    assert restarted.dead() == []
    clean = Learner.start(moments=True, snapshot_key=key)
    await stream(clean, {21: 1, 6: 1})
    for m in ("m", "m-dral"):
        assert learned(restarted.model(m)) == learned(clean.model(m))
    rebuilt = restarted.rebuilt().replace(updated_at=0.0)
    assert rebuilt == restarted.model().replace(updated_at=0.0)
