"""The worker's stack in memory: the learner's label path and the model a scorer serves.

:class:`MemoryService` runs one model of a stream worker without Kafka:

* the learn side is a real :class:`~service.stream.labels.joiner.LabelJoiner` over
  in-memory tables (dicts: the :class:`~service.stream.labels.state.Table` protocol), its
  history included, writing to a :class:`MemorySink`. Label requests, labels, second
  opinions and corrections go in as the records the topics carry (their JSON, their
  offsets), through :meth:`LabelJoiner.handle`, so a correction takes the learner's own
  path (checks, checkpoint, the later labels applied again) and is refused for the same
  reasons;
* the scoring side serves what the learner publishes on the models topic, as a scorer
  does: each new version becomes a :class:`~service.stream.models.served.ServedModel`.
  With ``keep=True`` (the default) the scoring side takes the envelope the learner's
  model store holds (it keeps what it wrote beside its bytes) instead of parsing the bytes
  published (a 70 kB state for Phishing: parsing it costs more than learning the label);
  ``keep=False`` parses every version published, as a worker does, with the same results
  (``tests/replay/people/test_learner.py``).
  :meth:`MemoryService.decide` decides an event as the scorer's budgeted path does
  (:func:`service.stream.scoring.decide.score_batch`): the served pipeline's
  ``transform``, the learner's ``decide_many`` for the label and score, and the model's
  :class:`~service.learning.QueryBudget` asked with the learner's utility of the score and
  the event's coin, all on arrays (:meth:`service.learning.Budgeted.decide_many` on a batch
  of one), and it counts the event in the model's moments, which the next label request
  carries (:func:`~service.stream.scoring.scorer.attach_moments`), signed as a keyed
  worker signs them, so the learner trusts them (:mod:`service.records.moments`;
  the replay's other records go unsigned, as without a key). That is the scorer's
  decision bit for bit
  (``tests/replay/people/test_learner.py``); the plain replay's scalar
  :meth:`~service.learning.Budgeted.decide` can differ from it in the last bits of the
  query probability (``math.exp`` against numpy's ``exp``), never in a decision the tests
  have met.

The clock is the replay's: one second per event.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import orjson
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from service.config import ModelConfig, Settings
from service.learning import Budgeted, Decision, QueryBudget
from service.learning.moments import Moments
from service.learning.risk import DEFAULT_MAX_WEIGHT
from service.metrics import Metrics
from service.records import (
    Correction,
    Label,
    LabelRequest,
    ModelEnvelope,
    Opinion,
    RawMessage,
    parse_model_envelope,
    request_id,
)
from service.records.signing import Signer
from service.replay.errors import ReplayConfigError
from service.stream.kafka.produce import Headers, partition_for
from service.stream.labels.admission import admission
from service.stream.labels.history import History
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore
from service.stream.models.served import ServedModel, initial_envelope
from service.stream.outputs import Outputs
from service.stream.scoring.scorer import attach_moments, gathers_moments, make_budget

__all__ = ["MODEL", "MemoryService", "MemorySink", "replay_settings"]

#: the model's name in a replay's settings
MODEL = "replay"


@dataclass
class MemorySink:
    """What the learner writes, by topic: the last model record and the dead letters."""

    models_topic: str
    dead_letters_topic: str
    model: bytes | None = None  # the newest record of the models topic (not yet served)
    dead: Counter[str] = field(default_factory=Counter)  # dead letters by reason

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None
    ) -> None:
        if topic == self.models_topic:
            self.model = value
        elif topic == self.dead_letters_topic and value is not None:
            self.dead[_reason(value)] += 1

    async def flush(self) -> None:
        return None


def _reason(value: bytes) -> str:
    record = orjson.loads(value)
    return str(record.get("reason", "unknown")) if isinstance(record, dict) else "unknown"


def replay_settings(config: ModelConfig) -> Settings:
    """Settings of a worker that serves ``config`` alone as :data:`MODEL`; what the
    environment could change about the label path is given explicitly."""
    if config.label_budget is None or config.label_budget.fraction is None:
        raise ReplayConfigError("a replay with people needs a label budget (a fraction)")
    return Settings(
        models={MODEL: config},
        default_model=MODEL,
        max_importance_weight=DEFAULT_MAX_WEIGHT,
        # a keyed deployment: the scorer signs its moments and the learner trusts them
        # (the replay's other records are handed to the learner unsigned, its tables too)
        snapshot_key=SecretStr(REPLAY_KEY),
        snapshot_key_previous=None,
        request_ttl_seconds=1e9,
        sweep_every=1_000_000,
    )


#: the key the replay's scorer signs its moments with (any key: scorer and learner share it)
REPLAY_KEY = "abstain-replay-moments-key-0123456789"  # noqa: S105 - not a secret


class MemoryService:
    """One model's scorer and learner in memory (module docstring)."""

    def __init__(self, config: ModelConfig, *, keep: bool = True) -> None:
        self.settings = s = replay_settings(config)
        self.config = config
        self.registry = CollectorRegistry()
        self.sink = MemorySink(s.topics.models, s.topics.dead_letters)
        metrics = Metrics(self.registry, models=s.models)
        out = Outputs(self.sink, s.topics, metrics)
        self.joiner = LabelJoiner(
            s,
            pending=PendingStore({}, admission(s)),
            parked=ParkedStore({}),
            models=ModelStore({}, {MODEL: initial_envelope(MODEL, config)}),
            history=History({}, s, admission(s)),
            outputs=out,
            metrics=metrics,
            clock=self.clock,
        )
        self.signer = Signer(REPLAY_KEY.encode())  # signs the moments, as a keyed scorer
        self.partition = partition_for(MODEL.encode(), s.partitions.labels)
        self.joiner.own(frozenset(range(s.partitions.labels)))
        assert config.label_budget is not None  # noqa: S101 - replay_settings checked it
        self.budget: QueryBudget = make_budget(config.label_budget, share=1.0)
        self.served = ServedModel.initial(MODEL, config)
        self._decider = Budgeted(self.served.learner, self.budget)
        gathers = gathers_moments(config, s.max_message_bytes)
        self.moments = {MODEL: Moments(config.moments_inputs)} if gathers else {}
        self.keep = keep
        self.now = 0.0
        self.offsets = {"requests": 0, "labels": 0}

    def clock(self) -> float:
        return self.now

    def decide(self, x: np.ndarray, coin: float) -> Decision:
        """The served model's decision on raw features ``x``, asked through the budget with
        ``coin``."""
        self._serve_newest()
        if self.moments:
            self.moments[MODEL].add_many(x[None, : self.moments[MODEL].n_features])
        z = self.served.pipeline.transform_many(x[None, :])
        labels, scores, probs, queries = self._decider.decide_many(z, coins=[coin])
        rho = float(self.served.learner.rho)
        return Decision(int(labels[0]), float(scores[0]), rho, bool(queries[0]), float(probs[0]))

    def _serve_newest(self) -> None:
        raw, self.sink.model = self.sink.model, None
        if raw is None:
            return
        envelope = self.model() if self.keep else parse_model_envelope(raw, model=MODEL)
        if envelope.version > self.served.version:
            self.served = ServedModel.from_envelope(self.config, envelope)
            self._decider = Budgeted(self.served.learner, self.budget)

    def request(self, event_id: str, x: np.ndarray, decision: Decision) -> LabelRequest:
        """The label request the scorer writes for ``decision`` on event ``event_id``."""
        rho = float(self.served.learner.rho)
        request = LabelRequest(
            request_id=request_id(MODEL, event_id),
            event_id=event_id,
            model=MODEL,
            features=x.tolist(),
            score=decision.score,
            rho=rho,
            decided_label=decision.label,
            query_probability=decision.query_probability,
            model_version=self.served.version,
            requested_at=self.now,
            expires_at=self.now + self.settings.request_ttl_seconds,
            priority=1.0 / (1.0 + min(abs(decision.score - rho), abs(decision.score + rho))),
        )
        return attach_moments([request], self.moments, signer=self.signer)[0]

    async def send(self, record: LabelRequest | Label | Opinion | Correction) -> bool:
        """Hand ``record`` to the learner as the next record of its topic; False when the
        learner dead-lettered it (a refused correction, say)."""
        topics = self.settings.topics
        kind = "requests" if isinstance(record, LabelRequest) else "labels"
        offset = self.offsets[kind]
        self.offsets[kind] += 1
        before = sum(self.sink.dead.values())
        message = RawMessage(
            record.to_json(),
            topics.label_requests if kind == "requests" else topics.labels,
            self.partition,
            offset,
            MODEL.encode(),
            self.now,
        )
        await self.joiner.handle(message)
        return sum(self.sink.dead.values()) == before

    def model(self) -> ModelEnvelope:
        """The learner's current version of the model."""
        return self.joiner.models.get(MODEL)

    def corrections(self) -> dict[str, int]:
        """``abstain_corrections_total`` by outcome (changed, withdrawn, unchanged)."""
        out = {}
        for outcome in ("changed", "withdrawn", "unchanged"):
            value = self.registry.get_sample_value(
                "abstain_corrections_total", {"model": MODEL, "outcome": outcome}
            )
            out[outcome] = int(value or 0)
        return out
