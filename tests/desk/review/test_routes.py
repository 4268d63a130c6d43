"""The review's HTTP side without Kafka: every route needs a person, the CSRF token and a
JSON object; refusals are 4xx with a code and write nothing; a second opinion's view never
carries the first answer; the review page is for reviewers (roles from the users file or
``desk.reviewers``, behind a proxy too); pages and charts are escaped and script-free."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from service.desk.auth.accounts import Accounts, Person
from service.desk.auth.logins import LoginGate
from service.desk.auth.passwords import hash_password
from service.desk.auth.sessions import Sessions
from service.desk.web import DeskWeb
from service.records import Label, Opinion
from service.records.labels import parse_labels_record

from .harness import ANN, BOB, Replica, Topics, answered, deployment, req

PASSWORDS = {"ann": "ann-secret", "bob": "bob-secret", "rita": "rita-secret", "sam": "sam-secret"}


class Site:
    """A desk replica served over HTTP, and people signed in to it."""

    def __init__(self, topics: Topics, replica: Replica, client: TestClient) -> None:
        self.topics, self.replica, self.client = topics, replica, client
        self.csrf: dict[str, str] = {}

    async def login(self, user: str) -> None:
        c = self.client
        c.session.cookie_jar.clear()
        page = await (await c.get("/login")).text()
        token = re.search(r'name="token" value="([^"]+)"', page)
        assert token is not None
        form = {"user": user, "password": PASSWORDS[user], "token": token.group(1)}
        resp = await c.post("/login", data=form, allow_redirects=False)
        assert resp.status == 303
        page = await (await c.get("/")).text()
        csrf = re.search(r'name="csrf-token" content="([^"]+)"', page)
        assert csrf is not None
        self.csrf[user] = csrf.group(1)
        self.user = user

    async def api(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        resp = await self.client.post(
            path,
            data=raw,
            headers={"X-CSRF-Token": self.csrf[self.user], "Content-Type": "application/json"},
        )
        return resp.status, await resp.json(content_type=None)

    def written(self) -> list[Any]:
        labels = self.topics.settings.topics.labels
        return [
            parse_labels_record(r.value)
            for r in self.topics.records
            if r.topic == labels and r.value is not None
        ]


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    topics, (replica,) = deployment(1, reviewers=["sam"])
    users = tmp_path / "users.json"
    accounts = {n: {"password": hash_password(p, n=2**8)} for n, p in PASSWORDS.items()}
    accounts["rita"]["reviewer"] = True  # type: ignore[assignment]
    users.write_text(json.dumps(accounts))
    book = Accounts.load(users, weak_ok=True)
    clock = topics.clock
    sessions = Sessions(b"k" * 32, lifetime=3600.0, clock=lambda: clock.now)
    logins = LoginGate(book, clock=lambda: clock.now, free=100, refusal_delay=0.0)
    web = DeskWeb(
        replica.desk.settings,
        replica.desk,
        book,
        sessions,
        logins=logins,
        models=lambda: replica.models,
    )
    client = TestClient(TestServer(web.app()))
    await client.start_server()
    try:
        yield Site(topics, replica, client)
    finally:
        await client.close()
        logins.close()


async def test_an_undo_comes_back_as_the_request_to_answer_again(site: Site) -> None:
    r = req("e1")
    await answered(site.topics, site.replica.desk, ANN, r, 1)
    await site.login("ann")
    status, mine = await site.api("/api/mine", {})
    assert status == 200
    assert [(a["request_id"], a["answer"], a["actions"]) for a in mine["answers"]] == [
        (r.request_id, "fraud", ["undo", "change"])
    ]
    assert mine["answers"][0]["grace_until"] == pytest.approx(site.topics.clock.now + 600)
    status, undone = await site.api("/api/undo", {"request_id": r.request_id})
    assert status == 200
    assert undone["request"]["request_id"] == r.request_id
    assert [f["value"] for f in undone["request"]["features"]] == [0.1, 0.2, 0.3]
    status, again = await site.api("/api/again", {"request_id": r.request_id})
    assert (status, again["request"]["request_id"]) == (200, r.request_id)
    status, saved = await site.api("/api/correct", {"request_id": r.request_id, "label": -1})
    assert (status, saved["label"]) == (200, -1)
    assert [(type(w).__name__, getattr(w, "label", None)) for w in site.written()] == [
        ("Label", 1),
        ("Correction", None),
        ("Correction", -1),
    ]
    status, mine = await site.api("/api/mine", {})
    assert mine["answers"][0]["status"] == "Changed to legitimate"


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/api/undo", {}, 400, "bad_request_id"),
        ("/api/undo", {"request_id": ["x"]}, 400, "bad_request_id"),
        ("/api/correct", {"request_id": "r", "label": 0}, 400, "bad_answer"),
        ("/api/correct", {"request_id": "r", "label": True}, 400, "bad_answer"),
        ("/api/correct", {"request_id": "r", "label": "1"}, 400, "bad_answer"),
        ("/api/review", {"request_id": "r", "label": None}, 400, "bad_answer"),
        ("/api/opinion", {"request_id": "r" * 300, "label": 1}, 400, "bad_request_id"),
        ("/api/opinion/skip", {"request_id": "r", "why": "bored"}, 400, "bad_reason"),
        ("/api/flag", b"[1, 2]", 400, "bad_json"),
        ("/api/flag", b"{nope", 400, "bad_json"),
        ("/api/undo", {"request_id": "f" * 32}, 404, "unknown_request"),
        ("/api/opinion", {"request_id": "f" * 32, "label": 1}, 404, "unknown_request"),
    ],
)
async def test_bad_bodies_and_unknown_requests_are_4xx_with_a_code_and_write_nothing(
    site: Site, path: str, body: Any, status: int, code: str
) -> None:
    await site.login("ann")
    got, answer = await site.api(path, body)
    assert (got, answer.get("error")) == (status, code)
    assert answer["message"]
    assert site.written() == []


async def test_without_the_csrf_token_or_a_session_nothing_is_done(site: Site) -> None:
    r = req("e1")
    await answered(site.topics, site.replica.desk, ANN, r, 1)
    body = {"request_id": r.request_id}
    assert (await site.client.post("/api/undo", json=body)).status == 401
    await site.login("ann")
    assert (await site.client.post("/api/undo", json=body)).status == 403  # no token
    assert len(site.written()) == 1  # the label alone


async def test_another_persons_answer_is_refused_and_the_reviewer_role_decides(site: Site) -> None:
    r = req("e1")
    await answered(site.topics, site.replica.desk, ANN, r, 1)
    await site.login("bob")
    for path, body in (
        ("/api/undo", {}),
        ("/api/correct", {"label": -1}),
        ("/api/flag", {}),
        ("/api/review", {"label": -1}),
    ):
        status, answer = await site.api(path, {"request_id": r.request_id, **body})
        assert status == 403, (path, answer)
        assert answer["error"] in ("not_author", "not_reviewer")
    assert (await site.client.get("/review")).status == 403
    await site.login("sam")  # a reviewer by desk.reviewers
    page = await (await site.client.get("/review")).text()
    assert 'href="/review" aria-current=page>Review</a>' in page
    status, decided = await site.api("/api/review", {"request_id": r.request_id, "label": -1})
    assert (status, decided["decided"]) == (200, "corrected")
    assert [(type(w).__name__, getattr(w, "role", "")) for w in site.written()] == [
        ("Label", ""),
        ("Correction", "reviewer"),
    ]
    assert site.replica.sample("abstain_desk_refusals_total", code="not_author") >= 3


async def test_a_second_opinion_is_served_without_the_first_answer(site: Site) -> None:
    r = req("e1", p=0.02)
    await answered(site.topics, site.replica.desk, ANN, r, -1)
    await site.login("bob")
    status, got = await site.api("/api/next", {})
    assert status == 200
    view = got["request"]
    assert (view["request_id"], view["second_opinion"]) == (r.request_id, True)
    text = json.dumps(got)
    assert "ann" not in text  # neither who answered ...
    assert not {"label", "labelled_by", "first", "current", "answer"} & set(view)  # ... nor what
    assert (await site.api("/api/opinion/renew", {"request_id": r.request_id}))[0] == 200
    status, saved = await site.api("/api/opinion", {"request_id": r.request_id, "label": 1})
    assert (status, saved) == (200, {"saved": True, "request_id": r.request_id, "can_change": True})
    assert [type(w) for w in site.written()] == [Label, Opinion]
    await site.login("ann")
    status, got = await site.api("/api/next", {})
    assert got["request"] is None  # never to her
    status, own = await site.api("/api/opinion", {"request_id": r.request_id, "label": 1})
    assert (status, own["error"]) == (403, "own_answer")


async def test_the_review_page_lists_the_queue_opens_an_answer_and_finds_any(site: Site) -> None:
    differ, plain = req("differ", p=0.02), req("plain")
    await answered(site.topics, site.replica.desk, ANN, differ, 1)
    await answered(site.topics, site.replica.desk, ANN, plain, 1)
    assert await site.replica.desk.next(BOB) is not None
    await site.replica.opinions.answer(BOB, differ.request_id, -1)
    await site.login("rita")
    page = await (await site.client.get("/review")).text()
    queue = page.split('id="queue"')[1].split("</table>")[0]
    assert differ.request_id[:12] in queue
    assert plain.request_id[:12] not in queue
    opened = await (await site.client.get(f"/review?item={differ.request_id}")).text()
    assert 'data-review="1"' in opened
    assert "ann answered fraud" in opened
    assert "bob second opinion: legitimate" in opened
    assert "<script>" not in opened.replace('<script src="/static/review.js"></script>', "")
    found = await (await site.client.get("/review?person=ann&model=m")).text()
    results = found.split('id="found"')[1]
    assert plain.request_id[:12] in results
    assert differ.request_id[:12] in results
    by_id = await (await site.client.get(f"/review?request={plain.request_id[:12]}")).text()
    assert plain.request_id[:12] in by_id.split('id="found"')[1]
    # the reviewer who gave the first answer cannot decide it
    await site.login("sam")
    own = req("own")
    await answered(site.topics, site.replica.desk, Person("sam"), own, 1)
    page = await (await site.client.get(f"/review?item={own.request_id}")).text()
    assert "You answered this request yourself" in page
    assert 'data-review="1"' not in page


async def test_the_team_view_shows_agreement_and_charts_computed_at_the_tick(site: Site) -> None:
    r = req("e1", p=0.02, at=site.topics.clock.now)
    await answered(site.topics, site.replica.desk, ANN, r, 1)
    await site.replica.review.correct(ANN, r.request_id, None)
    site.replica.desk.tick()
    await site.login("bob")
    page = await (await site.client.get("/team")).text()
    assert 'id="agreement"' in page
    row = page.split('id="quality"')[1].split("</tr>")[1]
    assert "<th scope=row>m</th><td>1</td><td>1 / 1" in row  # one label, later withdrawn
    assert row.count('<svg class="spark"') == 2
    assert "<title>open requests of m" in row
    people = page.split('id="agreement"')[1].split("</table>")[0]
    assert "<th scope=row>ann</th><td>1</td><td>0</td>" in people


async def test_a_proxy_desk_takes_the_reviewer_role_from_its_settings(tmp_path: Path) -> None:
    topics, (replica,) = deployment(
        1, reviewers=["rita"], auth="proxy", trusted_proxies=["127.0.0.1", "::1"]
    )
    sessions = Sessions(b"k" * 32, lifetime=3600.0, clock=lambda: topics.clock.now)
    web = DeskWeb(replica.desk.settings, replica.desk, Accounts({}), sessions)
    async with TestClient(TestServer(web.app())) as c:
        as_rita = {"X-Forwarded-User": "rita"}
        assert (await c.get("/review", headers=as_rita)).status == 200
        c.session.cookie_jar.clear()
        assert (await c.get("/review", headers={"X-Forwarded-User": "bob"})).status == 403
    web.logins.close()
