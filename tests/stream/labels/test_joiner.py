"""The learn protocol with in-memory tables and producer (no broker): joining, parking,
redelivery, expiry, sweeps, refusals, and the write order that makes a redo after a crash
apply a label exactly once."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from service.config import ModelConfig, Settings
from service.features import bucket
from service.records import (
    BadMessage,
    Label,
    ModelEnvelope,
    PendingEntry,
    parse_model_envelope,
    request_id,
)
from service.records.state import parse_pending_entry
from service.stream.kafka.produce import partition_for
from service.stream.labels.admission import admission
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore
from service.stream.models.served import ServedModel, initial_envelope

from ..memory import CFG, MemoryKafka, msg, outputs, request, settings

REQUESTS, LABELS, MODELS, DEAD = (
    "abstain.label-requests",
    "abstain.labels",
    "abstain.models",
    "abstain.dead-letters",
)


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


class Crash(Exception):
    """The process dies here (not a data error: nothing catches it)."""


class CrashingModels(ModelStore):
    def put(self, envelope: ModelEnvelope, encoded: bytes) -> None:
        raise Crash


@dataclass
class Learner:
    """A joiner over tables recovered from ``kafka`` (a restarted worker)."""

    kafka: MemoryKafka
    settings: Settings
    clock: Clock
    registry: CollectorRegistry
    joiner: LabelJoiner

    @classmethod
    def start(
        cls,
        kafka: MemoryKafka | None = None,
        *,
        crash_on_model: bool = False,
        clock: Clock | None = None,
        **kw: object,
    ) -> Learner:
        kafka = kafka if kafka is not None else MemoryKafka()
        s = settings(**kw)
        clock = clock if clock is not None else Clock()
        registry = CollectorRegistry()
        initial = {name: initial_envelope(name, cfg) for name, cfg in s.models.items()}
        store = CrashingModels if crash_on_model else ModelStore
        out = outputs(kafka, s, registry)
        joiner = LabelJoiner(
            s,
            pending=PendingStore(kafka.table("pending"), admission(s)),
            parked=ParkedStore(kafka.table("orphans")),
            models=store(kafka.table("models"), initial),
            outputs=out,
            metrics=out.metrics,
            clock=clock,
        )
        return cls(kafka, s, clock, registry, joiner)

    def partition(self, model: str) -> int:
        return partition_for(model.encode(), self.settings.partitions.labels)

    async def request(self, rid: str, offset: int, model: str = "m", **kw: object) -> None:
        """The request for event ``rid`` of ``model``, on the model's partition."""
        req = request([1.0, 2.0, float(len(rid))], rid, model=model, **kw)
        await self.joiner.handle(
            msg(req.to_json(), offset, REQUESTS, self.partition(model), model.encode())
        )

    async def label(self, rid: str, offset: int, y: int = 1, model: str = "m") -> None:
        """A label for event ``rid`` of ``model``, on the model's partition."""
        body = Label(request_id(model, rid), model, y, "ops", None).to_json()
        await self.joiner.handle(msg(body, offset, LABELS, self.partition(model), model.encode()))

    def versions(self) -> list[int]:
        return [
            parse_model_envelope(r.value or b"", model="m").version for r in self.kafka.sent(MODELS)
        ]

    def dead(self) -> list[tuple[str, int]]:
        return [(str(r.json()["reason"]), int(r.json()["offset"])) for r in self.kafka.sent(DEAD)]

    def count(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, {"model": "m", **labels}) or 0.0


async def test_a_label_joins_its_request_and_publishes_a_new_version() -> None:
    learner = Learner.start()
    await learner.request("r1", 0)
    await learner.label("r1", 0)
    assert learner.versions() == [1]
    model = learner.joiner.models.get("m")
    assert (model.version, model.labels_offset, model.labels_applied) == (1, 0, 1)
    entry = learner.joiner.pending.get(request_id("m", "r1"))
    assert entry is not None
    assert (entry.applied, entry.label, entry.labelled_by) == (True, 1, "ops")
    assert learner.count("abstain_labels_applied_total") == 1
    assert learner.dead() == []


async def test_the_models_topic_carries_what_a_scorer_reads_and_the_table_the_whole() -> None:
    """The learner keeps a model's whole state (challengers, what it remembers, its
    normaliser) in its table; the models topic gets what a scorer reads of the same version,
    which decides exactly as the whole one does. A republish sends that part again. The
    learner never takes such a record as its state (from its table, or to put in it)."""
    learner = Learner.start()
    for i in range(30):  # enough labels for the recall to remember some
        await learner.request(f"r{i}", i)
        await learner.label(f"r{i}", i, y=1 if i % 3 else -1)
    store = learner.joiner.models
    whole = store.get("m")
    assert whole.version == 30
    assert not whole.serving
    topic = learner.kafka.sent(MODELS)
    published = parse_model_envelope(topic[-1].value or b"", model="m")
    assert published.serving
    assert published.version == whole.version
    assert published == whole.served()
    assert whole.learner["recall"]["labels"]
    assert published.learner["recall"] == {}
    assert len(topic[-1].value or b"") < len(whole.to_bytes())
    config = learner.settings.models["m"]
    rows = np.random.default_rng(1).normal(size=(50, 3))
    coins = np.random.default_rng(2).random(50)
    for served in (ServedModel.from_envelope(config, e) for e in (whole, published)):
        X = np.vstack([served.pipeline.transform(r) for r in rows])
        decided = served.learner.decide_many(X, coins=coins)
        if served.envelope is whole:
            expected = decided
    for a, b in zip(expected, decided, strict=True):
        np.testing.assert_array_equal(a, b)
    learner.joiner.own(frozenset({learner.partition("m")}))
    assert await learner.joiner.republish() == ["m"]
    again = parse_model_envelope(learner.kafka.sent(MODELS)[-1].value or b"", model="m")
    assert again == published
    with pytest.raises(ValueError, match="read to serve is not a learner's state"):
        store.put(published, published.to_bytes())
    forged = ModelStore({b"m": published.to_bytes()}, {"m": initial_envelope("m", config)})
    with pytest.raises(BadMessage, match="a record read to serve"):
        forged.get("m")
    assert forged.stored() == []


async def test_a_label_before_its_request_is_parked_then_applied_when_it_arrives() -> None:
    learner = Learner.start()
    await learner.label("r1", 0, y=-1)
    assert learner.versions() == []
    parked = learner.joiner.parked.get(request_id("m", "r1"))
    assert parked is not None
    assert parked.offset == 0
    await learner.request("r1", 0)
    assert learner.versions() == [1]
    assert (
        learner.joiner.parked.get(request_id("m", "r1")) is None
    )  # forgotten once its effect is stored
    assert learner.joiner.pending.get(request_id("m", "r1")).label == -1  # type: ignore[union-attr]


async def test_a_duplicate_label_is_ignored_and_a_second_answer_dead_lettered() -> None:
    learner = Learner.start()
    await learner.request("r1", 0)
    await learner.label("r1", 4)
    await learner.label("r1", 4)  # redelivered (same offset)
    await learner.label("r1", 5, y=-1)  # another person answered too
    assert learner.versions() == [1]
    assert learner.count("abstain_labels_ignored_total", reason="redelivered") == 1
    assert learner.count("abstain_labels_ignored_total", reason="already_applied") == 1
    assert learner.dead() == [("already_applied", 5)]


async def test_a_re_sent_request_does_not_reset_its_answer() -> None:
    learner = Learner.start()
    await learner.request("r1", 0)
    await learner.label("r1", 0)
    await learner.request("r1", 1)  # the scorer re-scored the event after a crash
    entry = learner.joiner.pending.get(request_id("m", "r1"))
    assert entry is not None
    assert entry.applied


async def test_a_label_for_an_expired_request_is_dead_lettered_and_changes_nothing() -> None:
    learner = Learner.start()
    await learner.request("r1", 0, expires_at=150.0)
    learner.clock.now = 151.0
    await learner.label("r1", 0)
    assert learner.versions() == []
    assert learner.dead() == [("expired", 0)]
    assert learner.joiner.models.get("m").version == 0


async def test_crash_between_the_applied_mark_and_the_model_write_redoes_the_label_once() -> None:
    kafka = MemoryKafka()
    crashing = Learner.start(kafka, crash_on_model=True)
    await crashing.request("r1", 0)
    with pytest.raises(Crash):
        await crashing.label("r1", 3)
    # the mark was flushed before the model write was attempted: it survives the crash
    kafka.crash()
    marks = [
        parse_pending_entry(r.value)
        for r in kafka.durable
        if r.topic == "pending-changelog" and r.value is not None
    ]
    assert [m.applied for m in marks] == [False, True]
    assert marks[-1].applied_version == 1
    restarted = Learner.start(kafka)
    assert restarted.joiner.models.get("m").version == 0  # the model lacks the label
    await restarted.request("r1", 0)  # redelivered: the committed offsets were behind
    await restarted.label("r1", 3)  # redelivered: applied once more (redo)
    await restarted.label("r1", 3)  # and again: now a no-op
    assert restarted.versions() == [1]
    clean = Learner.start()
    await clean.request("r1", 0)
    await clean.label("r1", 3)
    redone, once = restarted.joiner.models.get("m"), clean.joiner.models.get("m")
    assert redone.replace(updated_at=0.0) == once.replace(updated_at=0.0)


async def test_a_crash_after_the_model_write_does_not_apply_the_label_twice() -> None:
    kafka = MemoryKafka()
    learner = Learner.start(kafka)
    await learner.request("r1", 0)
    await learner.label("r1", 3)
    await kafka.flush()  # faust flushes before committing; then the worker dies
    restarted = Learner.start(kafka)
    await restarted.label("r1", 3)
    assert restarted.joiner.models.get("m").version == 1
    assert restarted.versions() == [1]


async def test_sweeps_drop_what_is_due_on_the_swept_partition_in_expiry_order() -> None:
    learner = Learner.start(
        sweep_every=1_000_000, expired_grace_seconds=5.0, models={"m": CFG, "n": CFG}
    )
    assert (learner.partition("m"), learner.partition("n")) == (0, 1)
    await learner.request("late", 0, expires_at=130.0)
    await learner.request("early", 1, expires_at=110.0)
    await learner.request("answered", 2, expires_at=109.0)
    await learner.request("other", 3, model="n", expires_at=110.0)
    await learner.label("answered", 0)
    pending = learner.joiner.pending
    learner.clock.now = 114.0  # past expiry, within the grace: a late label is recognised
    await learner.joiner.sweep(0)
    assert {"early", "answered", "late"} <= {e.request.event_id for e in pending.entries()}
    await learner.label("early", 1)
    assert learner.dead() == [("expired", 1)]
    learner.clock.now = 116.0
    await learner.joiner.sweep(0)
    assert {e.request.event_id for e in pending.entries()} == {"late", "other"}
    assert learner.count("abstain_label_requests_expired_total") == 1  # "answered" was
    learner.clock.now = 200.0
    await learner.joiner.sweep(0)
    await learner.joiner.sweep(1)
    assert pending.entries() == []
    assert learner.count("abstain_label_requests_expired_total") == 2  # early and late
    assert (
        learner.registry.get_sample_value("abstain_label_requests_expired_total", {"model": "n"})
        == 1
    )  # other


async def test_a_parked_label_whose_request_never_comes_is_dead_lettered_after_the_wait() -> None:
    learner = Learner.start(sweep_every=1_000_000, orphan_label_seconds=30.0)
    label = Label(request_id("m", "ghost"), "m", 1, "ops", None).to_json()
    await learner.joiner.handle(msg(label, 7, LABELS, 0, b"m", timestamp=100.0))
    await tick_request(learner, "r-early", offset=1, timestamp=125.0)  # written before
    learner.clock.now = 131.0
    await learner.joiner.sweep(0)
    assert learner.dead() == []  # its request could still be behind in label-requests
    await tick_request(learner, "r-late", offset=2, timestamp=131.0)  # written 31 s after
    await learner.joiner.sweep(1)  # another partition's sweep leaves it
    assert learner.dead() == []
    await learner.joiner.sweep(0)
    assert learner.dead() == [("unknown_request", 7)]
    assert learner.joiner.parked.get(request_id("m", "ghost")) is None
    assert learner.count("abstain_labels_ignored_total", reason="unknown_request") == 1


async def tick_request(learner: Learner, event: str, *, offset: int, timestamp: float) -> None:
    req = request([1.0, 2.0, 3.0], event).to_json()
    await learner.joiner.handle(msg(req, offset, REQUESTS, 0, b"m", timestamp=timestamp))


async def test_a_backlog_of_requests_does_not_make_a_waiting_label_unknown() -> None:
    learner = Learner.start(sweep_every=1, orphan_label_seconds=2.0)
    label = Label(request_id("m", "late"), "m", -1, "ops", None).to_json()
    await learner.joiner.handle(msg(label, 0, LABELS, 0, b"m", timestamp=100.0))
    learner.clock.now = 160.0  # the learner is a minute behind on label-requests
    for i in range(50):  # requests written before the label, read long after it was parked
        await tick_request(learner, f"old-{i}", offset=i, timestamp=90.0 + i * 0.1)
    await tick_request(learner, "late", offset=50, timestamp=99.0)
    assert learner.dead() == []
    assert learner.versions() == [1]  # applied when its request finally came


async def test_a_parked_label_is_given_up_after_the_request_ttl_whatever_the_backlog() -> None:
    learner = Learner.start(
        sweep_every=1_000_000, orphan_label_seconds=2.0, request_ttl_seconds=60.0
    )
    await learner.label("ghost", 3)  # no timestamps: nothing tells how far along it is
    learner.clock.now = 150.0
    await learner.joiner.sweep(0)
    assert learner.dead() == []
    learner.clock.now = 161.0
    await learner.joiner.sweep(0)
    assert learner.dead() == [("unknown_request", 3)]


async def test_a_non_finite_update_is_refused_and_the_model_keeps_its_version() -> None:
    cfg = ModelConfig(
        algorithm="dsal", cost=0.25, n_features=3, standardize=False, hyperparameters={"eta": 1e300}
    )
    learner = Learner.start(models={"m": cfg})
    req = request([1e308, 1e308, 1.0], "r1")
    await learner.joiner.handle(msg(req.to_json(), 0, REQUESTS, learner.partition("m"), b"m"))
    await learner.label("r1", 0)
    assert learner.versions() == []
    assert learner.dead() == [("non_finite", 0)]
    assert learner.count("abstain_updates_refused_total", reason="non_finite") == 1
    assert learner.joiner.models.get("m") == initial_envelope("m", cfg)


GOOD_REQUEST = request([1.0, 2.0, 3.0], "e1")
GOOD_LABEL = Label(request_id("m", "e1"), "m", 1, "ops", None).to_json()


@pytest.mark.parametrize(
    ("topic", "value", "key", "partition", "reason"),
    [
        (LABELS, b"", b"m", 0, "not_json"),  # a tombstone
        (LABELS, b'{"request_id": "r", "model": "m", "label": 2}', b"m", 0, "bad_label"),
        (LABELS, b'{"request_id": "r", "model": "zzz", "label": 1}', b"zzz", 0, "unknown_model"),
        (LABELS, GOOD_LABEL, None, 0, "bad_key"),  # no key
        (LABELS, GOOD_LABEL, b"n", 0, "bad_key"),  # another model's key
        (LABELS, GOOD_LABEL, b"m", 1, "wrong_partition"),  # "m" maps to partition 0 of 2
        (REQUESTS, b"", b"m", 0, "not_json"),  # a tombstone
        (REQUESTS, b"[]", b"m", 0, "schema"),
        (REQUESTS, request([1.0], "r").to_json(), b"m", 0, "feature_count"),
        (REQUESTS, GOOD_REQUEST.to_json(), b"m", 1, "wrong_partition"),
        (REQUESTS, GOOD_REQUEST.to_json(), None, 0, "bad_key"),
        (
            REQUESTS,
            replace(GOOD_REQUEST, request_id="chosen-by-me").to_json(),
            b"m",
            0,
            "forged_id",
        ),
        (REQUESTS, replace(GOOD_REQUEST, event_id="e2").to_json(), b"m", 0, "forged_id"),
    ],
)
async def test_bad_records_are_dead_lettered_and_change_nothing(
    topic: str, value: bytes, key: bytes | None, partition: int, reason: str
) -> None:
    learner = Learner.start(models={"m": CFG, "n": CFG})
    await learner.joiner.handle(msg(value, 9, topic, partition, key))
    assert learner.dead() == [(reason, 9)]
    assert learner.versions() == []
    assert learner.joiner.pending.entries() == []
    assert learner.joiner.parked.entries() == []


async def test_an_event_id_reused_with_other_features_is_dead_lettered_as_duplicate_id() -> None:
    learner = Learner.start()
    first = request([1.0, 2.0, 3.0], "e1")
    second = replace(first, features=[9.0, 9.0, 9.0])
    await learner.joiner.handle(msg(first.to_json(), 0, REQUESTS, 0, b"m"))
    await learner.joiner.handle(msg(first.to_json(), 1, REQUESTS, 0, b"m"))  # re-scored: same
    await learner.joiner.handle(msg(second.to_json(), 2, REQUESTS, 0, b"m"))
    assert learner.dead() == [("duplicate_id", 2)]
    entry = learner.joiner.pending.get(first.request_id)
    assert entry is not None
    assert entry.request.features == [1.0, 2.0, 3.0]  # the first event's, never replaced


async def test_a_declared_event_resent_without_its_inputs_is_the_same_event() -> None:
    # a request written before declared requests dropped their inputs (features and fields)
    # and the same event scored again since (its fields alone) are one event; other fields
    # under the same id are another
    declared = ModelConfig(fields={"hash_bits": 3, "fields": {"a": "number", "c": "category"}})
    learner = Learner.start(models={"m": declared})
    shown = {"a": 1.5, "c": "SE"}
    inputs = [1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    inputs[1 + bucket("c=SE", seed=0, bits=3)] = 1.0
    first = request(inputs, "e1", fields=shown)
    again = replace(first, features=None)
    other = replace(again, fields={"a": 1.5, "c": "NO"})
    await learner.joiner.handle(msg(first.to_json(), 0, REQUESTS, 0, b"m"))
    await learner.joiner.handle(msg(again.to_json(), 1, REQUESTS, 0, b"m"))
    await learner.joiner.handle(msg(other.to_json(), 2, REQUESTS, 0, b"m"))
    assert learner.dead() == [("duplicate_id", 2)]
    entry = learner.joiner.pending.get(first.request_id)
    assert entry is not None
    assert entry.request == first  # the first event's, never replaced


async def test_a_tiny_query_probability_is_capped_in_the_risk_weight() -> None:
    learner = Learner.start(max_importance_weight=50.0)
    await learner.request("e1", 0, query_probability=0.001, decided_label=-1)
    await learner.label("e1", 0, y=1)  # wrong: loss 1
    model = learner.joiner.models.get("m")
    assert (model.iw_loss, model.iw_weight) == (50.0, 50.0)  # 1/p capped at 50, not 1000


async def test_applied_offsets_count_per_partition() -> None:
    learner = Learner.start()
    await learner.request("e1", 0)
    await learner.label("e1", 7)
    model = learner.joiner.models.get("m")
    assert (model.labels_partition, model.labels_offset) == (0, 7)
    assert model.applied(0, 7)
    assert not model.applied(1, 3)  # another partition's offsets are not comparable


def test_the_default_model_config_serves_the_demo_width() -> None:
    assert CFG.n_inputs == 3
    assert Settings().models["default"].n_inputs == 68


async def test_a_full_queue_drops_its_least_urgent_request_and_counts_it() -> None:
    learner = Learner.start(models={"m": CFG.model_copy(update={"max_open_requests": 3})})
    for i, priority in enumerate([0.5, 0.9, 0.1, 0.7, 0.3]):
        await learner.request(f"e{i}", i, priority=priority)
    kept = {e.request.event_id for e in learner.joiner.pending.entries()}
    assert kept == {"e0", "e1", "e3"}  # 0.1 went when the 4th came, 0.3 was itself the least
    assert learner.joiner.pending.open_count("m") == 3
    assert learner.count("abstain_label_requests_dropped_total") == 2
    await learner.label("e2", 0)  # an answer to a dropped request joins nothing
    assert learner.versions() == []


async def test_a_learner_caught_up_on_requests_gives_up_a_label_after_the_wait() -> None:
    learner = Learner.start(sweep_every=1_000_000, orphan_label_seconds=30.0)
    await learner.label("ghost", 5)  # parked at 100 (no record timestamps)
    learner.joiner.caught_up(0, 120.0)  # housekeeping: no lag on label-requests[0]
    learner.clock.now = 131.0
    await learner.joiner.sweep(0)
    assert learner.dead() == []  # it has waited 31 s, but the learner read only up to 120
    learner.joiner.caught_up(0, 131.0)
    await learner.joiner.sweep(0)
    assert learner.dead() == [("unknown_request", 5)]


async def test_a_label_flip_is_counted_once_as_a_change_and_a_takeover() -> None:
    learner = Learner.start()
    rng = np.random.default_rng(5)
    part = learner.partition("m")
    for i in range(700):
        x = rng.normal(size=3)
        y = (1 if x[0] + 0.5 * x[1] > 0 else -1) * (1 if i < 300 else -1)
        req = request([float(v) for v in x], f"e{i}", query_probability=0.5)
        await learner.joiner.handle(msg(req.to_json(), i, REQUESTS, part, b"m"))
        body = Label(req.request_id, "m", y, "ops", None).to_json()
        await learner.joiner.handle(msg(body, i, LABELS, part, b"m"))
    served = ServedModel.from_envelope(CFG, learner.joiner.models.get("m")).learner
    assert learner.count("abstain_labels_applied_total") == 700
    assert learner.count("abstain_drift_detected_total") == served.changes_detected
    assert learner.count("abstain_takeovers_total") == served.takeovers
    assert served.changes_detected >= 1
    assert served.takeovers >= 1
    assert served.last_change is not None
    assert served.last_change >= 300  # nothing before the flip
    assert served.risk_since_change.risk < CFG.cost  # recovered: better than rejecting


async def test_a_pending_entry_the_learner_would_not_write_is_not_there_for_it() -> None:
    """A forged changelog entry under a request's id (five features for a model of three)
    neither blocks the genuine request nor takes its label."""
    kafka = MemoryKafka()
    s = settings()
    rid = request_id("m", "r1")
    forged = PendingEntry(request([1.0, 2.0, 3.0, 4.0, 5.0], "r1"), partition_for(b"m", 2))
    kafka.table("pending")[rid.encode()] = forged.to_json()
    await kafka.flush()
    learner = Learner.start(kafka)
    assert s.partitions.labels == 2
    assert learner.joiner.pending.get(rid) is None
    assert rid not in learner.joiner.pending
    await learner.request("r1", 0)
    await learner.label("r1", 0)
    assert learner.versions() == [1]
    entry = learner.joiner.pending.get(rid)
    assert entry is not None
    assert len(entry.request.features) == 3
    assert learner.dead() == []


async def test_a_second_label_for_a_waiting_request_does_not_replace_the_first() -> None:
    learner = Learner.start()
    await learner.label("r1", 0, y=-1)  # the answer, before its request
    await learner.label("r1", 1, y=1)  # another record for the same request
    assert learner.dead() == [("already_applied", 1)]
    await learner.request("r1", 0)
    assert learner.versions() == [1]
    entry = learner.joiner.pending.get(request_id("m", "r1"))
    assert entry is not None
    assert (entry.label, entry.applied_offset) == (-1, 0)
    await learner.label("r1", 0, y=-1)  # a redelivery of the first: a no-op
    assert learner.dead() == [("already_applied", 1)]
