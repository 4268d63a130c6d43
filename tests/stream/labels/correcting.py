"""A learner over in-memory tables that can be restarted from its changelogs, for the tests
of corrections: it remembers what it was fed (the labels log, for ``abstain rebuild`` and for
the learner's own checks of a history read back), and derives corrections in this process
(at once) or with a :class:`ManualRunner` (when the test says)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from service.config import ModelConfig, Settings
from service.records import Correction, Label, ModelEnvelope, RawMessage, Signer, request_id
from service.records.signing import moments_message
from service.records.wire import FeatureMoments
from service.stream.kafka.produce import partition_for
from service.stream.labels.admission import admission
from service.stream.labels.history import Derived, History, Job, run_job
from service.stream.labels.history.runner import Runner
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.rebuild import LogRecord, Rebuilt, rebuild_model
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore
from service.stream.models.served import initial_envelope

from ..memory import CFG, MemoryKafka, outputs, request, settings

REQUESTS, LABELS, MODELS, DEAD = (
    "abstain.label-requests",
    "abstain.labels",
    "abstain.models",
    "abstain.dead-letters",
)
KEY = "k" * 40
SHADOW = ModelConfig(algorithm="dral", cost=0.25, n_features=3, champion="m")


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


class Crash(Exception):
    """The process dies here."""


class CrashingModels(ModelStore):
    """Dies at the ``after``-th model write from now (0: the first)."""

    after = 0

    def put(self, envelope: ModelEnvelope, encoded: bytes) -> None:
        if self.after == 0:
            raise Crash
        self.after -= 1
        super().put(envelope, encoded)


@dataclass
class Learner:
    """A joiner over tables recovered from ``kafka`` (a restarted worker), history included;
    it remembers what it was fed as a log, for ``abstain rebuild``."""

    kafka: MemoryKafka
    settings: Settings
    clock: Clock
    registry: CollectorRegistry
    joiner: LabelJoiner
    log: list[RawMessage]
    moments: bool = False  # each request carries the moments of the events scored before it

    @classmethod
    def start(
        cls,
        kafka: MemoryKafka | None = None,
        *,
        crash_after: int | None = None,
        log: list[RawMessage] | None = None,
        runner: Runner | None = None,
        moments: bool = False,
        **kw: Any,
    ) -> Learner:
        kafka = kafka if kafka is not None else MemoryKafka()
        kw.setdefault("models", {"m": CFG, "m-dral": SHADOW})
        s = settings(**kw)
        registry = CollectorRegistry()
        initial = {name: initial_envelope(name, cfg) for name, cfg in s.models.items()}
        models = ModelStore(kafka.table("models"), initial)
        if crash_after is not None:
            models = CrashingModels(kafka.table("models"), initial)
            models.after = crash_after
        out = outputs(kafka, s, registry)
        signer = Signer(KEY.encode()) if s.snapshot_key is not None else None
        joiner = LabelJoiner(
            s,
            pending=PendingStore(kafka.table("pending"), admission(s)),
            parked=ParkedStore(kafka.table("orphans")),
            models=models,
            history=History(kafka.table("history"), s, admission(s)),
            outputs=out,
            metrics=out.metrics,
            clock=Clock(),
            signer=signer,
            runner=runner,
        )
        made = cls(
            kafka,
            s,
            joiner.clock,
            registry,
            joiner,
            log if log is not None else [],  # type: ignore[arg-type]
            moments,
        )
        joiner.corrector.readback.read_labels = made.read_labels
        joiner.own(frozenset(range(s.partitions.labels)))
        return made

    async def read_labels(
        self, partition: int, offsets: Collection[int]
    ) -> Mapping[int, bytes | None]:
        """The labels log as the learner reads it back (what it was fed)."""
        wanted = set(offsets)
        return {
            m.offset: m.value
            for m in self.log
            if m.topic == LABELS and m.partition == partition and m.offset in wanted
        }

    @property
    def p(self) -> int:
        return partition_for(b"m", self.settings.partitions.labels)

    async def feed(
        self, value: bytes, offset: int, topic: str = LABELS, signature: bytes | None = None
    ) -> None:
        message = RawMessage(value, topic, self.p, offset, b"m", self.clock.now, signature)
        if not any(m.topic == topic and m.offset == offset for m in self.log):
            self.log.append(message)
        await self.joiner.handle(message)

    async def request(self, event: str, offset: int) -> None:
        x = [float(offset % 7) - 3.0, 1.0 + (offset % 3), float(len(event))]
        seen = None
        if self.moments:  # as a scorer sends them: the events it scored since its last request
            count, mean = 5 + offset % 4, tuple(v + 0.5 for v in x)
            m2 = tuple(2.0 + offset % 5 for _ in x)
            signature = None
            if self.settings.snapshot_key is not None:  # a keyed scorer signs them
                signed = moments_message("m", request_id("m", event), count, mean, m2)
                signature = Signer(KEY.encode()).sign(*signed).decode()
            seen = FeatureMoments(count, mean, m2, signature)
        req = request(
            x,
            event,
            query_probability=0.5,
            decided_label=1 if offset % 2 else -1,
            requested_at=self.clock.now,
            expires_at=self.clock.now + 1e6,
            moments=seen,
        )
        await self.feed(req.to_json(), offset, REQUESTS)

    async def label(self, event: str, offset: int, y: int, by: str = "alice") -> None:
        self.clock.now += 1.0
        await self.feed(Label(request_id("m", event), "m", y, by, self.clock.now).to_json(), offset)

    async def correct(
        self,
        event: str,
        offset: int,
        y: int | None,
        by: str = "alice",
        role: str = "author",
        *,
        sign: bool = True,
    ) -> bytes:
        """A correction at ``offset`` (signed with :data:`KEY`); its bytes."""
        self.clock.now += 1.0
        body = Correction(request_id("m", event), "m", y, by, role, self.clock.now).to_json()  # type: ignore[arg-type]
        signature = Signer(KEY.encode()).sign(b"m", body) if sign else None
        await self.feed(body, offset, signature=signature)
        return body

    def model(self, name: str = "m") -> ModelEnvelope:
        return self.joiner.models.get(name)

    def dead(self) -> list[tuple[str, int]]:
        return [(str(r.json()["reason"]), int(r.json()["offset"])) for r in self.kafka.sent(DEAD)]

    def published(self, name: str = "m") -> int:
        return sum(1 for r in self.kafka.sent(MODELS) if r.key == name.encode())

    def rebuild(self) -> Rebuilt:
        """``abstain rebuild`` of the champion over what this learner was fed."""

        def rec(m: RawMessage) -> LogRecord:
            return LogRecord(
                m.partition, m.offset, int((m.timestamp or 0) * 1000), m.value, m.key, m.signature
            )

        requests = [rec(m) for m in self.log if m.topic == REQUESTS]
        labels = [rec(m) for m in self.log if m.topic == LABELS]
        return rebuild_model(self.settings, "m", requests, labels)

    def rebuilt(self) -> ModelEnvelope:
        return self.rebuild().model


def learned(model: ModelEnvelope) -> tuple[Any, ...]:
    """What a model learned, without where and when it was written."""
    return (
        model.pipeline,
        model.learner,
        model.labels_applied,
        model.iw_loss,
        model.iw_weight,
        model.estimate,
    )


async def stream(learner: Learner, answers: dict[int, int], *, requests: int = 30) -> None:
    """``requests`` requests (offsets 0..n-1), then a label for each (offsets 0..n-1) with
    ``answers[i]`` in place of the default answer for request ``i``."""
    for i in range(requests):
        await learner.request(f"e{i}", i)
    for i in range(requests):
        await learner.label(f"e{i}", i, answers.get(i, 1 if i % 3 else -1))


@dataclass
class ManualRunner:
    """Derivations that wait until the test runs them (:meth:`run`): the learner's
    derivation process, slowed down at will."""

    settings: Settings
    hold: bool = True  # False: each derivation is done as soon as it is submitted
    waiting: list[tuple[Job, Future[Derived]]] = field(default_factory=list)
    jobs: int = 0

    def submit(self, job: Job) -> Future[Derived]:
        future: Future[Derived] = Future()
        self.waiting.append((job, future))
        self.jobs += 1
        if not self.hold:
            self.run()
        return future

    def run(self) -> int:
        """Carry out every derivation submitted so far; how many."""
        waiting, self.waiting = self.waiting, []
        for job, future in waiting:
            future.set_result(run_job(self.settings, job))
        return len(waiting)

    def close(self) -> None:
        return None
