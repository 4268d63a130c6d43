"""The label desk's trust boundaries on a real broker, with a real worker and desk replicas
(``python -m service desk``), written to as an attacker and an unlucky operator would:

- a forged claim on the leases topic (a lease "until" years away) holds its request for
  ``lease_seconds`` from its record's time, no longer: then another person gets it, on the
  replica that read the claim and on one started afterwards;
- forged records of the learner's pending changelog (a model that is not configured, the
  wrong width, a request the learner never read) are never offered, nobody gets a 500, and
  a label written with the wrong key (which the learner dead-letters) leaves its request
  open at the desk, where a person answers it and the learner applies that answer;
- every bad body (a 3,000-deep JSON document, bytes that are not UTF-8, a form that is no
  form) is a 4xx, and the desk serves on;
- a logout on one replica ends the session on every replica, one restarted afterwards
  included;
- a login flood is answered 429 with the wait (also when the flood claims other addresses
  in ``X-Forwarded-For``, which only a trusted proxy may set) while a signed-in person
  works on; behind a proxy, the person the proxy names is believed from the proxy only.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from faults.desk import FORM, DeskProcess, Person
from faults.kafkaio import Out, produce_records

from service.desk.auth.passwords import hash_password
from service.records import Label, LabelRequest, PendingEntry, request_id
from service.stream.kafka.produce import partition_for

Service = Worker = KafkaIO = Any  # fixtures' types live in conftest.py
PASSWORDS = {"ann": "ann-password-1", "bob": "bob-password-2", "cat": "cat-password-3"}
LEASE = 8.0  # desk.lease_seconds of this module's replicas
PARTITIONS = 2  # of the label topics (make_config)


@pytest.fixture(scope="module")
def users(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("desk-trust") / "users.json"
    path.write_text(json.dumps({n: hash_password(p) for n, p in PASSWORDS.items()}))
    return path


@pytest.fixture(scope="module")
def deployment(service_factory: Callable[..., Service]) -> tuple[Service, Worker]:
    run = uuid.uuid4().hex[:8]
    desk = {  # (settings every version of the desk takes: its own topics are per run)
        "session_key": "t" * 40,
        "lease_seconds": LEASE,
        "min_time_left_seconds": 0,
        "leases_topic": f"trust-{run}.desk-leases",
    }
    service = service_factory(desk=desk, default_model="m")
    worker = service.start()
    worker.wait_ready()
    return service, worker


def start_desk(service: Service, users: Path, **desk: Any) -> DeskProcess:
    return DeskProcess(service, users, **desk).wait_ready()


@pytest.fixture
def desks(deployment: tuple[Service, Worker], users: Path) -> Iterator[Callable[..., DeskProcess]]:
    """Start desk replicas for one test; all stopped (by PID) after it."""
    started: list[DeskProcess] = []

    def start(**desk: Any) -> DeskProcess:
        proc = start_desk(deployment[0], users, **desk)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def signed_in(desk: DeskProcess, user: str) -> Person:
    person = Person(desk)
    status, body, _ = person.login(user, PASSWORDS[user])
    assert status == 303, body[:300]
    return person


def request_record(
    event: str, *, priority: float, ttl: float = 600.0, n: int = 3, model: str = "m"
) -> LabelRequest:
    now = time.time()
    return LabelRequest(
        request_id(model, event),
        event,
        model,
        [0.5, -1.0, 2.0, 1.0, 1.0][:n],
        0.1,
        1.0,
        0,
        0.5,
        0,
        now,
        now + ttl,
        priority,
    )


def ask(service: Service, *requests: LabelRequest) -> None:
    """Write well-formed label requests as the worker does (key = model, its partition)."""
    produce_records(
        service.bootstrap,
        service.topics["label_requests"],
        [
            Out(r.model.encode(), r.to_json(), partition_for(r.model.encode(), PARTITIONS))
            for r in requests
        ],
    )


def forged_claim(service: Service, rid: str, *, holder: str = "mallory") -> None:
    """A claim on the leases topic that says it lasts ten years."""
    now = time.time()
    decade = 10 * 365 * 86400.0
    record = {
        "request_id": rid,
        "kind": "claim",
        "holder": holder,
        "at": now,
        "expires_at": now + decade,
        "attempt": None,
        "replica": "forger",
    }
    produce_records(
        service.bootstrap,
        service.config["desk"]["leases_topic"],
        [Out(rid.encode(), json.dumps(record).encode(), 0)],
    )


def test_a_forged_claim_holds_its_request_for_lease_seconds_only_also_after_a_restart(
    deployment: tuple[Service, Worker], desks: Callable[..., DeskProcess]
) -> None:
    service, _ = deployment
    first = desks()
    tag = uuid.uuid4().hex[:6]
    a = request_record(f"lease-a-{tag}", priority=101.0)
    b = request_record(f"lease-b-{tag}", priority=100.0)
    ask(service, a, b)
    first.wait(lambda: first.open_requests() >= 2, "the two requests")
    forged_claim(service, a.request_id)
    forged_claim(service, b.request_id)
    claimed = time.monotonic()
    first.wait(lambda: first.sample("abstain_desk_active_leases") >= 2, "the forged claims")
    ann = signed_in(first, "ann")
    if time.monotonic() - claimed < LEASE - 1.0:  # (asked while the claims still ran)
        assert ann.next() is None  # honoured while they run: nobody gets those two
    time.sleep(max(0.0, claimed + LEASE + 1.0 - time.monotonic()))
    restarted = desks()  # reads the topics from their beginning, the forged claims too
    bob = signed_in(restarted, "bob")
    cat = signed_in(first, "cat")
    got = {bob.next(), cat.next()}
    assert got == {a.request_id, b.request_id}, "a forged claim still holds its request"


def pending_record(entry: PendingEntry, partition: int) -> Out:
    return Out(entry.request_id.encode(), entry.to_json(), partition)


def test_records_the_learner_refuses_are_not_offered_and_a_wrongly_keyed_label_closes_nothing(
    deployment: tuple[Service, Worker], desks: Callable[..., DeskProcess], kafka_io: KafkaIO
) -> None:
    service, worker = deployment
    desk = desks()
    tag = uuid.uuid4().hex[:6]
    m = partition_for(b"m", PARTITIONS)
    ghost = PendingEntry(request_record(f"ghost-{tag}", priority=300.0, model="ghost"), m)
    wide = PendingEntry(request_record(f"wide-{tag}", priority=299.0, n=5), m)
    unread = PendingEntry(request_record(f"unread-{tag}", priority=298.0), m)
    real = request_record(f"real-{tag}", priority=200.0)
    produce_records(
        service.bootstrap,
        service.changelog("pending"),
        [
            pending_record(ghost, m),
            pending_record(wide, m),
            pending_record(unread, m),
            Out(b"\xff\xfe", unread.to_json(), m),
            Out(b"x" * 32, b"[" * 3000 + b"]" * 3000, m),
        ],
    )
    ask(service, real)
    wrong_key = Label(real.request_id, "m", 1, "mallory", time.time())
    produce_records(
        service.bootstrap, service.topics["labels"], [Out(b"boom", wrong_key.to_json(), m)]
    )
    # the learner dead-letters that label (bad_key): the request stays open there
    kafka_io.wait_for(
        service.topics["dead_letters"],
        lambda rs: any(
            r.json()["reason"] == "bad_key" and real.request_id in r.json()["raw"] for r in rs
        ),
    )
    desk.wait(lambda: desk.open_requests() >= 1, "the real request")
    time.sleep(2.0)  # the desk has read the label too by now (it reads every topic at once)
    before = json.loads(worker.get("/readyz")[1])["models"]["m"]
    ann = signed_in(desk, "ann")
    assert ann.next() == real.request_id  # neither forged entry, and not closed by the label
    status, body = ann.api("/api/answer", {"request_id": real.request_id, "label": -1})
    assert (status, body.get("saved")) == (200, True), body
    deadline = time.monotonic() + 60
    while json.loads(worker.get("/readyz")[1])["models"]["m"] <= before:  # applied
        assert time.monotonic() < deadline, "the saved answer was never applied"
        time.sleep(0.3)
    for _ in range(3):  # nothing the learner would not take is offered after it
        got = ann.next()
        assert got not in (ghost.request_id, wide.request_id, unread.request_id)
        if got is None:
            break
        ann.api("/api/skip", {"request_id": got, "why": "skip"})
    assert desk.sample('abstain_desk_records_skipped_total{topic="pending_changelog"}') >= 4
    assert desk.sample('abstain_desk_records_skipped_total{topic="labels"}') >= 1


BAD_BODIES = [
    b"[" * 3000 + b"]" * 3000,
    b'{"a":' * 3000 + b"1" + b"}" * 3000,
    b"{" * 60_000,
    b"\xff\xfe\xfd",
    b"",
    b'{"request_id": "x", "label": 1e999}',
    b"x" * 70_000,
]


def test_every_bad_body_is_a_4xx_and_the_desk_serves_on(
    deployment: tuple[Service, Worker], desks: Callable[..., DeskProcess]
) -> None:
    desk = desks()
    ann = signed_in(desk, "ann")
    statuses = {}
    for path in ("/api/next", "/api/renew", "/api/answer", "/api/skip"):
        for i, body in enumerate(BAD_BODIES):
            statuses[(path, i)] = ann.api(path, body)[0]
    forms = [
        ("multipart/form-data; boundary=x", b"--x\r\nbroken"),
        (FORM, b"user=%ff%fe&\xff"),
        ("text/plain", b"user=ann"),
        (FORM, b"[" * 3000),
    ]
    for path in ("/login", "/logout"):
        for i, (kind, body) in enumerate(forms):
            statuses[(path, i)] = ann.request(path, body, {"Content-Type": kind})[0]
    bad = {where: status for where, status in statuses.items() if not 400 <= status < 500}
    assert bad == {}, bad
    assert desk.get("/healthz")[0] == 200
    assert ann.page() == 200  # still signed in: nothing above logged anyone out


def test_a_logout_ends_the_session_on_every_replica_one_started_later_included(
    deployment: tuple[Service, Worker], desks: Callable[..., DeskProcess]
) -> None:
    one, two = desks(), desks()
    ann = signed_in(one, "ann")
    cookie = {"Cookie": "; ".join(f"{c.name}={c.value}" for c in ann.jar)}

    def page(desk: DeskProcess) -> int:  # 200, or 303 to the login page
        return Person(desk, cookie).request("/")[0]

    assert page(two) == 200  # any replica honours the session
    assert ann.logout() == 303
    assert page(one) == 303
    two.wait(lambda: page(two) == 303, "the logout on the other replica", timeout=15)
    api = Person(two, {**cookie, "Content-Type": "application/json"}).request("/api/next", b"{}")
    assert api[0] == 401
    three = desks()  # started after the logout: reads it before it is ready
    assert page(three) == 303


def flood(desk: DeskProcess, guesses: list[tuple[str, str]]) -> list[tuple[int, str | None]]:
    """Wrong passwords for ``(user, X-Forwarded-For)``, all sent at once (each from a login
    form of its own); ``(status, Retry-After)`` of each."""
    people = [Person(desk) for _ in guesses]
    forms = []
    for person, (user, _) in zip(people, guesses, strict=True):
        _, page, _ = person.request("/login")
        token = re.search(rb'name="token" value="([^"]+)"', page)
        assert token is not None
        forms.append(
            urllib.parse.urlencode(
                {"user": user, "password": "not-the-password", "token": token.group(1).decode()}
            ).encode()
        )

    def post(i: int) -> tuple[int, str | None]:
        headers = {"Content-Type": FORM, "X-Forwarded-For": guesses[i][1]}
        status, _, got = people[i].request("/login", forms[i], headers)
        return status, got.get("Retry-After")

    with ThreadPoolExecutor(len(guesses)) as pool:
        return list(pool.map(post, range(len(guesses))))


def test_a_login_flood_is_throttled_per_address_and_per_account(
    deployment: tuple[Service, Worker], desks: Callable[..., DeskProcess]
) -> None:
    # a desk that trusts no proxy: X-Forwarded-For is the client's own word, and twelve
    # accounts tried "from twelve addresses" are twelve guesses from one address
    direct = desks()
    bob = signed_in(direct, "bob")
    got = flood(direct, [(f"user{i}", f"198.51.100.{i}") for i in range(12)])
    assert sorted(status for status, _ in got) == [401] * 5 + [429] * 7
    assert all(int(wait or 0) >= 1 for status, wait in got if status == 429)
    assert bob.page() == 200  # the signed-in person works on
    assert bob.api("/api/next", {})[0] == 200
    assert direct.sample('abstain_desk_logins_total{outcome="throttled"}') == 7
    # behind a trusted proxy the addresses are believed: one account from twelve addresses
    # is still one account, and other people from other addresses sign in meanwhile
    proxied = desks(trusted_proxies=["127.0.0.1"])
    got = flood(proxied, [("ann", f"198.51.100.{i}") for i in range(12)])
    assert sorted(status for status, _ in got) == [401] * 5 + [429] * 7
    status, _, _ = Person(proxied).login(
        "cat", PASSWORDS["cat"], {"X-Forwarded-For": "203.0.113.5"}
    )
    assert status == 303


def test_behind_a_proxy_the_person_is_believed_from_the_proxy_only(
    deployment: tuple[Service, Worker], desks: Callable[..., DeskProcess]
) -> None:
    elsewhere = desks(auth="proxy", trusted_proxies=["192.0.2.10"])
    via = desks(auth="proxy", trusted_proxies=["127.0.0.1"])
    names = {"X-Forwarded-User": "ann"}
    assert elsewhere.get("/", names)[0] == 401  # this client is not the proxy
    person = Person(via, names)
    assert person.page() == 200
    _, page, _ = person.request("/")
    assert b'<strong id="who">ann</strong>' in page
