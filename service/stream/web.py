"""faust web pages for the worker: ``/metrics``, ``/healthz``, ``/readyz``, ``/models``,
``/labels``.

The answers are computed by :mod:`service.web.views` (plain functions) from what the worker
already holds (the last :class:`~service.stream.health.housekeeping.WorkerStatus`, the pending
store's queue); this module only adapts them to faust's web server, and sends labels
(:class:`LabelSender`: a reply is given once Kafka has acknowledged the record).

faust's own pages (``/router``, ``/table``, ``/graph``, statistics, ``/performance``) are
switched off in :func:`service.stream.app.create_app`; ``/`` answers ``{"status": "OK"}``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

import faust
from aiokafka.errors import KafkaError
from faust.exceptions import ProducerSendError

from service.config import Settings
from service.metrics import Metrics
from service.records import Label
from service.stream.errors import StreamError
from service.stream.health.housekeeping import Housekeeping
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.state import PendingStore
from service.stream.models.book import ModelBook
from service.stream.models.champions import comparison
from service.stream.scoring.scorer import Scorer
from service.web import views

__all__ = ["LabelSender", "Worker", "mount_web"]

log = logging.getLogger(__name__)


def _reply(view: Any, r: views.Reply) -> Any:
    headers = {"Content-Type": r.content_type, **dict(r.headers)}
    return view.bytes(r.body, status=r.status, headers=headers)


class LabelSender:
    """Sends a label to the labels topic (keyed by model) and returns once Kafka has
    acknowledged it (the producer's ``acks=all``: every in-sync replica has it).

    The caller bounds the wait (``asyncio.wait_for``); cancelling it leaves the record in
    the producer's buffer, from where it may still be written."""

    def __init__(self, topic: Any) -> None:
        self.topic = topic

    async def __call__(self, label: Label) -> None:
        try:
            delivery = await self.topic.send(
                key=label.model.encode(), value=label.to_json(), force=True
            )
            await asyncio.shield(delivery)  # a timeout must not cancel the delivery itself
        except (KafkaError, ProducerSendError) as exc:
            log.warning("label for request %s not acknowledged: %r", label.request_id, exc)
            raise StreamError(f"the labels topic did not take the label: {exc!r}") from exc


class Worker(Protocol):
    """What the pages read of a worker (its :class:`~service.stream.app.Parts`)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def book(self) -> ModelBook: ...

    @property
    def scorer(self) -> Scorer: ...

    @property
    def joiner(self) -> LabelJoiner: ...

    @property
    def housekeeping(self) -> Housekeeping: ...


def mount_web(app: Any, parts: Worker, labels_topic: Any, pending: PendingStore) -> None:
    """Register the pages on ``app``."""
    s = parts.settings
    token = s.label_token.get_secret_value() if s.label_token is not None else None
    clock = parts.joiner.clock
    send = LabelSender(labels_topic)
    pacer = views.Pacer()

    @app.page("/metrics")
    class MetricsView(faust.web.View):
        async def get(self, request: Any) -> Any:
            return _reply(self, views.metrics(parts.metrics.registry))

    @app.page("/healthz")
    class HealthView(faust.web.View):
        async def get(self, request: Any) -> Any:
            status = parts.housekeeping.status
            detail = {"stalled": list(status.stalled), "pinned": list(status.pinned)}
            return _reply(self, views.health(status.live, detail))

    @app.page("/readyz")
    class ReadyView(faust.web.View):
        async def get(self, request: Any) -> Any:
            status = parts.housekeeping.status
            models = {name: m.version for name, m in parts.book.snapshot().items()}  # live
            detail = {
                "recovered": status.recovered,
                "models_loaded": status.models_loaded,
                "models": models,
                "unreadable": list(status.unreadable),
            }
            return _reply(self, views.ready(status.ready, detail))

    @app.page("/models")
    class ModelsView(faust.web.View):
        async def get(self, request: Any) -> Any:
            models, champions = parts.book.serving()
            rows = comparison(s, models, champions, parts.scorer.tally)
            return _reply(self, views.models(rows))

    @app.page("/labels")
    class LabelsView(faust.web.View):
        async def get(self, request: Any) -> Any:
            r = await views.labels_get(
                request.query,
                request.headers.get("Authorization"),
                token=token,
                queue=pending,
                clock=clock,
                pacer=pacer,
                as_html="text/html" in request.headers.get("Accept", ""),
            )
            return _reply(self, r)

        async def post(self, request: Any) -> Any:
            r = await views.labels_post(
                await request.read(),
                request.headers.get("Authorization"),
                token=token,
                default_model=s.default_model,
                produce=send,
                now=clock(),
                ack_timeout=s.label_ack_timeout_seconds,
            )
            return _reply(self, r)

    _ = (MetricsView, HealthView, ReadyView, ModelsView, LabelsView)
