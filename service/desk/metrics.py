"""The desk's Prometheus series (``abstain_desk_*``), declared once on an injected registry.

Label values come from closed sets (model names from the settings, answers, outcomes);
never request ids or people (the team view shows people).

>>> from prometheus_client import CollectorRegistry
>>> reg = CollectorRegistry()
>>> m = DeskMetrics(reg, models=["m"])
>>> m.answers.labels(model="m", answer="1").inc()
>>> reg.get_sample_value("abstain_desk_answers_total", {"model": "m", "answer": "1"})
1.0
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "CORRECTION_KINDS",
    "LOGIN_OUTCOMES",
    "OPINION_OUTCOMES",
    "REFUSAL_CODES",
    "REVIEW_OUTCOMES",
    "TOPIC_ROLES",
    "DeskMetrics",
]

# the codes of service.desk.errors.Refused the desk answers with (its refusal series)
REFUSAL_CODES = (
    "already_answered",
    "already_opinion",
    "bad_answer",
    "beyond_reach",
    "expired",
    "grace_over",
    "loading",
    "not_answered",
    "not_author",
    "not_asked",
    "not_reviewer",
    "not_yours",
    "out_of_scope",
    "own_answer",
    "reviewed",
    "unchanged",
    "unknown",
    "unknown_request",
    "withdrawn",
)
#: corrections the desk wrote: an author's undo (withdraw) or change (another answer, or an
#: answer again after an undo), a reviewer's decision (a confirmation included)
CORRECTION_KINDS = ("undo", "change", "review")
#: a second opinion agreed with the label it checked, or not (the answer goes to review)
OPINION_OUTCOMES = ("agree", "disagree")
#: a reviewer kept the label (confirmed) or gave another answer (corrected)
REVIEW_OUTCOMES = ("confirmed", "corrected")
#: how a login attempt ended: signed in, wrong name or password (or a stale form), refused
#: before any check (too many attempts for the account or from the address: 429), or no
#: check free (too many logins being checked at once: 429)
LOGIN_OUTCOMES = ("ok", "failed", "throttled", "busy")
#: the topics the desk follows (``abstain_desk_records_skipped_total{topic}``)
TOPIC_ROLES = ("label_requests", "labels", "pending_changelog", "leases", "revocations")


class DeskMetrics:
    """Every series of the desk."""

    def __init__(self, registry: CollectorRegistry, *, models: Iterable[str]) -> None:
        self.registry = registry
        self.open = Gauge(
            "abstain_desk_open_requests", "open label requests", ["model"], registry=registry
        )
        self.oldest = Gauge(
            "abstain_desk_oldest_open_age_seconds",
            "age of the oldest open request",
            ["model"],
            registry=registry,
        )
        self.expired = Gauge(
            "abstain_desk_expired_last_hour",
            "requests that expired unanswered in the last hour",
            ["model"],
            registry=registry,
        )
        self.leases = Gauge(
            "abstain_desk_active_leases", "requests held by someone now", registry=registry
        )
        self.ready = Gauge(
            "abstain_desk_ready", "1 once the topics are read to their end", registry=registry
        )
        self.answers = Counter(
            "abstain_desk_answers_total",
            "labels sent and acknowledged",
            ["model", "answer"],
            registry=registry,
        )
        self.give_backs = Counter(
            "abstain_desk_give_backs_total",
            "requests skipped or not answerable",
            ["model", "why"],
            registry=registry,
        )
        self.answer_seconds = Histogram(
            "abstain_desk_answer_seconds",
            "from claim to answer",
            ["model"],
            registry=registry,
            buckets=(2, 5, 10, 20, 30, 60, 120, 300, 600),
        )
        self.claims = Counter(
            "abstain_desk_claims_total",
            "claims on the leases topic",
            ["outcome"],
            registry=registry,
        )
        self.refusals = Counter(
            "abstain_desk_refusals_total", "actions refused", ["code"], registry=registry
        )
        self.send_failures = Counter(
            "abstain_desk_send_failures_total",
            "labels Kafka did not acknowledge in time",
            registry=registry,
        )
        self.logins = Counter(
            "abstain_desk_logins_total", "login attempts", ["outcome"], registry=registry
        )
        self.skipped = Counter(
            "abstain_desk_records_skipped_total",
            "records of a followed topic the desk did not take (they fail the learner's checks "
            "or are unreadable)",
            ["topic"],
            registry=registry,
        )
        self._review_series(registry)
        for model in models:
            self._review_children(model)
            for series in (self.open, self.oldest, self.expired):
                series.labels(model=model).set(0)
            # every child from the start, at 0: rate() misses the first increment of a
            # series that appears with it
            self.answer_seconds.labels(model=model)
            for answer in ("1", "-1"):
                self.answers.labels(model=model, answer=answer)
            for why in ("skip", "cant_tell"):
                self.give_backs.labels(model=model, why=why)
        for code in REFUSAL_CODES:
            self.refusals.labels(code=code)
        for outcome in LOGIN_OUTCOMES:
            self.logins.labels(outcome=outcome)
        for topic in TOPIC_ROLES:
            self.skipped.labels(topic=topic)
        for outcome in ("won", "lost"):
            self.claims.labels(outcome=outcome)

    def _review_series(self, registry: CollectorRegistry) -> None:
        """Corrections, second opinions and reviews (docs/operate/desk.md): written by this replica
        (counters), waiting on the topics (gauges: the same on every replica)."""
        self.corrections = Counter(
            "abstain_desk_corrections_total",
            "corrections written (undo, change, review)",
            ["model", "kind"],
            registry=registry,
        )
        self.second_opinions = Counter(
            "abstain_desk_second_opinions_total",
            "second opinions written, by whether they agreed with the label",
            ["model", "outcome"],
            registry=registry,
        )
        self.reviews = Counter(
            "abstain_desk_reviews_total",
            "reviewers' decisions written (confirmed, corrected)",
            ["model", "outcome"],
            registry=registry,
        )
        self.review_requests = Counter(
            "abstain_desk_review_requests_total",
            "authors who asked for a review of their answer",
            ["model"],
            registry=registry,
        )
        self.opinions_open = Gauge(
            "abstain_desk_second_opinions_open",
            "answers waiting for a second opinion",
            ["model"],
            registry=registry,
        )
        self.reviews_open = Gauge(
            "abstain_desk_reviews_open",
            "answers waiting for a reviewer (disagreements, requests for review)",
            ["model"],
            registry=registry,
        )
        self.corrected_ratio = Gauge(
            "abstain_desk_labels_corrected_ratio",
            "share of the labels of the last two days later withdrawn or changed",
            ["model"],
            registry=registry,
        )

    def _review_children(self, model: str) -> None:
        for kind in CORRECTION_KINDS:
            self.corrections.labels(model=model, kind=kind)
        for outcome in OPINION_OUTCOMES:
            self.second_opinions.labels(model=model, outcome=outcome)
        for outcome in REVIEW_OUTCOMES:
            self.reviews.labels(model=model, outcome=outcome)
        self.review_requests.labels(model=model)
        for gauge in (self.opinions_open, self.reviews_open, self.corrected_ratio):
            gauge.labels(model=model).set(0)
