"""Shadow models without a broker: the configuration that declares them, scoring (counted,
never served, their decisions on the label requests), learning from the champion's labels
with its weights, and a crash between the champion's and a shadow's writes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from service.config import ConfigError, ModelConfig, Settings, load_settings
from service.learning import RiskEstimate, learn_from_champion
from service.metrics import Metrics
from service.records import (
    BadMessage,
    Champions,
    Label,
    ModelEnvelope,
    PendingEntry,
    Signer,
    coin,
    parse_label_request,
    parse_model_envelope,
    request_id,
)
from service.records.champions import CHAMPIONS_KEY
from service.records.labels import Rollback, parse_labels_record
from service.records.state import parse_pending_entry
from service.stream import cli
from service.stream.kafka.produce import partition_for
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.state import HISTORY, ModelStore, ParkedStore, PendingStore
from service.stream.models import cli as models_cli
from service.stream.models.book import ModelBook, signer_for
from service.stream.models.champions import comparison, promoted
from service.stream.models.served import ServedModel, initial_envelope, served_learner
from service.stream.outputs import Outputs
from service.stream.scoring.decide import Limits, score_batch
from service.stream.scoring.scorer import DecisionTally, Scorer
from service.web import views

from .memory import MemoryKafka, msg, request

CHAMPION = ModelConfig(algorithm="dsal", cost=0.25, n_features=3, audit_rate=0.05)
SHADOW = ModelConfig(algorithm="dral", cost=0.25, n_features=3, champion="c", seed=1)
MODELS = {"c": CHAMPION, "s": SHADOW}
MODELS_JSON = {name: cfg.model_dump(exclude_none=True) for name, cfg in MODELS.items()}
REQUESTS, LABELS, MODELS_TOPIC = "abstain.label-requests", "abstain.labels", "abstain.models"


def shadow_settings(**kw: object) -> Settings:
    kw.setdefault("models", MODELS)
    kw.setdefault("default_model", "c")
    return Settings(**kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- configuration


def test_a_shadow_names_its_champion_and_the_settings_list_it() -> None:
    s = shadow_settings()
    assert s.shadows_of("c") == ("s",)
    assert s.shadows_of("s") == ()
    assert (s.learner_key("s"), s.learner_key("c")) == ("c", "c")


@pytest.mark.parametrize(
    ("models", "words"),
    [
        ({"c": CHAMPION, "s": SHADOW.model_copy(update={"champion": "x"})}, "no model named 'x'"),
        ({"c": CHAMPION, "s": SHADOW.model_copy(update={"champion": "s"})}, "its own champion"),
        (
            {"c": CHAMPION, "s": SHADOW, "t": SHADOW.model_copy(update={"champion": "s"})},
            "'s' is itself a shadow",
        ),
        (
            {"c": CHAMPION, "s": SHADOW.model_copy(update={"n_features": 4})},
            "a shadow takes its champion's features",
        ),
        (
            {"c": CHAMPION, "s": SHADOW.model_copy(update={"label_budget": {"fraction": 0.1}})},
            "asks for no labels of its own",
        ),
    ],
)
def test_a_bad_champion_is_refused_with_a_message_that_says_why(
    models: dict[str, object], words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        load_settings(None, models=models, default_model="c")


def test_a_shadow_cannot_be_the_default_model() -> None:
    with pytest.raises(ConfigError, match="is a shadow"):
        load_settings(None, models=MODELS, default_model="s")


# --------------------------------------------------------------------------- records


def test_label_requests_carry_the_shadows_decisions_and_old_ones_still_parse() -> None:
    req = request([1.0, 2.0, 3.0], "e1", model="c", shadow_labels={"s": 0})
    assert parse_label_request(req.to_json()).shadow_labels == {"s": 0}
    old = req.to_dict()
    del old["shadow_labels"]
    assert parse_label_request(orjson.dumps(old)).shadow_labels == {}
    bad = {**req.to_dict(), "shadow_labels": {"s": 2}}
    with pytest.raises(BadMessage, match="shadow_labels"):
        parse_label_request(orjson.dumps(bad))


def test_a_pending_mark_keeps_each_shadows_version_and_an_envelope_its_risk_sums() -> None:
    entry = PendingEntry(request([1.0, 2.0, 3.0], "e1", model="c"), 0)
    label = Label(entry.request_id, "c", 1, "ops", None)
    marked = entry.answered(label, offset=3, version=2, now=1.0, shadow_versions={"s": 5})
    assert parse_pending_entry(marked.to_json()) == marked
    est = RiskEstimate()
    est.add(1.0, 0.5)
    env = initial_envelope("c", CHAMPION).replace(estimate=est.to_state())
    assert parse_model_envelope(env.to_json(), model="c") == env
    assert "estimate" not in initial_envelope("c", CHAMPION).to_dict()  # old shape kept


# --------------------------------------------------------------------------- scoring


def events(n: int, model: str = "c") -> list:  # type: ignore[type-arg]
    rng = np.random.default_rng(3)
    return [
        msg({"id": f"e{i}", "model": model, "features": rng.normal(size=3).tolist()}, i)
        for i in range(n)
    ]


def test_a_shadow_decides_its_champions_events_but_only_the_champion_is_served() -> None:
    models = {name: ServedModel.initial(name, cfg) for name, cfg in MODELS.items()}
    limits = Limits(default_model="c", request_ttl=60.0)
    out = score_batch(models, events(200), limits=limits, now=1.0, groups={"c": ("c", "s")})
    assert {d.model for d in out.decisions} == {"c"}
    assert len(out.decisions) == 200
    assert sum(out.shadow.values()) == 200
    alone = score_batch(models, events(200), limits=limits, now=1.0)
    assert alone.decisions == out.decisions  # the shadow changes nothing that is served
    assert out.label_requests  # DSAL at w = 0 asks about every event
    shadow = models["s"]
    for r in out.label_requests:
        x = np.asarray(r.features)
        z = shadow.pipeline.transform(x)
        mine = shadow.learner.decide(z, coin=coin("s", r.event_id, 0))
        assert r.shadow_labels == {"s": mine.label}


def test_an_event_addressed_to_a_shadow_is_dead_lettered() -> None:
    models = {name: ServedModel.initial(name, cfg) for name, cfg in MODELS.items()}
    out = score_batch(
        models, events(2, model="s"), limits=Limits("c", 60.0), now=1.0, groups={"c": ("c", "s")}
    )
    assert out.decisions == []
    assert [(d.reason, "shadow of 'c'" in d.detail) for d in out.dead_letters] == [
        ("unknown_model", True)
    ] * 2


def test_the_scorer_counts_shadow_decisions_and_writes_none() -> None:
    s = shadow_settings()
    registry = CollectorRegistry()
    metrics = Metrics(registry, models=s.models)
    models = {name: ServedModel.initial(name, cfg) for name, cfg in s.models.items()}
    out = Outputs(MemoryKafka(), s.topics, metrics)
    scorer = Scorer(s, lambda: (models, Champions()), out, metrics, clock=lambda: 1.0)
    result, records = scorer.decide(events(50))
    assert len([r for r in records if r.topic == "abstain.decisions"]) == 50
    counted = sum(
        registry.get_sample_value("abstain_shadow_decisions_total", {"model": "s", "action": a})
        or 0.0
        for a in ("predict", "reject")
    )
    assert counted == 50
    assert registry.get_sample_value("abstain_events_total", {"model": "s"}) == 0
    assert (scorer.tally["s"].events, scorer.tally["c"].events) == (50, 50)


# --------------------------------------------------------------------------- learning


class Crash(Exception):
    """The process dies here."""


class CrashOn(ModelStore):
    """A model table whose write of one model kills the process."""

    victim = "s"

    def put(self, envelope: ModelEnvelope, encoded: bytes) -> None:
        if envelope.model == self.victim:
            raise Crash
        super().put(envelope, encoded)


@dataclass
class Learner:
    kafka: MemoryKafka
    settings: Settings
    registry: CollectorRegistry
    joiner: LabelJoiner

    @classmethod
    def start(
        cls,
        kafka: MemoryKafka | None = None,
        crash_on: str | None = None,
        signer: Signer | None = None,
        keep: int = HISTORY,
    ) -> Learner:
        kafka = kafka if kafka is not None else MemoryKafka()
        s = shadow_settings()
        registry = CollectorRegistry()
        initial = {name: initial_envelope(name, cfg) for name, cfg in s.models.items()}
        store: ModelStore
        if crash_on is None:
            store = ModelStore(kafka.table("models"), initial, history=keep)
        else:
            store = CrashOn(kafka.table("models"), initial)
            store.victim = crash_on  # type: ignore[misc]
        metrics = Metrics(registry, models=s.models)
        joiner = LabelJoiner(
            s,
            pending=PendingStore(kafka.table("pending")),
            parked=ParkedStore(kafka.table("orphans")),
            models=store,
            outputs=Outputs(kafka, s.topics, metrics),
            metrics=metrics,
            clock=lambda: 100.0,
            signer=signer,
        )
        joiner.own(frozenset(range(s.partitions.labels)))
        return cls(kafka, s, registry, joiner)

    def part(self, model: str = "c") -> int:
        return partition_for(model.encode(), self.settings.partitions.labels)

    async def request(
        self, rid: str, offset: int, x: list[float], p: float, shadow: int, model: str = "c"
    ) -> None:
        req = request(
            x, rid, model=model, query_probability=p, decided_label=1, shadow_labels={"s": shadow}
        )
        await self.joiner.handle(
            msg(req.to_json(), offset, REQUESTS, self.part(model), model.encode())
        )

    async def label(self, rid: str, offset: int, y: int, model: str = "c") -> None:
        body = Label(request_id(model, rid), model, y, "ops", None).to_json()
        await self.joiner.handle(msg(body, offset, LABELS, self.part(model), model.encode()))

    def published(self, model: str) -> list[int]:
        return [
            parse_model_envelope(r.value or b"", model=model).version
            for r in self.kafka.sent(MODELS_TOPIC)
            if r.key == model.encode()
        ]


STREAM = [  # (event, features, champion's p, shadow's decision, true label)
    ("e0", [1.0, 0.5, -0.2], 0.8, 1, 1),
    ("e1", [-0.3, 1.5, 0.7], 0.25, 0, -1),
    ("e2", [0.4, -1.0, 2.0], 0.02, -1, 1),
    ("e3", [2.0, 0.1, 0.3], 1.0, 1, 1),
]


def offline_shadow() -> tuple[Any, float, float]:
    """The shadow after :data:`STREAM` replayed with the learning functions alone, and
    its importance-weighted loss and weight."""
    served = ServedModel.initial("s", SHADOW)
    pipeline = served.pipeline
    learner = served_learner(SHADOW, dict(served.envelope.learner), serving=False)
    loss = weight = 0.0
    for _, x, p, mine, y in STREAM:
        pipeline.learn_label(np.asarray(x), None)  # the label path's, for a request without
        learn_from_champion(learner, pipeline.transform(np.asarray(x)), y, p, max_weight=100.0)
        q = max(p, 0.01)
        loss += (0.25 if mine == 0 else float(mine != y)) / q
        weight += 1.0 / q
    return learner, loss, weight


async def test_a_champions_label_teaches_each_shadow_with_the_champions_weight() -> None:
    learner = Learner.start()
    for i, (rid, x, p, mine, y) in enumerate(STREAM):
        await learner.request(rid, i, x, p, mine)
        await learner.label(rid, 10 + i, y)
    champion, shadow = learner.joiner.models.get("c"), learner.joiner.models.get("s")
    assert (champion.version, shadow.version) == (4, 4)
    assert (shadow.labels_offset, shadow.labels_partition) == (13, learner.part("c"))
    offline, loss, weight = offline_shadow()
    served = ServedModel.from_envelope(SHADOW, shadow)
    np.testing.assert_allclose(served.learner.w, offline.w, rtol=1e-12)
    assert served.learner.rho == pytest.approx(offline.rho, rel=1e-12)
    assert (shadow.iw_loss, shadow.iw_weight) == pytest.approx((loss, weight))
    assert served.estimate is not None
    assert served.estimate.labels == 4
    assert learner.published("s") == [1, 2, 3, 4]
    assert learner.joiner.versions() == {"c": 4, "s": 4}
    assert learner.registry.get_sample_value("abstain_labels_applied_total", {"model": "s"}) == 4


async def test_requests_and_labels_addressed_to_a_shadow_are_refused() -> None:
    learner = Learner.start()
    await learner.request("e0", 0, [1.0, 2.0, 3.0], 0.5, 1, model="s")
    await learner.label("e0", 0, 1, model="s")
    dead = [r.json() for r in learner.kafka.sent("abstain.dead-letters")]
    assert [(d["reason"], "shadow of 'c'" in str(d["detail"])) for d in dead] == [
        ("unknown_model", True)
    ] * 2
    assert learner.joiner.models.get("s").version == 0


@pytest.mark.parametrize("crash_on", ["c", "s"])
async def test_a_crash_between_the_writes_redoes_only_what_is_missing_once(crash_on: str) -> None:
    kafka = MemoryKafka()
    crashing = Learner.start(kafka, crash_on=crash_on)
    await crashing.request("e0", 0, *STREAM[0][1:4])  # type: ignore[arg-type]
    with pytest.raises(Crash):
        await crashing.label("e0", 7, 1)
    kafka.durable += [r for r in kafka.buffered if r.topic == "models-changelog"]  # written
    kafka.crash()
    restarted = Learner.start(kafka)
    before = restarted.joiner.models.get("c").version
    assert before == (0 if crash_on == "c" else 1)
    assert restarted.joiner.models.get("s").version == 0
    await restarted.request("e0", 0, *STREAM[0][1:4])  # type: ignore[arg-type]
    await restarted.label("e0", 7, 1)  # redelivered: the missing writes are redone
    await restarted.label("e0", 7, 1)  # and again: a no-op
    models = restarted.joiner.models
    assert (models.get("c").version, models.get("s").version) == (1, 1)
    clean = Learner.start()
    await clean.request("e0", 0, *STREAM[0][1:4])  # type: ignore[arg-type]
    await clean.label("e0", 7, 1)
    for name in ("c", "s"):
        redone, once = models.get(name), clean.joiner.models.get(name)
        assert redone.replace(updated_at=0.0) == once.replace(updated_at=0.0)
    assert restarted.published("s") == [1]


# --------------------------------------------------------------------------- promotion


def signed_book(key: str | None = None) -> ModelBook:
    s = shadow_settings(snapshot_key=key) if key else shadow_settings()
    return ModelBook(s, signer=signer_for(s))


def champions_record(serial: int, servers: dict[str, str]) -> bytes:
    return Champions(serial=serial, servers=servers, updated_at=1.0).to_json()


def test_the_book_takes_a_champions_record_that_names_a_member_of_the_group() -> None:
    book = signed_book()
    assert book.serving()[1].server("c") == "c"
    assert book.offer(CHAMPIONS_KEY.encode(), champions_record(1, {"c": "s"}))
    models, champions = book.serving()
    assert champions.server("c") == "s"
    assert models["s"].name == "s"
    for servers, words in [({"c": "x"}, "cannot serve"), ({"s": "c"}, "no model that decides")]:
        with pytest.raises(BadMessage, match=words):
            book.offer(CHAMPIONS_KEY.encode(), champions_record(2, servers))
    assert book.champions.server("c") == "s"


def test_with_a_key_the_champions_record_is_signed_and_only_a_higher_serial_counts() -> None:
    key = "k" * 32
    book = signed_book(key)
    value = champions_record(3, {"c": "s"})
    with pytest.raises(BadMessage, match="unsigned"):
        book.offer(CHAMPIONS_KEY.encode(), value)
    signer = signer_for(book.settings)
    assert signer is not None
    sign = signer.sign
    assert book.offer(CHAMPIONS_KEY.encode(), value, signature=sign(CHAMPIONS_KEY.encode(), value))
    older = champions_record(2, {})
    assert not book.offer(
        CHAMPIONS_KEY.encode(), older, signature=sign(CHAMPIONS_KEY.encode(), older)
    )
    assert book.champions.server("c") == "s"


def test_with_a_key_records_of_one_serial_are_ordered_by_their_bytes_in_any_order() -> None:
    key = CHAMPIONS_KEY.encode()
    a = Champions(serial=1, servers={"c": "s"}, updated_at=1.0).to_json()
    b = Champions(serial=1, servers={}, updated_at=2.0).to_json()
    served = []
    for order in ((a, b), (b, a), (b,), (a,)):  # read live in either order, or one kept
        book = signed_book("k" * 32)
        signer = signer_for(book.settings)
        assert signer is not None
        for value in order:
            book.offer(key, value, signature=signer.sign(key, value))
        served.append(book.champions_record)
    winner = max((a, b), key=lambda v: hashlib.sha256(v).hexdigest())
    assert [r[0] if r else None for r in served[:2]] == [winner, winner]
    assert None not in served[2:]  # alone, each is taken


def test_promoted_refuses_a_serial_no_reader_takes() -> None:
    s = shadow_settings()
    top = Champions(serial=2**53 - 1, servers={"c": "s"})
    with pytest.raises(ValueError, match="no successor"):
        promoted(s, top, "c", now=1.0)
    with pytest.raises(BadMessage, match="out of range"):
        signed_book().offer(CHAMPIONS_KEY.encode(), champions_record(2**53, {}))


def test_promoted_names_the_challenger_and_promoting_the_route_gives_it_back() -> None:
    s = shadow_settings()
    first = promoted(s, Champions(), "s", now=5.0)
    assert (first.serial, dict(first.servers)) == (1, {"c": "s"})
    back = promoted(s, first, "c", now=6.0)
    assert (back.serial, dict(back.servers)) == (2, {})
    with pytest.raises(ValueError, match="no model named"):
        promoted(s, first, "x", now=7.0)


def test_after_promotion_the_challenger_decides_and_the_champion_is_its_shadow() -> None:
    models = {name: ServedModel.initial(name, cfg) for name, cfg in MODELS.items()}
    limits = Limits(default_model="c", request_ttl=60.0)
    champions = Champions(1, {"c": "s"})
    before = score_batch(models, events(100), limits=limits, now=1.0, groups={"c": ("c", "s")})
    after = score_batch(
        models, events(100), limits=limits, now=1.0, groups={"c": ("c", "s")}, champions=champions
    )
    assert {d.model for d in after.decisions} == {"s"}
    assert [d.id for d in after.decisions] == [d.id for d in before.decisions]
    assert {m for m, _ in after.shadow} == {"c"}
    for r in after.label_requests:  # asked for the route, by the member that decided
        assert (r.model, r.served_by, r.request_id) == ("c", "s", request_id("c", r.event_id))
        assert set(r.shadow_labels) == {"c"}


async def test_after_promotion_the_server_learns_as_champion_and_the_route_as_shadow() -> None:
    learner = Learner.start()
    x, p = [1.0, 0.5, -0.2], 0.25
    req = request(
        x,
        "e0",
        model="c",
        query_probability=p,
        decided_label=1,
        shadow_labels={"c": 0},
        served_by="s",
    )
    await learner.joiner.handle(msg(req.to_json(), 0, REQUESTS, learner.part(), b"c"))
    await learner.label("e0", 0, -1)
    c, s = learner.joiner.models.get("c"), learner.joiner.models.get("s")
    assert (c.version, s.version) == (1, 1)
    mark = learner.joiner.pending.get(request_id("c", "e0"))
    assert mark is not None
    assert (mark.applied_version, dict(mark.shadow_versions)) == (1, {"c": 1})
    assert s.iw_loss == pytest.approx(1.0 / p)  # decided +1, truth -1
    assert c.iw_loss == pytest.approx(0.25 / p)  # rejected: d / p
    shadow = ServedModel.initial("c", CHAMPION)
    alone = served_learner(CHAMPION, dict(shadow.envelope.learner), serving=False)
    shadow.pipeline.learn_label(np.asarray(x), None)
    learn_from_champion(alone, shadow.pipeline.transform(np.asarray(x)), -1, p)
    np.testing.assert_allclose(
        ServedModel.from_envelope(CHAMPION, c).learner.w, alone.w, rtol=1e-12
    )


async def test_a_request_served_by_a_model_outside_the_group_is_refused() -> None:
    learner = Learner.start()
    req = request([1.0, 2.0, 3.0], "e0", model="c", served_by="x")
    await learner.joiner.handle(msg(req.to_json(), 0, REQUESTS, learner.part(), b"c"))
    assert [r.json()["reason"] for r in learner.kafka.sent("abstain.dead-letters")] == [
        "unknown_model"
    ]


def test_the_comparison_lists_each_group_serving_member_first() -> None:
    s = shadow_settings()
    models = {name: ServedModel.initial(name, cfg) for name, cfg in s.models.items()}
    tally = {"c": DecisionTally(10, 4), "s": DecisionTally(10, 1)}
    rows = comparison(s, models, Champions(1, {"c": "s"}), tally)
    assert [(r["model"], r["role"], r["route"]) for r in rows] == [
        ("s", "champion", "c"),
        ("c", "challenger", "c"),
    ]
    assert (rows[0]["reject_rate"], rows[1]["reject_rate"], rows[0]["risk"]) == (0.1, 0.4, None)
    assert orjson.loads(views.models(rows).body)["models"] == rows


# --------------------------------------------------------------------------- rollback


async def rollback(
    learner: Learner, target: str, version: int, offset: int, signer: Signer | None = None
) -> None:
    base = learner.joiner.models.get(target).version  # written against the version served
    order = Rollback("c", target, version, "ops", None, base).to_json()
    message = msg(order, offset, LABELS, learner.part(), b"c")
    if signer is not None:
        message = replace(message, signature=signer.sign(b"c", order))
    await learner.joiner.handle(message)


async def test_with_a_key_only_a_rollback_order_signed_by_a_known_key_is_taken() -> None:
    old, new = b"o" * 32, b"n" * 32
    learner = Learner.start(signer=Signer(new, [old]))
    for i, (rid, x, p, mine, y) in enumerate(STREAM[:3]):
        await learner.request(rid, i, x, p, mine)
        await learner.label(rid, 10 + i, y)
    await rollback(learner, "c", 0, 20)  # unsigned
    await rollback(learner, "c", 0, 21, Signer(b"x" * 32))  # another key
    await rollback(learner, "c", 0, 22, Signer(new))  # signed with the current key
    dead = [r.json() for r in learner.kafka.sent("abstain.dead-letters")]
    assert [(d["reason"], d["offset"], d["topic"]) for d in dead] == [
        ("unsigned", 20, LABELS),
        ("bad_signature", 21, LABELS),
    ]
    assert learner.joiner.models.get("c").version == 4  # the third was taken
    await rollback(learner, "c", 1, 23, Signer(old))  # the previous key, during a rotation
    assert learner.joiner.models.get("c").version == 5
    assert learner.joiner.models.get("c").labels_applied == 1


async def test_a_rollback_serves_the_old_state_as_a_new_version_and_learning_goes_on() -> None:
    learner = Learner.start()
    for i, (rid, x, p, mine, y) in enumerate(STREAM[:3]):
        await learner.request(rid, i, x, p, mine)
        await learner.label(rid, 10 + i, y)
    models = learner.joiner.models
    v1 = models.version("c", 1)
    assert v1 is not None
    await rollback(learner, "c", 1, 20)
    now = models.get("c")
    assert (now.version, now.labels_offset) == (4, 20)
    assert (now.learner, now.pipeline, now.labels_applied) == (v1.learner, v1.pipeline, 1)
    assert learner.published("c")[-1] == 4
    await rollback(learner, "c", 1, 20)  # redelivered: a no-op
    assert models.get("c").version == 4
    rid, x, p, mine, y = STREAM[3]
    await learner.request(rid, 3, x, p, mine)
    await learner.label(rid, 21, y)
    after = models.get("c")
    assert (after.version, after.labels_applied) == (5, 2)  # learned on from version 1
    await rollback(learner, "s", 0, 22)  # a shadow too, to its initial state
    assert models.get("s").learner == initial_envelope("s", SHADOW).learner
    assert models.get("s").version == 5
    assert learner.registry.get_sample_value("abstain_labels_applied_total", {"model": "c"}) == 4


async def test_a_rollback_to_a_version_no_longer_kept_is_dead_lettered() -> None:
    learner = Learner.start(keep=2)
    for i, (rid, x, p, mine, y) in enumerate(STREAM):
        await learner.request(rid, i, x, p, mine)
        await learner.label(rid, 10 + i, y)
    assert learner.joiner.models.version("c", 2) is None  # versions 3 and 4 are kept
    assert learner.joiner.models.version("c", 3) is not None
    await rollback(learner, "c", 2, 20)
    await rollback(learner, "c", 9, 21)
    dead = [r.json() for r in learner.kafka.sent("abstain.dead-letters")]
    assert [(d["reason"], d["offset"]) for d in dead] == [
        ("unknown_version", 20),
        ("unknown_version", 21),
    ]
    assert "kept: 0, 3," in dead[0]["detail"]  # what an operator may roll back to instead
    assert learner.joiner.models.get("c").version == 4


def test_a_rollback_order_round_trips_and_labels_still_parse_on_the_labels_topic() -> None:
    order = Rollback("c", "s", 3, "ops", 1.5)
    assert parse_labels_record(order.to_json()) == order
    label = Label("r", "c", 1, "ops", None)
    assert parse_labels_record(label.to_json()) == label


def test_rebuild_refuses_a_shadow(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text(orjson.dumps({"models": MODELS_JSON, "default_model": "c"}).decode())
    assert cli.main(["rebuild", "--model", "s", "--config", str(config)]) == 2
    assert "is a shadow of 'c'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["promote", "x"], "no model named 'x'"),
        (["rollback", "x", "--to-version", "1"], "no model named 'x'"),
        (["rollback", "s", "--to-version", "-1"], "--to-version must be 0 or more"),
        (["compare", "--url", "ftp://worker"], "--url must start with http"),
    ],
)
def test_models_commands_refuse_what_they_cannot_do_before_touching_kafka(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "c.json"
    config.write_text(
        orjson.dumps(
            {"models": MODELS_JSON, "default_model": "c", "broker": "127.0.0.1:1"}
        ).decode()
    )
    assert models_cli.main([*argv, "--config", str(config)]) == 2
    assert words in capsys.readouterr().err
