"""The metric catalogue: every series of the brief, on the injected registry only."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from service.metrics import Metrics

CATALOGUE = {
    "abstain_events_total": ("counter", {"model"}),
    "abstain_decisions_total": ("counter", {"model", "action"}),
    "abstain_label_requests_total": ("counter", {"model"}),
    "abstain_label_requests_expired_total": ("counter", {"model"}),
    "abstain_labels_applied_total": ("counter", {"model"}),
    "abstain_labels_ignored_total": ("counter", {"model", "reason"}),
    "abstain_updates_refused_total": ("counter", {"model", "reason"}),
    "abstain_label_groups_redone_total": ("counter", {"model"}),
    "abstain_moments_refused_total": ("counter", {"model", "reason"}),
    "abstain_pending_requests": ("gauge", {"model"}),
    "abstain_oldest_pending_age_seconds": ("gauge", {"model"}),
    "abstain_label_turnaround_seconds": ("histogram", {"model"}),
    "abstain_model_version": ("gauge", {"model"}),
    "abstain_model_version_bytes": ("gauge", {"model"}),
    "abstain_model_version_share": ("gauge", {"model"}),
    "abstain_model_rho": ("gauge", {"model"}),
    "abstain_model_weight_norm": ("gauge", {"model"}),
    "abstain_query_rate": ("gauge", {"model"}),
    "abstain_risk_estimate": ("gauge", {"model"}),
    "abstain_risk_estimate_low": ("gauge", {"model"}),
    "abstain_risk_estimate_high": ("gauge", {"model"}),
    "abstain_model_labels": ("gauge", {"model"}),
    "abstain_shadow_decisions_total": ("counter", {"model", "action"}),
    "abstain_iw_loss_total": ("counter", {"model"}),
    "abstain_dead_letters_total": ("counter", {"source", "reason"}),
    "abstain_decide_latency_seconds": ("histogram", {"model"}),
    "abstain_consumer_lag": ("gauge", {"topic", "partition"}),
    "abstain_last_progress_timestamp_seconds": ("gauge", {"topic", "partition"}),
    "abstain_pinned_transaction_seconds": ("gauge", {"topic", "partition"}),
    "abstain_records_past_stable_offset": ("gauge", {"topic", "partition"}),
    "abstain_label_requests_suppressed_total": ("counter", {"model"}),
    "abstain_label_requests_dropped_total": ("counter", {"model"}),
    "abstain_importance_weights_clipped_total": ("counter", {"model"}),
    "abstain_label_budget_labels_per_hour": ("gauge", {"model"}),
    "abstain_label_budget_spent_ratio": ("gauge", {"model"}),
    "abstain_model_collapsed": ("gauge", {"model"}),
    "abstain_drift_detected_total": ("counter", {"model"}),
    "abstain_takeovers_total": ("counter", {"model"}),
    "abstain_risk_since_change": ("gauge", {"model"}),
    "abstain_labels_since_change": ("gauge", {"model"}),
    "abstain_model_reject_fraction": ("gauge", {"model"}),
    "abstain_corrections_total": ("counter", {"model", "outcome"}),
    "abstain_correction_seconds": ("histogram", {"model"}),
    "abstain_corrections_queued": ("gauge", {"model"}),
    "abstain_unreadable_partitions": ("gauge", {"topic"}),
    "abstain_unreadable_batches_total": ("counter", {"topic", "outcome"}),
    "abstain_ready": ("gauge", set()),
    "abstain_live": ("gauge", set()),
}


def _families(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    out = {}
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le"}
        out[name] = (family.type, labels)
    return out


def test_every_series_of_the_catalogue_is_declared_with_its_type_and_labels() -> None:
    registry = CollectorRegistry()
    m = Metrics(registry, models=["a", "b"])
    m.set_partition("abstain.features", 0, lag=3, progress_ts=1.0)
    m.set_stable("abstain.features", 0, pinned=0.0, past_stable=0)
    m.dead_letters.labels(source="features", reason="not_json").inc()
    m.unreadable_partitions.labels(topic="abstain.features").set(0)
    m.unreadable_batches.labels(topic="abstain.features", outcome="stopped").inc()
    # shown only for models that have them (a budget) or once known (a full window)
    for gauge in (m.label_budget_target, m.label_budget_spent, m.model_reject_fraction):
        gauge.labels(model="a").set(0.5)
    assert _families(registry) == CATALOGUE


def test_model_children_exist_at_zero_before_traffic() -> None:
    registry = CollectorRegistry()
    Metrics(registry, models=["spam"])
    get = registry.get_sample_value
    assert get("abstain_decisions_total", {"model": "spam", "action": "reject"}) == 0.0
    assert get("abstain_labels_ignored_total", {"model": "spam", "reason": "redelivered"}) == 0
    assert get("abstain_decide_latency_seconds_count", {"model": "spam"}) == 0.0
    assert get("abstain_live") == 1.0
    assert get("abstain_ready") == 0.0


def test_two_instances_do_not_collide_and_the_global_registry_stays_clean() -> None:
    a, b = CollectorRegistry(), CollectorRegistry()
    Metrics(a, models=["m"]).events.labels(model="m").inc(3)
    Metrics(b, models=["m"])
    assert a.get_sample_value("abstain_events_total", {"model": "m"}) == 3.0
    assert b.get_sample_value("abstain_events_total", {"model": "m"}) == 0.0
    assert b"abstain_" not in generate_latest(REGISTRY)


def test_revoked_partitions_lose_their_series() -> None:
    registry = CollectorRegistry()
    m = Metrics(registry)
    m.set_partition("t", 3, lag=5, progress_ts=10.0)
    assert registry.get_sample_value("abstain_consumer_lag", {"topic": "t", "partition": "3"}) == 5
    m.remove_partition("t", 3)
    m.remove_partition("t", 3)  # twice is harmless
    assert (
        registry.get_sample_value("abstain_consumer_lag", {"topic": "t", "partition": "3"}) is None
    )


def test_dead_letter_series_exist_for_every_source_and_reason() -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    for source in ("features", "labels", "label-requests"):
        for reason in ("not_json", "schema", "expired", "oversize"):
            labels = {"source": source, "reason": reason}
            assert registry.get_sample_value("abstain_dead_letters_total", labels) == 0.0
