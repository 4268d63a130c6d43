"""Nothing let in, nothing let out: without the right bearer token no label reaches the
labels topic through HTTP (whatever the Authorization header looks like); with it, the
label is produced once and applied; the token and the Kafka password appear in no log line
(debug level), no HTTP answer and no error message. (The plain 401 / 202 cases and
repr(settings) are covered in test_service.py and test_config.py; oversize messages in the
fuzz test.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

from faults.data import EventSource
from faults.kafkaio import produce, read_topic
from faults.oracle import Observer
from faults.scenario import deployment, max_version
from faults.workers import REPO


def test_labels_need_the_token_and_secrets_never_leak(kafka_bootstrap: str, tmp_path: Path) -> None:
    token = f"tok-{uuid.uuid4().hex}"
    password = f"pw-{uuid.uuid4().hex}"
    with deployment(
        kafka_bootstrap,
        tmp_path,
        label_token=token,
        security={"protocol": "PLAINTEXT", "username": "svc", "password": password},
        log_level="debug",
    ) as dep:
        t = dep.topics
        src = EventSource("sec")
        observer = Observer(kafka_bootstrap, t, src.truth).begin()  # budget 0: never labels
        worker = dep.start()
        worker.wait_ready()
        produce(dep.bootstrap, t["features"], src.make(20))
        observer.wait(lambda o: len(o.requests) >= 1, 60, "a label request")
        with observer.lock:
            rid, request = next(iter(observer.requests.items()))
        body = json.dumps({"request_id": rid, "model": "m", "label": 1}).encode()

        refused = {
            "no header": {},
            "wrong token": {"Authorization": "Bearer wrong"},
            "empty bearer": {"Authorization": "Bearer "},
            "token without scheme": {"Authorization": token},
            "basic scheme": {"Authorization": f"Basic {token}"},
            "lower-case scheme": {"Authorization": f"bearer{token}"},
            "token prefix": {"Authorization": f"Bearer {token[:-1]}"},
            "token plus extra": {"Authorization": f"Bearer {token}x"},
            "token in another header": {"X-Api-Key": token},
        }
        answers = {what: worker.post("/labels", body, headers) for what, headers in refused.items()}
        status, _ = worker.post(f"/labels?token={token}", body)
        answers["token in the query string"] = (status, b"")
        for what, (status, text) in answers.items():
            assert status == 401, (what, status)
            assert token.encode() not in text, what
        time.sleep(1.0)
        assert not [
            r for r in read_topic(dep.bootstrap, t["labels"]) if rid.encode() in (r.value or b"")
        ]

        # the right token: produced once, applied once
        status, text = worker.post("/labels", body, {"Authorization": f"Bearer {token}"})
        assert status == 202, text
        observer.wait(lambda o: max_version(o, "m") == 1, 60, "the label applied")
        mine = [
            r for r in read_topic(dep.bootstrap, t["labels"]) if rid.encode() in (r.value or b"")
        ]
        assert len(mine) == 1
        assert json.loads(mine[0].value or b"{}")["label"] == 1
        assert request["event_id"].startswith("sec-")

        # no secret in any HTTP answer
        for path in ("/metrics", "/healthz", "/readyz", "/labels"):
            for accept in ("application/json", "text/html"):
                _, text = worker.get(path, {"Accept": accept})
                assert token.encode() not in text, path
                assert password.encode() not in text, path
        observer.halt()
        assert worker.stop() == 0

    # ... in no log line of the worker (debug level, from start to a clean stop)
    logs = dep.logs() + "".join(p.stdout.read_text(errors="replace") for p in dep.processes)
    assert "DEBUG" in logs or "debug" in logs.lower()
    assert token not in logs
    assert password not in logs

    # ... and in no error message about a bad configuration that holds them
    bad = dict(
        dep.config,
        request_ttl_seconds=-1,
        security={"protocol": "SASL_PLAINTEXT", "username": "svc", "password": password},
    )
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    done = subprocess.run(
        [sys.executable, "-m", "service", "worker", "--config", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "request_ttl_seconds" in done.stderr
    assert token not in done.stdout + done.stderr
    assert password not in done.stdout + done.stderr
