"""The label desk in a real Chromium (Playwright) against a real broker and a real worker.

One worker and one desk serve the module (model ``m``, feature names, display names for the
answers); people ``ann`` and ``bob`` log in through the login page. A second desk replica
(same settings, session key and users file, another port) serves the test of two people on
two replicas; a third one, with the shortest lease the settings allow (5 s), the test of a
lease left to run out. Screenshots of the labelling view and the team view go to
``docs/desk/``.

What the tests show:

- one person answers 20 requests with the keyboard only (login included): exactly 20 labels
  on the labels topic, each request once, ``labelled_by`` her, the served model version +20;
- the team view counts those answers;
- no or wrong credentials see the login page; a forged cross-site POST is refused;
- two people on two replicas answering for 20 s (60 s: ``slow``) never have the same
  request on screen at any sample, and together label each request at most once, every
  label applied once;
- a lease left to run out (the person's browser goes offline) returns the request: another
  person gets it then, not before; the first person's page moves on when it is back;
- an expired request is no longer offered, an answer to it is refused and saves nothing,
  and the team view's expired count rises;
- a flood of wrong passwords for one account is told to wait (429, the seconds shown on
  the login page: ``docs/desk/login-throttled.png``) while a person already signed in to
  the same replica works on;
- with the broker stopped a submit shows an error and the request stays (last: it stops
  the broker).
"""

from __future__ import annotations

import contextlib
import http.server as httpserver
import itertools
import json
import os
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults.desk import DeskProcess
from faults.workers import REPO, http

from service.desk.auth.passwords import hash_password
from service.localkafka import LocalKafka
from service.records import request_id

playwright_sync = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("ABSTAIN_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

Service = Worker = KafkaIO = Any  # fixtures' types live in conftest.py
SHOTS = REPO / "docs" / "desk"
FEATURES = ["amount", "account_age_days", "foreign_ip"]
PASSWORDS = {"ann": "ann-password-1", "bob": "bob-password-2"}
SHORT_LEASE = 5.0  # the shortest lease the settings allow (desk.lease_seconds >= 5)
URGENT = 10.0  # priority of the requests a test injects: above every request the worker asks
_events = itertools.count()


def produce_events(service: Service, n: int) -> None:
    """``n`` fresh feature events for model ``m`` (the worker asks labels for many)."""
    from faults.kafkaio import produce  # noqa: PLC0415

    rng = np.random.default_rng(7 + next(_events))
    events = [
        {"id": f"ev-{uuid.uuid4().hex[:12]}", "model": "m", "features": x}
        for x in rng.normal(size=(n, 3)).round(3).tolist()
    ]
    produce(
        service.bootstrap,
        service.topics["features"],
        [(e["id"].encode(), json.dumps(e).encode()) for e in events],
    )


def ensure_open(service: Service, desk: DeskProcess, n: int) -> None:
    """At least ``n`` open requests at ``desk``: more events until the worker asked them."""
    for _ in range(20):
        have = desk.open_requests()
        if have >= n:
            return
        off_loop(lambda: produce_events(service, max(40, 2 * (n - have))))  # noqa: B023
        with contextlib.suppress(AssertionError):
            desk.wait(lambda: desk.open_requests() >= n, f"{n} open requests", timeout=15)
    raise AssertionError(f"fewer than {n} open requests: {desk.open_requests()}")


def inject_request(service: Service, *, ttl: float) -> str:
    """A label request as the worker writes it (derived id, key = model, the model's
    partition), the most urgent of all, expiring in ``ttl`` s; its id."""
    from faults.kafkaio import produce  # noqa: PLC0415

    event = f"injected-{uuid.uuid4().hex[:12]}"
    rid, now = request_id("m", event), time.time()
    request = {
        "request_id": rid,
        "event_id": event,
        "model": "m",
        "features": [0.5, -1.25, 2.0],
        "score": 0.1,
        "rho": 1.0,
        "decided_label": 0,
        "query_probability": 0.5,
        "model_version": 0,
        "requested_at": now,
        "expires_at": now + ttl,
        "priority": URGENT,
    }
    off_loop(
        lambda: produce(
            service.bootstrap,
            service.topics["label_requests"],
            [(b"m", json.dumps(request).encode())],
        )
    )
    return rid


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("desk") / "users.json"
    path.write_text(json.dumps({n: hash_password(p) for n, p in PASSWORDS.items()}))
    return path


@pytest.fixture(scope="module")
def deployment(
    service_factory: Callable[..., Service], users: Path
) -> Iterator[tuple[Service, Worker, DeskProcess]]:
    model = {"algorithm": "dsal", "cost": 0.25, "feature_names": FEATURES, "audit_rate": 0.05}
    desk = {
        "session_key": "s" * 40,
        "lease_seconds": 30,
        "min_time_left_seconds": 0,
        "ack_timeout_seconds": 3,
        "answer_names": {"m": ["fraud", "legitimate"]},
        # the requests and their answers alone (second opinions: test_desk_review.py)
        "second_opinions": {"enabled": False},
    }
    service = service_factory(models={"m": model}, default_model="m", desk=desk)
    worker = service.start()
    worker.wait_ready()
    produce_events(service, 120)
    proc = DeskProcess(service, users)
    try:
        proc.wait_ready()
        ensure_open(service, proc, 40)
        yield service, worker, proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def second_desk(
    deployment: tuple[Service, Worker, DeskProcess], users: Path
) -> Iterator[DeskProcess]:
    """Another replica: the same settings, session key and users file, another port."""
    proc = DeskProcess(deployment[0], users)
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def lease_desk(
    deployment: tuple[Service, Worker, DeskProcess], users: Path
) -> Iterator[DeskProcess]:
    """A replica whose leases last ``SHORT_LEASE`` s (its page renews every 2 s)."""
    proc = DeskProcess(deployment[0], users, lease_seconds=SHORT_LEASE)
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


def login(browser: Any, desk: DeskProcess, user: str, *, width: int = 1280) -> Any:
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.goto(desk.url + "/")
    page.get_by_label("User name").fill(user)
    page.get_by_label("Password").fill(PASSWORDS[user])
    page.get_by_role("button", name="Log in").click()
    page.wait_for_selector("#card:not([hidden])", timeout=20_000)
    return page


def shown(page: Any) -> str:
    return str(page.locator("#rid").text_content())


def on_screen(page: Any) -> str | None:
    """The request the page shows right now (None while the card is hidden: ``#rid``
    keeps the last id then)."""
    got = page.evaluate(
        "document.getElementById('card').hidden ? null : document.getElementById('rid').textContent"
    )
    return None if got is None else str(got)


def skip(page: Any) -> str:
    """Press S (skip) and wait for the next request; it is returned."""
    rid = shown(page)
    page.keyboard.press("s")
    playwright_sync.expect(page.locator("#rid")).not_to_have_text(rid, timeout=15_000)
    return shown(page)


def model_version(worker: Worker) -> int:
    _, body = worker.get("/readyz")
    return int(json.loads(body)["models"]["m"])


def wait_version(worker: Worker, want: int, timeout: float = 60.0) -> int:
    """The served version once it reached ``want`` (and stayed 1 s: nothing more came)."""
    deadline = time.monotonic() + timeout
    while model_version(worker) < want and time.monotonic() < deadline:
        time.sleep(0.3)
    time.sleep(1.0)
    return model_version(worker)


def off_loop(call: Callable[[], Any]) -> Any:
    """Run ``call`` in another thread: Playwright's sync API keeps an event loop running in
    this one, and the Kafka helpers start their own."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def labels_by(service: Service, kafka_io: KafkaIO) -> list[dict[str, Any]]:
    return [r.json() for r in off_loop(lambda: kafka_io.read(service.topics["labels"]))]


def wait_labels(service: Service, kafka_io: KafkaIO, n: int) -> list[Any]:
    topic = service.topics["labels"]
    return list(off_loop(lambda: kafka_io.wait_for(topic, lambda rs: len(rs) >= n)))


def team_models_row(page: Any, desk: DeskProcess) -> list[str]:
    """Model ``m``'s row of the team view: open, being answered, oldest open, answers and
    expired requests in the last hour."""
    page.goto(desk.url + "/team")
    row = page.locator("#models tbody tr", has_text="m")
    return [str(c) for c in row.locator("td").all_text_contents()]


KEYS = ["1", "2", "1", "1", "2", "1", "2", "2", "1", "1"] * 2  # 20 answers, 12 of them "1"


def test_twenty_answers_typed_on_the_keyboard_are_applied_once_each_and_carry_the_person(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any, kafka_io: KafkaIO
) -> None:
    service, worker, desk = deployment
    before = model_version(worker)
    assert labels_by(service, kafka_io) == []
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(desk.url + "/")
    assert page.url.endswith("/login")
    page.wait_for_function("document.activeElement && document.activeElement.id === 'user'")
    page.keyboard.type("ann")  # the keyboard only, the login too
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORDS["ann"])
    page.keyboard.press("Enter")
    page.wait_for_selector("#card:not([hidden])", timeout=20_000)
    assert page.get_by_text("Keyboard:").is_visible()
    assert page.locator("#features tbody tr").first.text_content().startswith("amount")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "labelling.png"), full_page=True)
    seen = []
    for key in KEYS:
        rid = shown(page)
        seen.append(rid)
        page.keyboard.press(key)
        playwright_sync.expect(page.locator("#rid")).not_to_have_text(rid, timeout=20_000)
    assert len(set(seen)) == 20
    wait_labels(service, kafka_io, 20)
    assert wait_version(worker, before + 20) == before + 20  # 20 applied, not one more
    labels = labels_by(service, kafka_io)
    assert len(labels) == 20
    assert [lab["labelled_by"] for lab in labels] == ["ann"] * 20
    assert [lab["label"] for lab in labels] == [1 if k == "1" else -1 for k in KEYS]
    assert [lab["request_id"][:12] for lab in labels] == seen
    assert len({lab["request_id"] for lab in labels}) == 20
    context.close()


def test_the_team_view_shows_the_queue_and_the_people(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any
) -> None:
    _, _, desk = deployment
    page = login(browser, desk, "bob")
    page.goto(desk.url + "/team")
    row = page.locator("#people tbody tr", has_text="ann")
    assert row.count() == 1
    cells = [str(c) for c in row.locator("td").all_text_contents()]
    assert cells[:2] == ["20", "20"]  # answers in the last hour, in the last day
    assert cells[2].endswith(" s")  # median time to answer
    models = team_models_row(page, desk)
    assert int(models[0]) > 0  # open
    assert int(models[3]) == 20  # answers in the last hour
    page.screenshot(path=str(SHOTS / "team.png"), full_page=True)
    metrics = desk.get("/metrics")[1].decode()
    ones = KEYS.count("1")
    assert f'abstain_desk_answers_total{{answer="1",model="m"}} {ones}.0' in metrics
    assert f'abstain_desk_answers_total{{answer="-1",model="m"}} {20 - ones}.0' in metrics
    page.context.close()


def test_no_or_wrong_credentials_see_the_login_page(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any
) -> None:
    _, _, desk = deployment
    context = browser.new_context()
    page = context.new_page()
    page.goto(desk.url + "/team")
    assert page.url.endswith("/login")
    page.get_by_label("User name").fill("ann")
    page.get_by_label("Password").fill("not-her-password")
    page.get_by_role("button", name="Log in").click()
    assert page.get_by_role("alert").text_content() == "Wrong user name or password."
    assert page.url.endswith("/login")
    status, _ = http(
        desk.url + "/api/next", data=b"{}", headers={"Content-Type": "application/json"}
    )
    assert status == 401
    context.close()


class _Evil(httpserver.BaseHTTPRequestHandler):
    page = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_forged_cross_site_post_is_refused(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any, kafka_io: KafkaIO
) -> None:
    service, _, desk = deployment
    page = login(browser, desk, "ann")
    rid = page.evaluate("document.getElementById('rid').textContent")
    full = page.evaluate(
        "fetch('/api/next', {method: 'POST', headers: {'Content-Type': "
        "'application/json', 'X-CSRF-Token': document.querySelector("
        "'meta[name=csrf-token]').content}, body: '{}'}).then(r => r.json())"
    )
    full_id = full["request"]["request_id"]
    assert full_id.startswith(rid)
    before = len(labels_by(service, kafka_io))
    # same origin, with the cookie, without the token
    status = page.evaluate(
        f"fetch('/api/answer', {{method: 'POST', headers: {{'Content-Type': "
        f"'application/json'}}, body: JSON.stringify({{request_id: "
        f"'{full_id}', label: 1}})}}).then(r => r.status)"
    )
    assert status == 403
    # another site's page that posts a form to the desk (the cookie is SameSite=Strict)
    _Evil.page = (
        f'<form id="f" method="post" action="{desk.url}/api/answer">'
        f'<input name="request_id" value="{full_id}"><input name="label" value="1">'
        '</form><script>document.getElementById("f").submit()</script>'
    ).encode()
    server = httpserver.ThreadingHTTPServer(("127.0.0.1", 0), _Evil)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        evil = page.context.new_page()
        with evil.expect_navigation():
            evil.goto(f"http://localhost:{server.server_address[1]}/")
        assert "Unauthorized" in evil.content() or "login" in evil.content()
    finally:
        server.shutdown()
        server.server_close()
    time.sleep(1.0)
    assert len(labels_by(service, kafka_io)) == before
    page.context.close()


@pytest.mark.parametrize(
    "seconds", [20, pytest.param(60, marks=pytest.mark.slow)], ids=["20s", "60s"]
)
def test_two_people_on_two_replicas_never_see_the_same_request_and_label_each_once(
    deployment: tuple[Service, Worker, DeskProcess],
    second_desk: DeskProcess,
    browser: Any,
    kafka_io: KafkaIO,
    seconds: int,
) -> None:
    service, worker, desk = deployment
    ensure_open(service, desk, int(seconds * 2.5) + 20)  # ~2 answers a second together
    before_labels = len(labels_by(service, kafka_io))
    before = model_version(worker)
    pages = {
        "ann": login(browser, desk, "ann"),
        "bob": login(browser, second_desk, "bob", width=820),
    }
    rng = random.Random(seconds)
    pressed: dict[str, dict[str, float]] = {"ann": {}, "bob": {}}  # person -> rid -> when
    due = dict.fromkeys(pages, 0.0)
    samples, overlaps = 0, []
    end = time.monotonic() + seconds
    while (now := time.monotonic()) < end:
        showing = {person: on_screen(page) for person, page in pages.items()}
        samples += 1
        if showing["ann"] is not None and showing["ann"] == showing["bob"]:
            overlaps.append((round(now - end + seconds, 2), showing["ann"]))
        for person, page in pages.items():
            rid = showing[person]
            if rid is None or now < due[person]:
                continue
            if rid in pressed[person] and now - pressed[person][rid] < 5.0:
                continue  # being saved (pressed again only if the page seems stuck)
            page.keyboard.press(rng.choice(["1", "2"]))
            pressed[person].setdefault(rid, now)
            due[person] = now + rng.uniform(0.3, 1.2)  # a quick person's pace
    assert overlaps == [], f"both pages showed the same request at once: {overlaps[:5]}"
    assert samples >= 5 * seconds, samples  # sampled continuously (both pages each time)
    # the answers in flight at the end land; then nothing more comes
    for page in pages.values():
        with contextlib.suppress(playwright_sync.Error):
            page.wait_for_function(
                "!document.getElementById('status').textContent.startsWith('Saving')",
                timeout=10_000,
            )
    answered = set(pressed["ann"]) | set(pressed["bob"])
    assert not set(pressed["ann"]) & set(pressed["bob"])
    assert len(answered) >= seconds, len(answered)  # both worked, over the whole time
    wait_labels(service, kafka_io, before_labels + len(answered))
    applied = wait_version(worker, before + len(answered))
    labels = labels_by(service, kafka_io)
    ids = Counter(lab["request_id"] for lab in labels)
    assert [rid for rid, n in ids.items() if n > 1] == []  # no request labelled twice
    new = labels[before_labels:]
    assert len(new) == len(answered)  # every answered request labelled once
    for person in pages:
        mine = {lab["request_id"][:12] for lab in new if lab["labelled_by"] == person}
        assert mine == set(pressed[person]), person
    assert applied == before + len(answered)  # and applied once
    print(
        f"{seconds} s: {samples} samples of both pages, {len(answered)} answered "
        f"(ann {len(pressed['ann'])}, bob {len(pressed['bob'])})"
    )
    pages["bob"].screenshot(path=str(SHOTS / "labelling-tablet.png"), full_page=True)
    for page in pages.values():
        page.context.close()


def test_a_lease_left_to_run_out_returns_the_request(
    deployment: tuple[Service, Worker, DeskProcess], lease_desk: DeskProcess, browser: Any
) -> None:
    service, _, _ = deployment
    bob = login(browser, lease_desk, "bob")  # each holds some request (maybe one they
    ann = login(browser, lease_desk, "ann")  # were given in an earlier test)
    was = lease_desk.open_requests()
    rid = inject_request(service, ttl=600)[:12]  # then the most urgent of all arrives
    lease_desk.wait(lambda: lease_desk.open_requests() > was, "the injected request")
    skip(ann)
    assert shown(ann) == rid  # ann opens it ...
    ann.context.set_offline(True)  # ... and walks away: her page no longer renews the lease
    offline = time.monotonic()
    skip(bob)  # while ann's lease runs, bob is not given her request
    assert time.monotonic() - offline < SHORT_LEASE - 2.0  # (asked while it still ran)
    assert shown(bob) != rid
    time.sleep(max(0.0, offline + SHORT_LEASE + 1.5 - time.monotonic()))  # it ran out
    skip(bob)
    assert shown(bob) == rid  # returned: bob gets it
    ann.context.set_offline(False)  # ann is back: her page learns it is not hers any more
    playwright_sync.expect(ann.locator("#rid")).not_to_have_text(rid, timeout=15_000)
    assert shown(bob) == rid
    assert on_screen(ann) not in (rid, None)
    ann.context.close()
    bob.context.close()


def test_an_expired_request_is_no_longer_offered_and_counted_as_expired(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any, kafka_io: KafkaIO
) -> None:
    service, _, desk = deployment
    bob = login(browser, desk, "bob")
    expired_before = int(team_models_row(bob, desk)[4])
    bob.goto(desk.url + "/")
    bob.wait_for_selector("#card:not([hidden])", timeout=20_000)
    ann = login(browser, desk, "ann")
    ttl, was = 12.0, desk.open_requests()
    rid = inject_request(service, ttl=ttl)
    injected = time.monotonic()
    desk.wait(lambda: desk.open_requests() > was, "the injected request")
    skip(ann)
    assert shown(ann) == rid[:12]  # offered: the most urgent request
    time.sleep(max(0.0, injected + ttl + 1.5 - time.monotonic()))  # past its expiry
    if on_screen(ann) == rid[:12]:  # (else the page's renewal already learnt it expired)
        ann.keyboard.press("1")  # too late: refused, nothing saved, the next request shown
        status = ann.locator("#status")
        playwright_sync.expect(status).to_contain_text("expired", timeout=10_000)
    playwright_sync.expect(ann.locator("#rid")).not_to_have_text(rid[:12], timeout=10_000)
    skip(bob)  # bob asks for the most urgent request: no longer that one
    assert shown(bob) != rid[:12]
    expired_page = bob.context.new_page()
    desk.wait(
        lambda: int(team_models_row(expired_page, desk)[4]) == expired_before + 1, "expired + 1"
    )
    assert not [lab for lab in labels_by(service, kafka_io) if lab["request_id"] == rid]
    ann.context.close()
    bob.context.close()


def test_a_login_flood_gets_a_clear_wait_and_a_signed_in_person_works_on(
    deployment: tuple[Service, Worker, DeskProcess], users: Path, browser: Any
) -> None:
    service, _, _ = deployment
    desk = DeskProcess(service, users).wait_ready()  # a replica of its own: its throttle
    try:
        bob = login(browser, desk, "bob")  # signed in before the flood
        ensure_open(service, desk, 5)
        context = browser.new_context(viewport={"width": 1280, "height": 700})
        page = context.new_page()
        page.goto(desk.url + "/login")
        statuses, waits = [], []
        while 429 not in statuses and len(statuses) < 10:
            page.get_by_label("User name").fill("ann")
            page.get_by_label("Password").fill(f"guess-{len(statuses)}")
            with page.expect_response(
                lambda r: r.url.endswith("/login") and r.request.method == "POST"
            ) as answer:
                page.get_by_role("button", name="Log in").click()
            statuses.append(answer.value.status)
            waits.append(answer.value.headers.get("retry-after"))
        assert statuses[:5] == [401] * 5  # then the account waits: 1 s, 2 s, 4 s, ...
        assert statuses[-1] == 429
        alert = str(page.get_by_role("alert").text_content())
        assert re.fullmatch(
            r"Too many login attempts for this account or from your "
            r"address: try again in \d+ seconds?\.",
            alert,
        ), alert
        assert int(waits[-1]) >= 1
        assert page.get_by_label("User name").input_value() == "ann"  # the form stays filled
        page.screenshot(path=str(SHOTS / "login-throttled.png"), full_page=True)
        was = shown(bob)
        assert skip(bob) != was  # the signed-in person works on meanwhile
        context.close()
        bob.context.close()
    finally:
        desk.stop()


def test_with_the_broker_stopped_a_submit_shows_an_error_and_the_request_stays(
    deployment: tuple[Service, Worker, DeskProcess],
    browser: Any,
    kafka_broker: LocalKafka,
    kafka_io: KafkaIO,
) -> None:
    service, worker, desk = deployment
    if kafka_broker.bootstrap != service.bootstrap:
        pytest.skip("the broker of this session is not the one the harness controls")
    page = login(browser, desk, "ann")
    rid = shown(page)
    before = len(labels_by(service, kafka_io))
    kafka_broker.stop()
    try:
        page.keyboard.press("1")
        page.wait_for_selector("#status.error", timeout=30_000)
        assert "Not saved" in str(page.locator("#status").text_content())
        assert shown(page) == rid  # still on screen, still open
    finally:
        kafka_broker.start()
    page.keyboard.press("1")  # the broker is back: the same answer is saved once
    playwright_sync.expect(page.locator("#rid")).not_to_have_text(rid, timeout=60_000)
    labels = wait_labels(service, kafka_io, before + 1)
    mine = [r.json() for r in labels if r.json()["request_id"].startswith(rid)]
    assert len(mine) == 1
    assert mine[0]["labelled_by"] == "ann"
    page.context.close()
