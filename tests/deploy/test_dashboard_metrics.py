"""The Grafana dashboard and the alert rules query only series the worker and the label desk
really export, and the dashboard shows every one of them.

Names come from ``service.metrics.Metrics`` and ``service.desk.metrics.DeskMetrics``, each
built on a fresh registry; a counter ``x`` is
scraped as ``x_total``, a histogram ``h`` as ``h_bucket`` / ``h_sum`` / ``h_count``. The
metric table of the team brief is transcribed below as the contract both sides follow.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from service.desk.metrics import DeskMetrics
from service.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "abstain-dashboard.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

# Labels Prometheus attaches to every scraped series (scrape config / ServiceMonitor).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
# Series that Prometheus itself produces.
PROMETHEUS_SERIES: dict[str, set[str]] = {"up": set()}


_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}


# --------------------------------------------------------------------------- helpers


def exported_metrics() -> dict[str, tuple[str, set[str]]]:
    """Families the service exports (the worker's and the desk's registries):
    contract-style name -> (type, label names)."""
    families: dict[str, tuple[str, set[str]]] = {}
    for make in (Metrics, DeskMetrics):
        registry = CollectorRegistry()
        metrics = make(registry, models=["m"])
        # A child of every labelled metric, so the labels of those that have no default
        # child (per partition, or set only once there is something to report) show too.
        for metric in vars(metrics).values():
            if isinstance(metric, MetricWrapperBase) and metric._labelnames:
                metric.labels(*("x" for _ in metric._labelnames))
        for family in registry.collect():
            labels = {k for s in family.samples for k in s.labels if k not in {"le", "quantile"}}
            name = family.name + ("_total" if family.type == "counter" else "")
            assert name not in families, f"{name} exported by two registries"
            families[name] = (family.type, labels)
    return families


def test_the_desk_registry_is_collected() -> None:
    exported = exported_metrics()
    assert exported["abstain_desk_open_requests"] == ("gauge", {"model"})
    assert exported["abstain_desk_answers_total"] == ("counter", {"model", "answer"})
    assert exported["abstain_desk_answer_seconds"] == ("histogram", {"model"})
    assert "abstain_events_total" in exported  # and the worker's


def series_names(families: dict[str, tuple[str, set[str]]]) -> dict[str, set[str]]:
    """Every queryable series name -> the labels it carries."""
    out: dict[str, set[str]] = {}
    for name, (kind, labels) in families.items():
        base = name.removesuffix("_total") if kind == "counter" else name
        for suffix in _SUFFIXES[kind]:
            out[base + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """Metric selectors of a PromQL expression: (metric name, label names it matches on).

    Function and aggregation names, keywords, numbers, durations, grouping clauses and
    Grafana variables are not metric names.

    >>> selectors('sum by (model) (rate(abstain_events_total{model=~"$model"}[5m])) > 0.1')
    [('abstain_events_total', {'model'})]
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges, subqueries
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text
    )  # grouping clauses
    text = re.sub(r"(?<![\w:])\d+(\.\d+)?([eE][+-]?\d+)?", " ", text)  # numbers
    found = []
    pattern = r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?(\s*\()?"
    for match in re.finditer(pattern, text):
        name, matchers, call = match.groups()
        if (call and not matchers) or name in _KEYWORDS:
            continue
        labels = set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers or ""))
        found.append((name, labels))
    return found


def dashboard_targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            yield panel["title"], target


def alert_exprs() -> list[tuple[str, str]]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [
        (rule.get("alert") or rule["record"], rule["expr"])
        for group in rules["groups"]
        for rule in group["rules"]
    ]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


@pytest.fixture(scope="module")
def known() -> dict[str, set[str]]:
    return series_names(exported_metrics()) | PROMETHEUS_SERIES


def unknown_uses(expr: str, known: dict[str, set[str]]) -> list[str]:
    problems = []
    for name, labels in selectors(expr):
        if name not in known:
            problems.append(f"unknown series {name}")
        elif extra := labels - known[name] - TARGET_LABELS:
            problems.append(f"{name} has no label(s) {sorted(extra)}")
    return problems


# --------------------------------------------------------------------------- the checker


def test_selector_parser_separates_names_from_functions_and_clauses() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, model) (rate(abstain_label_turnaround_seconds_"
        'bucket{model=~"$model"}[$__rate_interval]))) / on(model) group_left() '
        'max(abstain_model_rho) and absent(up{job="abstain"} == 1) or time() - 1e3'
    )
    assert selectors(expr) == [
        ("abstain_label_turnaround_seconds_bucket", {"model"}),
        ("abstain_model_rho", set()),
        ("up", {"job"}),
    ]


def test_checker_flags_misspelt_names_and_labels(known: dict[str, set[str]]) -> None:
    assert unknown_uses("rate(abstian_events_total[5m])", known) == [
        "unknown series abstian_events_total"
    ]
    assert unknown_uses("abstain_events", known) == ["unknown series abstain_events"]
    assert unknown_uses('abstain_consumer_lag{model="m"}', known) == [
        "abstain_consumer_lag has no label(s) ['model']"
    ]
    assert unknown_uses('abstain_decide_latency_seconds_bucket{le="0.1"}', known) == []


# The catalogue itself (names, types, labels) is pinned by tests/test_metrics.py.


# --------------------------------------------------------------------------- dashboard


def test_dashboard_queries_only_exported_series(
    dashboard: dict[str, Any], known: dict[str, set[str]]
) -> None:
    problems = [
        f"{title}: {problem}"
        for title, target in dashboard_targets(dashboard)
        for problem in unknown_uses(target["expr"], known)
    ]
    assert problems == []


def test_dashboard_shows_every_exported_metric(dashboard: dict[str, Any]) -> None:
    used = {name for _, t in dashboard_targets(dashboard) for name, _ in selectors(t["expr"])}
    exported = exported_metrics()
    missing = {
        family
        for family, (kind, _) in exported.items()
        if not used & set(series_names({family: exported[family]}))
    }
    assert missing == set()


def test_every_per_model_query_follows_the_model_variable(
    dashboard: dict[str, Any], known: dict[str, set[str]]
) -> None:
    unfiltered = [
        f"{title}: {name}"
        for title, target in dashboard_targets(dashboard)
        for name, labels in selectors(target["expr"])
        if "model" in known.get(name, set()) and "model" not in labels
    ]
    assert unfiltered == []
    filters = {
        m
        for _, t in dashboard_targets(dashboard)
        for m in re.findall(r'model\s*=~\s*"([^"]*)"', t["expr"])
    }
    assert filters == {"$model"}


def test_dashboard_reads_from_its_prometheus_datasource_variable(
    dashboard: dict[str, Any],
) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query"
    assert model["datasource"]["uid"] == "${datasource}"
    assert selectors(model["query"].removeprefix("label_values(").split(",")[0]) == [
        ("abstain_events_total", set())
    ]
    sources = {json.dumps(t["datasource"], sort_keys=True) for _, t in dashboard_targets(dashboard)}
    assert sources == {'{"type": "prometheus", "uid": "${datasource}"}'}


def test_dashboard_panels_tile_the_grid_without_overlap(dashboard: dict[str, Any]) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_file_is_what_the_generator_writes() -> None:
    spec = importlib.util.spec_from_file_location(
        "build_dashboard", ROOT / "deploy" / "grafana" / "build_dashboard.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == DASHBOARD.read_text()


# --------------------------------------------------------------------------- alerts


def test_alert_rules_query_only_exported_series(known: dict[str, set[str]]) -> None:
    problems = [
        f"{alert}: {problem}"
        for alert, expr in alert_exprs()
        for problem in unknown_uses(expr, known)
    ]
    assert problems == []


def test_alert_rules_cover_the_operational_failure_modes() -> None:
    used = {name for _, expr in alert_exprs() for name, _ in selectors(expr)}
    assert {
        "up",
        "abstain_ready",
        "abstain_live",
        "abstain_consumer_lag",
        "abstain_last_progress_timestamp_seconds",
        "abstain_dead_letters_total",
        "abstain_pending_requests",
        "abstain_oldest_pending_age_seconds",
        "abstain_iw_loss_total",
        "abstain_updates_refused_total",
        "abstain_model_collapsed",
        "abstain_drift_detected_total",
        "abstain_label_requests_dropped_total",
        "abstain_label_budget_spent_ratio",
        "abstain_desk_ready",
        "abstain_desk_open_requests",
        "abstain_desk_answers_total",
        "abstain_desk_expired_last_hour",
    } <= used


def alert_rules() -> dict[str, dict[str, Any]]:
    rules = yaml.safe_load(ALERTS.read_text())
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load((ALERTS.parent / "alerts_test.yml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert set(alert_rules()) - fired == set()


@pytest.mark.parametrize(
    "alert",
    [
        "AbstainModelCollapsed",
        "AbstainSnapshotsRefused",
        "AbstainLabelQueueFull",
        "AbstainLabelBudgetOverspent",
        "AbstainDeskDown",
        "AbstainDeskQueueGrowing",
        "AbstainDeskRequestsExpiring",
        "AbstainDriftDetected",
    ],
)
def test_newer_alerts_say_what_to_do_first_in_one_line(alert: str) -> None:
    annotations = alert_rules()[alert]["annotations"]
    assert {"summary", "description", "runbook"} <= set(annotations)
    assert annotations["runbook"].strip()
    assert "\n" not in annotations["runbook"]
