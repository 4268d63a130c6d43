"""HTTP endpoints as plain functions: the token on reads and writes, pagination, pacing,
acknowledged labels."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping

import orjson
import pytest
from prometheus_client import CollectorRegistry

from service.errors import AbstainError
from service.metrics import Metrics
from service.records import Label, LabelRequest, PendingEntry
from service.web.views import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    Pacer,
    QueueKey,
    Reply,
    decode_cursor,
    encode_cursor,
    health,
    labels_get,
    labels_post,
    metrics,
    ready,
)

TOKEN = "a-token-of-at-least-16"  # noqa: S105 - a test token
AUTH = f"Bearer {TOKEN}"


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
    assert await _post(BODY, None, TOKEN, sink) == 401
    assert await _post(BODY, "Bearer wrong", TOKEN, sink) == 401
    assert await _post(BODY, f"Basic {TOKEN}", TOKEN, sink) == 401
    assert await _post(BODY, "Bearer ", TOKEN, sink) == 401
    assert await _post(BODY, f"Bearer {TOKEN}x", TOKEN, sink) == 401
    assert sink.sent == []
    assert await _post(BODY, AUTH, TOKEN, sink) == 202
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
    assert await _post(body, AUTH, TOKEN, sink) == 400
    assert sink.sent == []


async def test_a_label_kafka_does_not_acknowledge_in_time_gets_503_not_202() -> None:
    started = asyncio.Event()

    async def never_acknowledged(label: Label) -> None:
        started.set()
        await asyncio.sleep(3600)

    loop = asyncio.get_running_loop()
    began = loop.time()
    reply = await labels_post(
        BODY,
        AUTH,
        token=TOKEN,
        default_model="m",
        produce=never_acknowledged,
        now=5.0,
        ack_timeout=0.05,
    )
    assert started.is_set()
    assert loop.time() - began < 1.0
    assert reply.status == 503
    body = orjson.loads(reply.body)
    assert body["error"].endswith("not saved, try again")
    assert "0.05 s" in body["error"]
    assert body["request_id"] == "r1"
    assert ("Retry-After", "1") in reply.headers


async def test_a_label_kafka_refuses_gets_503() -> None:
    async def refused(label: Label) -> None:
        raise AbstainError("broker said no")

    reply = await labels_post(BODY, AUTH, token=TOKEN, default_model="m", produce=refused, now=5.0)
    assert reply.status == 503
    assert orjson.loads(reply.body)["error"] == "Kafka did not take the label: not saved, try again"


# --------------------------------------------------------------------------- the queue


def entry(
    rid: str, priority: float, requested_at: float = 1.0, expires_at: float = 99.0
) -> PendingEntry:
    request = LabelRequest(
        rid, f"e-{rid}", "m", [1.0, 2.0], 0.0, 1.0, 0, 0.5, 0, requested_at, expires_at, priority
    )
    return PendingEntry(request, 0)


class Queue:
    """A :class:`~service.web.views.LabelQueue` over a list, in queue order, recording how
    it was asked."""

    def __init__(self, entries: list[PendingEntry]) -> None:
        self.entries = entries
        self.asked: list[tuple[QueueKey | None, int, float]] = []

    def page(
        self, *, after: QueueKey | None, limit: int, now: float
    ) -> tuple[list[PendingEntry], QueueKey | None]:
        self.asked.append((after, limit, now))
        keyed = sorted(
            ((-e.request.priority, e.request.requested_at, e.request_id), e)
            for e in self.entries
            if not e.applied and e.request.expires_at >= now
        )
        rest = [(k, e) for k, e in keyed if after is None or k > after]
        page = rest[:limit]
        return [e for _, e in page], (page[-1][0] if len(rest) > limit else None)


async def _get(
    queue: Queue,
    query: Mapping[str, str] | None = None,
    auth: str | None = AUTH,
    token: str | None = TOKEN,
    **kw: object,
) -> Reply:
    return await labels_get(query or {}, auth, token=token, queue=queue, clock=lambda: 10.0, **kw)  # type: ignore[arg-type]


async def test_reading_the_queue_needs_the_token_like_posting() -> None:
    queue = Queue([entry("r1", 0.5)])
    for auth in (None, "Bearer wrong", f"Basic {TOKEN}", "Bearer ", TOKEN):
        reply = await _get(queue, auth=auth)
        assert reply.status == 401, auth
        assert b"r1" not in reply.body
    assert (await _get(queue, auth="Bearer anything", token=None)).status == 403
    assert queue.asked == []  # a refused request reads nothing
    reply = await _get(queue)
    assert reply.status == 200
    assert ("Cache-Control", "no-store") in reply.headers
    assert [p["request_id"] for p in orjson.loads(reply.body)["pending"]] == ["r1"]


async def test_the_queue_lists_open_requests_by_priority_then_age() -> None:
    done = entry("done", 1.0).answered(
        Label("done", "m", 1, "", None), offset=0, version=1, now=1.0
    )
    queue = Queue(
        [
            entry("low", 0.1),
            entry("high", 0.9, 2.0),
            entry("older", 0.9, 1.0),
            done,
            entry("expired", 1.0, expires_at=5.0),
        ]
    )
    body = orjson.loads((await _get(queue)).body)
    assert [p["request_id"] for p in body["pending"]] == ["older", "high", "low"]
    assert body["count"] == 3
    assert body["next"] is None
    assert body["limit"] == DEFAULT_LIMIT
    assert body["pending"][0]["features"] == [1.0, 2.0]


async def test_pages_follow_the_cursor_to_the_end() -> None:
    queue = Queue([entry(f"r{i:02}", priority=i / 100) for i in range(7)])
    seen, cursor, pages = [], None, 0
    while True:
        query = {"limit": "3"} | ({"cursor": cursor} if cursor else {})
        body = orjson.loads((await _get(queue, query)).body)
        seen += [p["request_id"] for p in body["pending"]]
        pages += 1
        cursor = body["next"]
        if cursor is None:
            break
    assert seen == [f"r{i:02}" for i in reversed(range(7))]
    assert pages == 3
    assert [limit for _, limit, _ in queue.asked] == [3, 3, 3]


@pytest.mark.parametrize(
    ("limit", "asked"),
    [
        ("", DEFAULT_LIMIT),
        ("1", 1),
        ("500", 500),
        ("501", MAX_LIMIT),
        ("0500", 500),
        ("9" * 40, MAX_LIMIT),
    ],
)
async def test_the_page_size_defaults_to_50_and_is_cut_to_500(limit: str, asked: int) -> None:
    queue = Queue([])
    reply = await _get(queue, {"limit": limit} if limit else {})
    assert reply.status == 200
    assert orjson.loads(reply.body)["limit"] == asked


async def test_a_big_page_is_read_in_slices_of_50_letting_the_loop_go_between() -> None:
    queue = Queue([entry(f"r{i:03}", priority=i / 1000) for i in range(120)])
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    body = orjson.loads((await _get(queue, {"limit": "500"})).body)
    task.cancel()
    assert [p["request_id"] for p in body["pending"]] == [f"r{i:03}" for i in reversed(range(120))]
    assert body["next"] is None
    assert [limit for _, limit, _ in queue.asked] == [50, 50, 50]
    assert ticks >= 3  # the loop ran other work between the slices
    queue.asked.clear()
    body = orjson.loads((await _get(queue, {"limit": "70"})).body)
    assert [limit for _, limit, _ in queue.asked] == [50, 20]
    assert body["count"] == 70
    assert body["next"] is not None


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "0"},
        {"limit": "-1"},
        {"limit": "ten"},
        {"limit": "²"},
        {"limit": "1.5"},
        {"cursor": "not-a-cursor!"},
        {"cursor": "e30"},
        {"cursor": encode_cursor((1.0, 2.0, "x"))[:-2]},
        {"cursor": "x" * 2000},
    ],
)
async def test_malformed_page_requests_are_refused_with_400(query: dict[str, str]) -> None:
    queue = Queue([entry("r1", 0.5)])
    reply = await _get(queue, query)
    assert reply.status == 400, query
    assert queue.asked == []


def test_a_cursor_round_trips_and_forged_ones_are_refused() -> None:
    key = (-0.25, 1.7e9, "3f2a")
    assert decode_cursor(encode_cursor(key)) == key
    for forged in ('["a", 1, "r"]', "[1, 2]", '{"a": 1}', '[true, 1, "r"]'):
        with pytest.raises(ValueError, match="cursor"):
            decode_cursor(base64.urlsafe_b64encode(forged.encode()).decode())


async def test_the_html_queue_escapes_what_it_shows_and_links_the_next_page() -> None:
    queue = Queue([entry("<script>x</script>", 0.5), entry("high", 0.9), entry("low", 0.1)])
    page = await _get(queue, {"limit": "2"}, as_html=True)
    assert page.content_type.startswith("text/html")
    assert page.body.index(b"high") < page.body.index(b"&lt;script&gt;")
    assert b"<script" not in page.body
    assert b"next page" in page.body
    assert b"low" not in page.body


# --------------------------------------------------------------------------- pacing


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


async def test_the_pacer_spaces_renders_and_refuses_beyond_the_longest_wait() -> None:
    t = FakeTime()
    pacer = Pacer(interval=0.1, max_wait=0.25, clock=t.clock, sleep=t.sleep)
    assert [await pacer.slot() for _ in range(5)] == [True, True, True, False, False]
    assert t.slept == pytest.approx([0.1, 0.2])  # the first went at once, the third at 0.2
    t.now = 10.0  # long after: the schedule is free again
    assert await pacer.slot(cost=2.0)  # a big page books two slots
    assert pacer.reserve() == pytest.approx(0.2)
    with pytest.raises(ValueError, match="interval"):
        Pacer(interval=0.0)


async def test_hammering_clients_beyond_the_pacer_get_429_with_retry_after() -> None:
    t = FakeTime()
    pacer = Pacer(interval=0.1, max_wait=0.15, clock=t.clock, sleep=t.sleep)
    queue = Queue([entry("r1", 0.5)])
    statuses = [(await _get(queue, pacer=pacer)).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    refused = await _get(queue, pacer=pacer)
    assert ("Retry-After", "1") in refused.headers
    assert len(queue.asked) == 2  # a refused request reads nothing
    # a page of 500 costs ten of 50: it waits for (or is refused) a longer slot
    t.now = 100.0
    assert (await _get(queue, {"limit": "500"}, pacer=pacer)).status == 200
    assert (await _get(queue, pacer=pacer)).status == 429


async def test_unauthorised_requests_do_not_take_slots() -> None:
    t = FakeTime()
    pacer = Pacer(interval=0.1, max_wait=0.0, clock=t.clock, sleep=t.sleep)
    queue = Queue([])
    for _ in range(5):
        assert (await _get(queue, auth=None, pacer=pacer)).status == 401
    assert (await _get(queue, pacer=pacer)).status == 200


# --------------------------------------------------------------------------- the others


def test_health_ready_and_metrics_replies() -> None:
    assert health(True, {}).status == 200
    assert health(False, {"stalled": ["t[0]"]}).status == 503
    assert ready(False, {}).status == 503
    assert orjson.loads(ready(True, {"models": {"m": 3}}).body) == {
        "ready": True,
        "models": {"m": 3},
    }
    registry = CollectorRegistry()
    Metrics(registry, models=["m"])
    reply = metrics(registry)
    assert reply.status == 200
    assert b"abstain_events_total" in reply.body
