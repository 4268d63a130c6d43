"""A release against a secured Kafka: the CA (and a client certificate) come from a Secret
mounted read-only, each container's SASL password from a Secret key, the label desk logs in as
its own principal (``kafka.sasl.deskUsername``), and TLS host-name verification stays on
unless ``kafka.tls.checkHostname`` is false. Rendered with the real helm (skipped without it:
``deploy/check.sh`` installs it)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmtool import HELM, needs_helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "abstain"
TLS_DIR = "/etc/abstain/kafka-tls"

pytestmark = needs_helm

SECURED = {
    "kafka.securityProtocol": "SASL_SSL",
    "kafka.sasl.mechanism": "SCRAM-SHA-512",
    "kafka.sasl.username": "abstain-worker",
    "kafka.sasl.deskUsername": "abstain-desk",
    "kafka.tls.existingSecret": "kafka-ca",
    "secrets.existingSecret": "abstain-secrets",
    "desk.enabled": "true",
}


def secured(**changes: str | None) -> list[str]:
    """``--set`` arguments of SECURED with ``changes`` (keys with ``__`` for dots; None
    drops a value)."""
    values = dict(SECURED)
    for key, value in changes.items():
        name = key.replace("__", ".")
        if value is None:
            values.pop(name, None)
        else:
            values[name] = value
    flag = {"true": "--set", "false": "--set"}
    return [
        arg
        for name, value in values.items()
        for arg in (flag.get(value, "--set-string"), f"{name}={value}")
    ]


def render(*args: str) -> list[dict[str, Any]]:
    assert HELM is not None
    cmd = [HELM, "template", "rel", str(CHART), "--namespace", "ml", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def refusal(*args: str) -> str:
    assert HELM is not None
    cmd = [HELM, "template", "rel", str(CHART), "--namespace", "ml", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode != 0, "helm rendered what it should refuse"
    return out.stderr


def pod(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith(component)
    ]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def env_of(spec: dict[str, Any]) -> dict[str, Any]:
    (container,) = spec["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@pytest.mark.parametrize("component", ["abstain", "desk"])
def test_the_ca_is_mounted_read_only_from_its_secret_and_named_in_the_settings(
    component: str,
) -> None:
    spec = pod(render(*secured()), component)
    (container,) = spec["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == TLS_DIR]
    assert mount["readOnly"] is True
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "kafka-ca"
    env = env_of(spec)
    assert env["ABSTAIN_SECURITY__CA_FILE"] == f"{TLS_DIR}/ca.crt"
    assert env["ABSTAIN_SECURITY__PROTOCOL"] == "SASL_SSL"
    assert "ABSTAIN_SECURITY__CHECK_HOSTNAME" not in env  # the settings' default: on


def test_worker_and_desk_log_in_as_their_own_principals_with_passwords_from_the_secret() -> None:
    docs = render(*secured())
    worker, desk = env_of(pod(docs, "abstain")), env_of(pod(docs, "desk"))
    assert worker["ABSTAIN_SECURITY__USERNAME"] == "abstain-worker"
    assert desk["ABSTAIN_SECURITY__USERNAME"] == "abstain-desk"
    assert worker["ABSTAIN_SECURITY__PASSWORD"] == {
        "secretKeyRef": {"name": "abstain-secrets", "key": "sasl-password"}
    }
    assert desk["ABSTAIN_SECURITY__PASSWORD"] == {
        "secretKeyRef": {"name": "abstain-secrets", "key": "desk-sasl-password"}
    }
    assert not [d for d in docs if d["kind"] == "Secret"]  # an existing Secret: none made


def test_without_a_desk_username_the_desk_shares_the_workers_login() -> None:
    desk = env_of(pod(render(*secured(kafka__sasl__deskUsername=None)), "desk"))
    assert desk["ABSTAIN_SECURITY__USERNAME"] == "abstain-worker"
    assert desk["ABSTAIN_SECURITY__PASSWORD"]["secretKeyRef"]["key"] == "sasl-password"


def test_a_created_secret_holds_the_desk_password_and_the_client_certificate_is_mounted() -> None:
    docs = render(
        *secured(
            secrets__existingSecret=None,
            secrets__saslPassword="worker-password-123",
            secrets__deskSaslPassword="desk-password-123",
            kafka__tls__certKey="tls.crt",
            kafka__tls__keyKey="tls.key",
            secrets__deskSessionKey="k" * 40,
            secrets__deskUsers='ann = "x"',
        )
    )
    (secret,) = [d for d in docs if d["kind"] == "Secret"]
    assert {"sasl-password", "desk-sasl-password"} <= set(secret["data"])
    env = env_of(pod(docs, "desk"))
    assert env["ABSTAIN_SECURITY__CERT_FILE"] == f"{TLS_DIR}/tls.crt"
    assert env["ABSTAIN_SECURITY__KEY_FILE"] == f"{TLS_DIR}/tls.key"


def test_host_name_verification_is_turned_off_only_explicitly() -> None:
    env = env_of(pod(render(*secured(), "--set", "kafka.tls.checkHostname=false"), "abstain"))
    assert env["ABSTAIN_SECURITY__CHECK_HOSTNAME"] == "false"


def test_a_desk_username_without_its_password_or_without_sasl_is_refused() -> None:
    alone = secured(
        secrets__existingSecret=None,
        secrets__saslPassword="pw-123456",
        secrets__deskSessionKey="k" * 40,
        secrets__deskUsers='ann = "x"',
    )
    assert "deskSaslPassword" in refusal(*alone)
    assert "deskUsername" in refusal("--set", "kafka.sasl.deskUsername=abstain-desk")
