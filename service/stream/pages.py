"""faust web pages for the worker: ``/metrics``, ``/healthz``, ``/readyz``, ``/labels``.

The answers are computed by :mod:`service.web.views` (plain functions) from what the worker
already holds (the last :class:`~service.stream.housekeeping.WorkerStatus`, the pending
store); this module only adapts them to faust's web server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import faust

from service.records import Label
from service.stream.stores import PendingStore
from service.web import views

if TYPE_CHECKING:
    from service.stream.app import Parts

__all__ = ["mount_web"]


def _reply(view: Any, r: views.Reply) -> Any:
    return view.bytes(r.body, status=r.status, headers={"Content-Type": r.content_type})


def mount_web(app: Any, parts: Parts, labels_topic: Any, pending: PendingStore) -> None:
    """Register the pages on ``app``."""
    s = parts.settings
    token = s.label_token.get_secret_value() if s.label_token is not None else None
    clock = parts.joiner.clock

    @app.page("/metrics")
    class MetricsView(faust.web.View):
        async def get(self, request: Any) -> Any:
            return _reply(self, views.metrics(parts.metrics.registry))

    @app.page("/healthz")
    class HealthView(faust.web.View):
        async def get(self, request: Any) -> Any:
            status = parts.housekeeping.status
            return _reply(self, views.health(status.live, {"stalled": list(status.stalled)}))

    @app.page("/readyz")
    class ReadyView(faust.web.View):
        async def get(self, request: Any) -> Any:
            status = parts.housekeeping.status
            models = {name: m.version for name, m in parts.book.snapshot().items()}  # live
            detail = {"recovered": status.recovered, "models_loaded": status.models_loaded,
                      "models": models}  # fmt: skip
            return _reply(self, views.ready(status.ready, detail))

    async def produce(label: Label) -> None:
        await labels_topic.send(key=label.model.encode(), value=label.to_json())

    @app.page("/labels")
    class LabelsView(faust.web.View):
        async def get(self, request: Any) -> Any:
            as_html = "text/html" in request.headers.get("Accept", "")
            return _reply(self, views.labels_get(pending.entries(), now=clock(), as_html=as_html))

        async def post(self, request: Any) -> Any:
            r = await views.labels_post(
                await request.read(),
                request.headers.get("Authorization"),
                token=token,
                default_model=s.default_model,
                produce=produce,
                now=clock(),
            )
            return _reply(self, r)

    _ = (MetricsView, HealthView, ReadyView, LabelsView)
