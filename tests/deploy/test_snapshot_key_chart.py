"""The chart signs by default: without a given key it creates a random snapshot key in its
Secret, reads it back on an upgrade (``lookup``, shown against a small stand-in for the
Kubernetes API that holds the Secret of an earlier install), and running unsigned is an
explicit value.

Skipped without helm (``deploy/check.sh`` installs it under ``$ABSTAIN_TOOLS_DIR``, default
``~/.cache/abstain-tools``; ``ABSTAIN_HELM`` names another binary).
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmtool import HELM, needs_helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "abstain"
KEPT = "a-key-an-earlier-install-generated-0123456789"

pytestmark = needs_helm


def render(*args: str) -> list[dict[str, Any]]:
    assert HELM is not None
    cmd = [HELM, "template", "rel", str(CHART), "--namespace", "ml", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def secret_data(docs: list[dict[str, Any]]) -> dict[str, str] | None:
    secrets = [d for d in docs if d["kind"] == "Secret"]
    if not secrets:
        return None
    (secret,) = secrets
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def key_env(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The worker's ABSTAIN_SNAPSHOT_KEY (None: not set)."""
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    (worker,) = [
        d for d in deployments if d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]
    env = {e["name"]: e for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]}
    return env.get("ABSTAIN_SNAPSHOT_KEY")


def test_a_fresh_install_generates_a_random_key_and_every_worker_reads_it() -> None:
    first, second = render(), render()
    keys = [secret_data(docs) for docs in (first, second)]
    assert None not in keys
    one, two = (k["snapshot-key"] for k in keys if k is not None)
    assert len(one) == 64
    assert one.isalnum()
    assert one != two  # random: nothing in the chart or the values
    ref = key_env(first)
    assert ref is not None
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "rel-abstain", "key": "snapshot-key"}


class _Api(BaseHTTPRequestHandler):
    """What ``helm template --dry-run=server`` asks of a cluster for one ``lookup``: the
    core group's resources and the release's Secret (every other path: 404)."""

    secret: dict[str, Any] = {}
    asked: list[str] = []

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.asked.append(path)
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "code": 404,
            "status": "Failure",
            "reason": "NotFound",
        }
        status = 404
        if path == "/api/v1":
            status, body = (
                200,
                {
                    "kind": "APIResourceList",
                    "groupVersion": "v1",
                    "resources": [
                        {
                            "name": "secrets",
                            "singularName": "secret",
                            "namespaced": True,
                            "kind": "Secret",
                            "verbs": ["get"],
                        }
                    ],
                },
            )
        elif path == "/api/v1/namespaces/ml/secrets/rel-abstain":
            status, body = 200, self.secret
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig for a stand-in API on 127.0.0.1 holding an earlier install's Secret."""
    _Api.secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "rel-abstain", "namespace": "ml"},
        "data": {"snapshot-key": base64.b64encode(KEPT.encode()).decode()},
    }
    _Api.asked = []
    server = HTTPServer(("127.0.0.1", 0), _Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = tmp_path / "kubeconfig"
    config.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                ],
                "contexts": [
                    {"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        )
    )
    try:
        yield config
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_an_upgrade_keeps_the_key_the_existing_secret_holds(cluster: Path) -> None:
    docs = render("--dry-run=server", "--kubeconfig", str(cluster))
    assert "/api/v1/namespaces/ml/secrets/rel-abstain" in _Api.asked
    data = secret_data(docs)
    assert data is not None
    assert data["snapshot-key"] == KEPT


def test_an_upgrade_of_a_secret_without_a_key_generates_one(cluster: Path) -> None:
    _Api.secret["data"] = {"label-token": base64.b64encode(b"x" * 20).decode()}
    data = secret_data(render("--dry-run=server", "--kubeconfig", str(cluster)))
    assert data is not None
    assert len(data["snapshot-key"]) == 64


def test_a_given_key_is_used_and_running_unsigned_is_an_explicit_value() -> None:
    given = "a-given-snapshot-key-0123456789abcdef"
    data = secret_data(render("--set", f"secrets.snapshotKey={given}"))
    assert data == {"snapshot-key": given}
    unsigned = render("--set", "secrets.unsignedSnapshots=true")
    assert secret_data(unsigned) is None
    assert key_env(unsigned) is None


def test_an_existing_secret_must_hold_the_key_unless_unsigned_is_chosen() -> None:
    docs = render("--set", "secrets.existingSecret=mine")
    assert secret_data(docs) is None
    ref = key_env(docs)
    assert ref is not None
    assert ref["valueFrom"]["secretKeyRef"] == {"name": "mine", "key": "snapshot-key"}
    unsigned = key_env(
        render("--set", "secrets.existingSecret=mine", "--set", "secrets.unsignedSnapshots=true")
    )
    assert unsigned is not None
    assert unsigned["valueFrom"]["secretKeyRef"]["optional"] is True
