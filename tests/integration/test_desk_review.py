"""Undo, second opinions and review at the label desk, in a real Chromium (Playwright)
against a real broker, a real worker and desk replicas (``python -m service desk``).

One worker and one desk serve the module (model ``m`` with feature names and display names
for the answers, ``snapshot_key`` set: corrections are signed, reviewer ``rita``); people
``ann``, ``bob``, ``cat`` and ``rita`` log in through the login page. Second opinions are
asked for the answers that train with weight 90 or more only (no share at random, no
contradiction margin): the requests the tests inject ask with probability 0.01 (weight 100,
the cap); the worker's own requests, audited at 5 %, never weigh that much.

What the tests show (the labels and leases topics read back each time):

- a person answers, undoes with ``U`` within the grace period: a withdrawal (``label:
  null``, role author, signed) is on the labels topic, the request comes back on her screen
  and her answer again is a second correction; it is never offered to anyone else;
- a second opinion goes to another person, never to the first, without the first answer;
  the disagreement lands in the review queue, where the reviewer's answer is written as a
  correction with ``role: reviewer``; a reviewer also finds and corrects an older answer;
- after the grace period the author asks for a review (a ``flag`` record on the leases
  topic) and the answer is in the reviewer's queue;
- bad or forged corrections (an unknown request, another person's answer without the
  reviewer role, a label beyond the model's reach, an unsigned correction or a forged flag
  written to the topics) are refused with a reason and write nothing;
- the team view shows the agreement per person and per model, and the charts.

Screenshots go to ``docs/desk/``: ``answers.png`` (the answers list with undo),
``review.png`` (the review page, an answer opened), ``team-agreement.png``.

The model follows every correction exactly: after the undo the model served equals the
replay of the label log without that label, and after the answer again and the reviewer's
corrections it equals the replay of the corrected log (``service.stream.labels.rebuild``
over the topics). The model keeps its last 4 labels within reach of a correction
(``corrections.reach``), so the test of refusals soon finds a label beyond it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from faults.desk import DeskProcess, Person
from faults.kafkaio import Out, produce, produce_records
from faults.workers import REPO

from service.config import load_settings
from service.desk.auth.passwords import hash_password
from service.records import (
    SIGNATURE_HEADER,
    ModelEnvelope,
    Signer,
    parse_model_envelope,
    request_id,
)
from service.stream.kafka.produce import partition_for
from service.stream.labels.rebuild import LogRecord, rebuild_model

playwright_sync = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("ABSTAIN_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

Service = Worker = KafkaIO = Any  # fixtures' types live in conftest.py
SHOTS = REPO / "docs" / "desk"
FEATURES = ["amount", "account_age_days", "foreign_ip"]
PASSWORDS = {
    "ann": "ann-password-1",
    "bob": "bob-password-2",
    "cat": "cat-password-3",
    "rita": "rita-password-4",
}
KEY = "review-snapshot-key-0123456789abcdef"
URGENT = 10.0  # above every request the worker asks
PARTITIONS = 2  # of the label topics (make_config)
REACH = 4  # labels a correction reaches back


def off_loop(call: Callable[[], Any]) -> Any:
    """Run ``call`` in another thread (Playwright's sync API runs an event loop here)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("desk-review") / "users.json"
    path.write_text(json.dumps({n: hash_password(p) for n, p in PASSWORDS.items()}))
    return path


@pytest.fixture(scope="module")
def deployment(
    service_factory: Callable[..., Service], users: Path
) -> Iterator[tuple[Service, Worker, DeskProcess]]:
    model = {
        "algorithm": "dsal",
        "cost": 0.25,
        "feature_names": FEATURES,
        "audit_rate": 0.05,
        "corrections": {"reach": REACH},
    }
    desk = {
        "session_key": "r" * 40,
        "lease_seconds": 30,
        "min_time_left_seconds": 0,
        "answer_names": {"m": ["fraud", "legitimate"]},
        "reviewers": ["rita"],
        "second_opinions": {"share": 0.0, "min_weight": 90.0, "confident_margin": 1e6},
        "leases_topic": f"review-{uuid.uuid4().hex[:8]}.desk-leases",
    }
    service = service_factory(models={"m": model}, default_model="m", desk=desk, snapshot_key=KEY)
    worker = service.start()
    worker.wait_ready()
    proc = DeskProcess(service, users)
    try:
        proc.wait_ready()
        yield service, worker, proc
    finally:
        proc.stop()


def newest(service: Service, kafka_io: KafkaIO) -> ModelEnvelope | None:
    """The newest version of model ``m`` on the models topic."""
    out = None
    for record in off_loop(lambda: kafka_io.read(service.topics["models"])):
        if record.key == b"m" and record.value:
            envelope = parse_model_envelope(record.value, model="m")
            if out is None or envelope.version > out.version:
                out = envelope
    return out


def replayed(service: Service, kafka_io: KafkaIO, *, without: str | None = None) -> ModelEnvelope:
    """The offline replay of the label log (what ``abstain rebuild`` computes), with every
    record about request ``without`` left out (its label and its corrections)."""
    settings = load_settings(service.write_config(), broker=service.bootstrap)

    def records(topic: str) -> list[LogRecord]:
        read = off_loop(lambda: kafka_io.read(topic))
        return [
            LogRecord(
                r.partition,
                r.offset,
                r.timestamp,
                r.value,
                r.key,
                dict(r.headers).get(SIGNATURE_HEADER),
            )
            for r in read
            if r.value and (without is None or without.encode() not in r.value)
        ]

    t = service.topics
    return rebuild_model(settings, "m", records(t["label_requests"]), records(t["labels"])).model


def learned(model: ModelEnvelope | None) -> tuple[Any, ...]:
    """What a model learned, without where and when it was written, as the models topic
    carries it (what a scorer reads)."""
    assert model is not None
    model = model.served()
    return (
        model.pipeline,
        model.learner,
        model.labels_applied,
        model.iw_loss,
        model.iw_weight,
        model.estimate,
    )


def served_after(service: Service, kafka_io: KafkaIO, record: Any) -> ModelEnvelope:
    """The model once it has applied the labels record ``record`` (waits for it)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        model = newest(service, kafka_io)
        if model is not None and model.applied(record.partition, record.offset):
            return model
        time.sleep(0.3)
    raise AssertionError(f"the model never applied labels offset {record.offset}")


def inject(service: Service, *, p: float = 0.5, ttl: float = 900.0) -> str:
    """A label request as the worker writes it, the most urgent of all; its id."""
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
        "query_probability": p,
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


def login(browser: Any, desk: DeskProcess, user: str, *, width: int = 1280) -> Any:
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    page.goto(desk.url + "/")
    page.get_by_label("User name").fill(user)
    page.get_by_label("Password").fill(PASSWORDS[user])
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(desk.url + "/")
    return page


def person(desk: DeskProcess, user: str) -> Person:
    who = Person(desk)
    assert who.login(user, PASSWORDS[user])[0] == 303
    return who


def labels_records(service: Service, kafka_io: KafkaIO) -> list[Any]:
    return list(off_loop(lambda: kafka_io.read(service.topics["labels"])))


def corrections(service: Service, kafka_io: KafkaIO, kind: str = "correction") -> list[Any]:
    return [r for r in labels_records(service, kafka_io) if (r.json() or {}).get("kind") == kind]


def shown(page: Any) -> str:
    return str(page.locator("#rid").text_content())


def wait_shown(page: Any, rid: str, timeout: float = 30.0) -> None:
    """Reload the queue (``R``) until ``rid`` is on the card."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        card = page.locator("#card")
        if card.is_visible() and shown(page) == rid[:12]:
            return
        if not card.is_visible():
            page.keyboard.press("r")
        time.sleep(0.5)
    raise AssertionError(f"{rid[:12]} never shown; on screen: {shown(page)}")


def wait_desk(desk: DeskProcess, check: Callable[[], bool], what: str) -> None:
    desk.wait(check, what, timeout=30)


def press(page: Any, key: str) -> str:
    """Answer the request on the card with ``key``; its id, once the page moved on."""
    playwright_sync.expect(page.locator("#card")).to_be_visible(timeout=20_000)
    done = shown(page)
    page.keyboard.press(key)
    page.wait_for_function(
        "id => document.getElementById('card').hidden || "
        "document.getElementById('rid').textContent !== id",
        arg=done,
        timeout=20_000,
    )
    return done


def test_an_answer_undone_with_the_keyboard_comes_back_and_is_answered_again(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any, kafka_io: KafkaIO
) -> None:
    service, _, desk = deployment
    injected = [inject(service) for _ in range(4)]
    wait_desk(desk, lambda: desk.open_requests() >= 4, "the injected requests")
    page = login(browser, desk, "ann")
    answered = [press(page, key) for key in ("1", "2", "1")]  # the most urgent first
    assert answered == [r[:12] for r in injected[:3]]
    playwright_sync.expect(page.locator("#rid")).to_have_text(injected[3][:12])
    mine = page.locator("#mine-list tbody tr")
    playwright_sync.expect(mine).to_have_count(3, timeout=20_000)
    assert [str(t) for t in mine.locator("th").all_text_contents()] == answered[::-1]
    undo = mine.first.get_by_role("button", name="Undo your answer to")
    playwright_sync.expect(undo).to_be_visible()
    assert "undo your last answer" in str(page.locator("#keys").text_content())
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "answers.png"), full_page=True)
    last = answered[-1]
    page.keyboard.press("u")
    playwright_sync.expect(page.locator("#card")).to_be_visible(timeout=20_000)
    playwright_sync.expect(page.locator("#rid")).to_have_text(last, timeout=20_000)
    playwright_sync.expect(page.locator("#mode")).to_contain_text("You withdrew")
    (withdrawal,) = corrections(service, kafka_io)
    body = withdrawal.json()
    assert (body["label"], body["labelled_by"], body["role"]) == (None, "ann", "author")
    assert body["request_id"] == injected[2]
    signature = dict(withdrawal.headers)[SIGNATURE_HEADER]
    assert Signer(KEY.encode()).verify(withdrawal.key, withdrawal.value, signature) is None
    playwright_sync.expect(mine.first).to_contain_text("Withdrawn", timeout=20_000)
    # the model is the replay of the log without that label
    model = served_after(service, kafka_io, withdrawal)
    assert learned(model) == learned(replayed(service, kafka_io, without=injected[2]))
    page.keyboard.press("2")  # answered again: legitimate
    playwright_sync.expect(mine.first).to_contain_text("Changed to legitimate", timeout=20_000)
    _, again = corrections(service, kafka_io)
    assert (again.json()["label"], again.json()["role"]) == (-1, "author")
    assert again.json()["request_id"] == injected[2]
    # the label came back at its place with the new answer: the replay of the log
    model = served_after(service, kafka_io, again)
    assert learned(model) == learned(replayed(service, kafka_io))
    # back to the request she holds; the withdrawn one did not reopen: nobody else is
    # offered it (nor the one she holds)
    playwright_sync.expect(page.locator("#rid")).to_have_text(injected[3][:12])
    bob = person(desk, "bob")
    assert {bob.next() for _ in range(3)} == {None}
    page.keyboard.press("s")  # (gives the one she holds back)
    page.context.close()


def test_a_second_opinion_goes_to_someone_else_and_a_disagreement_to_the_reviewer(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any, kafka_io: KafkaIO
) -> None:
    service, _, desk = deployment
    old = inject(service)
    heavy = inject(service, p=0.01)
    wait_desk(desk, lambda: desk.open_requests() >= 2, "the injected requests")
    ann = person(desk, "ann")
    for rid in (old, heavy):
        assert ann.next() == rid
        assert ann.api("/api/answer", {"request_id": rid, "label": 1})[0] == 200
    for _ in range(3):  # never to her
        assert ann.next() is None
    page = login(browser, desk, "bob")
    wait_shown(page, heavy)
    playwright_sync.expect(page.locator("#mode")).to_contain_text("Second opinion")
    card = page.locator("#card").inner_text()
    assert "ann" not in card
    assert "fraud (" not in card  # her answer is nowhere on it
    press(page, "2")  # legitimate: he disagrees
    (opinion,) = off_loop(
        lambda: kafka_io.wait_for(
            service.topics["labels"],
            lambda rs: [r for r in rs if (r.json() or {}).get("kind") == "opinion"],
        )
    )[-1:]
    assert (opinion.json()["labelled_by"], opinion.json()["label"]) == ("bob", -1)
    assert opinion.json()["request_id"] == heavy
    rita = login(browser, desk, "rita")
    rita.goto(desk.url + "/review")
    playwright_sync.expect(rita.locator("#queue tbody")).to_contain_text(heavy[:12])
    rita.get_by_role("link", name=heavy[:12]).click()
    playwright_sync.expect(rita.locator("#item")).to_have_attribute("data-request", heavy)
    playwright_sync.expect(rita.locator("#item-steps")).to_contain_text(
        "bob second opinion: legitimate"
    )
    playwright_sync.expect(rita.locator('[data-review="1"]')).to_be_focused()  # (review.js)
    rita.screenshot(path=str(SHOTS / "review.png"), full_page=True)
    rita.keyboard.press("2")
    playwright_sync.expect(rita.locator("#status")).to_contain_text(
        f"{heavy[:12]} corrected", timeout=20_000
    )
    decision = corrections(service, kafka_io)[-1].json()
    assert (
        decision["request_id"],
        decision["role"],
        decision["labelled_by"],
        decision["label"],
    ) == (heavy, "reviewer", "rita", -1)
    playwright_sync.expect(rita.locator("#queue tbody")).not_to_contain_text(heavy[:12])
    # an older answer of anyone, found by who gave it
    rita.goto(desk.url + "/review?person=ann")
    rita.locator("#found").get_by_role("link", name=old[:12]).click()
    playwright_sync.expect(rita.locator("#item")).to_have_attribute("data-request", old)
    playwright_sync.expect(rita.locator('[data-review="1"]')).to_be_focused()  # (review.js)
    rita.keyboard.press("2")
    playwright_sync.expect(rita.locator("#status")).to_contain_text(
        f"{old[:12]} corrected", timeout=20_000
    )
    record = corrections(service, kafka_io)[-1]
    decision = record.json()
    assert (decision["request_id"], decision["role"], decision["label"]) == (old, "reviewer", -1)
    # the older label corrected: the model is the replay of the corrected log
    model = served_after(service, kafka_io, record)
    assert learned(model) == learned(replayed(service, kafka_io))
    assert learned(model) != learned(replayed(service, kafka_io, without=old))
    rita.context.close()
    page.context.close()


def test_after_the_grace_period_an_author_asks_for_a_review(
    deployment: tuple[Service, Worker, DeskProcess],
    users: Path,
    browser: Any,
    kafka_io: KafkaIO,
) -> None:
    service, _, desk = deployment
    quick = DeskProcess(service, users, undo_seconds=3).wait_ready()  # a replica of its own
    try:
        rid = inject(service)
        wait_desk(quick, lambda: quick.open_requests() >= 1, "the injected request")
        cat = person(quick, "cat")
        assert cat.next() == rid
        assert cat.api("/api/answer", {"request_id": rid, "label": 1})[0] == 200
        time.sleep(3.5)  # the grace period of this replica is over
        page = login(browser, quick, "cat")
        row = page.locator("#mine-list tbody tr").first
        playwright_sync.expect(row).to_contain_text(rid[:12], timeout=20_000)
        ask = row.get_by_role("button", name="Ask a reviewer to look at")
        playwright_sync.expect(ask).to_be_visible(timeout=20_000)
        assert row.get_by_role("button", name="Undo your answer to").count() == 0
        ask.click()
        playwright_sync.expect(row).to_contain_text("Under review (you asked)", timeout=20_000)
        leases = off_loop(lambda: kafka_io.read(service.config["desk"]["leases_topic"]))
        flags = [r.json() for r in leases if r.json().get("kind") == "flag"]
        assert [(f["request_id"], f["holder"]) for f in flags] == [(rid, "cat")]
        rita = person(desk, "rita")  # on the other replica
        status, page_text, _ = rita.request("/review")
        assert status == 200
        assert rid[:12].encode() in page_text.split(b'id="queue"')[1].split(b"</table>")[0]
        page.context.close()
    finally:
        quick.stop()


def beyond_reach(service: Service, kafka_io: KafkaIO, offset: int) -> bool:
    """The model's newest snapshot has learned the label at ``offset`` and can no longer
    correct it."""
    model = newest(service, kafka_io)
    return (
        model is not None
        and model.labels_offset >= offset
        and (model.corrections_from < 0 or model.corrections_from > offset)
    )


def test_bad_or_forged_corrections_are_refused_with_a_reason_and_write_nothing(
    deployment: tuple[Service, Worker, DeskProcess], kafka_io: KafkaIO
) -> None:
    service, _, desk = deployment
    ann, bob = person(desk, "ann"), person(desk, "bob")
    rid = inject(service)
    wait_desk(desk, lambda: ann.next() == rid, "the injected request")
    assert ann.api("/api/answer", {"request_id": rid, "label": 1})[0] == 200
    before = len(corrections(service, kafka_io))
    refused = [
        (bob, "/api/undo", {"request_id": rid}, 403, "not_author"),
        (bob, "/api/correct", {"request_id": rid, "label": -1}, 403, "not_author"),
        (bob, "/api/review", {"request_id": rid, "label": -1}, 403, "not_reviewer"),
        (ann, "/api/undo", {"request_id": "f" * 32}, 404, "unknown_request"),
        (ann, "/api/correct", {"request_id": rid, "label": 7}, 400, "bad_answer"),
        (ann, "/api/opinion", {"request_id": rid, "label": -1}, 403, "own_answer"),
    ]
    for who, path, body, status, code in refused:
        got, answer = who.api(path, body)
        assert (got, answer.get("error")) == (status, code), (path, answer)
        assert answer["message"]
    # the learner learns the label, then more labels (bob's) until the label is beyond the
    # model's reach (REACH labels back)
    (label,) = [
        r
        for r in labels_records(service, kafka_io)
        if (r.json() or {}).get("request_id") == rid and "kind" not in r.json()
    ]
    deadline = time.monotonic() + 90
    while not beyond_reach(service, kafka_io, label.offset):
        assert time.monotonic() < deadline, "the label never left the model's reach"
        inject(service)
        given: list[str] = []  # he answers whatever the desk gives him (the most urgent)
        wait_desk(
            desk,
            lambda: bool(given.append(bob.next() or "") or given[-1]),  # noqa: B023
            "another request",
        )
        assert bob.api("/api/answer", {"request_id": given[-1], "label": 1})[0] == 200

    def settled() -> bool:  # the desk has read that snapshot too
        rows = ann.api("/api/mine", {})[1]["answers"]
        return [a["actions"] for a in rows if a["request_id"] == rid] == [[]]

    wait_desk(desk, settled, "the desk to read the snapshot")
    got, answer = ann.api("/api/undo", {"request_id": rid})
    assert (got, answer["error"]) == (410, "beyond_reach"), answer
    assert "can no longer change it" in answer["message"]
    # forged on the topics: an unsigned correction of her answer, a flag by someone else
    skipped = {
        t: desk.sample(f'abstain_desk_records_skipped_total{{topic="{t}"}}')
        for t in ("labels", "leases")
    }
    forged = {
        "kind": "correction",
        "request_id": rid,
        "model": "m",
        "label": -1,
        "labelled_by": "ann",
        "role": "author",
        "ts": time.time(),
    }
    part = partition_for(b"m", PARTITIONS)
    off_loop(
        lambda: produce_records(
            service.bootstrap,
            service.topics["labels"],
            [Out(b"m", json.dumps(forged).encode(), part)],
        )
    )
    flag = {"request_id": rid, "kind": "flag", "holder": "bob", "at": time.time()}
    leases = service.config["desk"]["leases_topic"]
    off_loop(
        lambda: produce_records(
            service.bootstrap, leases, [Out(rid.encode(), json.dumps(flag).encode(), 0)]
        )
    )
    for topic in ("labels", "leases"):
        wait_desk(
            desk,
            lambda topic=topic: (
                desk.sample(f'abstain_desk_records_skipped_total{{topic="{topic}"}}')
                > skipped[topic]
            ),
            f"the forged record on {topic} skipped",
        )
    status, mine = ann.api("/api/mine", {})
    (row,) = [a for a in mine["answers"] if a["request_id"] == rid]
    assert (row["label"], row["actions"]) == (1, [])
    assert row["status"] == "Saved · too old to change"
    assert len(corrections(service, kafka_io)) == before + 1  # the forged one: the desk wrote none
    rita = person(desk, "rita")
    _, page, _ = rita.request("/review")
    assert rid[:12].encode() not in page.split(b'id="queue"')[1].split(b"</table>")[0]


def test_the_team_view_shows_agreement_and_charts(
    deployment: tuple[Service, Worker, DeskProcess], browser: Any
) -> None:
    service, _, desk = deployment
    waiting = [inject(service, ttl=3600) for _ in range(5)]  # open: the queue's chart
    wait_desk(desk, lambda: desk.open_requests() >= len(waiting), "the injected requests")
    cat = person(desk, "cat")
    desk.wait(
        lambda: f"now {desk.open_requests()},".encode() in cat.request("/team")[1],
        "the charts of the next tick",
    )
    page = login(browser, desk, "bob")
    page.goto(desk.url + "/team")
    table = page.locator("#agreement")
    ann = table.locator("tbody tr", has_text="ann")
    cells = [str(c) for c in ann.locator("td").all_text_contents()]
    assert int(cells[0]) >= 5  # her answers
    assert cells[2].startswith("0 / 1")  # bob's second opinion differed from her answer
    assert cells[3].startswith("0 / 2")  # both reviewed answers of hers were corrected
    bob = [
        str(c) for c in table.locator("tbody tr", has_text="bob").locator("td").all_text_contents()
    ]
    assert bob[1] == "1"  # one second opinion given
    quality = page.locator("#quality tbody tr", has_text="m")
    assert quality.locator("svg.spark").count() == 2
    assert "open requests of m" in str(quality.locator("svg title").first.text_content())
    corrected = str(quality.locator("td").nth(1).text_content())
    assert corrected.startswith("3 / ")  # withdrawn-and-changed, and two by rita
    page.locator("#agreement").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "team-agreement.png"), full_page=True)
    metrics = desk.get("/metrics")[1].decode()
    assert 'abstain_desk_corrections_total{kind="undo",model="m"} 1.0' in metrics
    assert 'abstain_desk_second_opinions_total{model="m",outcome="disagree"} 1.0' in metrics
    assert 'abstain_desk_reviews_total{model="m",outcome="corrected"} 2.0' in metrics
    page.context.close()
