"""The scoring path with an in-memory producer (no broker): what goes to which topic with
which key, what is counted, a model swapped mid-batch, an internal error in one event."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from service.config import LabelBudget
from service.learning.moments import Moments
from service.records import Champions, RawMessage, parse_label_request, request_id
from service.stream.models.book import ModelBook
from service.stream.models.served import ServedModel
from service.stream.scoring import scorer as scorer_module
from service.stream.scoring.scorer import Scorer

from ..memory import CFG, MemoryKafka, msg, outputs, score, settings, trained

DECISIONS, REQUESTS, DEAD = "abstain.decisions", "abstain.label-requests", "abstain.dead-letters"


class Book:
    """The models a scorer reads, swappable by a test."""

    def __init__(self, served: ServedModel) -> None:
        self.models = {"m": served}

    def snapshot(self) -> Mapping[str, ServedModel]:
        return self.models

    def serving(self) -> tuple[Mapping[str, ServedModel], Champions]:
        return self.models, Champions()


def make(served: ServedModel) -> tuple[Scorer, MemoryKafka, Book, CollectorRegistry]:
    kafka, registry, book = MemoryKafka(), CollectorRegistry(), Book(served)
    s = settings()
    out = outputs(kafka, s, registry)
    return Scorer(s, book.serving, out, out.metrics, clock=lambda: 50.0), kafka, book, registry


def batch() -> list[RawMessage]:
    good = [msg({"id": f"e{i}", "features": [i - 3.0, 1.0, -0.5 * i]}, i) for i in range(8)]
    bad = [msg(b"{", 8), msg({"id": "short", "features": [1, 2]}, 9), msg(b"", 10)]
    return [good[0], bad[0], *good[1:4], bad[1], *good[4:], bad[2]]


async def test_a_batch_with_bad_events_writes_each_output_to_its_topic_and_counts_it() -> None:
    scorer, kafka, _, registry = make(trained(CFG, 30))
    result = await score(scorer, batch())
    decisions = [orjson.loads(r.value or b"") for r in kafka.sent(DECISIONS)]
    assert [d["id"] for d in decisions] == [f"e{i}" for i in range(8)]  # input order
    assert [r.key for r in kafka.sent(DECISIONS)] == [f"e{i}".encode() for i in range(8)]
    requests = kafka.sent(REQUESTS)
    assert {r.key for r in requests} <= {b"m"}
    assert [orjson.loads(r.value or b"")["request_id"] for r in requests] == [
        request_id("m", d["id"]) for d in decisions if d["queried"]
    ]
    dead = [orjson.loads(r.value or b"") for r in kafka.sent(DEAD)]
    assert [(d["offset"], d["reason"]) for d in dead] == [
        (8, "not_json"),
        (9, "feature_count"),
        (10, "not_json"),
    ]
    sample = registry.get_sample_value
    predicted = sum(d["action"] == "predict" for d in decisions)
    assert sample("abstain_events_total", {"model": "m"}) == 8
    assert sample("abstain_decisions_total", {"model": "m", "action": "predict"}) == predicted
    assert sample("abstain_label_requests_total", {"model": "m"}) == len(requests)
    assert sample("abstain_decide_latency_seconds_count", {"model": "m"}) == 8
    assert sample("abstain_dead_letters_total", {"source": "features", "reason": "not_json"}) == 2
    assert len(result.decisions) == 8
    assert scorer.query_rates()["m"] == pytest.approx(len(requests) / 8)


async def test_a_model_swapped_while_a_batch_is_written_serves_from_the_next_batch() -> None:
    old, new = trained(CFG, 5), trained(CFG, 40)
    scorer, kafka, book, _ = make(old)
    sends = kafka.send

    async def swap_on_first_send(topic: str, key: bytes | None, value: bytes) -> None:
        book.models = {"m": new}  # the follower swaps while outputs are being written
        await sends(topic, key, value)

    kafka.send = swap_on_first_send  # type: ignore[method-assign]
    await score(scorer, batch())
    kafka.send = sends  # type: ignore[method-assign]
    await score(scorer, batch())
    versions = [orjson.loads(r.value or b"")["model_version"] for r in kafka.sent(DECISIONS)]
    assert versions == [old.version] * 8 + [new.version] * 8


async def test_an_internal_error_on_one_event_dead_letters_it_and_scores_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scorer, kafka, _, _ = make(trained(CFG, 10))
    real = scorer_module.score_batch

    def fragile(models, messages, **kw):  # type: ignore[no-untyped-def]
        if any(m.offset == 2 for m in messages):
            raise ZeroDivisionError("a bug met by odd data")
        return real(models, messages, **kw)

    monkeypatch.setattr(scorer_module, "score_batch", fragile)
    await score(scorer, [msg({"id": f"e{i}", "features": [1.0, 2.0, i]}, i) for i in range(4)])
    assert [orjson.loads(r.value or b"")["id"] for r in kafka.sent(DECISIONS)] == [
        "e0",
        "e1",
        "e3",
    ]
    (dead,) = [orjson.loads(r.value or b"") for r in kafka.sent(DEAD)]
    assert (dead["offset"], dead["reason"]) == (2, "schema")
    assert "ZeroDivisionError" in dead["detail"]


def budgeted(budget: dict[str, float], **kw: object) -> tuple[Scorer, MemoryKafka, Book]:
    cfg = CFG.model_copy(update={"label_budget": LabelBudget(**budget), **kw})
    kafka, registry = MemoryKafka(), CollectorRegistry()
    s = settings(models={"m": cfg})
    out = outputs(kafka, s, registry)
    book = Book(ServedModel.initial("m", cfg))  # w = 0: the learner alone would ask a lot
    clock = iter(range(10**9))
    return Scorer(s, book.serving, out, out.metrics, clock=lambda: float(next(clock))), kafka, book


async def test_a_fraction_budget_asks_that_share_of_events_with_the_true_probability() -> None:
    scorer, kafka, _ = budgeted({"fraction": 0.05})
    rng = np.random.default_rng(5)
    for b in range(40):
        batch = [
            msg({"id": f"b{b}-{i}", "features": rng.normal(size=3).tolist()}, i) for i in range(100)
        ]
        await score(scorer, batch)
    decisions = [orjson.loads(r.value or b"") for r in kafka.sent(DECISIONS)]
    requests = kafka.sent(REQUESTS)
    assert len(decisions) == 4000
    assert 0.04 * 4000 <= len(requests) <= 0.06 * 4000  # the budget, not the learner's ~100 %
    asked = {d["id"]: d["query_probability"] for d in decisions if d["queried"]}
    for r in requests:
        req = orjson.loads(r.value or b"")
        assert req["query_probability"] == asked[req["event_id"]]  # the p it was asked with
    # the expected number of asks is the sum of the probabilities used: they are honest
    total_p = sum(d["query_probability"] for d in decisions)
    assert abs(total_p - len(requests)) < 4 * np.sqrt(len(requests))
    suppressed = scorer.metrics.registry.get_sample_value(
        "abstain_label_requests_suppressed_total", {"model": "m"}
    )
    assert suppressed is not None
    assert suppressed > 2500  # the fresh model (p = 0.79 at w = 0) would have asked more


async def test_a_per_hour_budget_is_shared_by_the_workers_partitions() -> None:
    scorer, _, _ = budgeted({"per_hour": 3600.0})
    assert scorer.budgets["m"].rate == pytest.approx(1.0)  # a label a second on one worker
    scorer.set_share(0.25)  # this worker scores a quarter of the feature partitions
    assert scorer.budgets["m"].rate == pytest.approx(0.25)
    scorer.budget_gauges()
    gauge = scorer.metrics.registry.get_sample_value(
        "abstain_label_budget_labels_per_hour", {"model": "m"}
    )
    assert gauge == pytest.approx(900.0)


async def test_a_model_that_rejects_everything_while_rho_grows_raises_the_collapse_gauge() -> None:
    scorer, _, book, _ = make(ServedModel.initial("m", CFG))
    rng = np.random.default_rng(2)
    for step in range(12):  # every event rejected (w = 0), rho growing version by version
        served = book.models["m"]
        learner = served.learner.champion  # inside the adaptive wrapper
        learner._rho = 1.0 + step  # noqa: SLF001 - a collapsing learner, built by hand
        batch = [
            msg({"id": f"{step}-{i}", "features": rng.normal(size=3).tolist()}, i)
            for i in range(100)
        ]
        await score(scorer, batch)
    sample = scorer.metrics.registry.get_sample_value
    assert sample("abstain_model_collapsed", {"model": "m"}) == 1.0
    assert sample("abstain_model_reject_fraction", {"model": "m"}) == 1.0


def overflowing(served: ServedModel, version: int) -> bytes:
    """A snapshot of ``served``'s model whose learned numbers are all within the bound but
    which overflows on every event: a standardiser centred on 9e99 that divides by 1e-154,
    weights of 1e99."""
    env = served.envelope
    pipeline = orjson.loads(orjson.dumps(dict(env.pipeline)))
    scaler = pipeline["steps"][0]
    n = len(scaler["learned"]["m2"])
    scaler["params"]["min_std"] = 1e-300
    scaler["learned"].update(count=10, mean=[9e99] * n, m2=[1e-307] * n)
    learner = orjson.loads(orjson.dumps(dict(env.learner)))
    inner = learner.get("champion", learner)  # inside the adaptive wrapper
    inner["learned"]["w"] = [1e99] * len(inner["learned"]["w"])
    return env.replace(version=version, pipeline=pipeline, learner=learner).to_json()


async def test_a_snapshot_that_cannot_score_is_refused_and_its_events_decided() -> None:
    s = settings()
    book = ModelBook(s)
    good = trained(CFG, 30)
    assert book.offer(b"m", good.envelope.to_json())
    kafka, registry = MemoryKafka(), CollectorRegistry()
    out = outputs(kafka, s, registry)
    scorer = Scorer(s, book.serving, out, out.metrics, clock=lambda: 50.0, fallback=book.refuse)
    events = [msg({"id": f"e{i}", "features": [i - 3.0, 1.0, -0.5 * i]}, i) for i in range(8)]
    await score(scorer, events[:4])  # version 30 scores: it is good
    origin = RawMessage(b"", "abstain.models", 0, 77, b"m")
    assert book.offer(b"m", overflowing(good, 31), origin=origin)
    result = await score(scorer, events[4:])
    decided = [(d.id, d.model_version) for d in result.decisions]
    assert decided == [(f"e{i}", 30) for i in range(4, 8)]
    dead = [orjson.loads(r.value or b"") for r in kafka.sent(DEAD)]
    assert [(d["topic"], d["offset"], d["reason"]) for d in dead] == [
        ("abstain.models", 77, "non_finite")
    ]
    assert "version 31" in dead[0]["detail"]
    assert book.models["m"].version == 30  # served again
    sample = registry.get_sample_value
    assert sample("abstain_dead_letters_total", {"source": "models", "reason": "non_finite"}) == 1
    assert not sample("abstain_dead_letters_total", {"source": "features", "reason": "non_finite"})


async def test_an_event_that_overflows_alone_is_its_own_fault_and_the_model_stays() -> None:
    s = settings()
    book = ModelBook(s)
    assert book.offer(b"m", trained(CFG, 30).envelope.to_json())
    kafka, registry = MemoryKafka(), CollectorRegistry()
    out = outputs(kafka, s, registry)
    scorer = Scorer(s, book.serving, out, out.metrics, clock=lambda: 50.0, fallback=book.refuse)
    await score(scorer, [msg({"id": "a", "features": [1.0, 2.0, 3.0]}, 0)])
    assert book.offer(b"m", trained(CFG, 31).envelope.to_json())
    events = [msg({"id": f"e{i}", "features": [1.0, 0.5, 2.0]}, i) for i in range(1, 4)]
    events.append(msg({"id": "huge", "features": [1.7e308, -1.7e308, 1.7e308]}, 4))
    result = await score(scorer, events)
    assert {d.model_version for d in result.decisions} == {31}
    dead = [orjson.loads(r.value or b"") for r in kafka.sent(DEAD)]
    assert [(d["topic"], d["reason"]) for d in dead] == [("abstain.features", "non_finite")]
    assert book.models["m"].version == 31


async def test_each_label_request_carries_the_moments_of_the_events_scored_since_the_last() -> None:
    scorer, kafka, _, _ = make(trained(CFG, 30))
    rng = np.random.default_rng(3)
    rows = rng.normal(size=(60, 3)) * [1.0, 20.0, 0.5] + [0.0, 100.0, 0.0]
    for start in range(0, 60, 7):  # batches of 7 events
        batch = [
            msg({"id": f"v{i}", "features": rows[i].tolist()}, i)
            for i in range(start, min(start + 7, 60))
        ]
        await score(scorer, batch)
    requests = [parse_label_request(r.value or b"") for r in kafka.sent(REQUESTS)]
    assert len(requests) >= 2
    carried = [r.moments for r in requests if r.moments is not None]
    # the first request of a batch takes all that was gathered; the others of the batch none
    assert 1 <= len(carried) <= len(requests)
    total = Moments(3)
    for m in carried:
        total.merge(
            Moments.from_record({"count": m.count, "mean": list(m.mean), "m2": list(m.m2)}, 3)
        )
    left = scorer.moments["m"]
    total.merge(left)  # what the next request will carry
    assert total.count == 60  # every event, once
    np.testing.assert_allclose(total.mean, rows.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(total.m2, ((rows - rows.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-7)


def test_only_models_that_standardise_and_fit_in_a_message_gather_moments() -> None:
    s = settings(
        models={
            "m": CFG,
            "raw": CFG.model_copy(update={"standardize": False}),
            "wide": CFG.model_copy(update={"n_features": 30_000}),
        }
    )
    kafka, registry = MemoryKafka(), CollectorRegistry()
    out = outputs(kafka, s, registry)
    scorer = Scorer(s, lambda: ({}, Champions()), out, out.metrics, clock=lambda: 0.0)
    assert set(scorer.moments) == {"m"}
