"""The chart's `config.topic_policy`: its schema is the worker's TopicPolicy, its defaults
leave replication to the brokers, and what it renders is what the worker reads."""

from __future__ import annotations

import json
import os
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.config import TopicPolicy, load_settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "abstain"
CASES = ROOT / "tests" / "deploy" / "helm"


def policy_schema() -> dict[str, Any]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    node: dict[str, Any] = schema["properties"]["config"]["properties"]["topic_policy"]
    return node


def test_the_schema_names_every_policy_field_with_the_workers_bounds() -> None:
    node = policy_schema()
    assert node["additionalProperties"] is False
    assert set(node["properties"]) == set(TopicPolicy.model_fields)
    creation = TopicPolicy.model_fields["creation"].annotation
    assert node["properties"]["creation"]["enum"] == list(typing.get_args(creation))
    for name in ("replication_factor", "min_insync_replicas"):
        prop = node["properties"][name]
        metadata = TopicPolicy.model_fields[name].metadata
        assert prop["minimum"] == next(m.ge for m in metadata if hasattr(m, "ge"))
        assert prop["maximum"] == next(m.le for m in metadata if hasattr(m, "le"))
        assert prop["type"] == ["integer", "null"]


def _policy_of(config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in [n for n in os.environ if n.startswith("ABSTAIN_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"topic_policy": config["topic_policy"]}))
    return load_settings(config=path).topic_policy


def test_the_defaults_create_topics_with_the_brokers_replication(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = yaml.safe_load((CHART / "values.yaml").read_text())["config"]
    assert _policy_of(config, tmp_path, monkeypatch) == TopicPolicy()


def test_a_checking_release_renders_the_policy_the_worker_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = yaml.safe_load((CASES / "values-all.yaml").read_text())["config"]
    policy = _policy_of(config, tmp_path, monkeypatch)
    assert policy == TopicPolicy(creation="check", replication_factor=3, min_insync_replicas=2)


def test_every_policy_value_is_explained_in_values() -> None:
    text = (CHART / "values.yaml").read_text()
    block = text[text.index("  topic_policy:") :].split("\n  # -- Settings of the label desk")[0]
    for name in TopicPolicy.model_fields:
        assert f"    {name}:" in block, name
    assert "default.replication.factor" in block
    assert "acks=all" in block
