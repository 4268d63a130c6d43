"""The desk under load: many people asking at once each get their own request, and what a
page or a scrape costs does not grow with the number of open requests (work is counted as
lines of the desk's code executed, not timed)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

import service.desk
from service.desk.auth.accounts import Accounts, Person
from service.desk.auth.passwords import hash_password
from service.desk.auth.sessions import Sessions
from service.desk.core import Desk
from service.desk.leases import LeaseRecord
from service.desk.team import team_stats
from service.desk.web import DeskWeb
from service.records import Label, Opinion

from .fakes import MemoryLeaseLog, request
from .test_core import Clock, make_desks

PEOPLE = [Person(f"p{i:02d}") for i in range(20)]
DESK_CODE = str(Path(service.desk.__file__).parent)


class Work:
    """Counts the lines of ``service/desk/`` executed while active (a loop's body counts
    once per pass), so a walk over every open request shows up whatever its speed."""

    def __init__(self) -> None:
        self.lines = 0

    def _line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
        return self._line

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._line if frame.f_code.co_filename.startswith(DESK_CODE) else None

    def __enter__(self) -> Work:
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


def urgency(desk: Desk, rid: str) -> tuple[float, float]:
    r = desk.queue.requests[rid]
    return (-r.priority, r.expires_at)


async def test_twenty_people_asking_at_once_each_get_one_of_the_most_urgent() -> None:
    (desk,), _, _, clock = make_desks(lag=True)
    offer = [
        request(f"e{i}", priority=(i % 97) / 97, at=clock.now, ttl=600 + i) for i in range(200)
    ]
    for r in offer:
        desk.queue.offer(r)
    got = await asyncio.gather(*(desk.next(p) for p in PEOPLE))
    assert all(g is not None for g in got), sum(g is None for g in got)
    ids = [g.request.request_id for g in got if g is not None]
    assert len(set(ids)) == len(PEOPLE)
    top = sorted(desk.queue.requests, key=lambda rid: urgency(desk, rid))[: len(PEOPLE)]
    assert sorted(ids) == sorted(top)  # one replica: exactly the most urgent ones
    for person, rid in zip(PEOPLE, ids, strict=True):
        lease = desk.leases.holder(rid, now=clock.now)
        assert lease is not None
        assert lease.holder == person.name
    assert desk.metrics.claims.labels(outcome="lost")._value.get() == 0


async def test_people_on_two_replicas_asking_at_once_never_share_a_request() -> None:
    (d1, d2), log, _, clock = make_desks(2, lag=True)
    for i in range(100):
        r = request(f"e{i}", priority=i / 100, at=clock.now)
        d1.queue.offer(r)
        d2.queue.offer(r)
    for _ in range(3):  # rounds of next + answer, everyone at once
        got = await asyncio.gather(*(d.next(p) for d, p in zip([d1, d2] * 10, PEOPLE, strict=True)))
        assert all(g is not None for g in got)
        ids = [g.request.request_id for g in got if g is not None]
        assert len(set(ids)) == len(PEOPLE)
        for rid in ids:
            holders = {d.leases.holder(rid, now=clock.now) for d in (d1, d2)}
            assert len(holders) == 1  # both replicas agree
        desks = [d1, d2] * 10
        await asyncio.gather(
            *(d.answer(p, rid, 1) for d, p, rid in zip(desks, PEOPLE, ids, strict=True))
        )
        for d in (d1, d2):
            for rid in ids:
                d.queue.close(rid, "answered")  # as read back from the labels topic
    assert len({r.request_id for r in log.records if r.kind == "answer"}) == 3 * len(PEOPLE)


async def test_one_person_asking_twice_at_once_gets_one_request() -> None:
    (desk,), _, _, clock = make_desks(lag=True)
    for i in range(5):
        desk.queue.offer(request(f"e{i}", at=clock.now))
    a, b = await asyncio.gather(desk.next(PEOPLE[0]), desk.next(PEOPLE[0]))
    assert a is not None
    assert b is not None
    assert a.request is b.request


async def busy(n: int) -> tuple[Desk, MemoryLeaseLog, Clock]:
    """A desk with ``n`` open requests, ``n`` requests answered over the last day (claimed,
    answered on the leases topic, labelled; their leases over) and five held now."""
    (desk,), log, _, clock = make_desks()
    began = clock.now
    for i in range(n):
        clock.now = at = began + i * 80_000 / n
        rid, who = request(f"done-{i}", at=at - 60).request_id, PEOPLE[i % 20].name
        await log.publish(LeaseRecord(rid, "claim", who, at=at - 30, expires_at=at + 90))
        await log.publish(LeaseRecord(rid, "answer", who, at=at, expires_at=at + 120, attempt="a"))
        desk.queue.on_label(Label(rid, "m", 1, who, at), at=at)
    clock.now = began + 80_200
    for i in range(n):
        desk.queue.offer(
            request(
                f"open-{i}", model="mz"[i % 2], priority=(i % 13) / 13, at=clock.now, ttl=3600 + i
            )
        )
    for person in PEOPLE[:5]:
        assert await desk.next(person) is not None
    desk.tick()
    clock.now += 1.0
    desk.tick()
    return desk, log, clock


async def costs(n: int, tmp_path: Path) -> dict[str, int]:
    """Lines of desk code run by the team numbers, a tick, a ``next``, ``GET /team`` and
    ``GET /metrics`` with :func:`busy` ``(n)``."""
    desk, _, clock = await busy(n)
    stats = team_stats(desk.queue, desk.leases, desk.settings.models, now=clock.now)
    assert sum(row.open for row in stats.models) == n
    assert sum(row.held for row in stats.models) == 5
    assert sum(p.answers_last_day for p in stats.people) == n
    last_hour = sum(1 for i in range(n) if i * 80_000 / n > 80_200 - 3600)
    assert sum(p.answers_last_hour for p in stats.people) == last_hour
    assert all(p.median_answer_seconds == 30.0 for p in stats.people)
    out = {}
    with Work() as work:
        team_stats(desk.queue, desk.leases, desk.settings.models, now=clock.now)
    out["team_stats"] = work.lines
    clock.now += 1.0
    with Work() as work:
        desk.tick()
    out["tick"] = work.lines
    with Work() as work:
        assert await desk.next(PEOPLE[7]) is not None
    out["next"] = work.lines

    users = tmp_path / "users.json"
    users.write_text(json.dumps({"p07": hash_password("p07-secret", n=2**8)}))
    sessions = Sessions(b"k" * 32, lifetime=3600.0, clock=lambda: clock.now)
    app = DeskWeb(desk.settings, desk, Accounts.load(users, weak_ok=True), sessions).app()
    async with TestClient(TestServer(app)) as c:
        page = await (await c.get("/login")).text()
        token = re.search(r'name="token" value="([^"]+)"', page)
        assert token is not None
        data = {"user": "p07", "password": "p07-secret", "token": token.group(1)}
        await c.post("/login", data=data, allow_redirects=False)
        with Work() as work:
            resp = await c.get("/team")
        out["/team"] = work.lines
        assert resp.status == 200
        assert f"<th scope=row>m</th><td>{n // 2}</td>" in await resp.text()
        with Work() as work:
            text = await (await c.get("/metrics")).text()
        out["/metrics"] = work.lines
        assert f'abstain_desk_open_requests{{model="m"}} {n // 2}.0' in text
    return out


async def test_the_team_view_metrics_and_next_cost_the_same_with_100_or_10000_open(
    tmp_path: Path,
) -> None:
    small, large = await costs(100, tmp_path), await costs(10_000, tmp_path)
    for what, lines in small.items():
        assert large[what] <= 2 * lines + 50, (what, lines, large[what])


async def test_a_team_page_is_served_from_the_last_tick() -> None:
    desk, _, clock = await busy(10)
    before = desk.team_view()
    assert desk.team_view() is before  # not computed again
    desk.queue.offer(request("new", at=clock.now))
    assert desk.team_view() is before
    clock.now += 1.0
    after = desk.tick()
    assert desk.team_view() is after
    assert sum(r.open for r in after.models) == sum(r.open for r in before.models) + 1


async def reviewing(n: int, tmp_path: Path) -> dict[str, int]:
    """Lines of desk code run by a tick, a ``next`` (a second opinion found), ``GET /team``
    and ``GET /metrics`` with ``n`` answers waiting for a second opinion, ``n // 2`` for a
    reviewer and ``n`` open requests (an answer a second: the model's reach, 200 labels,
    leaves time for the last 185)."""
    from .review.harness import Person as P
    from .review.harness import deployment, req

    topics, (replica,) = deployment(1)
    people = [f"p{i:02d}" for i in range(20)]
    for i in range(n):
        r = req(f"a{i}", p=0.02, at=topics.clock.now, ttl=20_000)
        topics.request(r)
        topics.label(Label(r.request_id, "m", 1, people[i % 20], topics.clock.now))
        if i % 2:
            topics.signed(
                Opinion(
                    r.request_id,
                    "m",
                    1 if i % 4 == 1 else -1,
                    people[(i + 1) % 20],
                    topics.clock.now,
                )
            )
        topics.request(req(f"o{i}", at=topics.clock.now, ttl=20_000))
        topics.clock.now += 1.0
    book = replica.book
    assert len(book.opinion_queue("m")) == n - n // 2
    assert len(list(book.review_queue("m"))) == n // 4
    replica.desk.tick()
    topics.clock.now += 1.0
    out = {}
    with Work() as work:
        replica.desk.tick()
    out["tick"] = work.lines
    with Work() as work:
        got = await replica.desk.next(P("p07"))
    out["next"] = work.lines
    assert got is not None
    assert got.opinion
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"p07": hash_password("p07-secret", n=2**8)}))
    sessions = Sessions(b"k" * 32, lifetime=3600.0, clock=lambda: topics.clock.now)
    app = DeskWeb(
        replica.desk.settings, replica.desk, Accounts.load(users, weak_ok=True), sessions
    ).app()
    async with TestClient(TestServer(app)) as c:
        page = await (await c.get("/login")).text()
        token = re.search(r'name="token" value="([^"]+)"', page)
        assert token is not None
        data = {"user": "p07", "password": "p07-secret", "token": token.group(1)}
        await c.post("/login", data=data, allow_redirects=False)
        with Work() as work:
            resp = await c.get("/team")
        out["/team"] = work.lines
        assert f"<td>{n - n // 2}</td><td>{n // 4}</td>" in await resp.text()
        with Work() as work:
            text = await (await c.get("/metrics")).text()
        out["/metrics"] = work.lines
        assert f'abstain_desk_reviews_open{{model="m"}} {n // 4}.0' in text
    return out


async def test_the_review_queues_cost_next_a_tick_the_team_view_and_metrics_the_same(
    tmp_path: Path,
) -> None:
    small, large = await reviewing(100, tmp_path), await reviewing(10_000, tmp_path)
    for what, lines in small.items():
        assert large[what] <= 2 * lines + 50, (what, lines, large[what])
