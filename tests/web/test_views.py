"""HTTP endpoints as plain functions: token checks, validation, queue ordering."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client import CollectorRegistry

from service.metrics import Metrics
from service.stream.records import Label
from service.web.views import health, labels_get, labels_post, metrics, ready


class Sink:
    def __init__(self) -> None:
        self.sent: list[Label] = []

    async def __call__(self, label: Label) -> None:
        self.sent.append(label)


async def _post(body: bytes, auth: str | None, token: str | None, sink: Sink) -> int:
    reply = await labels_post(body, auth, token=token, default_model="m", produce=sink, now=5.0)
    return reply.status


BODY = b'{"request_id": "r1", "label": -1}'


async def test_posting_a_label_needs_the_right_bearer_token() -> None:
    sink = Sink()
    assert await _post(BODY, None, "s3cret", sink) == 401
    assert await _post(BODY, "Bearer wrong", "s3cret", sink) == 401
    assert await _post(BODY, "Basic s3cret", "s3cret", sink) == 401
    assert await _post(BODY, "Bearer ", "s3cret", sink) == 401
    assert sink.sent == []
    assert await _post(BODY, "Bearer s3cret", "s3cret", sink) == 202
    assert sink.sent == [Label("r1", "m", -1, "http", 5.0)]


async def test_posting_is_disabled_without_a_configured_token() -> None:
    sink = Sink()
    assert await _post(BODY, "Bearer anything", None, sink) == 403
    assert sink.sent == []


@pytest.mark.parametrize(
    "body", [b"{", b"[1]", b'{"request_id": "r", "label": 2}', b'{"label": 1}']
)
async def test_invalid_labels_are_refused_with_400_and_not_produced(body: bytes) -> None:
    sink = Sink()
    assert await _post(body, "Bearer t", "t", sink) == 400
    assert sink.sent == []


def test_label_queue_lists_open_requests_by_priority() -> None:
    entries = [
        {"request_id": "low", "priority": 0.1, "requested_at": 1.0, "expires_at": 99.0,
         "features": [1.0], "model": "m"},
        {"request_id": "high", "priority": 0.9, "requested_at": 2.0, "expires_at": 99.0,
         "features": [1.0], "model": "m"},
        {"request_id": "done", "priority": 1.0, "requested_at": 0.0, "expires_at": 99.0,
         "applied": True, "features": [1.0], "model": "m"},
        {"request_id": "old", "priority": 1.0, "requested_at": 0.0, "expires_at": 5.0,
         "features": [1.0], "model": "m"},
    ]  # fmt: skip
    reply = labels_get(entries, now=10.0)
    body = orjson.loads(reply.body)
    assert [p["request_id"] for p in body["pending"]] == ["high", "low"]
    page = labels_get(entries, now=10.0, as_html=True)
    assert page.content_type.startswith("text/html")
    assert page.body.index(b"high") < page.body.index(b"low")
    assert (
        b"<script"
        not in labels_get(
            [{**entries[0], "request_id": "<script>x</script>"}], now=10.0, as_html=True
        ).body
    )


def test_health_ready_and_metrics_replies() -> None:
    assert health(True, {}).status == 200
    assert health(False, {"stalled": ["t[0]"]}).status == 503
    assert ready(False, {}).status == 503
    assert orjson.loads(ready(True, {"models": {"m": 3}}).body) == {
        "ready": True, "models": {"m": 3},
    }  # fmt: skip
    registry = CollectorRegistry()
    Metrics(registry, models=["m"])
    reply = metrics(registry)
    assert reply.status == 200
    assert b"abstain_events_total" in reply.body
