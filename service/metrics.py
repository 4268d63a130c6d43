"""Every Prometheus series the service exports, declared once on an injected registry.

Names use the ``abstain_`` prefix, base units (seconds) and ``_total`` for counters. Label
values come from closed sets: model names (from configuration), actions, reasons, topics
and partitions the worker consumes; never event or request ids.

>>> from prometheus_client import CollectorRegistry
>>> reg = CollectorRegistry()
>>> m = Metrics(reg, models=["default"])
>>> m.decisions.labels(model="default", action="predict").inc()
>>> reg.get_sample_value("abstain_decisions_total", {"model": "default", "action": "predict"})
1.0
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.records import Action
from service.records.codec import DEAD_LETTER_REASONS
from service.records.reasons import IGNORED, MOMENTS_REFUSED, REFUSED, Source

__all__ = ["CORRECTION_OUTCOMES", "Metrics"]

#: what a correction did (the ``outcome`` label of ``abstain_corrections_total``)
CORRECTION_OUTCOMES: Final = ("changed", "withdrawn", "unchanged")

_LATENCY_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
_CORRECTION_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_TURNAROUND_BUCKETS: Final = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0)


class Metrics:
    """The service's series. Construct once per process (or per test) with its registry;
    ``models`` pre-creates the per-model children so every series shows from the start."""

    def __init__(self, registry: CollectorRegistry, *, models: Iterable[str] = ()) -> None:
        self.registry = registry
        r = registry
        self.events = Counter(
            "abstain_events_total", "Feature events consumed", ["model"], registry=r
        )
        self.decisions = Counter(
            "abstain_decisions_total", "Decisions served", ["model", "action"], registry=r
        )
        self.shadow_decisions = Counter(
            "abstain_shadow_decisions_total",
            "Decisions of shadow models on their champion's events (counted, never served)",
            ["model", "action"],
            registry=r,
        )
        self.risk_low = Gauge(
            "abstain_risk_estimate_low",
            "Lower end of the risk estimate's 95 % interval (ratio, score interval)",
            ["model"],
            registry=r,
        )
        self.risk_high = Gauge(
            "abstain_risk_estimate_high",
            "Upper end of the risk estimate's 95 % interval (ratio, score interval)",
            ["model"],
            registry=r,
        )
        self.model_labels = Gauge(
            "abstain_model_labels",
            "Labels the model version in use has learned from (a shadow: its champion's)",
            ["model"],
            registry=r,
        )
        self.label_requests = Counter(
            "abstain_label_requests_total", "Label requests emitted", ["model"], registry=r
        )
        self.label_requests_expired = Counter(
            "abstain_label_requests_expired_total",
            "Label requests dropped unanswered after their TTL",
            ["model"],
            registry=r,
        )
        self.labels_applied = Counter(
            "abstain_labels_applied_total", "Labels applied to the model", ["model"], registry=r
        )
        self.labels_ignored = Counter(
            "abstain_labels_ignored_total",
            "Labels that changed nothing",
            ["model", "reason"],
            registry=r,
        )
        self.updates_refused = Counter(
            "abstain_updates_refused_total",
            "Model updates refused (state would not be finite)",
            ["model", "reason"],
            registry=r,
        )
        self.groups_redone = Counter(
            "abstain_label_groups_redone_total",
            "Groups of labels the learner applied again one label at a time, each version "
            "checked: the group's newest version failed a check, or one of its labels was "
            "refused",
            ["model"],
            registry=r,
        )
        self.moments_refused = Counter(
            "abstain_moments_refused_total",
            "Label requests whose moments were refused, not merged into the model's first "
            "standardiser: implausible against its statistics (mean, spread; no key), not "
            "signed by a worker (unsigned, bad_signature; with snapshot_key), or of other "
            "inputs than the model gathers (width). The label still teaches; the request is "
            "dead-lettered with reason moments",
            ["model", "reason"],
            registry=r,
        )
        self.pending_requests = Gauge(
            "abstain_pending_requests", "Unanswered label requests", ["model"], registry=r
        )
        self.oldest_pending_age = Gauge(
            "abstain_oldest_pending_age_seconds",
            "Age of the oldest unanswered label request",
            ["model"],
            registry=r,
        )
        self.label_turnaround = Histogram(
            "abstain_label_turnaround_seconds",
            "Time from label request to applied label",
            ["model"],
            buckets=_TURNAROUND_BUCKETS,
            registry=r,
        )
        self.model_version = Gauge(
            "abstain_model_version", "Model version in use for scoring", ["model"], registry=r
        )
        self.model_version_bytes = Gauge(
            "abstain_model_version_bytes",
            "Bytes of the record of the model version in use (0 until a version is read: the "
            "initial one is made, not read)",
            ["model"],
            registry=r,
        )
        self.model_version_share = Gauge(
            "abstain_model_version_share",
            "The record of the model version in use over the most a version may take "
            "(max_message_bytes): a hashed model's grows with the buckets its stream touches; "
            "a label whose version would pass 1 is refused as oversize",
            ["model"],
            registry=r,
        )
        self.model_rho = Gauge("abstain_model_rho", "Rejection width rho", ["model"], registry=r)
        self.model_weight_norm = Gauge(
            "abstain_model_weight_norm", "Euclidean norm of w", ["model"], registry=r
        )
        self.query_rate = Gauge(
            "abstain_query_rate", "Fraction of recent decisions that queried", ["model"], registry=r
        )
        self.risk_estimate = Gauge(
            "abstain_risk_estimate",
            "Importance-weighted running 0-d-1 risk of served decisions",
            ["model"],
            registry=r,
        )
        self.iw_loss = Counter(
            "abstain_iw_loss_total",
            "Sum of L_d / p over applied labels",
            ["model"],
            registry=r,
        )
        self.dead_letters = Counter(
            "abstain_dead_letters_total", "Messages dead-lettered", ["source", "reason"], registry=r
        )
        self.decide_latency = Histogram(
            "abstain_decide_latency_seconds",
            "Time to decide one event (batch time / batch size)",
            ["model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.consumer_lag = Gauge(
            "abstain_consumer_lag", "Messages behind the end", ["topic", "partition"], registry=r
        )
        self.pinned_transaction = Gauge(
            "abstain_pinned_transaction_seconds",
            "Seconds the partition's last stable offset has stood behind its high watermark "
            "without moving: a transaction neither committed nor aborted holds back every "
            "record after it under read_committed (0 while it moves or is at the end)",
            ["topic", "partition"],
            registry=r,
        )
        self.past_stable = Gauge(
            "abstain_records_past_stable_offset",
            "Records at or after the partition's last stable offset (high watermark minus last "
            "stable offset): written but not readable under read_committed until the "
            "transactions before them end; not counted in abstain_consumer_lag",
            ["topic", "partition"],
            registry=r,
        )
        self.last_progress = Gauge(
            "abstain_last_progress_timestamp_seconds",
            "Unix time of the last processed message",
            ["topic", "partition"],
            registry=r,
        )
        self.unreadable_partitions = Gauge(
            "abstain_unreadable_partitions",
            "Partitions stopped at a record batch the worker cannot read (codec, CRC, a record "
            "that does not parse) until `abstain skip` moves them past it",
            ["topic"],
            registry=r,
        )
        self.unreadable_batches = Counter(
            "abstain_unreadable_batches_total",
            "Record batches the worker could not read: stopped at (an input) or skipped (on an "
            "operator's order, or read again from the beginning: models, changelogs)",
            ["topic", "outcome"],
            registry=r,
        )
        self.label_requests_suppressed = Counter(
            "abstain_label_requests_suppressed_total",
            "Events the learner would have asked about that its label budget did not",
            ["model"],
            registry=r,
        )
        self.label_requests_dropped = Counter(
            "abstain_label_requests_dropped_total",
            "Open label requests dropped, least urgent first, when a model's queue was full",
            ["model"],
            registry=r,
        )
        self.weights_clipped = Counter(
            "abstain_importance_weights_clipped_total",
            "Applied labels whose importance weight 1/p was capped (max_importance_weight): "
            "the risk estimate is biased upwards while this grows",
            ["model"],
            registry=r,
        )
        self.label_budget_target = Gauge(
            "abstain_label_budget_labels_per_hour",
            "Labels per hour this worker's share of the model's budget allows (per-hour "
            "budgets; fraction budgets: the fraction times this worker's event rate)",
            ["model"],
            registry=r,
        )
        self.label_budget_spent = Gauge(
            "abstain_label_budget_spent_ratio",
            "Labels asked over labels the budget allowed so far on this worker (1 = on target)",
            ["model"],
            registry=r,
        )
        self.model_collapsed = Gauge(
            "abstain_model_collapsed",
            "1 while the model rejects nearly every event and its rho keeps growing",
            ["model"],
            registry=r,
        )
        self.model_reject_fraction = Gauge(
            "abstain_model_reject_fraction",
            "Fraction of the last window of decisions that rejected",
            ["model"],
            registry=r,
        )
        self.drift_detected = Counter(
            "abstain_drift_detected_total",
            "Changes the model's detector found on its labels (rising margin errors, or a "
            "collapse); each starts challengers and a while of uniform exploration",
            ["model"],
            registry=r,
        )
        self.takeovers = Counter(
            "abstain_takeovers_total",
            "Challengers that replaced the model's learner after a change (better on the "
            "labels since the change)",
            ["model"],
            registry=r,
        )
        self.risk_since_change = Gauge(
            "abstain_risk_since_change",
            "Importance-weighted 0-d-1 risk of the model's learner on its labels since the "
            "last change or takeover (NaN: no label since)",
            ["model"],
            registry=r,
        )
        self.labels_since_change = Gauge(
            "abstain_labels_since_change",
            "Labels the model learned since its last change or takeover",
            ["model"],
            registry=r,
        )
        self.corrections = Counter(
            "abstain_corrections_total",
            "Corrections of labels the learner applied: the label changed, withdrawn, or "
            "left as it was (a reviewer's confirmation); refused ones are dead letters",
            ["model", "outcome"],
            registry=r,
        )
        self.correction_seconds = Histogram(
            "abstain_correction_seconds",
            "Time to apply a correction, from when the learner read it to when the model "
            "holding it was written (the labels after the corrected one applied again)",
            ["model"],
            buckets=_CORRECTION_BUCKETS,
            registry=r,
        )
        self.corrections_queued = Gauge(
            "abstain_corrections_queued",
            "Corrections the learner read and noted that the model does not hold yet (they "
            "are applied together by the next derivation)",
            ["model"],
            registry=r,
        )
        self.ready = Gauge("abstain_ready", "1 when recovered and models loaded", registry=r)
        self.live = Gauge("abstain_live", "0 when a stalled consumer is detected", registry=r)
        self.live.set(1)
        for source in Source:
            for reason in sorted(DEAD_LETTER_REASONS):
                self.dead_letters.labels(source=source, reason=reason)
        for model in models:
            self.add_model(model)

    def add_model(self, model: str) -> None:
        """Create every per-model child so the series exist (at 0) before traffic."""
        for metric in (
            self.events,
            self.label_requests,
            self.label_requests_expired,
            self.labels_applied,
            self.pending_requests,
            self.oldest_pending_age,
            self.label_turnaround,
            self.model_version,
            self.model_version_bytes,
            self.model_version_share,
            self.model_rho,
            self.model_weight_norm,
            self.query_rate,
            self.risk_estimate,
            self.risk_low,
            self.risk_high,
            self.model_labels,
            self.iw_loss,
            self.decide_latency,
            self.label_requests_suppressed,
            self.label_requests_dropped,
            self.weights_clipped,
            self.model_collapsed,
            self.drift_detected,
            self.takeovers,
            self.groups_redone,
            self.risk_since_change,
            self.labels_since_change,
            self.correction_seconds,
            self.corrections_queued,
        ):
            metric.labels(model=model)
        for outcome in CORRECTION_OUTCOMES:
            self.corrections.labels(model=model, outcome=outcome)
        for action in Action:
            self.decisions.labels(model=model, action=action)
            self.shadow_decisions.labels(model=model, action=action)
        for reason in IGNORED:
            self.labels_ignored.labels(model=model, reason=reason)
        for reason in REFUSED:
            self.updates_refused.labels(model=model, reason=reason)
        for kind in MOMENTS_REFUSED:
            self.moments_refused.labels(model=model, reason=kind)

    def set_model(
        self,
        model: str,
        *,
        version: int,
        rho: float,
        weight_norm: float | None,
        risk: float,
        low: float = math.nan,
        high: float = math.nan,
        labels: int = 0,
        since_change: tuple[float, int] | None = None,
        record_bytes: int = 0,
        version_bytes: int = 0,
    ) -> None:
        """The gauges of the model version in use (``weight_norm`` None: no explicit w;
        ``risk`` NaN: no label yet, the gauges keep their last values; ``since_change``:
        an adaptive model's risk and labels since its last change, None for another;
        ``record_bytes``: its record's, 0 for a version made rather than read, and its
        share of ``version_bytes``, the most a version may take, when that is given)."""
        self.model_version_bytes.labels(model=model).set(record_bytes)
        if version_bytes > 0:
            self.model_version_share.labels(model=model).set(record_bytes / version_bytes)
        self.model_labels.labels(model=model).set(labels)
        if since_change is not None:
            self.risk_since_change.labels(model=model).set(since_change[0])
            self.labels_since_change.labels(model=model).set(since_change[1])
        if not math.isnan(low):
            self.risk_low.labels(model=model).set(low)
            self.risk_high.labels(model=model).set(high)
        self.model_version.labels(model=model).set(version)
        self.model_rho.labels(model=model).set(rho)
        if weight_norm is not None:
            self.model_weight_norm.labels(model=model).set(weight_norm)
        if not math.isnan(risk):
            self.risk_estimate.labels(model=model).set(risk)

    def set_partition(self, topic: str, partition: int, *, lag: float, progress_ts: float) -> None:
        self.consumer_lag.labels(topic=topic, partition=str(partition)).set(lag)
        self.last_progress.labels(topic=topic, partition=str(partition)).set(progress_ts)

    def set_stable(self, topic: str, partition: int, *, pinned: float, past_stable: int) -> None:
        """A partition's transaction gauges (:class:`~service.stream.health.stalls.PinnedWatch`)."""
        self.pinned_transaction.labels(topic=topic, partition=str(partition)).set(pinned)
        self.past_stable.labels(topic=topic, partition=str(partition)).set(past_stable)

    def remove_partition(self, topic: str, partition: int) -> None:
        """Drop a partition's series (on revoke)."""
        for metric in (
            self.consumer_lag,
            self.last_progress,
            self.pinned_transaction,
            self.past_stable,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(topic, str(partition))
