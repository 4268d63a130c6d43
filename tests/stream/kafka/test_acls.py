"""The ACLs each role needs, from the catalogue: the docs' table is the generated one, every
topic has a writer and a reader among the roles or outside them, and no role gets more than
the catalogue says (the desk never writes the models topic)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from service.config import Settings
from service.stream.kafka.acls import (
    ROLES,
    acl_commands,
    acl_json,
    acl_markdown,
    create_requests,
    main,
    role_acls,
)
from service.stream.kafka.topics import CATALOGUE

DOC = Path(__file__).resolve().parents[3] / "docs" / "operate" / "secure-kafka.md"


def test_the_docs_table_is_what_abstain_kafka_acls_prints_for_the_default_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    block = re.search(
        r"<!-- acls:begin[^>]*-->\n(.*?)\n<!-- acls:end -->", DOC.read_text(), re.DOTALL
    )
    assert block is not None, f"{DOC} has no acls:begin/end block"
    assert main(["--format", "markdown"]) == 0
    printed = capsys.readouterr().out.rstrip("\n")
    assert block.group(1) == printed == acl_markdown(Settings())


def test_every_catalogue_topic_is_in_some_role_s_acls() -> None:
    s = Settings()
    named = {acl.name for role in ROLES for acl in role_acls(s, role, "User:x")}
    assert {e.name(s) for e in CATALOGUE} <= named


def test_the_desk_may_not_write_the_models_topic_nor_read_features() -> None:
    s = Settings()
    desk = {(a.operation, a.name) for a in role_acls(s, "desk", "User:d")}
    assert ("WRITE", s.topics.models) not in desk
    assert ("READ", s.topics.models) in desk
    assert not {name for _, name in desk} & {s.topics.features, s.topics.decisions}


def test_operators_join_no_group_and_create_nothing() -> None:
    ops = role_acls(Settings(), "operator", "User:o")
    assert {a.resource for a in ops} == {"TOPIC", "GROUP"}
    assert {(a.operation, a.name) for a in ops if a.resource == "GROUP"} == {
        ("DESCRIBE", "abstain-score"),
        ("DESCRIBE", "abstain-learn"),
    }
    assert "CREATE" not in {a.operation for a in ops}


def test_topic_policy_check_drops_create_and_the_cluster_config() -> None:
    checked = Settings(topic_policy={"creation": "check"})
    for role in ("worker", "desk"):
        acls = role_acls(checked, role, "User:x")
        assert "CREATE" not in {a.operation for a in acls}
        assert "CLUSTER" not in {a.resource for a in acls}
    fixed = Settings(topic_policy={"replication_factor": 3})
    assert "CLUSTER" not in {a.resource for a in role_acls(fixed, "worker", "User:x")}
    assert "CLUSTER" in {a.resource for a in role_acls(Settings(), "worker", "User:x")}


def test_the_app_id_and_topic_names_come_from_the_settings() -> None:
    s = Settings(app_id="fraud", topics={"labels": "fraud.labels"})
    worker = role_acls(s, "worker", "User:w")
    assert {a.name for a in worker if a.resource == "GROUP"} == {
        "fraud",
        "fraud-score",
        "fraud-learn",
    }
    assert "fraud.labels" in {a.name for a in worker}
    assert "fraud-pending-changelog" in {a.name for a in worker}


def test_commands_json_and_requests_carry_the_same_acls() -> None:
    acls = role_acls(Settings(), "worker", "User:w")
    lines = acl_commands(acls, bootstrap="k:9093")
    ops = sum(line.count("--operation ") for line in lines)
    assert ops == len(acls) == len(json.loads(acl_json(acls))) == len(create_requests(acls))
    assert all(line.startswith("kafka-acls.sh --bootstrap-server k:9093 ") for line in lines)
    assert any(line.endswith("--cluster") for line in lines)


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="role must be one of"):
        role_acls(Settings(), "admin", "User:a")


def test_a_principal_needs_one_role(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--principal", "User:x"]) == 2
    assert "--role" in capsys.readouterr().err
