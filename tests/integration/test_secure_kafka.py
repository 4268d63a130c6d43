"""abstain against a secured Kafka, as a managed cluster runs: TLS on the wire, SCRAM-SHA-512
logins, ACLs enforced by KRaft's StandardAuthorizer (``LocalKafka(secure=True)``, the code
of ``abstain kafka start --secure``), each part of abstain logged in as its own principal
with exactly the ACLs ``abstain kafka acls --role ... --apply`` sets:

- the whole loop: events -> decisions -> label requests -> an answer at the desk -> a new
  model version that every worker serves;
- the desk's principal writing to the models topic gets Kafka's authorisation error, and
  nothing changes (a second line behind the snapshot signatures);
- a wrong password or an untrusted certificate stops the worker at start-up within 10 s,
  with a message that names the setting and never the secret;
- TLS host-name verification is on unless turned off explicitly.

The test harness itself (producing events, reading decisions) logs in as the super user.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError
from faults.desk import DeskProcess, Person
from faults.workers import REPO, Deployment, WorkerProcess, service_config, wait_until

from service.config import Settings, load_settings
from service.desk.auth.passwords import hash_password
from service.localkafka import LocalKafka, StartError, find_free_ports
from service.localkafka.secure import ADMIN_USER, ROLE_USERS, make_tls
from service.stream.errors import KafkaLoginError
from service.stream.kafka.clients import read_topic
from service.stream.kafka.login import check_login

PERSON, PERSON_PASSWORD = "ann", "ann-password-1"


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A secure single-node broker on free ports, for this module."""
    data_dir = tmp_path_factory.mktemp("secure-kafka")
    for attempt in range(3):
        port, controller = find_free_ports(2)
        kafka = LocalKafka(
            port=port,
            controller_port=controller,
            data_dir=data_dir,
            secure=True,
            die_with_parent=True,
        )
        try:
            kafka.start()
            break
        except StartError as exc:
            if attempt == 2 or "in use" not in str(exc):
                raise
    try:
        yield kafka
    finally:
        kafka.stop()


def security_of(kafka: LocalKafka, user: str) -> dict[str, Any]:
    return dict(json.loads(kafka.settings_file(user).read_text())["security"])


def cli(*args: str, config: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    return subprocess.run(  # noqa: S603 - fixed argv
        [sys.executable, "-m", "service", *args, "--config", str(config)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def deployment(
    secure_kafka: LocalKafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Two workers (principal abstain-worker) and a desk (abstain-desk) of one fresh app id,
    every role's ACLs set by ``abstain kafka acls --apply`` as the super user."""
    tmp = tmp_path_factory.mktemp("secure-svc")
    # two label partitions for two workers: the learner's consumer does not set an assignor,
    # and aiokafka's default (round robin) splits one partition of each label topic between
    # two members (the label and its request would meet on no worker)
    config = service_config(
        tmp,
        partitions={"features": 2, "decisions": 1, "labels": 2, "models": 1},
        models={"m": {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.5}},
        desk={
            "session_key": "s" * 40,
            "min_time_left_seconds": 0,
            "leases_topic": f"{tmp.name}.desk-leases",
            "revocations_topic": f"{tmp.name}.desk-revocations",
        },
    )
    config["app_id"] = f"secure-{tmp.name[-6:]}"
    config["broker"] = [secure_kafka.bootstrap]
    roles = {
        role: {**config, "security": security_of(secure_kafka, user)}
        for role, user in {**ROLE_USERS, "admin": ADMIN_USER}.items()
    }
    paths = {}
    for role, conf in roles.items():
        paths[role] = tmp / f"{role}.json"
        paths[role].write_text(json.dumps(conf))
    for role in ROLE_USERS:
        done = cli("kafka", "acls", "--role", role, "--apply", config=paths["admin"])
        assert done.returncode == 0, done.stderr
    workers = Deployment(secure_kafka.bootstrap, tmp / "w", roles["worker"])
    (tmp / "w").mkdir()
    users = tmp / "users.json"
    users.write_text(json.dumps({PERSON: hash_password(PERSON_PASSWORD)}))
    desk_side = Deployment(secure_kafka.bootstrap, tmp / "d", roles["desk"])
    (tmp / "d").mkdir()
    started: list[DeskProcess] = []
    try:
        first = workers.start()
        first.wait_ready()
        second = workers.start()
        second.wait_ready()
        desk = DeskProcess(desk_side, users)
        started.append(desk)
        desk.wait_ready()
        yield {
            "workers": [first, second],
            "desk": desk,
            "paths": paths,
            "settings": {r: load_settings(p) for r, p in paths.items()},
        }
    finally:
        for proc in started:
            proc.stop()
        workers.close()


def served_version(worker: WorkerProcess) -> int:
    status, body = worker.get("/readyz")
    return int(json.loads(body)["models"]["m"]) if status == 200 else -1


def test_the_whole_loop_runs_with_each_part_logged_in_as_its_own_least_privilege_principal(
    deployment: dict[str, Any],
) -> None:
    admin: Settings = deployment["settings"]["admin"]
    workers: list[WorkerProcess] = deployment["workers"]
    before = [served_version(w) for w in workers]

    async def events() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=admin.bootstrap_servers,
            acks="all",
            **admin.security.aiokafka_kwargs(),
        )
        await producer.start()
        try:
            for i in range(20):
                event = {"id": f"e{i}", "model": "m", "features": [1.0, -0.5, 0.25 * i]}
                await producer.send_and_wait(
                    admin.topics.features, json.dumps(event).encode(), key=f"e{i}".encode()
                )
        finally:
            await producer.stop()

    asyncio.run(events())
    decisions = wait_for_records(admin, admin.topics.decisions, 20)
    assert {json.loads(r.value)["id"] for r in decisions} >= {f"e{i}" for i in range(20)}
    wait_for_records(admin, admin.topics.label_requests, 1)

    person = Person(deployment["desk"])
    status, body, _ = person.login(PERSON, PERSON_PASSWORD)
    assert status == 303, body[:300]
    rid = None
    deadline = time.monotonic() + 60
    while rid is None and time.monotonic() < deadline:
        rid = person.next("m")
        time.sleep(0.3)
    assert rid is not None, "the desk never offered the worker's label request"
    assert person.api("/api/answer", {"request_id": rid, "label": 1})[0] == 200

    try:
        wait_until(
            lambda: all(served_version(w) > b for w, b in zip(workers, before, strict=True)),
            60,
            "every worker serving the new model version",
        )
    except Exception as exc:
        dead = [r.value[:300] for r in asyncio.run(read_topic(admin, admin.topics.dead_letters))]
        labels = [r.value[:300] for r in asyncio.run(read_topic(admin, admin.topics.labels))]
        models = [r.value[:200] for r in asyncio.run(read_topic(admin, admin.topics.models))]
        seen = [
            [
                line
                for line in w.get("/metrics")[1].decode().splitlines()
                if "label" in line and not line.startswith("#") and not line.endswith(" 0.0")
            ]
            for w in workers
        ]
        raise AssertionError(
            f"{exc}; labels {labels}; dead letters {dead}; models {models}; workers {seen}"
        ) from None

    done = cli("labels", "list", config=deployment["paths"]["operator"])
    assert done.returncode == 0, done.stderr  # the operator's principal reads the label topics


def wait_for_records(settings: Settings, topic: str, count: int, timeout: float = 60) -> list[Any]:
    deadline = time.monotonic() + timeout
    records: list[Any] = []
    while time.monotonic() < deadline:
        records = asyncio.run(read_topic(settings, topic))
        if len(records) >= count:
            return records
        time.sleep(0.5)
    raise AssertionError(f"{topic}: {len(records)} records, wanted {count}")


def test_the_desk_principal_cannot_write_the_models_topic(deployment: dict[str, Any]) -> None:
    desk: Settings = deployment["settings"]["desk"]
    admin: Settings = deployment["settings"]["admin"]
    before = asyncio.run(read_topic(admin, admin.topics.models))
    served = [served_version(w) for w in deployment["workers"]]

    async def forge() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=desk.bootstrap_servers, **desk.security.aiokafka_kwargs()
        )
        await producer.start()
        try:
            await producer.send_and_wait(desk.topics.models, b'{"forged": true}', key=b"m")
        finally:
            await producer.stop()

    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(forge())
    after = asyncio.run(read_topic(admin, admin.topics.models))
    assert [(r.offset, r.value) for r in after] == [(r.offset, r.value) for r in before]
    assert [served_version(w) for w in deployment["workers"]] == served


def start_worker(config: dict[str, Any], tmp: Path) -> tuple[int, float, str]:
    """Run ``abstain worker`` with ``config`` until it exits (at most 20 s): its exit code,
    how long it ran and what it wrote."""
    path = tmp / "config.json"
    path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    cmd = [
        sys.executable,
        "-m",
        "service",
        "worker",
        "--config",
        str(path),
        "--web-port",
        str(find_free_ports(1)[0]),
    ]
    began = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,  # noqa: S603
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return proc.returncode, time.monotonic() - began, out.decode(errors="replace")


def worker_config(kafka: LocalKafka, tmp: Path, **security: Any) -> dict[str, Any]:
    config = {**service_config(tmp), "broker": [kafka.bootstrap]}
    config["security"] = {**security_of(kafka, ROLE_USERS["worker"]), **security}
    return config


def test_a_wrong_password_stops_the_worker_at_start_naming_the_setting_not_the_secret(
    secure_kafka: LocalKafka, tmp_path: Path
) -> None:
    secret = "not-the-password-" + os.urandom(6).hex()
    code, took, out = start_worker(worker_config(secure_kafka, tmp_path, password=secret), tmp_path)
    assert code == 2, out
    assert took < 10, (took, out)
    assert "security.password" in out, out
    assert "abstain-worker" in out, out
    assert secret not in out


def test_an_untrusted_certificate_stops_the_worker_at_start(
    secure_kafka: LocalKafka, tmp_path: Path
) -> None:
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_bytes(make_tls(hosts=("127.0.0.1",), common_name="someone else").ca_pem)
    password = security_of(secure_kafka, ROLE_USERS["worker"])["password"]
    code, took, out = start_worker(
        worker_config(secure_kafka, tmp_path, ca_file=str(other_ca)), tmp_path
    )
    assert code == 2, out
    assert took < 10, (took, out)
    assert "security.ca_file" in out, out
    assert "not trusted" in out, out
    assert password not in out


def test_host_name_verification_is_on_unless_turned_off_explicitly(
    secure_kafka: LocalKafka, tmp_path: Path
) -> None:
    """The broker's certificate names 127.0.0.1 only: reached as localhost, it is refused
    until security.check_hostname is false (and then the chain is still checked)."""
    by_name = f"localhost:{secure_kafka.port}"
    security = security_of(secure_kafka, ROLE_USERS["worker"])
    strict = load_settings(broker=by_name, security=security)
    with pytest.raises(KafkaLoginError, match="security.check_hostname"):
        asyncio.run(check_login(strict))
    lenient = load_settings(broker=by_name, security={**security, "check_hostname": False})
    asyncio.run(check_login(lenient))
    code, _, out = start_worker(
        {**worker_config(secure_kafka, tmp_path), "broker": [by_name]}, tmp_path
    )
    assert code == 2, out
    assert "does not name that host" in out, out
