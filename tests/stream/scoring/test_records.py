"""The batch path writes exactly the records the event-by-event path wrote: decisions, label
requests and dead letters, byte for byte, to the same partitions, in the same order, for the
same input (``reference.py`` is that path as it was), over models, budgets, shadows, a
promoted shadow, the audit, events that overflow, and every kind of bad event."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from service.config import LabelBudget, ModelConfig, Settings
from service.learning import Adaptive
from service.learning.moments import Moments
from service.records import (
    Champions,
    Label,
    LabelRequest,
    ModelEnvelope,
    PendingEntry,
    RawMessage,
    request_id,
)
from service.stream.kafka.produce import BatchProducer, Outgoing, OutRecord
from service.stream.labels.protocol import apply_label
from service.stream.models.served import ServedModel, initial_envelope
from service.stream.scoring.scorer import Scorer, gathers_moments, make_budget

from ..memory import MemoryKafka, outputs
from . import reference

DSAL = ModelConfig(algorithm="dsal", cost=0.25, n_features=3, audit_rate=0.05)
MODELS: dict[str, ModelConfig] = {
    "m": DSAL,
    "s": ModelConfig(algorithm="dral", cost=0.25, n_features=3, champion="m"),
    "t": ModelConfig(algorithm="dsol", cost=0.2, n_features=3, champion="m"),
    "w": ModelConfig(algorithm="dral", cost=0.2, n_features=2, audit_rate=0.0),
    "b": DSAL.model_copy(update={"label_budget": LabelBudget(fraction=0.2)}),
    "h": DSAL.model_copy(update={"label_budget": LabelBudget(per_hour=1800.0)}),
    "n": ModelConfig(algorithm="dsal", cost=0.25, n_features=2, feature_names=("u", "v")),
    "r": DSAL.model_copy(update={"standardize": False}),  # gathers no moments
    # declared, 513 inputs: its requests written sparsely when an event sets few of them
    "f": ModelConfig.model_validate(
        {
            "algorithm": "dsol",
            "cost": 0.2,
            "fields": {"hash_bits": 9, "fields": {"a": "number", "c": "category", "t": "tokens"}},
        }
    ),
}
_WORDS = [f"w{i}" for i in range(300)]


def served(name: str, cfg: ModelConfig, labels: int, seed: int) -> ServedModel:
    """Model ``name`` moved away from w = 0 by ``labels`` labels (deterministic), a new
    object each call."""
    if not labels:
        return ServedModel.initial(name, cfg)
    return ServedModel.from_envelope(cfg, _envelope(name, labels, seed))


@functools.cache
def _envelope(name: str, labels: int, seed: int) -> ModelEnvelope:
    cfg = MODELS[name]
    rng = np.random.default_rng(seed)
    envelope = initial_envelope(name, cfg)
    for i in range(labels):
        x = rng.normal(size=cfg.n_inputs)
        y = 1 if x[0] > 0 else -1
        rid = request_id(name, f"t{i}")
        fields: dict[str, Any] = {
            "request_id": rid,
            "event_id": f"t{i}",
            "model": name,
            "features": [float(v) for v in x],
            "score": 0.0,
            "rho": 1.0,
            "decided_label": 0,
            "query_probability": 0.5,
            "model_version": 0,
            "requested_at": 0.0,
            "expires_at": 1e9,
            "priority": 0.5,
        }
        entry = PendingEntry(LabelRequest(**fields), 0)
        out = apply_label(cfg, envelope, entry, Label(rid, name, y, "t", None), i, now=1.0)
        assert out.model is not None
        envelope = out.model
    return envelope


def models_of(s: Settings, trained: int) -> dict[str, ServedModel]:
    """A fresh set of the settings' models (the same every call)."""
    return {
        name: served(name, cfg, trained if name != "w" else 0, seed=i)
        for i, (name, cfg) in enumerate(s.models.items())
    }


@dataclass
class Both:
    """The same input through the batch path (a :class:`Scorer`) and the reference."""

    s: Settings
    champions: Champions
    trained: int
    new_models: dict[str, ServedModel] = field(init=False)
    old_models: dict[str, ServedModel] = field(init=False)
    scorer: Scorer = field(init=False)
    budgets: dict[str, Any] = field(init=False)
    clock: itertools.count[int] = field(default_factory=lambda: itertools.count(1000, 7))

    def __post_init__(self) -> None:
        self.new_models = models_of(self.s, self.trained)
        self.old_models = models_of(self.s, self.trained)
        out = outputs(MemoryKafka(), self.s, CollectorRegistry())
        self.now = 0.0
        self.scorer = Scorer(
            self.s,
            lambda: (self.new_models, self.champions),
            out,
            out.metrics,
            clock=lambda: self.now,
        )
        self.budgets = {
            m: make_budget(c.label_budget, share=1.0)
            for m, c in self.s.models.items()
            if c.label_budget is not None
        }
        self.groups = {m: self.s.group(m) for m in self.s.models if self.s.shadows_of(m)}
        self.outputs = out
        self.moments = {
            m: Moments(c.moments_inputs)
            for m, c in self.s.models.items()
            if gathers_moments(c, self.s.max_message_bytes)
        }

    def batch(self, messages: Sequence[RawMessage]) -> tuple[list[OutRecord], Outgoing]:
        self.now = float(next(self.clock)) + 0.125
        result, new = self.scorer.decide(messages)
        old_result = reference.score_batch(
            self.old_models,
            messages,
            limits=self.scorer.limits,
            now=self.now,
            budgets=self.budgets,
            groups=self.groups,
            champions=self.champions,
        )
        reference.gather(self.moments, old_result)
        old = reference.records(self.outputs, old_result)
        assert result.scored == old_result.scored
        assert result.overflowed == old_result.overflowed
        assert result.suppressed == old_result.suppressed
        assert result.shadow == old_result.shadow
        assert result.decisions == old_result.decisions
        assert result.label_requests == old_result.label_requests
        assert result.moments.keys() == old_result.moments.keys()
        for route, seen in result.moments.items():
            them = old_result.moments[route]
            assert (seen.count, seen.mean.tolist(), seen.m2.tolist()) == (
                them.count,
                them.mean.tolist(),
                them.m2.tolist(),
            )
        return old, new

    def same_state(self) -> None:
        """Budgets, learners and the moments gathered for the next request moved on alike
        (an adaptive learner counts what its exploration floor raised while it decides)."""
        assert self.moments.keys() == self.scorer.moments.keys()
        for name, seen in self.moments.items():
            ours = self.scorer.moments[name]
            assert (ours.count, ours.mean.tolist(), ours.m2.tolist()) == (
                seen.count,
                seen.mean.tolist(),
                seen.m2.tolist(),
            )
        for name, budget in self.budgets.items():
            assert budget.report() == self.scorer.budgets[name].report()
        for name, model in self.new_models.items():
            assert served_state(model.learner) == served_state(self.old_models[name].learner)


def served_state(learner: Any) -> Any:
    """What a served learner holds and scoring changes: an adaptive learner's champion and
    the decisions its exploration floor raised (a served view writes no state of its own)."""
    if isinstance(learner, Adaptive):
        return learner.champion.to_state(), learner.explored, learner.champion_origin
    return learner.to_state()


def rows(records: Sequence[OutRecord]) -> list[tuple[Any, ...]]:
    return [(r.topic, r.key, r.value, r.partition, r.headers) for r in records]


def message(value: Any, offset: int, partition: int = 0, ts: float | None = 5.0) -> RawMessage:
    raw = value if isinstance(value, bytes) else orjson.dumps(value)
    return RawMessage(raw, "abstain.features", partition, offset, None, ts)


def settings_with(*names: str, default: str = "m") -> Settings:
    return Settings(models={n: MODELS[n] for n in names}, default_model=default)


_number = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.floats(min_value=-5, max_value=5),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0.0, -0.0, 1e-320, 1e300, -1e300, 1e308, 2**53 + 1]),
)


@st.composite
def _event(draw: st.DrawFn) -> bytes:
    """A features message: mostly scorable, often not (every kind of refusal)."""
    kind = draw(st.sampled_from(["m", "m", "m", "w", "b", "h", "n", "r", "s", "f", "zzz", "raw"]))
    if kind == "raw":
        return draw(
            st.sampled_from(
                [
                    b"",
                    b"{",
                    b"[1, 2]",
                    b"null",
                    b'{"id": "x", "features": [1e999, 0, 0]}',
                    b'{"id": "x", "features": [NaN, 0, 0]}',
                    b'{"id": "\\ud800", "features": [1, 2, 3]}',
                    b'{"id": "x", "features": [true, 0, 0]}',
                    b'{"id": "x", "features": ["1", 0, 0]}',
                    b'{"id": "x", "features": [1, 2, 3], "ts": "now"}',
                    b'{"id": 7, "features": [1, 2, 3]}',
                    b'{"id": "", "features": [1, 2, 3]}',
                    b'{"features": [1, 2, 3]}',
                    b'{"id": "x", "features": [1, 2, 3], "model": 5}',
                ]
            )
        )
    record: dict[str, Any] = {"id": draw(st.text(min_size=1, max_size=12))}
    width = {"w": 2, "n": 2}.get(kind, 3) + draw(st.sampled_from([0, 0, 0, 0, 0, 0, 1, -1]))
    if kind == "n":
        record["features"] = {"u": draw(_number), "v": draw(_number)}
    elif kind == "f":  # a few tokens (written sparsely) or many (written whole)
        few = draw(st.lists(st.sampled_from(_WORDS), max_size=5))
        tokens = few if draw(st.booleans()) else _WORDS[: draw(st.integers(150, 300))]
        record["features"] = {"a": draw(_number), "c": "SE", "t": tokens}
    else:
        record["features"] = [draw(_number) for _ in range(max(0, width))]
    if kind != "m" or draw(st.booleans()):
        record["model"] = kind
    if draw(st.booleans()):
        record["ts"] = draw(st.one_of(st.none(), _number))
    try:
        return orjson.dumps(record)
    except orjson.JSONEncodeError:  # an integer past 64 bits: written as Python writes it
        return json.dumps(record).encode()


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.lists(_event(), max_size=30), min_size=1, max_size=4),
    st.booleans(),
    st.integers(0, 40),
)
def test_the_batch_path_writes_the_records_the_event_by_event_path_wrote(
    batches: list[list[bytes]], promoted: bool, trained: int
) -> None:
    s = settings_with(*MODELS)
    champions = Champions(servers={"m": "s"}) if promoted else Champions()
    both = Both(s, champions, trained)
    offset = itertools.count()
    for raws in batches:
        messages = [
            message(
                raw,
                next(offset),
                partition=i % 3,
                ts=None if i % 3 == 1 else 5.0 + i * [1.0, -0.5][i % 2],
            )
            for i, raw in enumerate(raws)
        ]
        old, new = both.batch(messages)
        assert rows(new) == rows(old)
    both.same_state()


def test_the_benchmarks_events_give_the_same_records_with_and_without_a_budget() -> None:
    from service.datasets import load_dataset, resolve_dataset_path  # noqa: PLC0415

    X, _ = load_dataset(resolve_dataset_path("phishing"))
    fresh = ModelConfig(algorithm="dsal", cost=0.25, n_features=68)
    for cfg in (fresh, fresh.model_copy(update={"label_budget": LabelBudget(fraction=0.01)})):
        s = Settings(models={"default": cfg})
        both = Both(s, Champions(), 0)
        for b in range(8):
            at = [b * 256 + i for i in range(256)]
            messages = [
                message(
                    {"id": f"e-{j}", "features": X[j % len(X)].tolist()},
                    j,
                    partition=(j // 64) % 4,
                    ts=1e9 + j,
                )
                for j in at
            ]
            old, new = both.batch(messages)
            assert rows(new) == rows(old)
            asked = [r for r in old if r.topic == "abstain.label-requests"]
            assert len(old) == 256 + len(asked)
            # the first request of the batch carries the moments of the events since the last
            carried = [orjson.loads(r.value or b"")["moments"] for r in asked]
            assert not carried or carried[0]["count"] >= 1
            assert all(m is None for m in carried[1:])
        both.same_state()


def test_events_that_overflow_once_scaled_are_refused_alone_as_before() -> None:
    s = settings_with("m", "s", "t", "w")
    both = Both(s, Champions(), 30)
    huge = [message({"id": f"o{i}", "features": [1e308, -1e308, 1e308]}, i) for i in range(3)]
    fine = [message({"id": f"f{i}", "features": [0.1 * i, 1.0, -1.0]}, 3 + i) for i in range(5)]
    for batch in (huge + fine, fine[:2] + huge[:1] + fine[2:], huge):
        old, new = both.batch(batch)
        assert rows(new) == rows(old)
    both.same_state()


@dataclass
class _Batch:
    limit: int
    records: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)

    def append(self, *, key: Any, value: Any, timestamp: Any, headers: Any) -> Any:
        if len(self.records) >= self.limit or len(value or b"") > 4000:
            return None
        self.records.append((key, value))
        return True

    def record_count(self) -> int:
        return len(self.records)


@dataclass
class _Producer:
    """What reached each topic partition, in order."""

    counts: Mapping[str, int]
    sent: dict[tuple[str, int], list[tuple[bytes | None, bytes | None]]] = field(
        default_factory=dict
    )

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.counts[topic]))

    def create_batch(self) -> _Batch:
        return _Batch(5)

    async def send_batch(self, batch: _Batch, topic: str, *, partition: int) -> Any:
        self.sent.setdefault((topic, partition), []).extend(batch.records)
        return asyncio.get_running_loop().create_future()

    async def send(self, topic: str, value: Any, *, key: Any, partition: int, headers: Any) -> Any:
        self.sent.setdefault((topic, partition), []).append((key, value))
        return asyncio.get_running_loop().create_future()


async def test_the_producer_puts_the_columns_where_it_put_the_records() -> None:
    s = settings_with("m", "w", "b", "n")
    both = Both(s, Champions(), 5)
    rng = np.random.default_rng(9)
    messages = [
        message(
            {
                "id": f"e{i}",
                "model": ["m", "w", "b"][i % 3],
                "features": rng.normal(size=2 if i % 3 == 1 else 3).tolist(),
            },
            i,
            partition=i % 7,
        )
        for i in range(200)
    ]
    messages += [message(b"{", 200, partition=3), message({"id": "big", "features": [1] * 9}, 201)]
    old, new = both.batch(messages)
    counts = {"abstain.decisions": 4, "abstain.label-requests": 3, "abstain.dead-letters": 2}
    before, after = _Producer(counts), _Producer(counts)
    for producer, records in ((before, old), (after, new)):
        sent = await BatchProducer(producer).send_many(records)  # type: ignore[arg-type]
        sent.cancel()
    assert after.sent == before.sent
    assert {t for t, _ in before.sent} == set(counts)
