"""Build the Grafana dashboard ``abstain-dashboard.json`` from the panel list below.

The JSON file is the artefact operators import (Dashboards > New > Import, or a
provisioning / sidecar ConfigMap); this script keeps its layout, ids and queries consistent.
Edit the panels here, then regenerate::

    python deploy/grafana/build_dashboard.py          # rewrite the JSON file
    python deploy/grafana/build_dashboard.py --check  # exit 1 if the file is stale

Every query filters on the ``$model`` template variable where the series has a ``model``
label, and every panel reads from the ``$datasource`` variable (a Prometheus data source).
Metric names are the ones the worker (service/metrics.py) and the label desk
(service/desk/metrics.py) export; tests/deploy checks that each name used here exists and
that every exported one is shown. The desk's queue gauges are the same on every desk replica
(each reads the whole queue from the topics), so they are taken as a max over replicas; its
counters count what each replica did, so they are summed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUTPUT = Path(__file__).with_name("abstain-dashboard.json")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
M = 'model=~"$model"'  # the model filter every per-model query carries
RATE = "$__rate_interval"

Panel = dict[str, Any]


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "expr": expr,
        "legendFormat": legend,
        "range": True,
        "refId": ref,
    }


def timeseries(
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    *,
    unit: str = "short",
    width: int = 8,
    height: int = 8,
    minimum: float | None = 0,
    stack: bool = False,
) -> Panel:
    defaults: dict[str, Any] = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        },
    }
    if minimum is not None:
        defaults["min"] = minimum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": [target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(queries)],
        "_size": (width, height),
    }


def stat(
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    *,
    unit: str = "short",
    width: int = 4,
    height: int = 4,
    red_below: float | None = None,
    red_from: float | None = None,
) -> Panel:
    """A stat panel, green unless ``red_below`` (red under it) or ``red_from`` (red at and
    above it) says otherwise."""
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if red_below is not None:
        steps = [{"color": "red", "value": None}, {"color": "green", "value": red_below}]
    elif red_from is not None:
        steps = [{"color": "green", "value": None}, {"color": "red", "value": red_from}]
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "color": {"mode": "thresholds"},
                "thresholds": {"mode": "absolute", "steps": steps},
            },
            "overrides": [],
        },
        "options": {
            "colorMode": "background",
            "graphMode": "none",
            "justifyMode": "auto",
            "textMode": "value_and_name",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
        "targets": [target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(queries)],
        "_size": (width, height),
    }


def quantiles(metric: str, qs: tuple[float, ...]) -> list[tuple[str, str]]:
    return [
        (
            f"histogram_quantile({q}, sum by (le, model) (rate({metric}_bucket{{{M}}}[{RATE}])))",
            f"{{{{model}}}} p{round(q * 100)}",
        )
        for q in qs
    ]


ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Workers",
        [
            stat(
                "Workers up",
                "Scrape targets of job abstain that answer.",
                [('sum(up{job="abstain"})', "up")],
                red_below=1,
            ),
            stat(
                "Workers ready",
                "Workers whose /readyz passes: recovered, models loaded (abstain_ready).",
                [("sum(abstain_ready)", "ready")],
                red_below=1,
            ),
            stat(
                "Workers live",
                "Workers whose stall detector is quiet (abstain_live); 0 means /healthz fails.",
                [("sum(abstain_live)", "live")],
                red_below=1,
            ),
            timeseries(
                "Ready / live per worker",
                "1 = ready / live, 0 = not. A worker at 0 for long is restarted by its probes.",
                [
                    ("abstain_ready", "ready {{instance}}"),
                    ("abstain_live", "live {{instance}}"),
                ],
                width=12,
                height=4,
            ),
        ],
    ),
    (
        "Traffic and decisions",
        [
            timeseries(
                "Events / s",
                "Feature events scored per second, by model.",
                [(f"sum by (model) (rate(abstain_events_total{{{M}}}[{RATE}]))", "{{model}}")],
                unit="ops",
            ),
            timeseries(
                "Decisions / s by action",
                "Served decisions: predict (a label) or reject (abstain).",
                [
                    (
                        f"sum by (model, action) (rate(abstain_decisions_total{{{M}}}[{RATE}]))",
                        "{{model}} {{action}}",
                    )
                ],
                unit="ops",
                stack=True,
            ),
            timeseries(
                "Query rate",
                "Fraction of recent decisions that asked for a label (abstain_query_rate, "
                "averaged over workers).",
                [(f"avg by (model) (abstain_query_rate{{{M}}})", "{{model}}")],
                unit="percentunit",
            ),
            timeseries(
                "Decide latency p50 / p99",
                "Time to score one event (decide), from the abstain_decide_latency_seconds "
                "histogram.",
                quantiles("abstain_decide_latency_seconds", (0.5, 0.99)),
                unit="s",
                width=12,
            ),
            timeseries(
                "Dead letters / s by reason",
                "Messages sent to the dead-letter topic, by source topic and reason.",
                [
                    (
                        f"sum by (source, reason) (rate(abstain_dead_letters_total[{RATE}]))",
                        "{{source}} {{reason}}",
                    )
                ],
                unit="ops",
                width=12,
            ),
        ],
    ),
    (
        "Labelling",
        [
            timeseries(
                "Label requests vs labels applied",
                "Requests for labels, labels applied to the model, and requests that expired "
                "unanswered (per second).",
                [
                    (
                        f"sum by (model) (rate(abstain_label_requests_total{{{M}}}[{RATE}]))",
                        "{{model}} requested",
                    ),
                    (
                        f"sum by (model) (rate(abstain_labels_applied_total{{{M}}}[{RATE}]))",
                        "{{model}} applied",
                    ),
                    (
                        "sum by (model) "
                        f"(rate(abstain_label_requests_expired_total{{{M}}}[{RATE}]))",
                        "{{model}} expired",
                    ),
                ],
                unit="ops",
            ),
            timeseries(
                "Pending requests",
                "Label requests waiting for a label (abstain_pending_requests).",
                [(f"sum by (model) (abstain_pending_requests{{{M}}})", "{{model}}")],
            ),
            timeseries(
                "Oldest pending request age",
                "Age of the oldest unanswered label request; requests expire at "
                "request_ttl_seconds.",
                [(f"max by (model) (abstain_oldest_pending_age_seconds{{{M}}})", "{{model}}")],
                unit="s",
            ),
            timeseries(
                "Label turnaround p50 / p95",
                "Time from a label request to its label being applied.",
                quantiles("abstain_label_turnaround_seconds", (0.5, 0.95)),
                unit="s",
            ),
            timeseries(
                "Labels ignored / s by reason",
                "Labels that changed nothing: redelivered, already applied, expired or "
                "unknown request.",
                [
                    (
                        "sum by (model, reason) "
                        f"(rate(abstain_labels_ignored_total{{{M}}}[{RATE}]))",
                        "{{model}} {{reason}}",
                    )
                ],
                unit="ops",
            ),
            timeseries(
                "Updates refused",
                "Updates refused because they would make the model non-finite or too large "
                "to write (increase over the interval), and the groups of labels the learner "
                "applied again one at a time to refuse them (each costs a re-read of its "
                "tables).",
                [
                    (
                        "sum by (model, reason) "
                        f"(increase(abstain_updates_refused_total{{{M}}}[{RATE}]))",
                        "{{model}} {{reason}}",
                    ),
                    (
                        "sum by (model) "
                        f"(increase(abstain_label_groups_redone_total{{{M}}}[{RATE}]))",
                        "{{model}} groups applied again",
                    ),
                ],
            ),
            timeseries(
                "Moments refused",
                "Label requests whose moments were refused: a mean or a variance no scorer "
                "could have gathered from events like the model's so far (increase over the "
                "interval). The labels are applied; the requests are dead-lettered (moments).",
                [
                    (
                        "sum by (model, reason) "
                        f"(increase(abstain_moments_refused_total{{{M}}}[{RATE}]))",
                        "{{model}} {{reason}}",
                    )
                ],
            ),
        ],
    ),
    (
        "Label budget",
        [
            timeseries(
                "Labels per hour: allowed vs asked",
                "What the models' label_budget allows (abstain_label_budget_labels_per_hour, "
                "summed over the workers' shares) and what they asked for "
                "(rate(abstain_label_requests_total[5m]) * 3600). Models without a budget "
                "show only the asked line.",
                [
                    (
                        f"sum by (model) (abstain_label_budget_labels_per_hour{{{M}}})",
                        "{{model}} allowed",
                    ),
                    (
                        f"sum by (model) (rate(abstain_label_requests_total{{{M}}}[5m])) * 3600",
                        "{{model}} asked",
                    ),
                ],
                width=12,
            ),
            timeseries(
                "Budget spent ratio",
                "Labels asked over labels the budget allowed so far, per worker "
                "(abstain_label_budget_spent_ratio): 1 is on target. It settles near 1 after a "
                "start; above 1.1 for 30 minutes fires AbstainLabelBudgetOverspent.",
                [(f"abstain_label_budget_spent_ratio{{{M}}}", "{{model}} {{instance}}")],
                width=12,
            ),
            timeseries(
                "Requests suppressed by the budget / s",
                "Events the learner would have asked about that its label budget did not "
                "(abstain_label_requests_suppressed_total). Expected under a tight budget: "
                "the budget keeps the most informative of them.",
                [
                    (
                        "sum by (model) "
                        f"(rate(abstain_label_requests_suppressed_total{{{M}}}[{RATE}]))",
                        "{{model}}",
                    )
                ],
                unit="ops",
                width=12,
            ),
            timeseries(
                "Requests dropped, queue full / s",
                "Open label requests dropped, least urgent first, because the model's queue "
                "reached max_open_requests (abstain_label_requests_dropped_total). Above 0: "
                "requests arrive faster than they are answered (AbstainLabelQueueFull).",
                [
                    (
                        "sum by (model) "
                        f"(rate(abstain_label_requests_dropped_total{{{M}}}[{RATE}]))",
                        "{{model}}",
                    )
                ],
                unit="ops",
                width=12,
            ),
            timeseries(
                "Importance weights capped / s",
                "Applied labels whose weight 1/p was capped at max_importance_weight "
                "(abstain_importance_weights_clipped_total). Above 0 the risk estimate is "
                "biased upwards: raise max_importance_weight to at least 1 / (explore x the "
                "budget's share of events).",
                [
                    (
                        "sum by (model) "
                        f"(rate(abstain_importance_weights_clipped_total{{{M}}}[{RATE}]))",
                        "{{model}}",
                    )
                ],
                unit="ops",
                width=12,
            ),
        ],
    ),
    (
        "Label desk",
        [
            stat(
                "Desk replicas ready",
                "Desk replicas that have read the topics and hand out requests "
                "(abstain_desk_ready); AbstainDeskDown fires after 10 minutes at 0.",
                [("sum(abstain_desk_ready)", "ready")],
                red_below=1,
            ),
            stat(
                "Open at the desk",
                "Label requests people can still answer, all selected models "
                "(abstain_desk_open_requests: every replica reports the whole queue, so the "
                "max over replicas).",
                [(f"sum(max by (model) (abstain_desk_open_requests{{{M}}}))", "open")],
            ),
            stat(
                "Being answered now",
                "Requests someone holds a lease on right now (abstain_desk_active_leases, "
                "max over replicas).",
                [("max(abstain_desk_active_leases)", "held")],
            ),
            stat(
                "Expired unanswered, last hour",
                "Requests that expired at the desk without an answer in the last hour, all "
                "selected models (abstain_desk_expired_last_hour).",
                [(f"sum(max by (model) (abstain_desk_expired_last_hour{{{M}}}))", "expired")],
                red_from=1,
            ),
            stat(
                "Labels not saved, last hour",
                "Answers Kafka did not acknowledge in time: the person saw 'Not saved' and the "
                "request stayed open (abstain_desk_send_failures_total).",
                [("sum(increase(abstain_desk_send_failures_total[1h]))", "not saved")],
                red_from=1,
            ),
            stat(
                "Logins, last hour",
                "Logins on the desk's login page (abstain_desk_logins_total): ok, failed, "
                "throttled (too many attempts for the account or from the address: told to "
                "wait, nothing checked), busy (too many being checked at once). Many "
                "throttled: someone is guessing passwords.",
                [
                    (
                        "sum by (outcome) (increase(abstain_desk_logins_total[1h]))",
                        "{{outcome}}",
                    )
                ],
            ),
            timeseries(
                "Open requests per model",
                "Requests waiting at the desk, per model (abstain_desk_open_requests, max over "
                "the replicas, which all read the same topics).",
                [(f"max by (model) (abstain_desk_open_requests{{{M}}})", "{{model}}")],
            ),
            timeseries(
                "Arrivals vs answers per hour",
                "Label requests the workers ask for (abstain_label_requests_total), answers "
                "sent from the desk (abstain_desk_answers_total) and labels applied from every "
                "source (abstain_labels_applied_total: the desk, /labels, the CLI), per hour. "
                "Arrivals above answers for long: AbstainDeskQueueGrowing.",
                [
                    (
                        f"sum by (model) (rate(abstain_label_requests_total{{{M}}}[5m])) * 3600",
                        "{{model}} asked",
                    ),
                    (
                        f"sum by (model) (rate(abstain_desk_answers_total{{{M}}}[5m])) * 3600",
                        "{{model}} answered at the desk",
                    ),
                    (
                        f"sum by (model) (rate(abstain_labels_applied_total{{{M}}}[5m])) * 3600",
                        "{{model}} applied (all sources)",
                    ),
                ],
            ),
            timeseries(
                "Oldest open request",
                "Age of the oldest request still open at the desk, per model "
                "(abstain_desk_oldest_open_age_seconds); requests expire at "
                "request_ttl_seconds.",
                [(f"max by (model) (abstain_desk_oldest_open_age_seconds{{{M}}})", "{{model}}")],
                unit="s",
            ),
            timeseries(
                "Expired in the last hour",
                "Requests that expired unanswered in the last hour, per model "
                "(abstain_desk_expired_last_hour). Above 0 while people answer that model: "
                "AbstainDeskRequestsExpiring.",
                [(f"max by (model) (abstain_desk_expired_last_hour{{{M}}})", "{{model}}")],
            ),
            timeseries(
                "Answers per hour by answer",
                "Labels sent from the desk and acknowledged by Kafka, per model and answer "
                "(abstain_desk_answers_total, summed over replicas). Per person (answers, "
                "median time to answer): the desk's /team page; people are never metric "
                "labels.",
                [
                    (
                        "sum by (model, answer) "
                        f"(rate(abstain_desk_answers_total{{{M}}}[5m])) * 3600",
                        "{{model}} {{answer}}",
                    )
                ],
            ),
            timeseries(
                "Time from claim to answer p50 / p90",
                "How long people hold a request before answering it "
                "(abstain_desk_answer_seconds histogram, all people).",
                quantiles("abstain_desk_answer_seconds", (0.5, 0.9)),
                unit="s",
            ),
            timeseries(
                "Skipped / can't tell per hour",
                "Requests given back (abstain_desk_give_backs_total): skip (offered to others, "
                "not to that person for ten minutes) or can't tell.",
                [
                    (
                        "sum by (model, why) "
                        f"(rate(abstain_desk_give_backs_total{{{M}}}[5m])) * 3600",
                        "{{model}} {{why}}",
                    )
                ],
            ),
            timeseries(
                "Claims won / lost / s",
                "Claims on the leases topic (abstain_desk_claims_total): lost ones went to "
                "someone who claimed the same request first (another replica); many lost "
                "claims mean people race for the same few requests.",
                [
                    (
                        f"sum by (outcome) (rate(abstain_desk_claims_total[{RATE}]))",
                        "{{outcome}}",
                    )
                ],
                unit="ops",
            ),
            timeseries(
                "Records skipped / s by topic",
                "Records the desk did not take (abstain_desk_records_skipped_total): they fail "
                "the learner's checks (unknown model, wrong width, forged id, wrong key or "
                "partition) or do not parse. The learner dead-letters the same records of the "
                "label topics; on the changelog, leases or revocations topic they mean someone "
                "else writes there.",
                [
                    (
                        f"sum by (topic) (rate(abstain_desk_records_skipped_total[{RATE}]))",
                        "{{topic}}",
                    )
                ],
                unit="ops",
            ),
            timeseries(
                "Refusals / s by code",
                "Actions the desk refused (abstain_desk_refusals_total): already_answered, "
                "expired, not_yours, out_of_scope, loading, ...",
                [
                    (
                        f"sum by (code) (rate(abstain_desk_refusals_total[{RATE}]))",
                        "{{code}}",
                    )
                ],
                unit="ops",
            ),
        ],
    ),
    (
        "Label quality",
        [
            stat(
                "Waiting for a second opinion",
                "Answers chosen for a second person's blind answer that have none yet, all "
                "selected models (abstain_desk_second_opinions_open, max over replicas: each "
                "reads the whole labels topic). Chosen: desk.second_opinions (a share at "
                "random, large importance weights, answers against a confident model).",
                [(f"sum(max by (model) (abstain_desk_second_opinions_open{{{M}}}))", "waiting")],
            ),
            stat(
                "Waiting for a reviewer",
                "Answers a second opinion disagreed with, or whose author asked for a review, "
                "that no reviewer decided yet (abstain_desk_reviews_open, max over replicas). "
                "The queue is the desk's /review page.",
                [(f"sum(max by (model) (abstain_desk_reviews_open{{{M}}}))", "waiting")],
            ),
            timeseries(
                "Labels later corrected",
                "Share of the labels of the last two days withdrawn or changed since, by their "
                "author or a reviewer (abstain_desk_labels_corrected_ratio). Per person "
                "(agreement with second opinions and reviewers): the desk's /team page; people "
                "are never metric labels.",
                [(f"max by (model) (abstain_desk_labels_corrected_ratio{{{M}}})", "{{model}}")],
                unit="percentunit",
                width=8,
            ),
            timeseries(
                "Corrections per hour by kind",
                "Corrections written at the desk (abstain_desk_corrections_total, summed over "
                "replicas): undo (an author withdrew an answer), change (another answer, or "
                "an answer again after an undo), review (a reviewer's decision).",
                [
                    (
                        "sum by (model, kind) "
                        f"(rate(abstain_desk_corrections_total{{{M}}}[5m])) * 3600",
                        "{{model}} {{kind}}",
                    )
                ],
                width=8,
            ),
            timeseries(
                "Second opinions and reviews per hour",
                "Second opinions written (abstain_desk_second_opinions_total: agree closes the "
                "answer, disagree sends it to a reviewer), reviewers' decisions "
                "(abstain_desk_reviews_total: confirmed, corrected) and authors asking for a "
                "review (abstain_desk_review_requests_total). Many disagreements: the answers "
                "are noisy, or the question is.",
                [
                    (
                        "sum by (model, outcome) "
                        f"(rate(abstain_desk_second_opinions_total{{{M}}}[5m])) * 3600",
                        "{{model}} second opinion: {{outcome}}",
                    ),
                    (
                        "sum by (model, outcome) "
                        f"(rate(abstain_desk_reviews_total{{{M}}}[5m])) * 3600",
                        "{{model}} review: {{outcome}}",
                    ),
                    (
                        "sum by (model) "
                        f"(rate(abstain_desk_review_requests_total{{{M}}}[5m])) * 3600",
                        "{{model}} asked for review",
                    ),
                ],
                width=8,
            ),
            timeseries(
                "Waiting for a second opinion / a reviewer",
                "Per model (abstain_desk_second_opinions_open, abstain_desk_reviews_open, max "
                "over replicas). A second opinion is asked within "
                "desk.second_opinions.within_seconds of the answer and while the model can "
                "still correct it; a review waits while the model can.",
                [
                    (
                        f"max by (model) (abstain_desk_second_opinions_open{{{M}}})",
                        "{{model}} second opinion",
                    ),
                    (f"max by (model) (abstain_desk_reviews_open{{{M}}})", "{{model}} reviewer"),
                ],
                width=8,
            ),
        ],
    ),
    (
        "Model",
        [
            timeseries(
                "Model version",
                "Version of the model each worker serves; workers converge on the newest.",
                [(f"abstain_model_version{{{M}}}", "{{model}} {{instance}}")],
                minimum=None,
            ),
            timeseries(
                "Reject threshold rho",
                "rho of the reject band |f(x)| <= rho, per worker.",
                [(f"abstain_model_rho{{{M}}}", "{{model}} {{instance}}")],
            ),
            timeseries(
                "Weight norm ||w||",
                "Euclidean norm of the weight vector, per worker.",
                [(f"abstain_model_weight_norm{{{M}}}", "{{model}} {{instance}}")],
            ),
            timeseries(
                "Risk estimate",
                "Importance-weighted 0-d-1 risk of served decisions: each worker's running "
                "estimate (abstain_risk_estimate) and the fleet-wide rate ratio "
                "sum(rate(abstain_iw_loss_total[5m])) / sum(rate(abstain_decisions_total[5m])). "
                "Rejecting everything costs d.",
                [
                    (f"abstain_risk_estimate{{{M}}}", "{{model}} {{instance}} (worker)"),
                    (
                        f"sum by (model) (rate(abstain_iw_loss_total{{{M}}}[5m])) / "
                        f"sum by (model) (rate(abstain_decisions_total{{{M}}}[5m]))",
                        "{{model}} (fleet, 5m)",
                    ),
                ],
                width=12,
            ),
            timeseries(
                "Model version record",
                "Bytes of the record of the model version each worker serves. A hashed model's "
                "grows with the buckets its stream has touched, and while its challengers run.",
                [(f"abstain_model_version_bytes{{{M}}}", "{{model}} {{instance}}")],
                unit="bytes",
                width=6,
            ),
            timeseries(
                "Version record / max_message_bytes",
                "The served version's record over the most a version may take "
                "(max_message_bytes). At 100 % the learner refuses labels as oversize (Updates "
                "refused); AbstainModelVersionNearLimit fires above 80 %.",
                [(f"abstain_model_version_share{{{M}}}", "{{model}} {{instance}}")],
                unit="percentunit",
                width=6,
            ),
        ],
    ),
    (
        "Champion and challengers",
        [
            timeseries(
                "Risk with its 95 % interval",
                "Each model's importance-weighted 0-d-1 risk (abstain_risk_estimate) between "
                "the ends of its 95 % score interval (abstain_risk_estimate_low / _high), from "
                "the labels its version learned from; a shadow is judged on its champion's "
                "labels with the champion's query probabilities, so the estimates compare.",
                [
                    (f"max by (model) (abstain_risk_estimate{{{M}}})", "{{model}}"),
                    (f"max by (model) (abstain_risk_estimate_low{{{M}}})", "{{model}} low"),
                    (f"max by (model) (abstain_risk_estimate_high{{{M}}})", "{{model}} high"),
                ],
                width=12,
            ),
            timeseries(
                "Reject rate, served and shadow",
                "Fraction of the decisions that rejected, fleet-wide over 5 minutes: served "
                "decisions (abstain_decisions_total) and shadow decisions, counted and never "
                "served (abstain_shadow_decisions_total).",
                [
                    (
                        f'sum by (model) (rate(abstain_decisions_total{{action="reject",{M}}}'
                        f"[5m])) / sum by (model) (rate(abstain_decisions_total{{{M}}}[5m]))",
                        "{{model}} (served)",
                    ),
                    (
                        "sum by (model) (rate(abstain_shadow_decisions_total"
                        f'{{action="reject",{M}}}[5m])) / sum by (model) '
                        f"(rate(abstain_shadow_decisions_total{{{M}}}[5m]))",
                        "{{model}} (shadow)",
                    ),
                ],
                unit="percentunit",
                width=6,
            ),
            timeseries(
                "Labels learned from",
                "Labels each model's version in use has learned from (abstain_model_labels); "
                "a shadow's are its champion's.",
                [(f"max by (model) (abstain_model_labels{{{M}}})", "{{model}}")],
                width=6,
            ),
        ],
    ),
    (
        "Model health",
        [
            stat(
                "Collapsed",
                "1 while a model rejects at least 95 % of a window of decisions and its rho "
                "keeps growing, on any worker (max of abstain_model_collapsed); "
                "AbstainModelCollapsed fires after 5 minutes.",
                [(f"max by (model) (abstain_model_collapsed{{{M}}})", "{{model}}")],
                width=6,
                height=8,
                red_from=1,
            ),
            timeseries(
                "Reject fraction",
                "Fraction of the last window of decisions that rejected, per worker "
                "(abstain_model_reject_fraction).",
                [(f"abstain_model_reject_fraction{{{M}}}", "{{model}} {{instance}}")],
                unit="percentunit",
                width=9,
            ),
            timeseries(
                "Refused model snapshots / s by reason",
                "Records on the models topic the workers refused to serve "
                '(abstain_dead_letters_total{source="models"}), by reason: unsigned, '
                "bad_signature, schema, not_json, unknown_model, feature_count, ... Any at all "
                "fires AbstainSnapshotsRefused.",
                [
                    (
                        "sum by (reason) "
                        f'(rate(abstain_dead_letters_total{{source="models"}}[{RATE}]))',
                        "{{reason}}",
                    )
                ],
                unit="ops",
                width=9,
            ),
        ],
    ),
    (
        "Adaptive learning",
        [
            timeseries(
                "Changes detected and takeovers",
                "Changes each model's detector found on its labels "
                "(abstain_drift_detected_total: the champion's margin errors rose, or it "
                "collapsed), and challengers that replaced the learner after one "
                "(abstain_takeovers_total), per hour. A change starts challengers and asks "
                "uniformly more for a while; AbstainDriftDetected tells of it.",
                [
                    (
                        f"sum by (model) (increase(abstain_drift_detected_total{{{M}}}[1h]))",
                        "{{model}} changes",
                    ),
                    (
                        f"sum by (model) (increase(abstain_takeovers_total{{{M}}}[1h]))",
                        "{{model}} takeovers",
                    ),
                ],
                width=8,
            ),
            timeseries(
                "Risk since the last change",
                "Importance-weighted 0-d-1 risk of each model's learner on its labels since "
                "its last change or takeover (abstain_risk_since_change): it rises after a "
                "change and comes back down once the learner (or a challenger that took "
                "over) has recovered; the model's cost d is what rejecting everything costs.",
                [(f"max by (model) (abstain_risk_since_change{{{M}}})", "{{model}}")],
                width=10,
            ),
            timeseries(
                "Labels since the last change",
                "Labels each model learned since its last change or takeover "
                "(abstain_labels_since_change).",
                [(f"max by (model) (abstain_labels_since_change{{{M}}})", "{{model}}")],
                width=6,
            ),
        ],
    ),
    (
        "Corrections",
        [
            timeseries(
                "Corrections applied",
                "Corrections of labels the learner applied, per hour "
                "(abstain_corrections_total): a label changed, withdrawn (an undo), or left "
                "as it was (a reviewer's confirmation). Each changed or withdrawn one made the "
                "model what it would be had the corrected label been given; refused ones are "
                "dead letters (not_author, beyond_reach, ...).",
                [
                    (
                        f"sum by (model, outcome) (increase(abstain_corrections_total{{{M}}}[1h]))",
                        "{{model}} {{outcome}}",
                    )
                ],
                width=8,
            ),
            timeseries(
                "Time to apply a correction (p50, p99)",
                "How long a correction took from when the learner read it to when the model "
                "holding it was written: the labels after the corrected one applied again "
                "from the checkpoint before it, in the learner's derivation process, after "
                "the corrections queued before it (abstain_correction_seconds). It grows with "
                "how far back the correction reaches (corrections.reach), with the model's "
                "width and with the queue.",
                quantiles("abstain_correction_seconds", (0.5, 0.99)),
                unit="s",
                width=8,
            ),
            timeseries(
                "Corrections queued",
                "Corrections the learner has read and noted but that the model does not hold "
                "yet (abstain_corrections_queued): they wait for the derivation in flight and "
                "are applied together by the next one. A queue that stays long: corrections "
                "come faster than the learner derives them (scoring is not slowed by it).",
                [(f"max by (model) (abstain_corrections_queued{{{M}}})", "{{model}}")],
                width=8,
            ),
        ],
    ),
    (
        "Kafka consumers",
        [
            timeseries(
                "Consumer lag per partition",
                "Messages not yet consumed, per topic partition.",
                [
                    (
                        "sum by (topic, partition) (abstain_consumer_lag)",
                        "{{topic}}[{{partition}}]",
                    )
                ],
                width=12,
            ),
            timeseries(
                "Seconds since last progress",
                "Time since each partition last moved; with lag above 0 for stall_seconds "
                "the worker reports itself not live.",
                [
                    (
                        "time() - max by (topic, partition) "
                        "(abstain_last_progress_timestamp_seconds)",
                        "{{topic}}[{{partition}}]",
                    )
                ],
                unit="s",
                width=12,
            ),
            timeseries(
                "Records past the last stable offset",
                "Records written but not yet readable under read_committed, per partition: "
                "from the last stable offset (the first record of the oldest transaction not "
                "yet ended) to the high watermark (abstain_records_past_stable_offset). Not "
                "counted in the consumer lag above, which ends at the last stable offset.",
                [
                    (
                        "max by (topic, partition) (abstain_records_past_stable_offset)",
                        "{{topic}}[{{partition}}]",
                    )
                ],
                width=12,
            ),
            timeseries(
                "Last stable offset held by a transaction",
                "Seconds each partition's last stable offset has stood behind its high "
                "watermark without moving (abstain_pinned_transaction_seconds): a transaction "
                "neither committed nor aborted holds back every record after it. Above "
                "pinned_transaction_seconds /healthz names the partition (alert "
                "AbstainTransactionPinned).",
                [
                    (
                        "max by (topic, partition) (abstain_pinned_transaction_seconds)",
                        "{{topic}}[{{partition}}]",
                    )
                ],
                unit="s",
                width=12,
            ),
            timeseries(
                "Partitions stopped at an unreadable batch",
                "Partitions that stand at a record batch the worker cannot read (a codec, a "
                "CRC, a record that does not parse), per topic: their events wait until "
                "`abstain skip TOPIC PARTITION` dead-letters the batch "
                "(abstain_unreadable_partitions; alert AbstainUnreadableBatch).",
                [("sum by (topic) (abstain_unreadable_partitions)", "{{topic}}")],
                width=12,
            ),
            timeseries(
                "Unreadable batches",
                "Record batches the workers could not read, per topic and outcome: stopped "
                "at (an input), skipped (on an operator's order, or the models topic and "
                "the changelogs, which are read from the start at every start)",
                [
                    (
                        "sum by (topic, outcome) (increase(abstain_unreadable_batches_total[1h]))",
                        "{{topic}} {{outcome}}",
                    )
                ],
                width=12,
            ),
        ],
    ),
]


def layout(rows: list[tuple[str, list[Panel]]]) -> list[Panel]:
    """Give every panel an id and a gridPos: rows stacked, panels flowing left to right."""
    panels: list[Panel] = []
    next_id = 1
    y = 0
    for title, row_panels in rows:
        panels.append(
            {
                "type": "row",
                "title": title,
                "id": next_id,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for panel in row_panels:
            width, height = panel.pop("_size")
            if x + width > 24:
                x, y, line_height = 0, y + line_height, 0
            panels.append(
                {"id": next_id, "gridPos": {"h": height, "w": width, "x": x, "y": y}} | panel
            )
            next_id += 1
            x += width
            line_height = max(line_height, height)
        y += line_height
    return panels


def dashboard() -> dict[str, Any]:
    return {
        "title": "abstain",
        "uid": "abstain-overview",
        "description": "Stream workers with online active learning of reject-option "
        "classifiers: traffic, decisions, labelling, label budgets, the label desk, model state "
        "and health, Kafka consumers.",
        "tags": ["abstain", "kafka", "active-learning"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "hide": 0,
                    "includeAll": False,
                    "multi": False,
                    "refresh": 1,
                    "regex": "",
                },
                {
                    "name": "model",
                    "label": "Model",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "query": "label_values(abstain_events_total, model)",
                    "hide": 0,
                    "includeAll": True,
                    "allValue": ".*",
                    "multi": True,
                    "refresh": 2,
                    "regex": "",
                    "sort": 1,
                },
            ]
        },
        "panels": layout(ROWS),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the JSON file is stale")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text() if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
