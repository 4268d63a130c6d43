"""HTTP endpoints as plain functions: token checks, validation, queue ordering."""

from __future__ import annotations

import orjson
import pytest
from prometheus_client import CollectorRegistry

from service.metrics import Metrics
from service.records import Label, LabelRequest, PendingEntry
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
    def entry(rid: str, priority: float, requested_at: float, expires_at: float
              ) -> PendingEntry:  # fmt: skip
        request = LabelRequest(rid, "e", "m", [1.0], 0.0, 1.0, 0, 0.5, 0, requested_at,
                               expires_at, priority)  # fmt: skip
        return PendingEntry(request, 0)

    done = entry("done", 1.0, 0.0, 99.0).answered(Label("done", "m", 1, "", None), offset=0,
                                                  version=1, now=1.0)  # fmt: skip
    entries = [entry("low", 0.1, 1.0, 99.0), entry("high", 0.9, 2.0, 99.0), done,
               entry("old", 1.0, 0.0, 5.0)]  # fmt: skip
    reply = labels_get(entries, now=10.0)
    body = orjson.loads(reply.body)
    assert [p["request_id"] for p in body["pending"]] == ["high", "low"]
    page = labels_get(entries, now=10.0, as_html=True)
    assert page.content_type.startswith("text/html")
    assert page.body.index(b"high") < page.body.index(b"low")
    assert (
        b"<script"
        not in labels_get(
            [entry("<script>x</script>", 0.5, 1.0, 99.0)], now=10.0, as_html=True
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
