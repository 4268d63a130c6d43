"""The label desk in a real Chromium (Playwright) against a real broker and a real worker.

One worker and one desk serve the module (model ``m``, feature names, display names for the
answers); people ``ann`` and ``bob`` log in through the login page. Screenshots of the
labelling view and the team view go to ``docs/desk/``.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.server as httpserver
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults.workers import REPO, http

from service.desk.passwords import hash_password
from service.localkafka import LocalKafka, find_free_ports

playwright_sync = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("ABSTAIN_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

Service = Worker = KafkaIO = Any  # fixtures' types live in conftest.py
SHOTS = REPO / "docs" / "desk"
FEATURES = ["amount", "account_age_days", "foreign_ip"]
PASSWORDS = {"ann": "ann-password-1", "bob": "bob-password-2"}
ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-gpu",
]


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


class DeskProcess:
    """``python -m service desk`` for a deployment, stopped by PID."""

    def __init__(self, service: Service, users: Path) -> None:
        self.port = find_free_ports(1)[0]
        path = service.write_config()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
        self.log = service.tmp / f"desk-{self.port}.err"
        cmd = [
            sys.executable,
            "-m",
            "service",
            "desk",
            "--config",
            str(path),
            "--broker",
            service.bootstrap,
            "--port",
            str(self.port),
            "--users",
            str(users),
        ]
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
                cmd, cwd=REPO, env=env, stdout=err, stderr=err, preexec_fn=_die_with_parent
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, bytes]:
        return http(self.url + path)

    def metric(self, name: str, model: str = "m") -> float:
        _, body = self.get("/metrics")
        for line in body.decode().splitlines():
            if line.startswith(f'{name}{{model="{model}"}}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def wait(self, check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            with contextlib.suppress(OSError):
                if check():
                    return
            time.sleep(0.25)
        raise AssertionError(f"desk: timed out waiting for {what}\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def deployment(
    service_factory: Callable[..., Service], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Service, Worker, DeskProcess]]:
    tmp = tmp_path_factory.mktemp("desk")
    users = tmp / "users.json"
    users.write_text(json.dumps({n: hash_password(p) for n, p in PASSWORDS.items()}))
    model = {"algorithm": "dsal", "cost": 0.25, "feature_names": FEATURES, "audit_rate": 0.05}
    desk = {
        "session_key": "s" * 40,
        "lease_seconds": 30,
        "min_time_left_seconds": 0,
        "ack_timeout_seconds": 3,
        "answer_names": {"m": ["fraud", "legitimate"]},
    }
    service = service_factory(models={"m": model}, default_model="m", desk=desk)
    worker = service.start()
    worker.wait_ready()
    rng = np.random.default_rng(7)
    events = [
        {"id": f"ev-{i}", "model": "m", "features": rng.normal(size=3).round(3).tolist()}
        for i in range(40)
    ]
    from faults.kafkaio import produce  # noqa: PLC0415

    produce(
        service.bootstrap,
        service.topics["features"],
        [(e["id"].encode(), json.dumps(e).encode()) for e in events],
    )
    proc = DeskProcess(service, users)
    try:
        proc.wait(lambda: proc.get("/readyz")[0] == 200, "ready")
        proc.wait(lambda: proc.metric("abstain_desk_open_requests") >= 20, "20 open requests")
        yield service, worker, proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_sync.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


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


def model_version(worker: Worker) -> int:
    _, body = worker.get("/readyz")
    return int(json.loads(body)["models"]["m"])


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


def test_answers_typed_on_the_keyboard_are_applied_once_each_and_carry_the_person(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any, kafka_io: KafkaIO
) -> None:
    service, worker, desk = deployment
    before = model_version(worker)
    page = login(browser, desk, "ann")
    assert page.get_by_text("Keyboard:").is_visible()
    assert page.locator("#features tbody tr").first.text_content().startswith("amount")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "labelling.png"), full_page=True)
    seen = []
    for key in ["1", "2", "1"]:
        rid = shown(page)
        seen.append(rid)
        page.keyboard.press(key)
        playwright_sync.expect(page.locator("#rid")).not_to_have_text(rid, timeout=20_000)
    wait_labels(service, kafka_io, 3)
    labels = labels_by(service, kafka_io)
    assert [lab["labelled_by"] for lab in labels] == ["ann"] * 3
    assert [lab["label"] for lab in labels] == [1, -1, 1]
    assert [lab["request_id"][:12] for lab in labels] == seen
    deadline = time.monotonic() + 30
    while model_version(worker) < before + 3 and time.monotonic() < deadline:
        time.sleep(0.3)
    assert model_version(worker) == before + 3
    page.context.close()


def test_two_people_never_see_the_same_request_at_once(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any
) -> None:
    _, _, desk = deployment
    ann, bob = login(browser, desk, "ann"), login(browser, desk, "bob", width=820)
    for _ in range(3):
        a, b = shown(ann), shown(bob)
        assert a != b
        ann.keyboard.press("s")  # ann skips: hers goes back to the queue, not to her
        playwright_sync.expect(ann.locator("#rid")).not_to_have_text(a, timeout=20_000)
        assert shown(ann) != shown(bob)
    bob.screenshot(path=str(SHOTS / "labelling-tablet.png"), full_page=True)
    ann.context.close()
    bob.context.close()


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


def test_the_team_view_shows_the_queue_and_the_people(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any
) -> None:
    _, _, desk = deployment
    page = login(browser, desk, "bob")
    page.goto(desk.url + "/team")
    row = page.locator("#people tbody tr", has_text="ann")
    assert row.count() == 1
    cells = [str(c) for c in row.locator("td").all_text_contents()]
    assert cells[:2] == ["3", "3"]  # answers in the last hour, in the last day
    assert cells[2].endswith(" s")  # median time to answer
    models = page.locator("#models tbody tr", has_text="m")
    assert int(str(models.locator("td").first.text_content())) > 0
    page.screenshot(path=str(SHOTS / "team.png"), full_page=True)
    metrics = desk.get("/metrics")[1].decode()
    assert 'abstain_desk_answers_total{answer="1",model="m"} 2.0' in metrics
    page.context.close()


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
