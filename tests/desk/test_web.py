"""The HTTP side without Kafka: login, cookies, CSRF, identity from the server only, bad
bodies, throttled logins, logouts every replica hears of, headers believed only from the
trusted proxies."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from service.desk.auth.accounts import Accounts
from service.desk.auth.logins import LoginGate
from service.desk.auth.passwords import hash_password
from service.desk.auth.sessions import Sessions
from service.desk.errors import Unavailable
from service.desk.web import SESSION_COOKIE, DeskWeb

from .fakes import request
from .test_core import make_desks


class MemoryRevocations:
    """The revocations topic: what was written, or Kafka down."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.down = False

    async def publish(self, value: bytes, sid: str) -> None:
        if self.down:
            raise Unavailable("broker down")
        self.records.append(value)


async def serve(tmp_path: Path, **desk_settings: object) -> tuple[TestClient, DeskWeb]:
    (desk,), _, _, clock = make_desks()
    if desk_settings:
        update = {"desk": desk.settings.desk.model_copy(update=desk_settings)}
        desk.settings = desk.settings.model_copy(update=update)
    desk.queue.offer(request("e1", at=clock.now))
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"ann": hash_password("ann-secret", n=2**8)}))
    sessions = Sessions(b"k" * 32, lifetime=3600.0, clock=lambda: clock.now)
    accounts = Accounts.load(users, weak_ok=True)
    logins = LoginGate(accounts, clock=lambda: clock.now, free=3, refusal_delay=0.0)
    web = DeskWeb(
        desk.settings, desk, accounts, sessions, revocations=MemoryRevocations(), logins=logins
    )
    c = TestClient(TestServer(web.app()))
    await c.start_server()
    return c, web


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[tuple[TestClient, object]]:
    c, web = await serve(tmp_path)
    try:
        yield c, web.desk.sink
    finally:
        await c.close()
        web.logins.close()


async def login(c: TestClient, password: str = "ann-secret", **headers: str) -> str:  # noqa: S107
    page = await (await c.get("/login")).text()
    token = re.search(r'name="token" value="([^"]+)"', page)
    assert token is not None
    resp = await c.post(
        "/login",
        data={"user": "ann", "password": password, "token": token.group(1)},
        allow_redirects=False,
        headers=headers,
    )
    assert resp.status in (303, 401, 429)
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
        b"[" * 3000 + b"]" * 3000,
        b"{" * 100_000,
        b'{"request_id": "\xff\xfe", "label": 1}',
        b"\xff\xfe\x00",
        b"",
        b'{"label": 1e999, "request_id": "x"}',
        b'{"request_id": "' + b"x" * 70_000 + b'"}',
    ],
)
async def test_bad_input_is_a_4xx_and_produces_nothing(client: tuple, body: object) -> None:
    c, sink = client
    csrf = await login(c)
    # a body that is no JSON object is refused by every route; the fields, by /api/answer
    routes = (
        ["/api/answer"]
        if isinstance(body, dict)
        else ["/api/next", "/api/renew", "/api/answer", "/api/skip"]
    )
    for path in routes:
        if isinstance(body, bytes):
            resp = await c.post(
                path, data=body, headers={"X-CSRF-Token": csrf, "Content-Type": "application/json"}
            )
        else:
            resp = await c.post(path, json=body, headers={"X-CSRF-Token": csrf})
        assert 400 <= resp.status < 500, (path, resp.status, await resp.text())
    assert sink.labels == []


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data; boundary=x", b"--x\r\nnot a part\r\n--x--"),
        ("multipart/form-data", b"garbage"),
        ("application/x-www-form-urlencoded", b"user=\xff\xfe&password=%ff"),
        ("application/json", b'{"user": "ann"}'),
        ("text/plain", b"user=ann"),
    ],
)
async def test_a_form_that_is_not_one_is_a_4xx(
    client: tuple, content_type: str, body: bytes
) -> None:
    c, _ = client
    csrf = await login(c)
    for path in ("/login", "/logout"):
        resp = await c.post(
            path, data=body, headers={"Content-Type": content_type}, allow_redirects=False
        )
        assert 400 <= resp.status < 500, (path, resp.status)
    assert csrf  # still signed in: nothing logged out


async def test_a_login_flood_is_answered_429_with_the_wait(client: tuple) -> None:
    c, _ = client
    for _ in range(3):
        assert await login(c, "wrong") == ""
    page = await (await c.get("/login")).text()
    token = re.search(r'name="token" value="([^"]+)"', page)
    assert token is not None
    form = {"user": "ann", "password": "ann-secret", "token": token.group(1)}
    resp = await c.post("/login", allow_redirects=False, data=form)
    assert resp.status == 429
    assert resp.headers["Retry-After"] == "1"
    assert "Too many login attempts" in await resp.text()
    assert SESSION_COOKIE not in resp.cookies


async def test_logout_ends_the_session(client: tuple) -> None:
    c, _ = client
    csrf = await login(c)
    resp = await c.post("/logout", data={"csrf": csrf}, allow_redirects=False)
    assert resp.status == 303
    assert (await c.get("/", allow_redirects=False)).status == 303


async def test_a_logout_is_written_for_every_replica_and_said_when_it_is_not(
    tmp_path: Path,
) -> None:
    c, web = await serve(tmp_path)
    other = Sessions(b"k" * 32, lifetime=3600.0, clock=web.sessions.clock)  # another replica
    try:
        csrf = await login(c)
        cookie = c.session.cookie_jar.filter_cookies(c.make_url("/"))[SESSION_COOKIE].value
        assert other.read(cookie) is not None
        revocations = web.revocations
        assert isinstance(revocations, MemoryRevocations)
        assert (await c.post("/logout", data={"csrf": csrf}, allow_redirects=False)).status == 303
        (record,) = revocations.records
        other.on_revocation(record)
        assert other.read(cookie) is None
        revocations.down = True  # Kafka away: logged out here, and told so
        csrf = await login(c)
        resp = await c.post("/logout", data={"csrf": csrf}, allow_redirects=False)
        assert resp.status == 503
        assert "did not confirm the logout" in await resp.text()
        assert (await c.get("/", allow_redirects=False)).status == 303
    finally:
        await c.close()
        web.logins.close()


async def test_pages_and_the_api_wait_until_the_topics_are_read(tmp_path: Path) -> None:
    c, web = await serve(tmp_path)
    try:
        csrf = await login(c)
        web.desk.ready = False  # a restarted desk: revocations not read yet, among the rest
        assert (await c.get("/", allow_redirects=False)).status == 503
        resp = await c.post("/api/next", json={}, headers={"X-CSRF-Token": csrf})
        assert resp.status == 503
        assert (await resp.json())["error"] == "loading"
    finally:
        await c.close()
        web.logins.close()


async def test_forwarded_headers_are_believed_from_trusted_proxies_only(tmp_path: Path) -> None:
    spoof = {"X-Forwarded-For": "198.51.100.7", "X-Forwarded-Proto": "https"}
    for trusted, secure in (((), False), (("127.0.0.1",), True), (("10.0.0.0/8",), False)):
        c, web = await serve(tmp_path, trusted_proxies=trusted)
        try:
            page = await (await c.get("/login")).text()
            token = re.search(r'name="token" value="([^"]+)"', page)
            assert token is not None
            resp = await c.post(
                "/login",
                allow_redirects=False,
                headers=spoof,
                data={"user": "ann", "password": "ann-secret", "token": token.group(1)},
            )
            assert resp.status == 303
            assert bool(resp.cookies[SESSION_COOKIE]["secure"]) is secure
            for _ in range(3):  # wrong passwords from "198.51.100.7", via the proxy or not
                await login(c, "wrong", **spoof)
            # the client's own address: throttled when it was the one counted
            direct = web.logins.addresses_throttle.wait("127.0.0.1", now=web.sessions.clock())
            forwarded = web.logins.addresses_throttle.wait("198.51.100.7", now=web.sessions.clock())
            assert (direct > 0, forwarded > 0) == (not secure, secure)
        finally:
            await c.close()
            web.logins.close()


async def test_behind_a_proxy_the_person_is_believed_from_the_proxy_only(
    tmp_path: Path,
) -> None:
    for trusted, believed in ((("127.0.0.1",), True), (("10.9.9.9",), False)):
        c, web = await serve(tmp_path, auth="proxy", trusted_proxies=trusted)
        try:
            resp = await c.get("/", headers={"X-Forwarded-User": "ann"}, allow_redirects=False)
            assert (resp.status == 200) is believed
            if not believed:
                assert resp.status == 401
        finally:
            await c.close()
            web.logins.close()


async def test_behind_a_proxy_a_name_the_users_file_does_not_list_answers_nothing(
    tmp_path: Path,
) -> None:
    """Scopes fail closed: the users file lists ann (every model); mallory, whom the proxy
    vouches for, is not listed, so she is offered nothing and answers nothing."""
    c, web = await serve(tmp_path, auth="proxy", trusted_proxies=("127.0.0.1",))
    try:
        rid = next(iter(web.desk.queue.requests))
        for name, offered in (("mallory", False), ("ann", True)):
            proxy = {"X-Forwarded-User": name}
            page = await (await c.get("/", headers=proxy)).text()
            csrf = re.search(r'name="csrf-token" content="([^"]+)"', page)
            assert csrf is not None
            headers = {**proxy, "X-CSRF-Token": csrf.group(1)}
            got = await (await c.post("/api/next", json={}, headers=headers)).json()
            assert (got.get("request") is not None) is offered, (name, got)
            if not offered:
                resp = await c.post(
                    "/api/answer", json={"request_id": rid, "label": 1}, headers=headers
                )
                assert resp.status == 403
                assert (await resp.json())["error"] == "out_of_scope"
        assert [lab.labelled_by for lab in web.desk.sink.labels] == []
    finally:
        await c.close()
        web.logins.close()


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
