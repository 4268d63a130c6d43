"""Group commit: the learn loop hands the joiner a batch between ``stage`` and ``commit``; the
batch's marks become durable with one flush, then each model's newest version of the batch is
written to the table and the models topic, the very record its last label alone would have
written (in-memory tables and producer, no broker)."""

from __future__ import annotations

import contextlib

import pytest

from service.config import CorrectionsConfig, ModelConfig
from service.learning import Pipeline
from service.records import request_id
from service.stream.labels.joiner import STRICT_SECONDS, LabelJoiner
from service.stream.labels.protocol import StrictRedo

from ..memory import CFG, MemoryKafka, Sent, msg, request
from .test_joiner import DEAD, MODELS, REQUESTS, Crash, Learner

SHADOW = ModelConfig(algorithm="dral", cost=0.25, n_features=3, audit_rate=0.05, champion="m")
#: history checkpoints every 20 labels (a reach of 80): some fall inside a group of 30
EVERY_20 = CFG.model_copy(update={"corrections": CorrectionsConfig(reach=80)})
MODELS_CHANGELOG = "models-changelog"


def start(kafka: MemoryKafka | None = None, *, crash_on_model: bool = False) -> Learner:
    return Learner.start(
        kafka, crash_on_model=crash_on_model, models={"m": EVERY_20, "m-dral": SHADOW}
    )


def stage(joiner: LabelJoiner) -> None:
    joiner.stage(lambda partition: contextlib.nullcontext())


async def feed(learner: Learner, n: int) -> None:
    """``n`` requests and their labels: request i at offset i, its label at offset i + 1
    (labels flip halfway); request 3's label (offset 0, :func:`feed_parked_first`) came
    before it (parked); label 5 is sent twice (a second answer) and one label names a
    request never made."""
    for i in range(n):
        if i != 3:
            await learner.request(f"r{i}", i)
        if i == 4:
            await learner.request("r3", 3)  # the parked label of r3 is applied now
    for i in range(n):
        if i == 3:
            continue
        await learner.label(f"r{i}", i + 1, y=1 if (i % 3 and i < n // 2) else -1)
    await learner.label("r5", n + 1, y=-1)  # a second answer: dead-lettered
    await learner.label("nobody", n + 2)  # parked: no request


async def feed_parked_first(learner: Learner) -> None:
    await learner.label("r3", 0, y=1)  # the first label, before its request: parked


def versions(learner: Learner, name: str = "m") -> list[int]:
    """The versions of ``name`` on the models topic, in order."""
    return [int(r.json()["version"]) for r in learner.kafka.sent(MODELS) if r.key == name.encode()]


def by_topic(records: list[Sent], topic: str) -> list[tuple[bytes | None, bytes | None]]:
    return [(r.key, r.value) for r in records if r.topic == topic]


async def run(learner: Learner, n: int, *, staged: bool) -> None:
    if staged:
        stage(learner.joiner)
    await feed_parked_first(learner)
    await feed(learner, n)
    if staged:
        await learner.joiner.commit()
    await learner.kafka.flush()


async def test_a_batch_writes_what_its_labels_write_alone_with_one_flush() -> None:
    alone, batched = start(), start()
    await run(alone, 30, staged=False)
    await run(batched, 30, staged=True)
    assert versions(alone) == list(range(1, 31))
    assert alone.dead() == [("already_applied", 31)]
    pending = [by_topic(x.kafka.durable, "pending-changelog") for x in (alone, batched)]
    assert pending[0] == pending[1]  # every label's mark, as alone
    # the table is written each model's newest version of the batch, which holds the others:
    # the very record the last label alone wrote
    last = dict(by_topic(alone.kafka.durable, MODELS_CHANGELOG))
    written = [b"m", b"m@30", b"m-dral", b"m-dral@30"]
    assert by_topic(batched.kafka.durable, MODELS_CHANGELOG) == [(k, last[k]) for k in written]
    assert batched.joiner.models.kept("m") == [30]
    assert alone.joiner.models.kept("m") == list(range(11, 31))  # the last 20 written
    # the scorers are sent each model's newest version of the batch: the very same record
    each = by_topic(alone.kafka.durable, MODELS)
    newest = [r for k, r in enumerate(each) if all(later[0] != r[0] for later in each[k + 1 :])]
    assert [key for key, _ in newest] == [b"m", b"m-dral"]
    assert by_topic(batched.kafka.durable, MODELS) == newest
    # a parked label's copy is deleted once its label's model is written: later in a batch,
    # to the same end
    orphans = [dict(by_topic(x.kafka.durable, "orphans-changelog")) for x in (alone, batched)]
    assert orphans[0] == orphans[1]
    assert sum(v is not None for v in orphans[0].values()) == 1  # the label of no request
    assert by_topic(batched.kafka.durable, "abstain.dead-letters") == by_topic(
        alone.kafka.durable, "abstain.dead-letters"
    )
    assert batched.joiner.models.get("m-dral").version == 30  # the shadow learnt each label
    # one flush for the whole batch (and the test's own) against one a label
    assert batched.kafka.flushes == 2
    assert alone.kafka.flushes >= 30


async def test_the_next_label_of_a_batch_learns_from_the_staged_version() -> None:
    learner = start()
    learner.joiner.own(frozenset(range(learner.settings.partitions.labels)))
    stage(learner.joiner)
    for i in range(3):
        await learner.request(f"r{i}", i)
        await learner.label(f"r{i}", i)
        assert learner.joiner.models.get("m").version == i + 1  # staged, read back
    assert versions(learner) == []  # nothing written before the commit
    republished = await learner.joiner.republish()  # a republish publishes what is written
    assert republished == ["m", "m-dral"]
    assert versions(learner) == [0]
    await learner.joiner.commit()
    assert versions(learner) == [0, 3]  # the newest of the batch: what scorers serve
    assert learner.joiner.models.get("m", staged=False).version == 3


@pytest.mark.parametrize("where", ["before the flush", "after the flush, at a model write"])
async def test_a_crash_inside_a_batch_applies_every_label_once_after_a_restart(
    where: str,
) -> None:
    kafka = MemoryKafka()
    crashing = start(kafka, crash_on_model=where != "before the flush")
    stage(crashing.joiner)
    await feed_parked_first(crashing)
    await feed(crashing, 20)
    if where != "before the flush":  # the process dies at the first model write
        with pytest.raises(Crash):
            await crashing.joiner.commit()
    kafka.crash()
    marks_durable = any(r.topic == "pending-changelog" for r in kafka.durable)
    assert marks_durable == (where != "before the flush")
    # the restarted learner reads its tables back and is handed the batch again
    restarted = start(kafka)
    assert restarted.joiner.models.get("m").version == 0
    await run(restarted, 20, staged=True)
    await run(restarted, 20, staged=True)  # and once more: nothing applied twice
    clean = start()
    await run(clean, 20, staged=False)
    for name in ("m", "m-dral"):
        redone, once = restarted.joiner.models.get(name), clean.joiner.models.get(name)
        assert redone.version == once.version == 20
        assert redone.replace(updated_at=0.0) == once.replace(updated_at=0.0)
    applied = restarted.joiner.pending.get(request_id("m", "r7"))
    assert applied is not None
    assert applied.applied


# --------------------------------------------------------------------------- made once


BOOM = ModelConfig(  # no scaling and a huge step: its second label overflows (w, rho)
    algorithm="dsal", cost=0.25, n_features=3, standardize=False, hyperparameters={"eta": 1e300}
)
HUGE = [1.7e308, 1.7e308, -1.7e308]  # finite, but the standardiser's sums overflow
# a history checkpoint every 3 labels: one falls inside the group, after the HUGE label
CHECKPOINTED = CFG.model_copy(update={"corrections": CorrectionsConfig(reach=12)})


async def hostile_feed(learner: Learner, model: str = "m", *, at: int = 5, n: int = 12) -> None:
    """``n`` requests and labels of ``model``; the one ``at`` carries :data:`HUGE`; the
    first is answered twice (the second answer, at labels offset 1, is dead-lettered)."""
    for i in range(n):
        x = HUGE if i == at else [1.0, 2.0 + i % 3, float(i)]
        body = request(x, f"e{i}", model=model).to_json()
        where = learner.partition(model)
        await learner.joiner.handle(msg(body, i, REQUESTS, where, model.encode()))
    for i in range(n):
        await learner.label(f"e{i}", i + (i > 0), y=1 if i % 3 else -1, model=model)
        if i == 0:
            await learner.label("e0", 1, y=1, model=model)


async def test_a_group_makes_and_checks_only_each_models_newest_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside a group the versions between are never made (their states are deferred): the
    pipelines' states are made once per model written and once per member at a history
    checkpoint, not once per label, and what is written (versions, marks, the history's
    checkpoints) is what the labels alone write."""
    made = {"n": 0}
    to_state = Pipeline.to_state

    def counted(self: Pipeline) -> dict[str, object]:
        made["n"] += 1
        return to_state(self)

    monkeypatch.setattr(Pipeline, "to_state", counted)
    alone, batched = start(), start()
    await run(alone, 30, staged=False)
    alone_made, made["n"] = made["n"], 0
    await run(batched, 30, staged=True)
    checkpoints = [k for k in batched.joiner.history._table if b"#" in k]  # member#seq
    later = [k for k in checkpoints if not k.endswith(b"#0")]  # #0: the versions read back
    assert later  # the history took some in the group: made before their label took them
    assert made["n"] == 2 + len(later) < alone_made // 10
    for topic in ("pending-changelog", "history-changelog", MODELS_CHANGELOG):
        written = [dict(by_topic(x.kafka.durable, topic)) for x in (alone, batched)]
        assert written[1].items() <= written[0].items(), topic
    assert dict(alone.joiner.history._table) == dict(batched.joiner.history._table)


async def redone(kafka: MemoryKafka, models: dict[str, ModelConfig], model: str) -> Learner:
    """What the learn loop does once a group raised :class:`StrictRedo`: what was not
    durable is gone, the tables are read back, and ``model``'s group is applied again one
    label at a time."""
    kafka.crash()
    again = Learner.start(kafka, models=models)
    again.joiner.strictly(model)
    stage(again.joiner)
    return again


@pytest.mark.parametrize(
    ("models", "model", "why"),
    [
        ({"m": CFG, "m-dral": SHADOW}, "m", "newest version of a group fails: model state"),
        ({"m": CHECKPOINTED, "m-dral": SHADOW}, "m", "a version of a group fails: model state"),
        ({"m": CFG, "boom": BOOM}, "boom", "a label of a group was refused"),
    ],
    ids=[
        "the newest version fails its check",
        "a checkpoint's version fails its check",
        "a label is refused after a deferred one",
    ],
)
async def test_a_group_that_cannot_be_refused_in_place_is_applied_again_label_by_label(
    models: dict[str, ModelConfig], model: str, why: str
) -> None:
    """A label whose update overflows the standardiser's sums is caught only when the
    group's newest version is checked; one that overflows (w, rho) after a version whose
    states were never made cannot leave that version as it was. Either way nothing of the
    group is durable, and applied again one label at a time it refuses that label alone:
    the same versions, marks and dead letters as the labels applied alone."""
    kafka = MemoryKafka()
    first = Learner.start(kafka, models=models)
    stage(first.joiner)

    async def group() -> None:
        await hostile_feed(first, model)
        await first.joiner.commit()

    with pytest.raises(StrictRedo, match=why):
        await group()
    first.joiner.unstage()
    assert kafka.durable == []  # not a mark, not a version
    assert kafka.sent(DEAD) == []  # nor a dead letter, nor a count: they go with the group
    counted = [
        (s.name, s.labels)
        for family in first.registry.collect()
        for s in family.samples
        if s.name.endswith("_total") and s.value
    ]
    assert counted == []
    again = await redone(kafka, models, model)
    await hostile_feed(again, model)
    await again.joiner.commit()
    await kafka.flush()
    alone = Learner.start(models=models)
    await hostile_feed(alone, model)
    await alone.kafka.flush()
    assert [d for d in again.dead() if d[0] != "redelivered"] == alone.dead()
    assert ("already_applied", 1) in alone.dead()
    assert ("non_finite", 6) in alone.dead()  # the hostile label, refused alone
    for name in models:
        here, there = again.joiner.models.get(name), alone.joiner.models.get(name)
        assert here.version == there.version < 12
        assert here.to_bytes() == there.to_bytes()
    marks = [dict(by_topic(x.kafka.durable, "pending-changelog")) for x in (again, alone)]
    assert marks[0] == marks[1]


async def test_labels_are_deferred_again_once_the_strict_while_is_over() -> None:
    learner = start()
    learner.joiner.strictly("m-dral")  # a shadow's trouble: its champion's group is strict
    stage(learner.joiner)
    await learner.request("r0", 0)
    await learner.label("r0", 0)
    assert not learner.joiner.models.get("m").deferred
    assert not learner.joiner.models.get("m-dral").deferred
    learner.clock.now += STRICT_SECONDS + 1.0
    await learner.request("r1", 1)
    await learner.label("r1", 1)
    assert learner.joiner.models.get("m").deferred
    assert learner.joiner.models.get("m-dral").deferred
    await learner.joiner.commit()
    assert not learner.joiner.models.get("m").deferred  # made as it was written
