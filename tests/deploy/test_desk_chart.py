"""The chart's label desk, rendered by helm: its Deployment, Service, NetworkPolicy,
ServiceMonitor and Ingress, the secrets it reads, its probes, and that no selector of the
workers ever takes in a desk pod (or the other way round).

Skipped without helm (``deploy/check.sh`` installs it under ``$ABSTAIN_TOOLS_DIR``, default
``~/.cache/abstain-tools``; ``ABSTAIN_HELM`` names another binary).
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmtool import HELM, needs_helm

from service.config import Desk

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "abstain"
CASES = ROOT / "tests" / "deploy" / "helm"
KEY = "not-a-real-desk-session-key-0123456789"
USERS = '[users.ann]\npassword = "scrypt$16384$8$1$c2FsdA$aGFzaA"\n'
DESK = {"desk": {"enabled": True}, "secrets": {"deskSessionKey": KEY, "deskUsers": USERS}}


pytestmark = needs_helm


class Rendered:
    """The documents of one ``helm template rel`` in namespace ``ml``."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.docs = docs

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def one(self, kind: str, component: str) -> dict[str, Any]:
        (doc,) = [
            d
            for d in self.all(kind)
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == component
        ]
        return doc

    @property
    def desk(self) -> dict[str, Any]:
        return self.one("Deployment", "desk")

    @property
    def container(self) -> dict[str, Any]:
        container: dict[str, Any] = self.desk["spec"]["template"]["spec"]["containers"][0]
        return container

    @property
    def env(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.container["env"]}


def render(tmp_path: Path, values: dict[str, Any] | None = None, *files: Path) -> Rendered:
    assert HELM is not None
    args = [HELM, "template", "rel", str(CHART), "--namespace", "ml"]
    for f in files:
        args += ["-f", str(f)]
    if values is not None:
        path = tmp_path / f"values-{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["-f", str(path)]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60)
    return Rendered([d for d in yaml.safe_load_all(out.stdout) if d])


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (or a Service's plain selector map) takes ``labels``."""
    plain = selector.get("matchLabels", selector if "matchExpressions" not in selector else {})
    if any(labels.get(k) != v for k, v in plain.items()):
        return False
    for expr in selector.get("matchExpressions", []):
        value = labels.get(expr["key"])
        op = expr["operator"]
        if op == "In" and value not in expr["values"]:
            return False
        if op == "NotIn" and value in expr["values"]:
            return False
        if op == "Exists" and value is None:
            return False
        if op == "DoesNotExist" and value is not None:
            return False
    return True


# --------------------------------------------------------------------------- defaults


def test_no_desk_unless_enabled(tmp_path: Path) -> None:
    out = render(tmp_path)
    components = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in out.docs}
    assert components == {"worker"}


def test_the_desk_runs_two_replicas_from_the_release_image_with_the_workers_config(
    tmp_path: Path,
) -> None:
    out = render(tmp_path, DESK)
    desk, worker = out.desk, out.one("Deployment", "worker")
    assert desk["metadata"]["name"] == "rel-abstain-desk"
    assert desk["spec"]["replicas"] == 2
    assert desk["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    c, w = out.container, worker["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == ["desk"]
    assert c["image"] == w["image"]
    assert c["ports"] == [{"name": "http", "containerPort": 6070, "protocol": "TCP"}]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert desk["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    env = out.env
    assert env["ABSTAIN_CONFIG"]["value"] == "/etc/abstain/config/config.json"
    assert env["ABSTAIN_DESK__HOST"]["value"] == "0.0.0.0"  # noqa: S104 - in the pod
    assert env["ABSTAIN_DESK__PORT"]["value"] == "6070"
    assert env["ABSTAIN_DESK__AUTH"]["value"] == "users"
    assert env["ABSTAIN_DESK__REPLICA"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    worker_env = {e["name"]: e for e in w["env"]}
    for name in ("ABSTAIN_BROKER", "ABSTAIN_SECURITY__PROTOCOL"):
        assert env[name] == worker_env[name]
    volumes = {v["name"]: v for v in desk["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"] == {"name": "config", "configMap": {"name": "rel-abstain"}}


@pytest.mark.parametrize("replicas", [1, 2, 5])
def test_replicas_follow_the_value(tmp_path: Path, replicas: int) -> None:
    values = {**DESK, "desk": {"enabled": True, "replicas": replicas}}
    assert render(tmp_path, values).desk["spec"]["replicas"] == replicas


def test_probes_call_healthz_and_readyz_on_the_desk_port(tmp_path: Path) -> None:
    out = render(tmp_path, {**DESK, "desk": {"enabled": True, "port": 7070}})
    c = out.container
    assert c["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["ports"][0]["containerPort"] == 7070
    assert out.env["ABSTAIN_DESK__PORT"]["value"] == "7070"
    service = out.one("Service", "desk")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 6070, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == out.desk["spec"]["selector"]["matchLabels"]


# --------------------------------------------------------------------------- secrets


def test_session_key_and_users_file_come_from_the_chart_made_secret(tmp_path: Path) -> None:
    out = render(tmp_path, DESK)
    (secret,) = out.all("Secret")
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    generated = data.pop("snapshot-key")  # signed by default (test_snapshot_key_chart.py)
    assert len(generated) == 64
    assert data == {"desk-session-key": KEY, "desk-users.toml": USERS}
    assert out.env["ABSTAIN_DESK__SESSION_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "rel-abstain", "key": "desk-session-key"}  # not optional
    }
    assert out.env["ABSTAIN_DESK__USERS_FILE"]["value"] == "/etc/abstain/desk-users/desk-users.toml"
    mounts = {m["name"]: m for m in out.container["volumeMounts"]}
    assert mounts["users"] == {
        "name": "users",
        "mountPath": "/etc/abstain/desk-users",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in out.desk["spec"]["template"]["spec"]["volumes"]}
    assert volumes["users"]["secret"] == {
        "secretName": "rel-abstain",
        "defaultMode": 0o440,
        "items": [{"key": "desk-users.toml", "path": "desk-users.toml"}],
    }
    assert "ABSTAIN_LABEL_TOKEN" not in out.env  # the desk sends labels to Kafka itself


def test_an_existing_secret_and_a_users_secret_of_its_own(tmp_path: Path) -> None:
    out = render(tmp_path, None, CASES / "values-existing-secret.yaml")
    assert out.all("Secret") == []
    assert out.env["ABSTAIN_DESK__SESSION_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "abstain-credentials", "key": "desk-session-key"}
    }
    assert out.env["ABSTAIN_SECURITY__PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "abstain-credentials", "key": "password"}
    }
    volumes = {v["name"]: v for v in out.desk["spec"]["template"]["spec"]["volumes"]}
    assert volumes["users"]["secret"]["secretName"] == "desk-users"
    # the snapshot key, required in an existing Secret (unless unsignedSnapshots), lets the
    # desk read signed snapshots; the previous one is optional
    assert "optional" not in out.env["ABSTAIN_SNAPSHOT_KEY"]["valueFrom"]["secretKeyRef"]
    previous = out.env["ABSTAIN_SNAPSHOT_KEY_PREVIOUS"]["valueFrom"]["secretKeyRef"]
    assert previous["optional"] is True


def test_every_replica_gets_the_same_session_key(tmp_path: Path) -> None:
    out = render(tmp_path, {**DESK, "desk": {"enabled": True, "replicas": 3}})
    # one pod template, one Secret key: no per-pod randomness anywhere in it
    ref = out.env["ABSTAIN_DESK__SESSION_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "rel-abstain", "key": "desk-session-key"}
    assert "value" not in out.env["ABSTAIN_DESK__SESSION_KEY"]


def test_a_new_desk_user_rolls_the_desk_and_not_the_workers(tmp_path: Path) -> None:
    def checksums(values: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
        out = render(tmp_path, values)
        desk = out.desk["spec"]["template"]["metadata"]["annotations"]
        worker = out.one("Deployment", "worker")["spec"]["template"]["metadata"]["annotations"]
        return desk, worker

    desk, worker = checksums(DESK)
    more = {**DESK, "secrets": {**DESK["secrets"], "deskUsers": USERS + "[users.bob]\n"}}
    desk2, worker2 = checksums(more)
    assert desk2["checksum/secret"] != desk["checksum/secret"]
    assert worker2 == worker
    tuned = {**DESK, "config": {"desk": {"lease_seconds": 60}}}
    desk3, worker3 = checksums(tuned)
    assert desk3["checksum/config"] != desk["checksum/config"]
    assert worker3 == worker


# --------------------------------------------------------------------------- selectors


def test_desk_pods_are_the_ones_the_workers_policy_lets_in_and_no_worker_selector_takes(
    tmp_path: Path,
) -> None:
    out = render(tmp_path, DESK)
    desk_pod = out.desk["spec"]["template"]["metadata"]["labels"]
    worker_pod = out.one("Deployment", "worker")["spec"]["template"]["metadata"]["labels"]
    assert desk_pod["app.kubernetes.io/component"] == "desk"
    assert desk_pod["app.kubernetes.io/instance"] == "rel"
    policy = out.one("NetworkPolicy", "worker")
    peers = policy["spec"]["ingress"][0]["from"]
    assert any(matches(p["podSelector"], desk_pod) and "namespaceSelector" not in p for p in peers)
    worker_selectors = [
        out.one("Deployment", "worker")["spec"]["selector"],
        out.one("Service", "worker")["spec"]["selector"],
        out.one("PodDisruptionBudget", "worker")["spec"]["selector"],
        policy["spec"]["podSelector"],
    ]
    assert all(matches(s, worker_pod) for s in worker_selectors)
    assert not any(matches(s, desk_pod) for s in worker_selectors)
    desk_selectors = [
        out.desk["spec"]["selector"],
        out.one("Service", "desk")["spec"]["selector"],
        out.one("PodDisruptionBudget", "desk")["spec"]["selector"],
        out.one("NetworkPolicy", "desk")["spec"]["podSelector"],
    ]
    assert all(matches(s, desk_pod) for s in desk_selectors)
    assert not any(matches(s, worker_pod) for s in desk_selectors)


def test_service_monitors_scrape_the_desk_as_job_abstain_desk(tmp_path: Path) -> None:
    out = render(tmp_path, {**DESK, "serviceMonitor": {"enabled": True}})
    monitor = out.one("ServiceMonitor", "desk")
    service = out.one("Service", "desk")
    assert monitor["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert service["metadata"]["labels"]["app.kubernetes.io/name"] == "abstain-desk"
    assert matches(monitor["spec"]["selector"], service["metadata"]["labels"])
    assert monitor["spec"]["endpoints"][0]["port"] == "http"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    worker = out.one("ServiceMonitor", "worker")
    assert not matches(worker["spec"]["selector"], service["metadata"]["labels"])
    assert worker["spec"]["endpoints"] == [
        {**monitor["spec"]["endpoints"][0], "port": "http-metrics"}
    ]  # same interval, timeout and relabelling as the workers'


# --------------------------------------------------------------------------- access


def test_with_its_own_login_the_desk_port_is_open_to_all(tmp_path: Path) -> None:
    out = render(tmp_path, DESK)
    policy = out.one("NetworkPolicy", "desk")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": 6070}]}]
    assert out.all("Ingress") == []  # off by default


def test_behind_a_proxy_only_the_proxy_and_prometheus_reach_the_desk(tmp_path: Path) -> None:
    out = render(tmp_path, None, CASES / "values-desk-proxy.yaml")
    assert out.env["ABSTAIN_DESK__AUTH"]["value"] == "proxy"
    assert "ABSTAIN_DESK__USERS_FILE" not in out.env
    assert "users" not in {v["name"] for v in out.desk["spec"]["template"]["spec"]["volumes"]}
    (rule,) = out.one("NetworkPolicy", "desk")["spec"]["ingress"]
    prometheus, proxy = rule["from"]
    assert prometheus["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    assert proxy["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "ingress-nginx"}}
    ingress = out.one("Ingress", "desk")
    assert ingress["spec"]["rules"][0]["host"] == "labels.example.com"
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "rel-abstain-desk", "port": {"name": "http"}}
    # and the desk believes the proxy's headers from the proxy's pods only, as it loads them
    (configmap,) = out.all("ConfigMap")
    settings = Desk.model_validate(json.loads(configmap["data"]["config.json"])["desk"])
    assert settings.trusted_proxies == ("10.244.0.0/16", "fd00:10:244::/56")


def test_behind_a_proxy_the_proxy_addresses_are_required(tmp_path: Path) -> None:
    values = {
        **DESK,
        "networkPolicy": {"enabled": True},
        "desk": {
            "enabled": True,
            "auth": "proxy",
            "networkPolicy": {"from": [{"podSelector": {}}]},
        },
    }
    with pytest.raises(subprocess.CalledProcessError) as failed:
        render(tmp_path, values)
    assert "config.desk.trusted_proxies" in failed.value.stderr
    for bad in (["0.0.0.0/0"], ["::/0"], ["proxy.example"], ["10.0.0.1"] * 65):
        with pytest.raises(subprocess.CalledProcessError):
            render(tmp_path, {**values, "config": {"desk": {"trusted_proxies": bad}}})
    ok = render(tmp_path, {**values, "config": {"desk": {"trusted_proxies": ["10.0.0.7"]}}})
    assert ok.env["ABSTAIN_DESK__AUTH"]["value"] == "proxy"


def test_everything_switched_on(tmp_path: Path) -> None:
    out = render(tmp_path, None, CASES / "values-all.yaml")
    assert out.desk["spec"]["replicas"] == 3
    assert out.env["ABSTAIN_DESK__USERS_FILE"]["value"] == "/etc/abstain/desk-users/people.json"
    assert out.env["ABSTAIN_SECURITY__CA_FILE"]["value"] == "/etc/abstain/kafka-tls/ca.crt"
    mounts = {m["name"]: m for m in out.container["volumeMounts"]}
    assert mounts["kafka-tls"]["readOnly"] is True
    spread = out.desk["spec"]["template"]["spec"]["topologySpreadConstraints"][0]
    assert spread["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "desk"
    ingress = out.one("Ingress", "desk")
    assert ingress["spec"]["tls"][0]["secretName"] == "labels-example-com-tls"
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"] == {
        "name": "http"
    }
    service = out.one("Service", "desk")
    assert service["spec"]["ports"][0]["port"] == 80
    assert out.container["ports"][0]["containerPort"] == 8070
