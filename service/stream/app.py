"""``create_app(settings) -> faust.App``: topics, tables, agents, timers and web pages.

Wiring only; the logic lives in :mod:`service.stream.handlers` (scoring, learning) and
:mod:`service.web.views` (HTTP). Two agents:

- ``score`` consumes the features topic (keyed by event id, scales with its partitions) in
  batches (``take_events``), scores with the newest model snapshot this worker has, and emits
  one decision per event, a label request per queried event, a dead letter per bad event.
  It never writes a table.
- ``learn`` (concurrency 1) consumes label-requests AND labels, both keyed by model and
  co-partitioned, so one actor owns a model's pending requests and its (w, rho). It writes
  the ``pending`` and ``models`` tables (changelogs in Kafka, in-memory store) one event at a
  time and publishes each new model version to the compacted models topic.

Snapshots are followed by :func:`service.stream.snapshots.follow_models` (app task).
A one-second timer (``app.housekeeping``) refreshes gauges and liveness
(:mod:`service.stream.liveness`); the web pages are mounted by :mod:`service.stream.pages`.
Outputs go straight to the producer's buffer without awaiting each delivery: faust flushes
the producer before it commits consumed offsets, so delivery stays at-least-once.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import faust
import numpy as np
import orjson
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from service.config import Settings
from service.metrics import IGNORED_REASONS, Metrics
from service.stream import handlers
from service.stream.consumer import Transport
from service.stream.continuity import Continuity, KafkaGaps, acknowledge, tend_quiet
from service.stream.handlers import RawMessage, ServedModel
from service.stream.liveness import liveness_check
from service.stream.pages import mount_web
from service.stream.records import (
    BadMessage,
    DeadLetter,
    Label,
    decode_state,
    dumps,
    parse_label,
    parse_label_request,
)
from service.stream.runtime import Progress, Runtime, broker_credentials
from service.stream.snapshots import ModelBook, follow_models

__all__ = ["Runtime", "broker_credentials", "create_app"]

# Errors bad data could still provoke in a handler despite validation; infrastructure errors
# (Kafka) are not among them and still stop the agent, so faust restarts it.
DATA_ERRORS = (ValueError, TypeError, KeyError, IndexError, UnicodeError, ArithmeticError)

log = logging.getLogger(__name__)


class AbstainApp(faust.App):
    """A faust app that carries its :class:`Runtime` (metrics, models, progress)."""

    runtime: Runtime
    housekeeping: Callable[[], Awaitable[None]]  # what the one-second timer runs
    gaps: KafkaGaps | None = None  # reads what the consumer skipped (see continuity)

    def _new_transport(self) -> Any:
        # faust's aiokafka transport with the consumer whose commits do not crawl
        return Transport(self.conf.broker_consumer, self)

    async def on_stop(self) -> None:
        await super().on_stop()
        if self.gaps is not None:
            await self.gaps.close()


def _topic(app: Any, name: str, partitions: int, **kw: Any) -> Any:
    return app.topic(
        name,
        partitions=partitions,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        internal=True,
        **kw,
    )


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
) -> AbstainApp:
    """Build a faust app for ``settings`` (nothing is started)."""
    s = settings
    registry = registry if registry is not None else CollectorRegistry()
    metrics = Metrics(registry, models=s.models)

    def on_swap(served: ServedModel) -> None:
        m = served.name
        metrics.model_version.labels(model=m).set(served.version)
        metrics.model_rho.labels(model=m).set(float(served.learner.rho))
        w = getattr(served.learner, "w", None)  # kernel learners have no explicit w
        if w is not None:
            metrics.model_weight_norm.labels(model=m).set(float(np.linalg.norm(w)))
        risk = handlers.risk_estimate(served.state)
        if not math.isnan(risk):
            metrics.risk_estimate.labels(model=m).set(risk)

    book = ModelBook(s, on_swap=on_swap)
    rt = Runtime(s, metrics, book, clock, Progress(clock))
    rt.recent_queries = {m: deque(maxlen=1000) for m in s.models}

    s.datadir.mkdir(parents=True, exist_ok=True)
    app = AbstainApp(
        s.app_id,
        broker=list(s.broker),
        broker_credentials=broker_credentials(s.security),
        store="memory://",
        datadir=str(s.datadir / s.app_id),
        autodiscover=False,
        web_enabled=True,
        web_host=s.web.advertised,  # what faust advertises (links, other workers)
        web_port=s.web.port,
        web_bind=s.web.host,  # where it listens
        topic_partitions=s.partitions.labels,
        topic_replication_factor=1,
        producer_max_request_size=max(1_048_576, s.max_message_bytes * 2),
        producer_max_batch_size=262_144,  # a batch of label requests in a few produce calls
        consumer_max_fetch_size=max(1_048_576, s.max_message_bytes * 2),
        processing_guarantee="at_least_once",
        broker_commit_interval=s.commit_interval_seconds,
        broker_session_timeout=s.session_timeout_seconds,
        broker_heartbeat_interval=min(3.0, s.session_timeout_seconds / 3),
    )
    app.runtime = rt
    app.gaps = gaps = KafkaGaps(
        list(s.bootstrap_servers),
        s.app_id,
        client_kwargs=s.security.aiokafka_kwargs(),
        max_fetch_bytes=max(1_048_576, s.max_message_bytes * 2),
    )
    continuity = Continuity(gaps.committed, gaps.fetch)
    t, parts = s.topics, s.partitions
    consumed = (t.features, t.label_requests, t.labels)
    for topic in consumed:
        metrics.skipped_recovered.labels(topic=topic)  # the series shows from the start
    features = _topic(app, t.features, parts.features)
    decisions = _topic(app, t.decisions, parts.decisions)
    label_requests = _topic(app, t.label_requests, parts.labels)
    labels = _topic(app, t.labels, parts.labels)
    models_topic = _topic(app, t.models, parts.models, compacting=True)
    dead_letters = _topic(app, t.dead_letters, parts.dead_letters)
    learn_channel = app.topic(
        t.label_requests,
        t.labels,
        partitions=parts.labels,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        internal=True,
    )
    # Table values are bytes we encode ourselves (records.dumps / records.encode_state).
    models_table = app.Table("models", partitions=parts.labels, key_type=bytes, value_type=bytes)
    pending_table = app.Table("pending", partitions=parts.labels, key_type=bytes, value_type=bytes)

    # labels that arrived before their request (two topics: no order between them)
    orphans_table = app.Table("orphans", partitions=parts.labels, key_type=bytes, value_type=bytes)

    def _get(table: Any, key: str) -> dict[str, Any] | None:
        raw = table.get(key.encode())
        return None if raw is None else dict(orjson.loads(raw))

    def _entries(table: Any) -> list[tuple[str, dict[str, Any]]]:
        return [(k.decode(), orjson.loads(v)) for k, v in list(table.items())]

    def pending_get(request_id: str) -> dict[str, Any] | None:
        return _get(pending_table, request_id)

    def orphan_get(request_id: str) -> dict[str, Any] | None:
        return _get(orphans_table, request_id)

    def pending_entries() -> list[tuple[str, dict[str, Any]]]:
        return _entries(pending_table)

    # A slim in-memory index of the pending table (no features): sweeps and gauges scan it
    # instead of decoding every entry. Rebuilt from the table whenever the assignment of the
    # learner's partitions changes (after recovery, after a rebalance).
    index: dict[str, dict[str, Any]] = {}
    index_partitions: list[frozenset[int] | None] = [None]
    slim_keys = ("model", "requested_at", "expires_at", "partition", "applied")

    # expiry order per partition (expires_at, key): a sweep pops what is due instead of
    # scanning every pending request
    expiry: dict[int, list[tuple[float, str]]] = {}

    def index_add(key: str, entry: dict[str, Any]) -> None:
        if key not in index:
            heap = expiry.setdefault(int(entry.get("partition", -1)), [])
            heapq.heappush(heap, (float(entry["expires_at"]), key))
        index[key] = {k: entry.get(k) for k in slim_keys}

    def pending_put(key: str, entry: dict[str, Any]) -> None:
        pending_table[key.encode()] = dumps(entry)
        index_add(key, entry)

    def pending_del(key: str) -> None:
        del pending_table[key.encode()]
        index.pop(key, None)

    def index_refresh(partitions: frozenset[int]) -> None:
        if index_partitions[0] == partitions:
            return
        index.clear()
        expiry.clear()
        for key, entry in pending_entries():
            index_add(key, entry)
        index_partitions[0] = partitions

    def due(partition: int, now: float) -> list[tuple[str, dict[str, Any]]]:
        """Pending entries of ``partition`` past expiry plus grace (taken off the heap)."""
        heap = expiry.get(partition, [])
        out: list[tuple[str, dict[str, Any]]] = []
        while heap and now > heap[0][0] + s.expired_grace_seconds:
            _, key = heapq.heappop(heap)
            if key in index:
                out.append((key, index[key]))
        return out

    outputs = (decisions, label_requests, labels, models_topic, dead_letters, features)

    async def declare_outputs() -> None:
        for topic in outputs:
            await topic.maybe_declare()

    async def send_dead(letter: DeadLetter) -> None:
        metrics.dead_letters.labels(source=letter.source, reason=letter.reason).inc()
        await publish(t.dead_letters, None, letter.to_json())

    def _score(msgs: list[RawMessage], now: float) -> handlers.ScoreResult:
        return handlers.score_batch(
            book.snapshot(),
            msgs,
            default_model=s.default_model,
            request_ttl=s.request_ttl_seconds,
            now=now,
            max_bytes=s.max_message_bytes,
            max_features=s.max_features,
        )

    def _score_guarded(msgs: list[RawMessage], now: float) -> handlers.ScoreResult:
        """Score a batch; should an unexpected data-caused error escape the handlers, score
        one by one and dead-letter the culprit (reason "schema", detail says why)."""
        try:
            return _score(msgs, now)
        except DATA_ERRORS:
            log.exception("batch scoring failed; retrying one event at a time")
        result = handlers.ScoreResult()
        for m in msgs:
            try:
                one = _score([m], now)
            except DATA_ERRORS as exc:
                result.dead_letters.append(
                    DeadLetter("features", m.topic, m.partition, m.offset, "schema",
                               f"internal error: {exc!r}", m.value)
                )  # fmt: skip
                continue
            result.decisions += one.decisions
            result.label_requests += one.label_requests
            result.dead_letters += one.dead_letters
            result.event_ts += one.event_ts
        return result

    # Per-model metric children, bound once (a labels() lookup per event costs more than
    # the decision itself).
    bound = {
        m: (
            metrics.events.labels(model=m),
            metrics.decisions.labels(model=m, action="predict"),
            metrics.decisions.labels(model=m, action="reject"),
            metrics.decide_latency.labels(model=m),
            metrics.label_requests.labels(model=m),
        )
        for m in s.models
    }

    async def publish(topic: str, key: bytes | None, value: bytes) -> None:
        """Hand a record to the producer's buffer; delivery is not awaited here. faust
        flushes the producer before it commits consumed offsets (at-least-once)."""
        await app.producer.send(topic, key, value, partition=None, timestamp=None, headers=None)

    @app.agent(features, name="abstain.score")
    async def score(stream: Any) -> None:
        await declare_outputs()
        await book.loaded.wait()
        async for batch in stream.take_events(s.batch_size, within=s.batch_window_seconds):
            msgs: list[RawMessage] = []
            skipped: list[tuple[list[RawMessage], int]] = []
            for e in batch:
                m = e.message
                missed = await _missing(m)
                if missed:
                    msgs += missed
                    skipped.append((missed, m.offset))
                msgs.append(RawMessage(e.value, m.topic, m.partition, m.offset))
            started = time.perf_counter()
            result = _score_guarded(msgs, clock())
            per_event = (time.perf_counter() - started) / max(1, len(msgs))
            for d in result.decisions:
                await publish(t.decisions, d.id.encode(), d.to_json())
            for r in result.label_requests:
                await publish(t.label_requests, r.model.encode(), r.to_json())
            for letter in result.dead_letters:
                await send_dead(letter)
            _count_scored(result, per_event)
            for missed, upto in skipped:
                acknowledge(app.consumer, missed, upto)
            last: dict[tuple[str, int], int] = {}
            for m in msgs:
                last[(m.topic, m.partition)] = max(m.offset, last.get((m.topic, m.partition), -1))
            for (topic, partition), offset in last.items():
                rt.progress.mark(topic, partition, offset)

    async def _missing(message: Any) -> list[RawMessage]:
        """Records the consumer skipped before ``message`` (usually none; see continuity)."""
        topic, partition, offset = message.topic, message.partition, message.offset
        generation = int(message.generation_id or 0)
        if continuity.in_order(topic, partition, offset, generation=generation):
            return []
        missed = await continuity.missing(topic, partition, offset, generation=generation)
        if missed:
            metrics.skipped_recovered.labels(topic=topic).inc(len(missed))
        return missed

    def _count_scored(result: handlers.ScoreResult, per_event: float) -> None:
        counts: dict[str, list[int]] = {}
        for d in result.decisions:
            c = counts.setdefault(d.model, [0, 0, 0])
            c[0 if d.action == "predict" else 1] += 1
            rt.recent_queries[d.model].append(d.queried)
        for r in result.label_requests:
            counts.setdefault(r.model, [0, 0, 0])[2] += 1
        for model, (predicted, rejected, requested) in counts.items():
            events, predict, reject, latency, label_reqs = bound[model]
            events.inc(predicted + rejected)
            predict.inc(predicted)
            reject.inc(rejected)
            label_reqs.inc(requested)
            for _ in range(predicted + rejected):
                latency.observe(per_event)

    @app.agent(learn_channel, name="abstain.learn", concurrency=1)
    async def learn(stream: Any) -> None:
        await declare_outputs()
        async for event in stream.events():
            msg = event.message
            missed = await _missing(msg)
            for raw in missed:
                await _learn_one(raw)
            if missed:
                acknowledge(app.consumer, missed, msg.offset)
            await _learn_one(RawMessage(event.value, msg.topic, msg.partition, msg.offset))
            rt.labels_seen += 1
            if rt.labels_seen % s.sweep_every == 0:
                await _sweep(msg.partition)
            rt.progress.mark(msg.topic, msg.partition, msg.offset)

    async def _learn_one(raw: RawMessage) -> None:
        source = "label-requests" if raw.topic == t.label_requests else "labels"
        try:
            if source == "label-requests":
                await _on_request(raw)
            else:
                await _on_label(raw)
        except DATA_ERRORS as exc:  # a bug met by odd data: record it, keep learning
            log.exception("%s message at %s[%s]@%s", source, raw.topic, raw.partition,
                          raw.offset)  # fmt: skip
            await send_dead(
                DeadLetter(source, raw.topic, raw.partition, raw.offset, "schema",
                           f"internal error: {exc!r}", raw.value)
            )  # fmt: skip

    async def _on_request(raw: RawMessage) -> None:
        try:
            request = parse_label_request(raw.value, max_bytes=s.max_message_bytes)
            config = s.models.get(request.model)
            if config is None:
                raise BadMessage("unknown_model", f"no model named {request.model!r}")
            if len(request.features) != config.n_inputs:
                raise BadMessage(
                    "feature_count",
                    f"model {request.model!r} takes {config.n_inputs} features, "
                    f"got {len(request.features)}",
                )
        except BadMessage as bad:
            await send_dead(
                DeadLetter(
                    "label-requests",
                    raw.topic,
                    raw.partition,
                    raw.offset,
                    bad.reason,
                    bad.detail,
                    raw.value,
                )
            )
            return
        if request.request_id.encode() not in pending_table:  # a re-sent request must not
            entry = handlers.store_request(None, request, raw.partition)  # reset an answer
            if entry is None:  # pragma: no cover - only for an existing entry
                return
            pending_put(request.request_id, entry)
        orphan = orphan_get(request.request_id)
        if orphan is not None:  # its label overtook it: apply that label now
            label, offset = handlers.unpark_label(orphan)
            origin = RawMessage(
                str(orphan.get("raw", "")).encode(), t.labels, raw.partition, offset
            )
            await _join(label, origin, parked=True)
            # forget the parked label only once its effect is stored: its own offset was
            # committed long ago, so after a crash the parked copy is all there is; a request
            # redelivered after the crash finds it and applies it (or, already applied, skips)
            del orphans_table[request.request_id.encode()]

    async def _on_label(raw: RawMessage) -> None:
        try:
            label = parse_label(raw.value, max_bytes=s.max_message_bytes)
            if label.model not in s.models:
                raise BadMessage("unknown_model", f"no model named {label.model!r}")
        except BadMessage as bad:
            await send_dead(_label_dead(raw, bad.reason, bad.detail))
            return
        await _join(label, raw, parked=False)

    def _label_dead(raw: RawMessage, reason: str, detail: str) -> DeadLetter:
        return DeadLetter("labels", raw.topic, raw.partition, raw.offset, reason, detail, raw.value)

    async def _join(label: Label, raw: RawMessage, *, parked: bool) -> None:
        m = label.model
        config = s.models[m]
        stored = models_table.get(m.encode())
        state = decode_state(stored) if stored is not None else handlers.initial_state(m, config)
        pending = pending_get(label.request_id)
        now = clock()
        if pending is None and not parked and raw.offset > int(state["labels_offset"]):
            entry = handlers.park_label(
                orphan_get(label.request_id), label, raw.offset, raw.partition, now=now
            )
            if entry is None:
                metrics.labels_ignored.labels(model=m, reason="redelivered").inc()
            else:  # wait (bounded) for the request: it may still be in flight
                entry["raw"] = raw.value.decode("utf-8", errors="replace")
                orphans_table[label.request_id.encode()] = dumps(entry)
            return
        outcome = handlers.apply_label(
            config, state, pending, label, raw.offset, now=now, parked=parked
        )
        if outcome.kind == "applied":
            assert outcome.state is not None  # noqa: S101
            assert outcome.encoded is not None  # noqa: S101
            assert outcome.pending is not None  # noqa: S101
            encoded = outcome.encoded
            # the applied mark first, durably; then the model. Two tables are two changelog
            # partitions: a crash between unordered writes could keep the model's update and
            # lose the mark (the request is offered again, a second answer applied twice)
            pending_put(label.request_id, outcome.pending)
            await app.producer.flush()
            models_table[m.encode()] = encoded
            await models_topic.send(key=m.encode(), value=encoded)
            metrics.labels_applied.labels(model=m).inc()
            metrics.iw_loss.labels(model=m).inc(outcome.iw_loss)
            metrics.label_turnaround.labels(model=m).observe(outcome.turnaround)
            log.debug("model %s -> version %s", m, outcome.state["version"])
            return
        if outcome.reason in IGNORED_REASONS:
            metrics.labels_ignored.labels(model=m, reason=outcome.reason).inc()
        if outcome.kind == "refused":
            metrics.updates_refused.labels(model=m, reason=outcome.reason).inc()
        if outcome.kind in ("dead", "refused"):
            await send_dead(_label_dead(raw, outcome.reason, outcome.detail))

    async def _sweep(partition: int) -> None:
        now = clock()
        drop, unanswered = handlers.sweep_expired(
            due(partition, now), partition=partition, now=now, grace=s.expired_grace_seconds
        )
        for key in drop:
            pending_del(key)
        for model in unanswered:
            metrics.label_requests_expired.labels(model=model).inc()
        orphans = dict(_entries(orphans_table))
        for key in handlers.sweep_orphans(
            list(orphans.items()), partition=partition, now=now, wait=s.orphan_label_seconds
        ):
            entry = orphans[key]
            del orphans_table[key.encode()]
            model = str(entry["model"])
            metrics.labels_ignored.labels(model=model, reason="unknown_request").inc()
            origin = RawMessage(
                str(entry.get("raw", "")).encode(), t.labels, partition, int(entry["offset"])
            )
            detail = f"no request {key} within {s.orphan_label_seconds:g}s of its label"
            await send_dead(_label_dead(origin, "unknown_request", detail))

    @app.task  # type: ignore[untyped-decorator]
    async def follow() -> None:
        await declare_outputs()
        await follow_models(s, book, consumer_kwargs=s.security.aiokafka_kwargs())

    ready_since: list[float | None] = [None]

    async def housekeeping() -> None:
        """Readiness, pending-request gauges, query rate and liveness (every second)."""
        tables: Any = app.tables
        rt.recovered = bool(tables.recovery.completed.is_set())
        metrics.ready.set(1 if rt.ready else 0)
        now = clock()
        if rt.recovered:
            assigned = app.consumer.assignment()
            index_refresh(frozenset(tp.partition for tp in assigned if tp.topic == t.labels))
        _pending_gauges(now)
        if not rt.ready:
            ready_since[0] = None
        elif ready_since[0] is None:
            ready_since[0] = now  # until models load, records wait on purpose
        if ready_since[0] is not None and not app.rebalancing:
            try:
                tended = await tend_quiet(app, continuity, rt.progress.times,
                                          rt.progress.offsets, consumed, now,
                                          since=ready_since[0])  # fmt: skip
            except (KafkaError, OSError) as exc:  # the broker is away: try again next second
                log.debug("quiet-partition check skipped: %r", exc)
            else:
                for (topic, _), (start, end) in tended.reread.items():
                    metrics.skipped_recovered.labels(topic=topic).inc(end - start)
        for model, recent in rt.recent_queries.items():
            if recent:
                metrics.query_rate.labels(model=model).set(sum(recent) / len(recent))
        await _liveness(now)

    app.timer(1.0)(housekeeping)
    app.housekeeping = housekeeping

    def _pending_gauges(now: float) -> None:
        count = dict.fromkeys(s.models, 0)
        oldest = dict.fromkeys(s.models, now)
        for entry in index.values():
            if entry.get("applied") or entry.get("model") not in count:
                continue
            count[entry["model"]] += 1
            oldest[entry["model"]] = min(oldest[entry["model"]], float(entry["requested_at"]))
        for model in s.models:
            metrics.pending_requests.labels(model=model).set(count[model])
            metrics.oldest_pending_age.labels(model=model).set(now - oldest[model])

    _liveness = liveness_check(app, rt, set(consumed))

    mount_web(app, rt, pending_entries, labels)
    return app
