"""The one-second check without a broker: readiness, and when the learner publishes its
models again (a served version that differs for a while, or the periodic round)."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from service.metrics import Metrics
from service.records import Label, request_id
from service.stream.health.housekeeping import REPUBLISH_AFTER, Housekeeping
from service.stream.health.liveness import LivenessMonitor
from service.stream.kafka.loop import Progress
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore
from service.stream.models.book import HOLD_BACK, ModelBook
from service.stream.models.served import initial_envelope
from service.stream.outputs import Outputs
from service.stream.scoring.scorer import Scorer

from ..fakes import FakeConsumerView
from ..memory import CFG, MemoryKafka, msg, request, settings

MODELS = "abstain.models"


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class World:
    kafka: MemoryKafka
    book: ModelBook
    joiner: LabelJoiner
    house: Housekeeping
    clock: Clock

    def published(self) -> list[int]:
        return [int(r.json()["version"]) for r in self.kafka.sent(MODELS)]

    async def tick(self, seconds: float = 1.0) -> None:
        self.clock.now += seconds
        await self.house.check(self.clock.now)


def world(**kw: object) -> World:
    s = settings(republish_seconds=300.0, **kw)
    kafka, clock, registry = MemoryKafka(), Clock(), CollectorRegistry()
    metrics = Metrics(registry, models=s.models)
    book = ModelBook(s, clock=lambda: clock.now)
    book.loaded.set()
    outputs = Outputs(kafka, s.topics, metrics)
    pending = PendingStore(kafka.table("pending"))
    initial = {n: initial_envelope(n, c) for n, c in s.models.items()}
    joiner = LabelJoiner(
        s,
        pending=pending,
        parked=ParkedStore(kafka.table("orphans")),
        models=ModelStore(kafka.table("models"), initial),
        outputs=outputs,
        metrics=metrics,
        clock=clock,
    )
    # this worker owns the labels partition model "m" maps to (0 of 2): its learn loop says so
    # once the partition's tables are read
    joiner.own(frozenset({0}))
    view, progress = (
        FakeConsumerView(assigned={TopicPartition(s.topics.labels, 0)}),
        Progress(clock),
    )

    async def nothing(*_: object) -> None:
        return None

    house = Housekeeping(
        s,
        view=view,
        book=book,
        pending=pending,
        joiner=joiner,
        metrics=metrics,
        scorer=Scorer(s, book.serving, outputs, metrics, clock=clock),
        liveness=LivenessMonitor(view, progress, metrics, watched=(), stall_seconds=60.0),
    )
    return World(kafka, book, joiner, house, clock)


async def learn_once(w: World) -> None:
    req = request([1.0, 2.0, 3.0], "e1")
    await w.joiner.handle(msg(req.to_json(), 0, "abstain.label-requests", 0, b"m"))
    label = Label(request_id("m", "e1"), "m", 1, "ops", None).to_json()
    await w.joiner.handle(msg(label, 0, "abstain.labels", 0, b"m"))


async def learn_once_more(w: World) -> None:
    req = request([2.0, 1.0, -1.0], "e2")
    await w.joiner.handle(msg(req.to_json(), 1, "abstain.label-requests", 0, b"m"))
    label = Label(request_id("m", "e2"), "m", -1, "ops", None).to_json()
    await w.joiner.handle(msg(label, 1, "abstain.labels", 0, b"m"))


async def test_a_worker_is_ready_once_recovered_loaded_and_the_broker_answers() -> None:
    w = world()
    status = await w.house.check(w.clock.now)
    assert (status.ready, status.recovered, status.models_loaded, status.live) == (
        True,
        True,
        True,
        True,
    )


async def test_a_version_the_learner_just_published_is_not_published_again() -> None:
    w = world()
    await learn_once(w)
    assert w.published() == [1]
    await w.tick()  # the follower has not read it yet: the versions differ for a moment
    w.book.offer(b"m", w.kafka.sent(MODELS)[-1].value)  # now it has
    for _ in range(3 * int(REPUBLISH_AFTER)):
        await w.tick()
    assert w.published() == [1]  # nothing twice in normal operation


async def test_a_served_version_that_is_not_the_learners_is_replaced_after_a_while() -> None:
    w = world()
    await learn_once(w)
    w.book.offer(b"m", w.kafka.sent(MODELS)[-1].value)
    forged = initial_envelope("m", w.joiner.settings.models["m"]).replace(version=10**9)
    assert w.book.offer(b"m", forged.to_json())  # no key: the newest record wins
    await w.tick()
    assert w.published() == [1]  # not at once: the follower may simply be behind
    for _ in range(int(REPUBLISH_AFTER) + 1):
        await w.tick()
    assert w.published() == [1, 1]
    w.book.offer(b"m", w.kafka.sent(MODELS)[-1].value)  # older than the forgery: held back
    assert w.book.models["m"].version == 10**9
    await w.tick(HOLD_BACK)  # nobody published the forged version again: it goes
    assert w.book.snapshot()["m"].version == 1
    assert w.published() == [1, 1]  # the learner's own version held back: nothing to do


async def test_a_copy_of_an_older_version_is_held_back_and_never_served() -> None:
    w = world()
    await learn_once(w)
    first = w.kafka.sent(MODELS)[-1].value
    await learn_once_more(w)
    w.book.offer(b"m", w.kafka.sent(MODELS)[-1].value)
    assert w.book.models["m"].version == 2
    assert not w.book.offer(b"m", first)  # a copy of version 1, written again
    await w.tick()  # the learner sees it held back: publishes its newest at once
    assert w.published() == [1, 2, 2]
    w.book.offer(b"m", w.kafka.sent(MODELS)[-1].value)
    await w.tick(2 * HOLD_BACK)
    assert w.book.snapshot()["m"].version == 2  # never went back


async def test_a_forged_snapshot_of_a_model_that_learned_nothing_is_replaced_too() -> None:
    w = world()
    forged = initial_envelope("m", w.joiner.settings.models["m"]).replace(version=10**9)
    assert w.book.offer(b"m", forged.to_json())
    for _ in range(int(REPUBLISH_AFTER) + 2):
        await w.tick()
    assert w.published() == [0]  # the learner's version 0, so the newest record is its own
    w.book.offer(b"m", w.kafka.sent(MODELS)[-1].value)
    await w.tick(HOLD_BACK)
    assert w.book.snapshot()["m"].version == 0


async def test_a_worker_republishes_only_the_models_of_its_partitions() -> None:
    w = world(models={"m": CFG, "n": CFG})  # "n" maps to labels partition 1: not this worker's
    for name in ("m", "n"):
        forged = initial_envelope(name, CFG).replace(version=10**9)
        w.book.offer(name.encode(), forged.to_json())
    for _ in range(int(REPUBLISH_AFTER) + 2):
        await w.tick()
    assert [r.key for r in w.kafka.sent(MODELS)] == [b"m"]


async def test_every_model_is_republished_once_a_period() -> None:
    w = world()
    await learn_once(w)
    w.book.offer(b"m", w.kafka.sent(MODELS)[-1].value)
    await w.tick()
    await w.tick(299.0)
    assert w.published() == [1]
    await w.tick(2.0)
    assert w.published() == [1, 1]
