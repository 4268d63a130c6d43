"""The worker's web pages on faust's real web server, without a broker: the token on the
label queue, its pages, faust's own pages switched off, labels answered 202 only once
acknowledged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiokafka.errors import KafkaTimeoutError
from faust.exceptions import ProducerSendError

from service.config import Settings
from service.records import Label
from service.stream.app import create_app
from service.stream.errors import StreamError
from service.stream.kafka.internals import App
from service.stream.labels.state import PendingStore
from service.stream.web import LabelSender, mount_web
from service.web.views import labels_post

from .memory import MemoryKafka, pending

TOKEN = "pages-token-0123456789"  # noqa: S105 - a test token
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAUST_PAGES = [
    "/router/",
    "/table/",
    "/table/pending/",
    "/graph/",
    "/stats/",
    "/assignment/",
    "/performance/",
    "/signal/",
]


def settings(tmp_path: Path, **kw: Any) -> Settings:
    return Settings(app_id="pages", datadir=tmp_path, label_token=TOKEN, **kw)


def test_faust_pages_are_off_and_acks_all_whatever_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (
        "APP_WEB_TABLES_ENABLED",
        "APP_WEB_ROUTER_ENABLED",
        "APP_WEB_STATS_ENABLED",
        "APP_WEB_GRAPH_ENABLED",
        "APP_WEB_METRICS_ENABLED",
    ):
        monkeypatch.setenv(name, "true")
    monkeypatch.setenv("PRODUCER_ACKS", "1")
    app = create_app(settings(tmp_path))
    conf = app.conf
    assert conf.producer_acks == -1
    flags = ("router", "tables", "graph", "stats", "metrics")
    assert [f for f in flags if getattr(conf, f"web_{f}_enabled")] == []
    app.web.init_server()
    assert sorted(app.web.views) == ["/", "/healthz", "/labels", "/metrics", "/models", "/readyz"]


class Topic:
    """The labels topic as :class:`LabelSender` sees it: ``send`` returns the delivery."""

    def __init__(
        self, delivery: asyncio.Future[Any] | None = None, fails: Exception | None = None
    ) -> None:
        self.delivery = delivery
        self.fails = fails
        self.sent: list[tuple[bytes, bytes]] = []

    async def send(self, *, key: bytes, value: bytes, force: bool) -> asyncio.Future[Any]:
        if self.fails is not None:
            raise self.fails
        self.sent.append((key, value))
        if self.delivery is None:
            self.delivery = asyncio.get_running_loop().create_future()
            self.delivery.set_result("metadata")
        return self.delivery


@pytest.fixture
async def web(tmp_path: Path) -> AsyncIterator[tuple[TestClient[Any, Any], PendingStore, Topic]]:
    """The worker's pages on a fresh faust app's web server, over an in-memory queue and a
    labels topic that acknowledges nothing until the test says so."""
    parts = create_app(settings(tmp_path / "a", label_ack_timeout_seconds=0.2)).parts
    store = PendingStore(MemoryKafka().table("pending"))
    topic = Topic(asyncio.get_running_loop().create_future())
    app = App(
        "pages-web",
        env={},
        web_stats_enabled=False,
        web_router_enabled=False,
        web_tables_enabled=False,
        web_graph_enabled=False,
    )
    mount_web(app, parts, topic, store)
    app.web.init_server()
    async with TestClient(TestServer(app.web.web_app)) as client:
        yield client, store, topic


async def test_the_label_queue_needs_the_token_and_pages_through_the_store(
    web: tuple[TestClient[Any, Any], PendingStore, Topic],
) -> None:
    client, store, _ = web
    for i in range(120):
        store.put(pending([float(i)], f"e{i:03}", priority=i / 120, expires_at=4e9))
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        reply = await client.get("/labels", headers=headers)
        assert reply.status == 401
        assert "e119" not in await reply.text()
    seen: list[str] = []
    url = "/labels"
    while url:
        reply = await client.get(url, headers=AUTH)
        assert reply.status == 200
        assert reply.headers["Cache-Control"] == "no-store"
        body = orjson.loads(await reply.read())
        assert body["count"] <= 50
        seen += [p["event_id"] for p in body["pending"]]
        url = f"/labels?cursor={body['next']}" if body["next"] else ""
    assert seen == [f"e{i:03}" for i in reversed(range(120))]
    assert (await client.get("/labels?limit=zero", headers=AUTH)).status == 400


async def test_faust_pages_are_not_served(
    web: tuple[TestClient[Any, Any], PendingStore, Topic],
) -> None:
    client, _, _ = web
    for path in FAUST_PAGES:
        assert (await client.get(path)).status == 404, path
    assert orjson.loads(await (await client.get("/")).read()) == {"status": "OK"}
    assert (await client.get("/healthz")).status == 200


async def test_a_label_is_answered_202_only_once_kafka_acknowledged_it(
    web: tuple[TestClient[Any, Any], PendingStore, Topic],
) -> None:
    client, _, topic = web
    body = b'{"request_id": "r1", "label": 1}'
    loop = asyncio.get_running_loop()
    began = loop.time()
    reply = await client.post("/labels", data=body, headers=AUTH)  # nothing acknowledged
    assert reply.status == 503
    assert 0.2 <= loop.time() - began < 2.0
    assert (await reply.json())["error"].endswith("not saved, try again")
    assert topic.delivery is not None
    assert not topic.delivery.cancelled()  # still in the producer's hands
    topic.delivery.set_result("metadata")  # the broker answers
    reply = await client.post("/labels", data=body, headers=AUTH)
    assert reply.status == 202
    assert [k for k, _ in topic.sent] == [b"default", b"default"]


async def test_the_sender_turns_kafka_errors_into_the_projects_own() -> None:
    label = Label("r1", "m", 1, "http", 1.0)
    with pytest.raises(StreamError, match="did not take"):
        await LabelSender(Topic(fails=ProducerSendError("no leader")))(label)
    failed = asyncio.get_running_loop().create_future()
    failed.set_exception(KafkaTimeoutError())
    with pytest.raises(StreamError):
        await LabelSender(Topic(failed))(label)
    reply = await labels_post(
        b'{"request_id": "r1", "label": 1}',
        AUTH["Authorization"],
        token=TOKEN,
        default_model="m",
        produce=LabelSender(Topic(fails=ProducerSendError("x"))),
        now=1.0,
    )
    assert reply.status == 503
    delivered = Topic()
    await LabelSender(delivered)(label)
    assert delivered.sent == [(b"m", label.to_json())]
