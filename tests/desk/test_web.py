"""The HTTP side without Kafka: login, cookies, CSRF, identity from the server only."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from service.desk.accounts import Accounts
from service.desk.passwords import hash_password
from service.desk.sessions import Sessions
from service.desk.web import SESSION_COOKIE, DeskWeb

from .fakes import request
from .test_core import make_desks


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[TestClient, object]]:
    (desk,), _, sink, clock = make_desks()
    desk.queue.offer(request("e1", at=clock.now))
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"ann": hash_password("ann-secret", n=2**8)}))
    sessions = Sessions(b"k" * 32, lifetime=3600.0, clock=lambda: clock.now)
    app = DeskWeb(desk.settings, desk, Accounts.load(users, weak_ok=True), sessions).app()
    async with TestClient(TestServer(app)) as c:
        yield c, sink


async def login(c: TestClient, password: str = "ann-secret") -> str:  # noqa: S107
    page = await (await c.get("/login")).text()
    token = re.search(r'name="token" value="([^"]+)"', page)
    assert token is not None
    resp = await c.post(
        "/login",
        data={"user": "ann", "password": password, "token": token.group(1)},
        allow_redirects=False,
    )
    assert resp.status in (303, 401)
    page = await (await c.get("/")).text()
    csrf = re.search(r'name="csrf-token" content="([^"]+)"', page)
    return "" if csrf is None else csrf.group(1)


async def test_no_login_sees_the_login_page_and_the_api_refuses(client: tuple) -> None:
    c, _ = client
    resp = await c.get("/", allow_redirects=False)
    assert resp.status == 303
    assert resp.headers["Location"] == "/login"
    assert (await c.post("/api/next", json={})).status == 401
    assert await login(c, "wrong") == ""


async def test_the_cookie_is_http_only_and_same_site_strict(client: tuple) -> None:
    c, _ = client
    page = await (await c.get("/login")).text()
    token = re.search(r'name="token" value="([^"]+)"', page)
    assert token is not None
    resp = await c.post(
        "/login",
        data={"user": "ann", "password": "ann-secret", "token": token.group(1)},
        allow_redirects=False,
    )
    cookie = resp.cookies[SESSION_COOKIE]
    assert cookie["httponly"]
    assert cookie["samesite"] == "Strict"
    assert cookie["path"] == "/"


async def test_an_answer_is_labelled_by_the_signed_in_person(client: tuple) -> None:
    c, sink = client
    csrf = await login(c)
    headers = {"X-CSRF-Token": csrf}
    got = await (await c.post("/api/next", json={}, headers=headers)).json()
    rid = got["request"]["request_id"]
    resp = await c.post(
        "/api/answer",
        json={"request_id": rid, "label": 1, "labelled_by": "mallory"},
        headers=headers,
    )
    assert resp.status == 200
    assert [lab.labelled_by for lab in sink.labels] == ["ann"]
    again = await c.post("/api/answer", json={"request_id": rid, "label": 1}, headers=headers)
    assert again.status == 409
    assert (await again.json())["error"] == "already_answered"


async def test_a_post_without_csrf_token_or_from_another_site_is_refused(client: tuple) -> None:
    c, sink = client
    csrf = await login(c)
    got = await (await c.post("/api/next", json={}, headers={"X-CSRF-Token": csrf})).json()
    rid = got["request"]["request_id"]
    body = {"request_id": rid, "label": 1}
    assert (await c.post("/api/answer", json=body)).status == 403
    evil = {"X-CSRF-Token": csrf, "Origin": "https://evil.example"}
    assert (await c.post("/api/answer", json=body, headers=evil)).status == 403
    assert (await c.post("/logout", data={"csrf": "nope"}, allow_redirects=False)).status == 403
    assert sink.labels == []


@pytest.mark.parametrize(
    "body",
    [
        {"request_id": 5, "label": 1},
        {"request_id": "x", "label": 0},
        {"request_id": "x", "label": True},
        ["x"],
    ],
)
async def test_bad_input_is_a_4xx_and_produces_nothing(client: tuple, body: object) -> None:
    c, sink = client
    csrf = await login(c)
    resp = await c.post("/api/answer", json=body, headers={"X-CSRF-Token": csrf})
    assert 400 <= resp.status < 500
    assert sink.labels == []


async def test_logout_ends_the_session(client: tuple) -> None:
    c, _ = client
    csrf = await login(c)
    resp = await c.post("/logout", data={"csrf": csrf}, allow_redirects=False)
    assert resp.status == 303
    assert (await c.get("/", allow_redirects=False)).status == 303


async def test_pages_forbid_framing_and_foreign_scripts(client: tuple) -> None:
    c, _ = client
    resp = await c.get("/login")
    assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
    assert resp.headers["X-Frame-Options"] == "DENY"
    js = await c.get("/static/desk.js")
    assert js.status == 200
    assert "X-CSRF-Token" in await js.text()
    assert (await c.get("/static/../cli.py")).status == 404
    metrics = await (await c.get("/metrics")).text()
    assert "abstain_desk_open_requests" in metrics
