"""Observability on a live system: a real Prometheus (Debian's ``prometheus``) scrapes a real
worker and label desk on the session's broker, with the project's alert rules, while a feed
sends events at known rates, an oracle answers some label requests, a person works at the
desk and the faults are injected. One deployment serves the module:

- model ``m``: the oracle answers half of its requests (the queue grows; unanswered ones
  expire after ``TTL``) and a person at the desk some of the rest; ``c``: answered with coin
  flips at cost 0.4 (it never learns and rejects everything: collapse, high risk); ``boom``:
  a step size that overflows on features of 1e300 (updates refused); ``q``: a label budget
  and a queue of 3, never answered (requests dropped);
- 120 events that are not JSON (dead letters) and one record on the models topic that is not
  a snapshot (refused);
- a second Prometheus scrapes the same targets at the chart's default interval (30 s) all
  module long, with the rules as shipped, for the windows test at the end.

The fast Prometheus scrapes and evaluates every second and runs the rules with every ``for:``
cut to ``HOLD`` seconds and two thresholds that stand for a setting or a duration set to
this run's (``FAST``); the expressions and their windows are the shipped ones. Alerts whose
expressions look back over a window (increase over 1 h, rate over 5 m, ...) are seen firing;
they resolve once the window has passed, which is not waited for here (promtool's unit
tests, deploy/prometheus/alerts_test.yml, cover that on synthetic series).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from faults import HarnessError
from faults.kafkaio import produce
from faults.kcat import write_unreadable
from faults.oracle import Observer, answer_fraction
from faults.prom import (
    RULES,
    AlertLog,
    Corrector,
    DeskClient,
    DeskRun,
    DeskShift,
    PacedFeed,
    fast_rules,
    panel_queries,
    rule_names,
)
from faults.scenario import deployment
from faults.workers import REPO, Deployment, WorkerProcess, http, wait_until

from service.localkafka import LocalKafka
from service.localprom import LocalPrometheus

# its worker must keep up with ~130 events/s and their labels for the alerts to fire on
# time: with other tests beside it on two cores it falls behind (make test runs it alone)
pytestmark = pytest.mark.solo

FAULT_WORKER = Path(__file__).resolve().parent / "faults" / "faultworker.py"
SCRAPE = 1.0  # s, scrape and evaluation interval of the fast Prometheus
HOLD = 2.0  # s, every `for:` of the fast rules
TTL = 16.0  # s, request_ttl_seconds
STALL = 3.0  # s, stall_seconds
CHART_INTERVAL = 30.0  # s, serviceMonitor.interval in helm/abstain/values.yaml
# events/s; c fills a collapse window (500 decisions) in about 6 s
# d: asks the desk, where nobody works on it (its queue grows faster than it is answered)
RATES = {"m": 40.0, "c": 80.0, "boom": 2.0, "q": 4.0, "d": 4.0}
BAD_EVENTS = 120
FAST = {
    # 80 % of request_ttl_seconds, as the rule's comment asks
    "AbstainOldestPendingNearExpiry": {"0.8 * 3600": f"0.8 * {TTL:g}"},
    # "no progress for 5 minutes", scaled like the `for:` durations
    "AbstainConsumerNoProgress": {"> 300": "> 5"},
    # 80 % of max_message_bytes: this run's versions (3 inputs) take a few KB of its 1 MB,
    # so any version a worker serves after reading it stands for one near the limit
    "AbstainModelVersionNearLimit": {"> 0.8": "> 0"},
}
WAIT = 90.0  # s, the longest wait for one alert to fire or resolve (a loaded machine)


@dataclass
class Live:
    """The module's running system."""

    dep: Deployment
    worker: WorkerProcess
    desk: DeskRun
    prom: LocalPrometheus
    prom30: LocalPrometheus
    feed: PacedFeed
    observer: Observer
    shift: DeskShift
    alerts: AlertLog

    def restart(self) -> None:
        """A new worker and a new desk (new ports; the instance names stay)."""
        self.worker = _start_worker(self.dep)
        self.desk = DeskRun.start(self.dep, self.dep.tmp / "desk.log")
        _targets((self.prom, self.prom30), self.worker, self.desk)
        self.worker.wait_ready()
        # (it reads the pending changelog from its start: on a busy machine, a minute or more)
        wait_until(self.desk.ready, 150, "the desk ready again")
        self.shift.client.url = self.desk.url


def _start_worker(dep: Deployment) -> WorkerProcess:
    return dep.start(argv=[sys.executable, str(FAULT_WORKER)])


def _targets(proms: Iterable[LocalPrometheus], worker: WorkerProcess, desk: DeskRun) -> None:
    for prom in proms:
        prom.set_targets("abstain", {"worker-0": f"127.0.0.1:{worker.port}"})
        prom.set_targets("abstain-desk", {"desk-0": f"127.0.0.1:{desk.port}"})


def _models() -> dict[str, Any]:
    base = {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05}
    return {
        "m": base,
        "c": {**base, "cost": 0.4},
        "boom": {**base, "standardize": False, "hyperparameters": {"eta": 1e300}},
        "q": {**base, "max_open_requests": 3, "label_budget": {"per_hour": 3600}},
        "d": base,
        # a shadow: the champion-and-challengers panels chart its decisions and risk
        "c-dral": {**base, "algorithm": "dral", "cost": 0.4, "champion": "c"},
    }


def _answer(request: dict[str, Any]) -> bool:
    model = request.get("model")
    return model in ("c", "boom") or (model == "m" and answer_fraction(0.5)(request))


@pytest.fixture(scope="module")
def live(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("observability")
    desk = {
        "auth": "proxy",
        "trusted_proxies": ["127.0.0.1"],  # (the tests are the proxy)
        "session_key": "s" * 32,
        "min_time_left_seconds": 4.0,
        "leases_topic": f"obs-{time.time_ns()}.desk-leases",
    }
    with contextlib.ExitStack() as stack:
        dep = stack.enter_context(
            deployment(
                kafka_bootstrap,
                tmp / "svc",
                models=_models(),
                request_ttl_seconds=TTL,
                expired_grace_seconds=2.0,
                stall_seconds=STALL,
                sweep_every=1,
                desk=desk,
                env={"PYTHONPATH": str(REPO)},
            )
        )
        worker = _start_worker(dep)
        worker.wait_ready()
        # after the worker: the desk reads the pending changelog, which the worker creates
        desk_run = DeskRun.start(dep, dep.tmp / "desk.log")
        stack.callback(desk_run.stop)
        rules = fast_rules(tmp / "alerts-fast.yml", hold=HOLD, replace=FAST)
        prom = LocalPrometheus(
            tmp / "prom", scrape_interval=SCRAPE, rule_files=[rules], die_with_parent=True
        )
        prom30 = LocalPrometheus(
            tmp / "prom30", scrape_interval=CHART_INTERVAL, rule_files=[RULES], die_with_parent=True
        )
        _targets((prom, prom30), worker, desk_run)
        for server in (prom, prom30):
            stack.callback(server.stop)
            server.start()
        wait_until(desk_run.ready, 60, "the desk ready")
        # traffic once both are scraped: a first scrape after a change hides it from rate()
        scraped = 'count(up{job=~"abstain|abstain-desk"} == 1) == 2'
        wait_until(lambda: bool(prom.query(scraped)), 60, "the first scrapes")
        feed = PacedFeed(
            kafka_bootstrap,
            dep.topics["features"],
            RATES,
            noise=frozenset({"c"}),
            scale={"boom": 1e300},
        )
        observer = Observer(kafka_bootstrap, dep.topics, feed.truth, budget=10**9, answer=_answer)
        stack.callback(lambda: observer.halt() if observer.is_alive() else None)
        observer.begin()
        stack.callback(feed.halt)
        feed.begin()
        shift = DeskShift(DeskClient(desk_run.url, "ann"), "m")
        stack.callback(shift.halt)
        shift.start()
        # a reviewer correcting answered labels of m: the "Corrections" row's data
        corrector = Corrector(kafka_bootstrap, dep.topics["labels"], observer, "m")
        stack.callback(corrector.halt)
        corrector.start()
        produce(
            kafka_bootstrap,
            dep.topics["features"],
            [(f"bad-{i}".encode(), b"{not json") for i in range(BAD_EVENTS)],
        )
        produce(kafka_bootstrap, dep.topics["models"], [(b"m", b"{not a snapshot")])
        live = Live(dep, worker, desk_run, prom, prom30, feed, observer, shift, AlertLog(prom))
        stack.callback(lambda: live.desk.stop())  # the one a test restarted, if any
        yield live


def _number(sample: dict[str, Any]) -> float:
    return float(sample["value"][1])


def test_a_live_scrape_of_the_worker_and_the_desk_is_clean_for_promtool(live: Live) -> None:
    for url in (live.worker.url, live.desk.url):
        status, body = http(url + "/metrics")
        assert status == 200
        lint = subprocess.run(
            ["promtool", "check", "metrics"], input=body, capture_output=True, timeout=30
        )
        assert lint.returncode == 0, (url, lint.stdout.decode(), lint.stderr.decode())
        assert not lint.stdout.strip(), lint.stdout.decode()


def _empty_panels(live: Live, rate_interval: str) -> list[str]:
    """The panels with no finite value yet: a series that exists but saw nothing in the
    window (a quantile of no observations is NaN) is a gap on screen too."""
    return [
        f"{q.panel} [{q.ref}]: {q.expr}"
        for q in panel_queries(rate_interval)
        if not any(math.isfinite(_number(s)) for s in live.prom.query(q.expr))
    ]


def test_every_dashboard_query_returns_plausible_data(live: Live) -> None:
    # the consumer drops a few fetched events, which the worker then reads itself
    status, _ = live.worker.post(
        "/__faults/skip", json.dumps({"topic": live.dep.topics["features"], "count": 10}).encode()
    )
    assert status == 200
    # Grafana's $__rate_interval is at least 4 scrape intervals; 15 s is what it picks for
    # a few minutes on screen at a 1 s scrape (and smooths the feed's 0.1 s ticks)
    window = 15.0
    empty: list[str] = []
    # a correction is derived and applied in a few seconds on an idle machine, and may take
    # minutes beside a busy neighbour: the wait ends as soon as every panel has data
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        empty = _empty_panels(live, f"{window:g}s")
        if not empty:
            break
        time.sleep(2)
    assert not empty, (
        "panel queries without data:\n"
        + "\n".join(empty)
        + (f"\nthe desk shift: {live.shift.done}")
    )

    for q in panel_queries(f"{window:g}s"):
        values = [_number(s) for s in live.prom.query(q.expr)]
        finite = [v for v in values if math.isfinite(v)]
        assert finite, (q.panel, q.expr, values)
        if q.unit in ("ops", "s", "percentunit"):
            assert min(finite) >= 0, (q.panel, q.expr, values)
        if q.unit == "percentunit":
            assert max(finite) <= 1, (q.panel, q.expr, values)

    # events/s per model within 10 % of what the feed sent over the same window, once the
    # window holds a scrape a second and the feed has run for all of it
    full = f'count_over_time(abstain_events_total{{model="m"}}[{window:g}s]) >= {window - 1:g}'
    wait_until(lambda: bool(live.prom.query(full)), 60, "a full window of scrapes")
    wait_until(lambda: time.time() - live.feed.began >= window, 60, "a full window of events")
    expr = f"sum by (model) (rate(abstain_events_total[{window:g}s]))"
    now = time.time()
    measured = {s["metric"]["model"]: _number(s) for s in live.prom.query(expr)}
    for model in ("m", "c"):
        sent = live.feed.rate(model, now - window, now)
        assert sent == pytest.approx(RATES[model], rel=0.1)
        assert measured[model] == pytest.approx(sent, rel=0.1), (model, measured, sent)
    risk = {s["metric"]["model"]: _number(s) for s in live.prom.query("abstain_risk_estimate")}
    assert 0.0 <= risk["m"] <= 1.0, risk
    latency = f"rate(abstain_decide_latency_seconds_bucket[{window:g}s])"
    p99 = live.prom.query(f"histogram_quantile(0.99, sum by (le) ({latency}))")
    assert 0.0 < _number(p99[0]) < 1.0, p99
    answers = live.prom.query('sum(increase(abstain_desk_answers_total{model="m"}[5m]))')
    assert _number(answers[0]) > 0, (answers, live.shift.done)


def test_the_alerts_of_bad_input_unanswered_labels_and_a_collapsed_model_fire(
    live: Live,
) -> None:
    fire = live.alerts.wait_firing
    fire("AbstainDeadLettersHigh", {"source": "features", "reason": "not_json"}, timeout=WAIT)
    fire("AbstainSnapshotsRefused", {"reason": "not_json"}, timeout=WAIT)
    fire("AbstainUpdatesRefused", {"model": "boom"}, timeout=WAIT)
    fire("AbstainLabelQueueFull", {"model": "q"}, timeout=WAIT)
    fire("AbstainPendingRequestsGrowing", {"model": "m"}, timeout=WAIT)
    # (m's desk queue is answered by the shift as it grows; d's by nobody)
    fire("AbstainDeskQueueGrowing", {"model": "d"}, timeout=WAIT)
    fire("AbstainOldestPendingNearExpiry", {"model": "m"}, timeout=WAIT)
    fire("AbstainLabelRequestsExpiring", {"model": "m"}, timeout=WAIT)
    fire("AbstainDeskRequestsExpiring", {"model": "m"}, timeout=WAIT)
    # (c collapses while rho grows; once rho settles it only rejects, and the alert ends)
    live.alerts.wait_fired("AbstainModelCollapsed", {"model": "c"}, timeout=WAIT)
    fire("AbstainRiskHigh", {"model": "c"}, timeout=WAIT)
    # the served version's record, as a share of the most a version may take
    near = fire("AbstainModelVersionNearLimit", {"model": "m"}, timeout=WAIT)
    share = float(near["value"])
    size = _number(live.prom.query('max(abstain_model_version_bytes{model="m"})')[0])
    assert 1_000 < size < 100_000, size
    assert share == pytest.approx(size / 1_000_000, rel=0.5), (share, size)
    # the well-taught model is not at risk
    assert not live.alerts.active("AbstainRiskHigh", {"model": "m"})


def test_a_paused_consumer_fires_stalled_and_no_progress_which_resolve_after_resume(
    live: Live,
) -> None:
    for name in ("AbstainConsumerStalled", "AbstainConsumerNoProgress"):
        live.alerts.wait_resolved(name, timeout=WAIT)  # quiet before the fault
    status, _ = live.worker.post("/__faults/pause", b"")
    assert status == 200
    try:
        live.alerts.wait_firing("AbstainConsumerStalled", {"instance": "worker-0"}, timeout=WAIT)
        alert = live.alerts.wait_firing(
            "AbstainConsumerNoProgress", {"topic": live.dep.topics["features"]}, timeout=WAIT
        )
        assert float(alert["value"]) > 0  # the lag it reports
    finally:
        status, _ = live.worker.post("/__faults/resume", b"")
    assert status == 200
    live.alerts.wait_resolved("AbstainConsumerStalled", timeout=WAIT)
    live.alerts.wait_resolved("AbstainConsumerNoProgress", timeout=WAIT)


def test_a_batch_the_worker_cannot_read_fires_unreadable_which_resolves_after_skip(
    live: Live,
) -> None:
    live.alerts.wait_resolved("AbstainUnreadableBatch", timeout=WAIT)  # quiet before
    topic = live.dep.topics["features"]
    write_unreadable(
        live.dep.bootstrap, topic, 0, [{"id": "bad", "model": "m", "features": [0, 0, 0]}]
    )
    alert = live.alerts.wait_firing("AbstainUnreadableBatch", {"topic": topic}, timeout=WAIT)
    assert "skip" in alert["annotations"]["runbook"]
    cmd = [
        sys.executable,
        "-m",
        "service",
        "skip",
        topic,
        "0",
        "--by",
        "sre",
        "--config",
        str(live.dep.write_config()),
        "--broker",
        live.dep.bootstrap,
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["skipped"]
    live.alerts.wait_resolved("AbstainUnreadableBatch", timeout=WAIT)
    live.alerts.wait_resolved("AbstainConsumerStalled", timeout=WAIT)


def test_a_killed_worker_and_desk_fire_the_down_alerts_which_resolve_after_restarts(
    live: Live,
) -> None:
    for name in ("AbstainWorkerDown", "AbstainWorkersAbsent", "AbstainDeskDown"):
        live.alerts.wait_resolved(name, timeout=WAIT)  # quiet before the fault
    live.worker.kill9()
    live.desk.stop()
    live.alerts.wait_firing("AbstainWorkerDown", {"instance": "worker-0"}, timeout=WAIT)
    live.alerts.wait_firing("AbstainWorkersAbsent", timeout=WAIT)
    live.alerts.wait_firing("AbstainDeskDown", {"job": "abstain-desk"}, timeout=WAIT)
    live.restart()  # new ports: file discovery keeps the instance names
    live.alerts.wait_resolved("AbstainWorkerDown", timeout=WAIT)
    live.alerts.wait_resolved("AbstainWorkersAbsent", timeout=WAIT)
    live.alerts.wait_resolved("AbstainDeskDown", timeout=WAIT)


def test_a_stopped_broker_fires_not_ready_which_resolves_when_it_returns(
    live: Live, kafka_broker: LocalKafka
) -> None:
    # quiet before the fault (a restarted worker may be briefly unready in a rebalance)
    live.alerts.wait_resolved("AbstainWorkerNotReady", timeout=WAIT)
    live.feed.hold()
    try:
        assert kafka_broker.stop()
        live.alerts.wait_firing("AbstainWorkerNotReady", {"instance": "worker-0"}, timeout=WAIT)
        assert live.worker.alive()
        assert kafka_broker.start()
    finally:
        live.feed.go()
    live.alerts.wait_resolved("AbstainWorkerNotReady", timeout=WAIT)
    live.feed.check()


RANGE = re.compile(r"\b(rate|increase|deriv)\((\w+(?:\{[^}]*\})?)\[(\w+)\]\)")


def _seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]]


def test_rule_and_panel_windows_work_at_the_charts_default_scrape_interval(live: Live) -> None:
    """The rules as shipped and the dashboard at a 30 s scrape (the second Prometheus has
    scraped all module long): every windowed function returns series, and no window is
    shorter than four scrape intervals (one missed scrape must not empty it)."""
    doc = yaml.safe_load(RULES.read_text())
    exprs = [r["expr"] for g in doc["groups"] for r in g["rules"]]
    # Grafana: $__rate_interval = max(4 x scrape interval, interval + scrape interval)
    exprs += [q.expr for q in panel_queries(f"{4 * CHART_INTERVAL:g}s")]
    windows = {m for e in exprs for m in RANGE.findall(e)}
    unread = [e for e in exprs if "[" in e and not RANGE.search(e)]
    assert windows
    assert not unread, f"windowed expressions this test does not read: {unread}"
    for func, selector, window in sorted(windows):
        assert _seconds(window) >= 4 * CHART_INTERVAL, (func, selector, window)

    def empty() -> list[str]:
        exprs = [f"{func}({selector}[{window}])" for func, selector, window in sorted(windows)]
        return [e for e in exprs if not live.prom30.query(e)]

    # an earlier test of the module killed the worker and stopped the broker: the windows
    # fill once the worker has been scraped again for a window's length (a few scrapes)
    with contextlib.suppress(HarnessError):  # said below, with what stayed empty
        wait_until(
            lambda: not empty(), 240, "every window filled at the chart's interval", every=5.0
        )
    missing = empty()
    assert not missing, f"empty at a {CHART_INTERVAL:g}s scrape: {missing}"
    # the shipped rules load and are evaluated there
    groups = live.prom30.api("rules")["groups"]
    evaluated = {r["name"] for g in groups for r in g["rules"] if r.get("health") == "ok"}
    assert evaluated == set(rule_names())


def test_every_alert_was_seen_firing_or_is_listed_as_not_provoked_here(live: Live) -> None:
    """The alerts page (docs/operate/observability.md) names the alerts no test here
    provokes (AbstainTransactionPinned: tests/integration/test_pinned_transaction.py, with a
    Prometheus of its own)."""
    not_here = {"AbstainLabelBudgetOverspent", "AbstainTransactionPinned"}
    readme = (REPO / "docs" / "operate" / "observability.md").read_text()
    for name in not_here:
        assert name in readme
    assert live.alerts.fired() | not_here == set(rule_names()), live.alerts.fired()
