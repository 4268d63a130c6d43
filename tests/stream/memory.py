"""In-memory stand-ins for what the stream layer reaches through protocols, and builders.

:class:`MemoryKafka` models the two things the learn protocol's safety rests on: a table
write is a changelog record in the producer's buffer, and ``flush`` makes everything
buffered durable. :meth:`MemoryKafka.crash` drops what was not flushed, and
:meth:`MemoryKafka.table` rebuilt after a crash holds what a restarted worker would recover
from the changelog.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from prometheus_client import CollectorRegistry

from service.config import ModelConfig, Settings
from service.metrics import Metrics
from service.records import Label, LabelRequest, PendingEntry, RawMessage, request_id
from service.records.packed import is_packed, unpack
from service.stream.labels.protocol import apply_label
from service.stream.models.served import ServedModel, initial_envelope
from service.stream.outputs import Outputs
from service.stream.scoring.decide import ScoreResult
from service.stream.scoring.scorer import Scorer

CFG = ModelConfig(algorithm="dsal", cost=0.25, n_features=3, audit_rate=0.05)


@dataclass(frozen=True, slots=True)
class Sent:
    topic: str
    key: bytes | None
    value: bytes | None  # None: a table delete (tombstone)
    headers: tuple[tuple[str, bytes], ...] = ()

    def json(self) -> dict[str, object]:
        """The value as a record (a model version's packed form read back)."""
        assert self.value is not None
        return record_of(self.value)


def record_of(raw: bytes) -> dict[str, Any]:
    """A record as JSON or, a model version, in its packed form, read back."""
    out: dict[str, Any] = unpack(raw) if is_packed(raw) else orjson.loads(raw)
    return out


@dataclass
class MemoryKafka:
    """A producer with a buffer (``send``) and acknowledged records (``flush``)."""

    durable: list[Sent] = field(default_factory=list)
    buffered: list[Sent] = field(default_factory=list)
    flushes: int = 0
    fail_flush: bool = False

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> None:
        self.buffered.append(Sent(topic, key, value, tuple(headers or ())))

    async def flush(self) -> None:
        if self.fail_flush:
            raise ConnectionError("broker away")
        self.flushes += 1
        self.durable += self.buffered
        self.buffered = []

    def crash(self) -> None:
        """The process dies: what was not acknowledged is gone."""
        self.buffered = []

    def sent(self, topic: str) -> list[Sent]:
        """Records of ``topic``, durable first, then buffered."""
        return [r for r in self.durable + self.buffered if r.topic == topic]

    def table(self, name: str) -> MemoryTable:
        """A table recovered from the durable part of its changelog (each entry says where
        it was read back from: :meth:`MemoryTable.origin`)."""
        table = MemoryTable(self, name)
        for offset, record in enumerate(self.durable):
            if record.topic == table.changelog and record.key is not None:
                if record.value is None:
                    table.data.pop(record.key, None)
                    table.read.pop(record.key, None)
                else:
                    table.data[record.key] = record.value
                    table.read[record.key] = (0, offset)
        return table


class MemoryTable:
    """A changelog-backed table: each write also buffers a changelog record."""

    def __init__(self, kafka: MemoryKafka, name: str) -> None:
        self.kafka = kafka
        self.changelog = self.topic = f"{name}-changelog"
        self.data: dict[bytes, bytes] = {}
        self.read: dict[bytes, tuple[int, int]] = {}  # key -> (partition, offset) read back

    def origin(self, key: bytes) -> tuple[int, int] | None:
        return self.read.get(key)

    def get(self, key: bytes, /) -> bytes | None:
        return self.data.get(key)

    def __setitem__(self, key: bytes, value: bytes, /) -> None:
        self.data[key] = value
        self.read.pop(key, None)
        self.kafka.buffered.append(Sent(self.changelog, key, value))

    def __delitem__(self, key: bytes, /) -> None:
        del self.data[key]
        self.read.pop(key, None)
        self.kafka.buffered.append(Sent(self.changelog, key, None))

    def __contains__(self, key: object, /) -> bool:
        return key in self.data

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(list(self.data.items()))


def settings(**kw: object) -> Settings:
    """Settings with one model ``m`` (``CFG``) unless ``models`` is given."""
    kw.setdefault("models", {"m": CFG})
    kw.setdefault("default_model", "m")
    return Settings(**kw)  # type: ignore[arg-type]


def outputs(kafka: MemoryKafka, s: Settings, registry: CollectorRegistry) -> Outputs:
    return Outputs(kafka, s.topics, Metrics(registry, models=s.models))


async def score(scorer: Scorer, messages: Sequence[RawMessage]) -> ScoreResult:
    """What the scoring loop does with a batch, on the scorer's in-memory sink: decide, then
    send every record."""
    result, records = scorer.decide(messages)
    for r in records:
        if r.headers is None:
            await scorer.outputs.sink.send(r.topic, r.key, r.value)
        else:
            await scorer.outputs.sink.send(r.topic, r.key, r.value, r.headers)
    return result


def msg(
    value: object,
    offset: int = 0,
    topic: str = "abstain.features",
    partition: int = 0,
    key: bytes | None = None,
    timestamp: float | None = None,
) -> RawMessage:
    raw = value if isinstance(value, bytes) else orjson.dumps(value)
    return RawMessage(raw, topic, partition, offset, key, timestamp)


def request(features: Iterable[float], rid: str = "r1", **kw: object) -> LabelRequest:
    """A label request; its id is the one the service derives from (model, event id) unless
    ``request_id`` is given (the event id is ``rid``)."""
    model = str(kw.pop("model", "m"))
    fields: dict[str, object] = {
        "request_id": request_id(model, rid),
        "event_id": rid,
        "model": model,
        "features": list(features),
        "score": 0.0,
        "rho": 1.0,
        "decided_label": 0,
        "query_probability": 0.5,
        "model_version": 0,
        "requested_at": 0.0,
        "expires_at": 1e9,
        "priority": 0.5,
    }
    fields.update(kw)
    return LabelRequest(**fields)  # type: ignore[arg-type]


def pending(
    features: Iterable[float], rid: str = "r1", partition: int = 0, **kw: object
) -> PendingEntry:
    """A pending entry whose request id is ``rid`` itself (stores do not check ids)."""
    kw.setdefault("request_id", rid)
    return PendingEntry(request(features, rid, **kw), partition)


def trained(cfg: ModelConfig, n: int, seed: int = 1) -> ServedModel:
    """A model moved away from w = 0 by ``n`` labels, so scores and p vary."""
    rng = np.random.default_rng(seed)
    model = initial_envelope("m", cfg)
    for i in range(n):
        x = rng.normal(size=cfg.n_inputs)
        y = 1 if x[0] + 0.3 * x[1] > 0 else -1
        entry = pending([float(v) for v in x], request_id("m", f"t{i}"))
        out = apply_label(cfg, model, entry, Label(entry.request_id, "m", y, "t", None), i, now=1.0)
        assert out.model is not None
        model = out.model
    return ServedModel.from_envelope(cfg, model)
