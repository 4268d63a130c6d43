"""The chart's NetworkPolicy, rendered by helm: only Prometheus and the label desk reach the
web port, egress stays open; and the chart's label-token rule is the worker's.

Skipped without helm (``deploy/check.sh`` installs it under ``$ABSTAIN_TOOLS_DIR``, default
``~/.cache/abstain-tools``; ``ABSTAIN_HELM`` names another binary).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helmtool import HELM, needs_helm
from pydantic import SecretStr

from service.config import MIN_TOKEN, check_secret

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "abstain"
CASES = ROOT / "tests" / "deploy" / "helm"


def policies(*args: str) -> list[dict[str, Any]]:
    assert HELM is not None
    out = subprocess.run(
        [HELM, "template", "rel", str(CHART), "--namespace", "ml", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    # the workers' policy (the desk's own is tested in test_desk_chart.py)
    return [
        d
        for d in docs
        if d["kind"] == "NetworkPolicy"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    ]


@needs_helm
def test_by_default_only_prometheus_and_this_releases_desk_reach_the_web_port() -> None:
    (policy,) = policies()
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "abstain",
        "app.kubernetes.io/instance": "rel",
    }
    assert spec["policyTypes"] == ["Ingress"]  # egress is not restricted
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6066}]
    prometheus, desk = rule["from"]
    assert prometheus == {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    }
    assert desk == {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/component": "desk",
                "app.kubernetes.io/instance": "rel",
            }
        }
    }


@needs_helm
def test_selectors_ports_and_extra_rules_follow_the_values() -> None:
    (policy,) = policies("-f", str(CASES / "values-all.yaml"))
    first, extra = policy["spec"]["ingress"]
    assert first["ports"] == [{"protocol": "TCP", "port": 8080}]  # web.port
    prometheus, desk = first["from"]
    assert prometheus["podSelector"]["matchExpressions"][0]["values"] == ["prometheus", "agent"]
    assert desk == {
        "podSelector": {"matchLabels": {"app": "label-desk"}},
        "namespaceSelector": {"matchLabels": {"team": "labelling"}},
    }
    assert extra["from"] == [{"ipBlock": {"cidr": "10.0.0.0/16"}}]


@needs_helm
def test_the_policy_can_be_narrowed_or_switched_off() -> None:
    (policy,) = policies(
        "--set",
        "networkPolicy.labelDesk.enabled=false",
        "--set",
        "networkPolicy.prometheus.namespaceSelector=null",
    )
    assert policy["spec"]["ingress"][0]["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    ]  # a peer without namespaceSelector: Prometheus in the release namespace only
    assert policies("-f", str(CASES / "values-existing-secret.yaml")) == []


@pytest.mark.parametrize(
    "token",
    ["", "x" * 15, "x" * 16, " " + "x" * 16, "x" * 16 + "\n", "x" * 8 + " " + "x" * 8, "\t" * 16],
)
def test_the_schema_takes_the_label_tokens_the_worker_takes(token: str) -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    pattern = schema["properties"]["secrets"]["properties"]["labelToken"]["pattern"]
    assert pattern.endswith("$")  # Go (helm): end of text; Python's $ also matches before "\n"
    chart = re.search(pattern[:-1] + r"\Z", token) is not None
    try:
        check_secret(SecretStr(token), "label_token", MIN_TOKEN)
        worker = True
    except ValueError:
        worker = False
    assert chart == (worker or token == ""), token  # empty: the chart sets no token at all
