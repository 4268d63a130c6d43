"""faust web pages for the worker: ``/metrics``, ``/healthz``, ``/readyz``, ``/labels``.

The answers are computed by :mod:`service.web.views` (plain functions); this module only
adapts them to faust's web server.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import faust

from service.web import views

if TYPE_CHECKING:
    from service.stream.runtime import Runtime

__all__ = ["mount_web"]


def mount_web(
    app: Any,
    rt: Runtime,
    pending_entries: Callable[[], list[tuple[str, dict[str, Any]]]],
    labels_topic: Any,
) -> None:
    """Register the pages on ``app``."""
    s = rt.settings
    token = s.label_token.get_secret_value() if s.label_token is not None else None

    def reply(view: Any, r: views.Reply) -> Any:
        return view.bytes(r.body, status=r.status, headers={"Content-Type": r.content_type})

    @app.page("/metrics")
    class MetricsView(faust.web.View):
        async def get(self, request: Any) -> Any:
            return reply(self, views.metrics(rt.metrics.registry))

    @app.page("/healthz")
    class HealthView(faust.web.View):
        async def get(self, request: Any) -> Any:
            return reply(self, views.health(rt.live, {"stalled": rt.stalled}))

    @app.page("/readyz")
    class ReadyView(faust.web.View):
        async def get(self, request: Any) -> Any:
            detail = {
                "recovered": rt.recovered,
                "models_loaded": rt.book.loaded.is_set(),
                "models": {n: m.version for n, m in rt.book.models.items()},
            }
            return reply(self, views.ready(rt.ready, detail))

    async def produce(label: Any) -> None:
        await labels_topic.send(key=label.model.encode(), value=label.to_json())

    @app.page("/labels")
    class LabelsView(faust.web.View):
        async def get(self, request: Any) -> Any:
            as_html = "text/html" in request.headers.get("Accept", "")
            entries = [entry for _, entry in pending_entries()]
            return reply(self, views.labels_get(entries, now=rt.clock(), as_html=as_html))

        async def post(self, request: Any) -> Any:
            body = await request.read()
            r = await views.labels_post(
                body,
                request.headers.get("Authorization"),
                token=token,
                default_model=s.default_model,
                produce=produce,
                now=rt.clock(),
            )
            return reply(self, r)

    _ = (MetricsView, HealthView, ReadyView, LabelsView)
