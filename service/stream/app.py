"""``create_app(settings) -> faust.App``: topics, tables, the loops' tasks, a timer and web
pages.

Wiring only; each task and the timer call one object (the flow and the rules of the house:
``docs/reference/architecture.md``):

- every topic and table of the catalogue (:mod:`~service.stream.kafka.topics`) is declared,
  after the topic guard (:mod:`~service.stream.kafka.guard`) found the cluster fit;
- scoring needs no table: :class:`~service.stream.scoring.loop.ScoreLoop` consumes the
  features topic with its own aiokafka consumer (group ``<app_id>-score``) in whole fetched
  batches, calls :class:`~service.stream.scoring.scorer.Scorer` and writes with the batch
  produce API, committing once the outputs are acknowledged (a faust app task runs it);
- learning needs tables but not faust's per-record stream either:
  :class:`~service.stream.labels.loop.LearnLoop` consumes label-requests AND labels,
  co-partitioned by model (group ``<app_id>-learn``), in whole fetched batches, and calls
  :class:`~service.stream.labels.joiner.LabelJoiner`, which owns the ``pending``, ``parked``
  and ``models`` tables (:mod:`~service.stream.labels.tables`: in memory, changelogs in
  Kafka); :class:`~service.stream.labels.checkpoint.Checkpoint` makes their writes durable
  before the offsets that caused them are committed;
- ``follow`` feeds :class:`~service.stream.models.book.ModelBook` from the models topic;
- a one-second timer runs :class:`~service.stream.health.housekeeping.Housekeeping`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiokafka import AIOKafkaConsumer
from prometheus_client import CollectorRegistry

from service.config import Settings, TopicPolicy
from service.metrics import Metrics
from service.records.reasons import Source
from service.stream.health.housekeeping import Housekeeping
from service.stream.health.liveness import LivenessMonitor
from service.stream.kafka.clients import (
    LoopClients,
    broker_credentials,
    consumer_options,
    reader,
)
from service.stream.kafka.guard import guard_topics
from service.stream.kafka.internals import App
from service.stream.kafka.loop import Progress, RoutedView
from service.stream.kafka.produce import Headers
from service.stream.kafka.topics import TABLES, declared, largest_record, learned, watched
from service.stream.kafka.unreadable import SkipBook, Unreadable
from service.stream.labels.admission import admission
from service.stream.labels.checkpoint import Checkpoint
from service.stream.labels.history import History
from service.stream.labels.history.runner import ProcessRunner
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.loop import LearnLoop, learn_group
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore
from service.stream.labels.tables import ChangelogTable, Writes
from service.stream.models.book import ModelBook, follow_models, signer_for
from service.stream.models.served import initial_envelope
from service.stream.outputs import Outputs
from service.stream.scoring.loop import ScoreLoop, score_group
from service.stream.scoring.scorer import Scorer
from service.stream.web import mount_web

__all__ = ["Parts", "create_app"]


@dataclass(frozen=True, slots=True)
class Parts:
    """The objects a worker is made of (``app.parts``): what pages and tests look at."""

    settings: Settings
    metrics: Metrics
    book: ModelBook
    scorer: Scorer
    scoring: ScoreLoop
    learning: LearnLoop
    joiner: LabelJoiner
    housekeeping: Housekeeping


class FaustSink:
    """:class:`~service.stream.outputs.Sink` over faust's producer."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None
    ) -> None:
        await self.app.producer.send(
            topic, key, value, partition=None, timestamp=None, headers=headers
        )

    async def flush(self) -> None:
        await self.app.producer.flush()


def _faust_app(s: Settings) -> App:
    """The faust app of ``s``. Every faust setting comes from here: faust reads no
    environment variable (``env={}``), so ``PRODUCER_ACKS`` or ``APP_WEB_TABLES_ENABLED`` in
    a pod's environment cannot weaken the acknowledgements or expose faust's pages."""
    s.datadir.mkdir(parents=True, exist_ok=True)
    return App(
        s.app_id,
        env={},
        broker=list(s.broker),
        broker_credentials=broker_credentials(s.security),
        store="memory://",
        datadir=str(s.datadir / s.app_id),
        autodiscover=False,
        web_enabled=True,
        web_host=s.web.advertised,  # what faust advertises (links, other workers)
        web_port=s.web.port,
        web_bind=s.web.host,  # where it listens
        # faust's own pages describe tables, topology and sensors: off (/ stays, "OK")
        web_router_enabled=False,  # /router (only @table_route needs it: not used)
        web_tables_enabled=False,  # /table: keys and values of the tables
        web_graph_enabled=False,  # /graph
        web_stats_enabled=False,  # sensor statistics at / and /assignment
        web_metrics_enabled=False,  # /performance
        producer_acks=-1,  # acks=all: a 202 to POST /labels means every in-sync replica has it
        topic_partitions=s.partitions.labels,
        # unset: the brokers' default.replication.factor (topics.TopicGuard reads it)
        topic_replication_factor=s.topic_policy.replication_factor or 1,
        topic_allow_declare=s.topic_policy.creation == "create",
        producer_max_request_size=s.fetch_bytes,
        producer_compression_type=None if s.compression == "none" else s.compression,
        # faust's producer writes what is rare (snapshots, dead letters of the learner, POST
        # /labels); the table writes go in batches through the learner's own producer
        consumer_max_fetch_size=s.fetch_bytes,
        processing_guarantee="at_least_once",
        broker_commit_interval=s.commit_interval_seconds,
        broker_session_timeout=s.session_timeout_seconds,
        broker_heartbeat_interval=min(3.0, s.session_timeout_seconds / 3),
    )


def _score_loop(
    s: Settings, scorer: Scorer, progress: Progress, unreadable: Unreadable, skips: SkipBook
) -> ScoreLoop:
    """The scoring path's loop and its aiokafka clients."""
    clients = LoopClients(s, score_group(s.app_id), (s.topics.features,))
    return ScoreLoop(
        s,
        scorer,
        progress,
        consumer_factory=clients.consumer,
        producer_factory=clients.producer,
        admin_factory=clients.admin,
        unreadable=unreadable,
        skips=skips,
    )


def _learn_loop(
    s: Settings,
    joiner: LabelJoiner,
    tables: dict[str, ChangelogTable],
    checkpoint: Checkpoint,
    progress: Progress,
    unreadable: Unreadable,
    skips: SkipBook,
) -> LearnLoop:
    """The learner's loop and its aiokafka clients. Range assignment gives one member the
    same partition numbers of both label topics. aiokafka sends one fetch per broker at a
    time: a fetch for a quiet partition (labels) that the broker holds for the default
    500 ms would hold back a busy one, hence 50 ms."""
    clients = LoopClients(s, learn_group(s.app_id), learned(s), fetch_max_wait_ms=50)

    def changelogs() -> AIOKafkaConsumer:
        return reader(
            s.bootstrap_servers,
            f"{s.app_id}-recovery",
            max_partition_fetch_bytes=s.fetch_bytes,
            client_kwargs=consumer_options(s),
        )

    return LearnLoop(
        s,
        joiner,
        list(tables.values()),
        checkpoint,
        progress,
        consumer_factory=clients.consumer,
        producer_factory=clients.producer,
        reader_factory=changelogs,
        admin_factory=clients.admin,
        unreadable=unreadable,
        skips=skips,
    )


def _topic(
    app: App,
    *names: str,
    partitions: int,
    policy: TopicPolicy,
    compacting: bool = False,
    config: dict[str, str] | None = None,
) -> Any:
    """Raw bytes in and out: the records are ours to encode (service.records). A topic the
    worker creates gets the policy's configs and ``config``."""
    return app.topic(
        *names,
        partitions=partitions,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        internal=True,
        compacting=compacting or None,
        config={**policy.topic_configs, **(config or {})},
    )


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> App:
    """Build a faust app for ``settings`` (nothing is started)."""
    s, t = settings, settings.topics
    metrics = Metrics(registry if registry is not None else CollectorRegistry(), models=s.models)
    signer = signer_for(s)
    book = ModelBook(
        s,
        signer=signer,
        on_swap=lambda m: metrics.set_model(m.name, **m.gauges(), version_bytes=s.version_bytes),
    )
    app = _faust_app(s)
    guard_topics(app, s)  # before the producer and consumer start
    topics = {
        name: _topic(
            app,
            name,
            partitions=n,
            policy=s.topic_policy,
            compacting=compacted,
            config=largest_record(s, name),  # room for its largest record
        )
        for name, n, compacted in declared(s)
    }  # the catalogue's
    progress = Progress(clock)
    writes = Writes()
    # signed with the snapshot key; the history's unsigned records are never taken
    tables = {
        e.field: ChangelogTable(e.name(s), writes, signer=signer, legacy=e.field != "history")
        for e in TABLES
    }
    checkpoint = Checkpoint(writes, commit_interval=s.commit_interval_seconds)
    outputs = Outputs(FaustSink(app), t, metrics, signer=signer)  # scorer's records, follow
    scorer = Scorer(
        s,
        book.serving,
        outputs,
        metrics,
        clock=clock,
        fallback=book.refuse if signer is None else None,
        signer=signer,
    )
    unreadable = Unreadable(metrics, topics=watched(s))
    scoring = _score_loop(s, scorer, progress, unreadable, book.skips)
    pending = PendingStore(tables["pending"], admission(s))  # the learner's own checks
    initial = {name: initial_envelope(name, cfg) for name, cfg in s.models.items()}
    joiner = LabelJoiner(
        s,
        pending=pending,
        parked=ParkedStore(tables["parked"]),
        models=ModelStore(tables["models"], initial),
        metrics=metrics,
        history=History(tables["history"], s, admission(s)),
        outputs=Outputs(checkpoint.sink, t, metrics, signer=signer),
        clock=clock,
        signer=signer,
        runner=ProcessRunner(s),
    )
    learning = _learn_loop(s, joiner, tables, checkpoint, progress, unreadable, book.skips)
    joiner.corrector.readback.read_labels = learning.read_labels
    joiner.corrector.scope = writes.partition
    learning.on_skip = partial(outputs.skipped_batch, Source.CHANGELOGS)
    learning.defer = lambda: scoring.backlogged
    view = RoutedView(learning.view, {t.features: scoring.view})
    housekeeping = Housekeeping(
        s,
        view=view,
        book=book,
        pending=pending,
        scorer=scorer,
        joiner=joiner,
        metrics=metrics,
        liveness=LivenessMonitor(
            view,
            progress,
            metrics,
            watched=watched(s),
            stall_seconds=s.stall_seconds,
            unreadable=unreadable,
            pinned_seconds=s.pinned_transaction_seconds,
        ),
    )
    parts = app.parts = Parts(s, metrics, book, scorer, scoring, learning, joiner, housekeeping)

    async def declare_outputs() -> None:
        for topic in topics.values():
            await topic.maybe_declare()

    @app.task  # type: ignore[untyped-decorator]
    async def score() -> None:
        await declare_outputs()
        await scoring.run(book.loaded)

    @app.task  # type: ignore[untyped-decorator]
    async def learn() -> None:
        await declare_outputs()
        await learning.run()

    @app.task  # type: ignore[untyped-decorator]
    async def follow() -> None:
        await declare_outputs()
        await follow_models(
            s,
            book,
            consumer_kwargs=consumer_options(s),
            refused=outputs.refused_snapshot,
            skipped=partial(outputs.skipped_batch, Source.MODELS),
            unreadable=unreadable,
        )

    @app.timer(1.0)  # type: ignore[untyped-decorator]
    async def tick() -> None:
        await housekeeping.check(clock())

    mount_web(app, parts, topics[t.labels], pending)  # POST /labels writes there
    return app
