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

__all__ = ["LOGIN_OUTCOMES", "REFUSAL_CODES", "TOPIC_ROLES", "DeskMetrics"]

# the codes of service.desk.errors.Refused the desk answers with (its refusal series)
REFUSAL_CODES = (
    "already_answered",
    "bad_answer",
    "expired",
    "loading",
    "not_yours",
    "out_of_scope",
    "unknown",
)
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
        self.open = Gauge("abstain_desk_open_requests", "open label requests",
                          ["model"], registry=registry)  # fmt: skip
        self.oldest = Gauge(
            "abstain_desk_oldest_open_age_seconds", "age of the oldest open request", ["model"],
            registry=registry,
        )  # fmt: skip
        self.expired = Gauge("abstain_desk_expired_last_hour",
                             "requests that expired unanswered in the last hour", ["model"],
                             registry=registry)  # fmt: skip
        self.leases = Gauge("abstain_desk_active_leases", "requests held by someone now",
                            registry=registry)  # fmt: skip
        self.ready = Gauge("abstain_desk_ready", "1 once the topics are read to their end",
                           registry=registry)  # fmt: skip
        self.answers = Counter("abstain_desk_answers_total", "labels sent and acknowledged",
                               ["model", "answer"], registry=registry)  # fmt: skip
        self.give_backs = Counter(
            "abstain_desk_give_backs_total", "requests skipped or not answerable",
            ["model", "why"], registry=registry,
        )  # fmt: skip
        self.answer_seconds = Histogram(
            "abstain_desk_answer_seconds", "from claim to answer", ["model"], registry=registry,
            buckets=(2, 5, 10, 20, 30, 60, 120, 300, 600),
        )  # fmt: skip
        self.claims = Counter("abstain_desk_claims_total", "claims on the leases topic",
                              ["outcome"], registry=registry)  # fmt: skip
        self.refusals = Counter("abstain_desk_refusals_total", "actions refused",
                                ["code"], registry=registry)  # fmt: skip
        self.send_failures = Counter("abstain_desk_send_failures_total",
                                     "labels Kafka did not acknowledge in time",
                                     registry=registry)  # fmt: skip
        self.logins = Counter("abstain_desk_logins_total", "login attempts", ["outcome"],
                              registry=registry)  # fmt: skip
        self.skipped = Counter(
            "abstain_desk_records_skipped_total",
            "records of a followed topic the desk did not take (they fail the learner's checks "
            "or are unreadable)", ["topic"], registry=registry,
        )  # fmt: skip
        for model in models:
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
