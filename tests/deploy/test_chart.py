"""The Helm chart's values, schema and settings agree with each other and with the worker.

These run without helm (deploy/check.sh runs helm itself): they read values.yaml,
values.schema.json and the templates as files and compare them with ``service.config``.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

import service
from service.config import (
    MIN_KEY,
    USER_NAME,
    AdaptiveConfig,
    Desk,
    KafkaSecurity,
    LabelBudget,
    ModelConfig,
    Partitions,
    SecondOpinions,
    Settings,
    Topics,
    Web,
    load_settings,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "abstain"
CASES = ROOT / "tests" / "deploy" / "helm"

# Schema objects that deliberately accept any keys, and why.
FREE_OBJECTS = {
    "global": "values a parent chart shares with every subchart",
    "config.models.*.hyperparameters": "learner keyword arguments, validated by the learner",
    "affinity.nodeAffinity": "Kubernetes type, checked by kubernetes-validate --strict",
    "affinity.podAffinity": "Kubernetes type, checked by kubernetes-validate --strict",
    "affinity.podAntiAffinity": "Kubernetes type, checked by kubernetes-validate --strict",
    "networkPolicy.extraIngress[]": "Kubernetes type, checked by kubernetes-validate --strict",
    "desk.affinity.nodeAffinity": "Kubernetes type, checked by kubernetes-validate --strict",
    "desk.affinity.podAffinity": "Kubernetes type, checked by kubernetes-validate --strict",
    "desk.affinity.podAntiAffinity": "Kubernetes type, checked by kubernetes-validate --strict",
    "desk.networkPolicy.from[]": "Kubernetes type, checked by kubernetes-validate --strict",
}


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return data


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return data


def object_schemas(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every object-typed subschema with its dotted path (``*`` for map values, ``[]`` for
    array items)."""
    found = []
    if node.get("type") == "object":
        found.append((path, node))
    for key, child in node.get("properties", {}).items():
        found += object_schemas(child, f"{path}.{key}" if path else key)
    if isinstance(node.get("additionalProperties"), dict):
        found += object_schemas(node["additionalProperties"], f"{path}.*")
    if isinstance(node.get("items"), dict):
        found += object_schemas(node["items"], f"{path}[]")
    return found


def schema_at(schema: dict[str, Any], path: list[str]) -> dict[str, Any] | None:
    node = schema
    for key in path:
        props = node.get("properties", {})
        if key in props:
            node = props[key]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    return node


def leaf_paths(data: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(data, dict) and data:
        out = [prefix] if prefix else []
        for key, value in data.items():
            out += leaf_paths(value, (*prefix, str(key)))
        return out
    return [prefix]


# --------------------------------------------------------------------------- schema


def test_schema_rejects_unknown_keys_in_every_object(schema: dict[str, Any]) -> None:
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    open_objects = {
        path: node.get("additionalProperties")
        for path, node in object_schemas(schema)
        if node.get("additionalProperties") is not False
        and not isinstance(node.get("additionalProperties"), dict)
    }
    assert set(open_objects) == set(FREE_OBJECTS)


def test_every_values_key_is_in_the_schema(values: dict[str, Any], schema: dict[str, Any]) -> None:
    missing = [".".join(p) for p in leaf_paths(values) if schema_at(schema, list(p)) is None]
    assert missing == []


def test_every_schema_property_has_a_default_in_values(
    values: dict[str, Any], schema: dict[str, Any]
) -> None:
    # Blocks that mirror a worker or Kubernetes type accept optional keys beyond the
    # defaults; every other value of the chart has its default written in values.yaml.
    mirrors = ("config", "resources", "podSecurityContext", "securityContext", "desk.resources")

    def walk(node: dict[str, Any], data: Any, path: str) -> list[str]:
        out = []
        for key, child in node.get("properties", {}).items():
            where = f"{path}.{key}" if path else key
            if key == "global" or path.startswith(mirrors):
                continue
            if not isinstance(data, dict) or key not in data:
                out.append(where)
            elif child.get("type") == "object" and data[key]:
                out += walk(child, data[key], where)
        return out

    assert walk(schema, values, "") == []


def undocumented_values(text: str) -> list[str]:
    """Values without a comment: a key holding a value (not a group of keys) needs a comment
    line just above it, or above one of its enclosing keys."""
    lines = text.splitlines()
    keys = []  # (line number, indent, name, commented)
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z_][\w.-]*):", line)
        if match:
            above = lines[i - 1].strip() if i else ""
            keys.append((i, len(match.group(1)), match.group(2), above.startswith("#")))
    out = []
    stack: list[tuple[int, bool]] = []  # (indent, commented) of the enclosing keys
    for n, (i, indent, name, commented) in enumerate(keys):
        while stack and stack[-1][0] >= indent:
            stack.pop()
        following = keys[n + 1] if n + 1 < len(keys) else None
        is_group = (
            following is not None
            and following[1] > indent
            and all(
                not line.strip() or line.lstrip().startswith("#")
                for line in lines[i + 1 : following[0]]
            )
            and not lines[i].split(":", 1)[1].strip()
        )
        if not is_group and not commented and not any(c for _, c in stack):
            out.append(f"line {i + 1}: {name}")
        stack.append((indent, commented))
    return out


def test_every_value_is_commented() -> None:
    assert undocumented_values((CHART / "values.yaml").read_text()) == []


def test_comment_check_finds_a_bare_value() -> None:
    text = "# -- documented\na: 1\ngroup:\n  # -- documented\n  b: 2\n  c: 3\n"
    assert undocumented_values(text) == ["line 6: c"]
    block = "# -- a block, documented as a whole\nctx:\n  user: 1\n  nested:\n    x: 2\n"
    assert undocumented_values(block) == []


# --------------------------------------------------------------------------- the worker


def model_fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def test_config_schema_names_only_real_settings(schema: dict[str, Any]) -> None:
    config = schema["properties"]["config"]
    # Settings the chart sets from its own values, and secrets (a Secret through
    # secretKeyRef), are not allowed in config.
    set_by_chart = {"broker", "datadir", "web", "security", "label_token"}
    secrets = {"snapshot_key", "snapshot_key_previous"}
    assert set(config["properties"]) == model_fields(Settings) - set_by_chart - secrets
    model = config["properties"]["models"]["additionalProperties"]
    assert set(model["properties"]) == model_fields(ModelConfig)
    assert set(model["properties"]["label_budget"]["properties"]) == model_fields(LabelBudget)
    assert set(model["properties"]["adaptive"]["properties"]) == model_fields(AdaptiveConfig)
    assert all(
        p["type"] == "boolean" for p in model["properties"]["adaptive"]["properties"].values()
    )
    assert set(config["properties"]["topics"]["properties"]) == model_fields(Topics)
    assert set(config["properties"]["partitions"]["properties"]) == model_fields(Partitions)


# Desk settings the chart sets from the `desk` values (environment variables of the desk
# pods), and the desk's secret: the schema refuses them under config.desk.
DESK_SET_BY_CHART = {"host", "port", "auth", "users_file", "replica"}
DESK_SECRETS = {"session_key"}


def test_config_desk_schema_is_every_other_desk_setting(schema: dict[str, Any]) -> None:
    desk = schema_at(schema, ["config", "desk"])
    assert desk is not None
    assert desk["additionalProperties"] is False
    assert set(desk["properties"]) == model_fields(Desk) - DESK_SET_BY_CHART - DESK_SECRETS


def test_config_desk_schema_bounds_are_the_desk_bounds(schema: dict[str, Any]) -> None:
    desk = schema_at(schema, ["config", "desk"])
    assert desk is not None
    found = {
        name: {k: v for k, v in node.items() if k in _BOUNDS.values()}
        for name, node in desk["properties"].items()
    }
    assert found == {name: bounds(Desk, name) for name in desk["properties"]}
    assert desk["properties"]["leases_topic"]["pattern"].startswith("^[A-Za-z0-9._-]{1,")


@pytest.mark.parametrize(
    "key",
    ["", "x" * 31, "x" * 32, " " + "x" * 32, "x" * 32 + "\n", "x" * 16 + " " + "x" * 16, "\t" * 32],
)
def test_the_schema_takes_the_desk_session_keys_the_desk_takes(
    schema: dict[str, Any], key: str
) -> None:
    pattern = schema["properties"]["secrets"]["properties"]["deskSessionKey"]["pattern"]
    assert pattern.endswith("$")  # Go (helm): end of text; Python's $ also matches before "\n"
    chart = re.search(pattern[:-1] + r"\Z", key) is not None
    try:
        Desk(session_key=key)
        desk = True
    except ValueError:
        desk = False
    assert chart == (desk or key == ""), repr(key)  # empty: the chart refuses to render
    assert MIN_KEY == 32


_BOUNDS = {"gt": "exclusiveMinimum", "ge": "minimum", "lt": "exclusiveMaximum", "le": "maximum"}


def bounds(model: type[BaseModel], name: str) -> dict[str, float]:
    """A field's numeric bounds as JSON-schema keywords (``gt`` -> ``exclusiveMinimum``, ...)."""
    return {
        keyword: getattr(item, attr)
        for item in model.model_fields[name].metadata
        for attr, keyword in _BOUNDS.items()
        if getattr(item, attr, None) is not None
    }


@pytest.mark.parametrize(
    ("model", "path"),
    [(ModelConfig, []), (LabelBudget, ["label_budget"])],
    ids=["ModelConfig", "LabelBudget"],
)
def test_model_schema_bounds_are_the_worker_bounds(
    schema: dict[str, Any], model: type[BaseModel], path: list[str]
) -> None:
    node = schema_at(schema, ["config", "models", "*", *path])
    assert node is not None
    found = {
        name: {k: v for k, v in node["properties"][name].items() if k in _BOUNDS.values()}
        for name in model.model_fields
    }
    assert found == {name: bounds(model, name) for name in model.model_fields}


def test_the_label_budget_schema_wants_exactly_one_kind(schema: dict[str, Any]) -> None:
    budget = schema_at(schema, ["config", "models", "*", "label_budget"])
    assert budget is not None
    assert budget["oneOf"] == [{"required": ["per_hour"]}, {"required": ["fraction"]}]


def env_names(text: str) -> set[str]:
    """ABSTAIN_* names that a manifest (``name: X``) or the Dockerfile (``X=``) sets."""
    return set(re.findall(r"(?:name:\s*|\s)(ABSTAIN_[A-Z0-9_]+)(?=\s*$|=)", text, re.M))


def setting_for(env: str) -> bool:
    """Whether an ABSTAIN_* variable names a field of Settings (``__`` nests)."""
    model: type[BaseModel] = Settings
    parts = env.removeprefix("ABSTAIN_").lower().split("__")
    for part in parts[:-1]:
        annotation = model.model_fields[part].annotation if part in model.model_fields else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return False
        model = annotation
    return parts[-1] in model.model_fields


def test_environment_variables_set_by_the_chart_and_image_are_settings() -> None:
    texts = [p.read_text() for p in (CHART / "templates").glob("*")]
    texts += [(ROOT / "Dockerfile").read_text(), (CASES / "values-all.yaml").read_text()]
    names = set().union(*(env_names(t) for t in texts)) - {"ABSTAIN_CONFIG"}
    assert {n for n in names if not setting_for(n)} == set()
    # the names the worker needs in a pod are all there
    assert {
        "ABSTAIN_BROKER",
        "ABSTAIN_DATADIR",
        "ABSTAIN_WEB__HOST",
        "ABSTAIN_WEB__ADVERTISED_HOST",
        "ABSTAIN_WEB__PORT",
        "ABSTAIN_LABEL_TOKEN",
        "ABSTAIN_SECURITY__PASSWORD",
    } <= names
    assert model_fields(Web) == {"host", "advertised_host", "port"}
    assert {"password", "ca_file", "cert_file", "key_file"} <= model_fields(KafkaSecurity)


def test_env_names_are_read_from_assignments_only() -> None:
    text = (
        "- name: ABSTAIN_BROKER\n"
        "# mentions ABSTAIN_PORT in prose\n"
        "ENV ABSTAIN_WEB__HOST=0.0.0.0 \\\n"
    )
    assert env_names(text) == {"ABSTAIN_BROKER", "ABSTAIN_WEB__HOST"}


def test_setting_lookup_rejects_names_that_are_not_settings() -> None:
    assert setting_for("ABSTAIN_WEB__PORT")
    assert not setting_for("ABSTAIN_WEB_PORT")
    assert not setting_for("ABSTAIN_KAFKA__SASL_PASSWORD")
    assert not setting_for("ABSTAIN_BROKER__HOST")


@pytest.fixture
def no_abstain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the config file speaks: no ABSTAIN_* variable of the caller's shell leaks in."""
    for name in [n for n in os.environ if n.startswith("ABSTAIN_")]:
        monkeypatch.delenv(name)


def rendered_config(*files: Path) -> dict[str, Any]:
    """config.json as templates/configmap.yaml writes it: values merged, empties dropped."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in over.items():
            both_maps = isinstance(value, dict) and isinstance(out.get(key), dict)
            out[key] = merge(out[key], value) if both_maps else value
        return out

    config: dict[str, Any] = {}
    for path in (CHART / "values.yaml", *files):
        config = merge(config, (yaml.safe_load(path.read_text()) or {}).get("config", {}))
    return {k: v for k, v in config.items() if v not in ("", {}, [], None, 0, False)}


@pytest.mark.parametrize(
    "files",
    [(), (CASES / "values-all.yaml",), (CASES / "values-existing-secret.yaml",)],
    ids=["defaults", "values-all", "values-existing-secret"],
)
@pytest.mark.usefixtures("no_abstain_env")
def test_rendered_config_loads_in_the_worker(files: tuple[Path, ...], tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(rendered_config(*files)))
    settings = load_settings(config=path)
    assert settings.default_model in settings.models


@pytest.mark.usefixtures("no_abstain_env")
def test_rendered_config_with_a_typo_is_refused_by_the_worker(tmp_path: Path) -> None:
    config = rendered_config(CASES / "values-all.yaml")
    config["stall_second"] = 5
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="stall_second"):
        load_settings(config=path)


# --------------------------------------------------------------------------- consistency


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["dynamic"] == ["version"]  # read from the package
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "service.__version__"}
    assert chart["apiVersion"] == "v2"
    assert chart["appVersion"] == service.__version__


def test_expiry_alert_threshold_is_80_percent_of_the_request_ttl(values: dict[str, Any]) -> None:
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())
    (expr,) = [
        r["expr"]
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "AbstainOldestPendingNearExpiry"
    ]
    match = re.search(r">\s*0\.8\s*\*\s*(\d+)", expr)
    assert match is not None
    ttl = float(match.group(1))
    assert ttl == values["config"]["request_ttl_seconds"]
    assert ttl == Settings.model_fields["request_ttl_seconds"].default


def test_chart_ships_the_same_alert_rules_file() -> None:
    shipped = CHART / "files" / "alerts.yml"
    linked = ROOT / "deploy" / "prometheus" / "alerts.yml"
    assert linked.resolve() == shipped.resolve()
    assert (
        '.Files.Get "files/alerts.yml"' in (CHART / "templates" / "prometheusrule.yaml").read_text()
    )


def test_the_chart_schema_accepts_exactly_the_algorithms_the_service_knows() -> None:
    from service.learning.registry import ALGORITHM_NAMES

    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    model = schema["properties"]["config"]["properties"]["models"]["additionalProperties"]
    assert tuple(model["properties"]["algorithm"]["enum"]) == ALGORITHM_NAMES


def test_config_desk_second_opinions_schema_is_the_settings_with_their_bounds(
    schema: dict[str, Any],
) -> None:
    rule = schema_at(schema, ["config", "desk", "second_opinions"])
    assert rule is not None
    assert rule["additionalProperties"] is False
    assert set(rule["properties"]) == model_fields(SecondOpinions)
    found = {
        name: {k: v for k, v in node.items() if k in _BOUNDS.values()}
        for name, node in rule["properties"].items()
    }
    assert found == {name: bounds(SecondOpinions, name) for name in rule["properties"]}
    reviewer = schema_at(schema, ["config", "desk", "reviewers"])
    assert reviewer is not None
    assert reviewer["items"]["pattern"] == USER_NAME
