"""Label budgets on a real broker (``label_budget`` and ``max_open_requests`` per model).

1. **Pacing** (``per_hour``): a steady stream of the packaged Phishing data at ``rate`` events
   per second with a budget of ``per_window`` labels per test "hour" (``window`` seconds)
   puts ``per_window`` +- 5 % label requests on the label-requests topic in every window,
   after a warm-up, counted by the time the budget paces by: the Kafka timestamp of each
   request's event (its producer's clock). The same counts by the broker's time of the
   requests (the topic is made with ``LogAppendTime``) are printed beside them: they differ
   by how far the worker's lag moved over a window, which on a busy machine is seconds.
   With two workers (full size) each paces its share of the budget (half the
   feature partitions each) and the windows still hold the model's whole budget. A window
   is off by the change of the budget's credit over it, a few labels whatever its length
   (about sqrt(2 beta H) with H = 200 events: 1-2 % of 400, 2-3 % of 200); the windows
   hold 400 requests so that 5 % is a 3-4 sigma bound, not a coin toss over 14 windows.
   A budget banks at most H mean gaps of its allowance over a pause in the events' time
   (its ``burst`` cap, about a second here), so a window is held to its budget less what a
   pause of the feed past that lost, from the events' own timestamps (printed): the feeder,
   a thread of the test, falls behind on a busy machine and catches up in a burst.
2. **Risk estimate**: an oracle answers every request with the true label; once every label
   is applied, ``abstain_risk_estimate`` (importance-weighted: sum L_d / p over sum 1 / p)
   is compared with the true 0-d-1 risk of the decisions served, which the test computes
   from the labels it knows. Its standard error at CI size (about 0.01) makes a bound of
   0.02 a 2-sigma bound there: the CI size checks ``max(0.02, 4 SE)``, with SE the larger of
   the one estimated from the labelled sample and the one over every decision served (the
   test knows every label; the sample's alone is small exactly when a rare, heavily
   weighted error went unasked and the estimate is low), and the full size, about four
   times the labels, checks 0.02.
   The test also recomputes the estimate from the requests (the service's arithmetic, to
   1e-9) and checks that the decisions' ``query_probability`` is honest (sum p over the
   decisions matches the requests asked, within 4 sigma).
3. **Open-request cap**: a burst at ten times the steady event rate with nobody answering
   and ``max_open_requests`` 50: the budget still asks at its rate (not ten times it,
   over the events' span by their Kafka timestamps: the clock it paces by),
   less what a pause of the feed past the budget's bank lost, as in 1),
   ``abstain_pending_requests`` never exceeds 50, every request beyond 50 is dropped and
   counted (``abstain_label_requests_dropped_total``), and the 50 kept are the most urgent
   of all asked (the pending changelog, replayed).

Each test prints its numbers (and writes them as JSON under its tmp dir).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from faults import HarnessError
from faults.checks import final_entries
from faults.kafkaio import MAX_REQUEST, partitions_of, read_topic
from faults.oracle import Observer
from faults.scenario import max_version, quiesce
from faults.workers import Deployment, WorkerProcess, service_config, wait_until

from service.datasets import load_dataset, resolve_dataset_path
from service.learning import QueryBudget

MODEL = "m"
COST = 0.25


# --- sizes ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Pace:
    """One run of the pacing / risk test."""

    rate: float  # events per second, steady
    warmup: float  # seconds before the first window (the model learns fastest then)
    window: float  # seconds: the test's "hour"
    per_window: int  # label requests the budget allows per window
    windows: int  # windows measured, after the warm-up
    workers: int
    max_weight: float  # max_importance_weight (1/p floor of the estimate)
    risk_tolerance: float | None  # |estimate - true| bound (None: max(0.02, 4 SE))
    timeout: float  # bound on each wait after the feed

    @property
    def per_hour(self) -> float:
        return self.per_window * 3600.0 / self.window

    @property
    def seconds(self) -> float:
        """Feed length: the warm-up, the measured windows and a second to spare."""
        return self.warmup + self.window * self.windows + 1.0


# The budget's explore share (0.1) asks every event with p >= 0.1 * (budget / events), i.e.
# 0.01 (CI) and 0.005 (full): the default weight cap (100) would clip those weights and
# bias the estimate upwards (reported next to it), so the deployments raise it to 1000.
PACES = {
    "ci": Pace(200.0, 10.0, 20.0, 400, 2, 1, 1000.0, None, 120.0),
    "full": Pace(200.0, 20.0, 40.0, 400, 7, 2, 1000.0, 0.02, 300.0),
}


def pace_params() -> list[Any]:
    return [pytest.param("ci", id="ci"), pytest.param("full", id="full", marks=pytest.mark.slow)]


# --- data -------------------------------------------------------------------------------
class Phishing:
    """The packaged Phishing rows (68 features, labels +-1) in a shuffled order, cycled,
    as events ``{id, features}`` with unique ids; ``truth`` maps event id -> label."""

    def __init__(self, prefix: str, *, seed: int = 0) -> None:
        X, y = load_dataset(resolve_dataset_path("phishing"))
        self.prefix = prefix
        self.order = np.random.default_rng(seed).permutation(len(y)).tolist()
        self.rows = [json.dumps(x) for x in X.tolist()]
        self.labels = [int(v) for v in y.tolist()]
        self.truth: dict[str, int] = {}
        self.count = 0

    def make(self, n: int) -> list[tuple[bytes, bytes]]:
        out = []
        for _ in range(n):
            i = self.count
            self.count += 1
            row = self.order[i % len(self.order)]
            eid = f"{self.prefix}-{i}"
            self.truth[eid] = self.labels[row]
            out.append((eid.encode(), f'{{"id": "{eid}", "features": {self.rows[row]}}}'.encode()))
        return out


class Gaussian:
    """Cheap 3-feature events (the cap test needs volume, not a realistic model)."""

    def __init__(self, prefix: str, *, seed: int = 0) -> None:
        self.prefix = prefix
        self.rng = np.random.default_rng(seed)
        self.truth: dict[str, int] = {}
        self.count = 0

    def make(self, n: int) -> list[tuple[bytes, bytes]]:
        xs = self.rng.normal(size=(n, 3)).round(4).tolist()
        out = []
        for x in xs:
            eid = f"{self.prefix}-{self.count}"
            self.count += 1
            self.truth[eid] = 1 if x[0] + 0.5 * x[1] - x[2] > 0 else -1
            out.append((eid.encode(), json.dumps({"id": eid, "features": x}).encode()))
        return out


# --- Kafka helpers ----------------------------------------------------------------------
def _create(bootstrap: str, topics: dict[str, tuple[int, dict[str, str]]]) -> None:
    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            new = [NewTopic(n, p, 1, topic_configs=c) for n, (p, c) in topics.items()]
            response = await admin.create_topics(new)
            for topic_error in response.topic_errors:
                if topic_error[1] not in (0, TopicAlreadyExistsError.errno):
                    raise HarnessError(f"cannot create topic {topic_error[0]}: {topic_error[1]}")
        finally:
            await admin.close()

    asyncio.run(run())


@contextmanager
def budget_deployment(bootstrap: str, tmp: Path, **overrides: Any) -> Iterator[Deployment]:
    """A fresh deployment whose label-requests topic stamps records with the broker's time
    (``LogAppendTime``); its workers are stopped by PID on the way out."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = service_config(tmp, **overrides)
    dep = Deployment(bootstrap, tmp, config)
    t, p = dep.topics, config["partitions"]
    _create(
        bootstrap,
        {
            t["features"]: (p["features"], {}),
            t["decisions"]: (p["decisions"], {}),
            t["label_requests"]: (p["labels"], {"message.timestamp.type": "LogAppendTime"}),
            t["labels"]: (p["labels"], {}),
            t["models"]: (p["models"], {"cleanup.policy": "compact"}),
            t["dead_letters"]: (1, {}),
        },
    )
    try:
        yield dep
    finally:
        dep.close()


def read_stamped(bootstrap: str, topic: str, *, timeout: float = 60.0) -> list[tuple[float, Any]]:
    """``(timestamp in s, parsed value)`` of every record of ``topic`` up to its end now."""

    async def run() -> list[tuple[float, Any]]:
        tps = await partitions_of(bootstrap, topic)
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            enable_auto_commit=False,
            max_partition_fetch_bytes=MAX_REQUEST,
            fetch_max_bytes=4 * MAX_REQUEST,
        )
        await consumer.start()
        out: list[tuple[float, Any]] = []
        try:
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            end = await consumer.end_offsets(tps)
            deadline = time.monotonic() + timeout
            while any([await consumer.position(tp) < end[tp] for tp in tps]):
                if time.monotonic() > deadline:
                    raise HarnessError(f"reading {topic} took over {timeout:.0f}s")
                batch = await consumer.getmany(timeout_ms=500, max_records=10_000)
                for recs in batch.values():
                    out += [
                        (r.timestamp / 1000.0, json.loads(r.value))
                        for r in recs
                        if r.offset < end[TopicPartition(r.topic, r.partition)]
                    ]
        finally:
            await consumer.stop()
        return out

    return asyncio.run(run())


class PacedFeeder(threading.Thread):
    """Produces ``make(n)`` events at ``rate`` per second for ``seconds`` (one producer,
    a tick every ``tick`` s, on an absolute schedule so the mean rate holds even when a
    tick runs late). ``started_at`` / ``ended_at``: wall-clock times of the first send and
    of the last acknowledgement."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        make: Callable[[int], list[tuple[bytes, bytes]]],
        *,
        rate: float,
        seconds: float,
        tick: float = 0.02,
    ) -> None:
        super().__init__(name="budget-feeder", daemon=True)
        self.bootstrap, self.topic, self.make = bootstrap, topic, make
        self.rate, self.seconds, self.tick = rate, seconds, tick
        self.total = int(round(rate * seconds))
        self.sent = 0
        self.started_at = math.nan
        self.ended_at = math.nan
        self.late = 0.0  # longest the schedule ran behind (s)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - handed to the test by finish()
            self.error = exc

    async def _main(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, linger_ms=2, acks="all", enable_idempotence=True
        )
        await producer.start()
        try:
            pending: list[asyncio.Future[Any]] = []
            self.started_at = time.time()
            t0 = time.monotonic()
            while self.sent < self.total:
                elapsed = time.monotonic() - t0
                due = min(self.total, int(self.rate * elapsed) + 1) - self.sent
                self.late = max(self.late, elapsed - self.sent / self.rate)
                for key, value in self.make(due):
                    pending.append(await producer.send(self.topic, value, key=key))
                self.sent += due
                still = []
                for fut in pending:
                    if fut.done():
                        fut.result()  # raises what the send met
                    else:
                        still.append(fut)
                pending = still
                await asyncio.sleep(self.tick - (time.monotonic() - t0) % self.tick)
            await asyncio.gather(*pending)
            self.ended_at = time.time()
        finally:
            await producer.stop()

    def finish(self, timeout: float) -> None:
        self.join(timeout)
        if self.is_alive():
            raise HarnessError(f"the feeder did not finish in {timeout:.0f}s")
        if self.error is not None:
            raise HarnessError(f"the feeder failed: {self.error!r}") from self.error


class GaugeSampler(threading.Thread):
    """Reads a gauge of ``worker`` every ``every`` s; ``values`` as (time, value)."""

    def __init__(self, worker: WorkerProcess, name: str, every: float = 0.2) -> None:
        super().__init__(name="budget-gauge", daemon=True)
        self.worker, self.name, self.every = worker, name, every
        self.values: list[tuple[float, float]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.every):
            try:
                self.values.append((time.time(), self.worker.metric(self.name, {"model": MODEL})))
            except (OSError, ValueError):
                continue

    def halt(self) -> list[tuple[float, float]]:
        self._halt.set()
        self.join(10)
        return list(self.values)


# --- reporting --------------------------------------------------------------------------
def emit(name: str, numbers: dict[str, Any], tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Print the numbers past pytest's capture and keep them as JSON next to the logs."""
    (tmp / f"{name}.json").write_text(json.dumps(numbers, indent=2, default=str))
    width = max(len(k) for k in numbers)
    text = "\n".join(f"  {k:<{width}}  {v}" for k, v in numbers.items())
    with capsys.disabled():
        print(f"\n{name}\n{text}")


def lost_to_pauses(
    stamps: list[float], edges: list[float], bank: float, per_second: float
) -> list[float]:
    """The allowance each window between ``edges`` lost to pauses in the stream: a budget
    per second banks at most ``bank`` seconds of its allowance over a gap in the events'
    time (its ``burst`` cap: H mean gaps), so of a gap longer than that, what lies past the
    bank is never spent (``per_second`` labels a second of it). A feeder that falls behind
    on a busy machine and catches up in a burst makes such gaps.

    >>> lost_to_pauses([0.0, 1.0, 5.0, 6.0], [0.0, 4.0, 8.0], bank=1.0, per_second=10.0)
    [20.0, 10.0]
    """
    lost = [0.0] * (len(edges) - 1)
    ordered = sorted(stamps)
    for before, after in pairwise(ordered):
        start = before + bank
        if after <= start:
            continue
        for k, (a, b) in enumerate(pairwise(edges)):
            lost[k] += per_second * max(0.0, min(after, b) - max(start, a))
    return lost


def loss(decided: int | None, label: int) -> float:
    """0-d-1 loss of a served decision (``decided`` None or 0: rejected)."""
    if not decided:
        return COST
    return 0.0 if decided == label else 1.0


def estimate(requests: list[dict[str, Any]], truth: dict[str, int], cap: float) -> float:
    """The service's estimate from the requests: sum L / p over sum 1 / p, p >= 1 / cap."""
    w = np.array([1.0 / max(float(r["query_probability"]), 1.0 / cap) for r in requests])
    lo = np.array([loss(int(r["decided_label"]), truth[r["event_id"]]) for r in requests])
    return float((w * lo).sum() / w.sum())


def standard_error(requests: list[dict[str, Any]], truth: dict[str, int], cap: float) -> float:
    """Estimated standard error of the self-normalised importance-weighted estimate (Poisson
    sampling: sum (1 - p) w^2 (L - R)^2 over the asked, over (sum w)^2)."""
    p = np.array([max(float(r["query_probability"]), 1.0 / cap) for r in requests])
    lo = np.array([loss(int(r["decided_label"]), truth[r["event_id"]]) for r in requests])
    w = 1.0 / p
    r = float((w * lo).sum() / w.sum())
    return float(math.sqrt(((1.0 - np.minimum(p, 1.0)) * w**2 * (lo - r) ** 2).sum()) / w.sum())


def design_standard_error(
    decisions: list[dict[str, Any]], truth: dict[str, int], cap: float
) -> float:
    """The estimate's standard error over every decision served, which the test can compute
    because it knows every event's label: each is asked with its probability p and, if
    asked, weighs w = 1 / max(p, 1 / cap); linearised, sum p (1 - p) w^2 (L - R)^2 over
    (sum p w)^2. Unlike :func:`standard_error` it does not depend on which events happened
    to be asked: a rare error with a large weight that was not asked makes the estimate low
    and the sample's standard error small at once."""
    p = np.array([min(1.0, float(d["query_probability"])) for d in decisions])
    w = 1.0 / np.maximum(p, 1.0 / cap)
    lo = np.array([loss(d["label"], truth[d["id"]]) for d in decisions])
    r = float((p * w * lo).sum() / (p * w).sum())
    return float(math.sqrt((p * (1.0 - p) * w**2 * (lo - r) ** 2).sum()) / (p * w).sum())


def gauge_sum(workers: list[WorkerProcess], name: str) -> float:
    return sum(w.metric(name, {"model": MODEL}) for w in workers)


# --- 1 + 2: pacing and the risk estimate ------------------------------------------------
@pytest.mark.parametrize("size", pace_params())
def test_budget_paces_requests_and_the_risk_estimate_is_unbiased(
    size: str, kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pace = PACES[size]
    began = time.monotonic()
    models = {
        MODEL: {
            "algorithm": "dsal",
            "cost": COST,
            "n_features": 68,
            "label_budget": {"per_hour": pace.per_hour},
        }
    }
    with budget_deployment(
        kafka_bootstrap,
        tmp_path,
        partitions={"features": 4, "decisions": 2, "labels": 1, "models": 1},
        models=models,
        max_importance_weight=pace.max_weight,
    ) as dep:
        src = Phishing("ph", seed=3)
        observer = Observer(kafka_bootstrap, dep.topics, src.truth, budget=10**9).begin()
        workers = [dep.start() for _ in range(pace.workers)]
        for w in workers:
            w.wait_ready()
        # every worker holds its share of the features (the budget splits by them)
        wait_until(
            lambda: (
                all(
                    w.metric("abstain_label_budget_labels_per_hour", {"model": MODEL}) > 0
                    for w in workers
                )
                and math.isclose(
                    gauge_sum(workers, "abstain_label_budget_labels_per_hour"),
                    pace.per_hour,
                    rel_tol=1e-9,
                )
            ),
            60,
            "the budget split between the workers",
        )
        shares = [
            w.metric("abstain_label_budget_labels_per_hour", {"model": MODEL}) for w in workers
        ]
        ready_s = time.monotonic() - began

        feeder = PacedFeeder(
            dep.bootstrap, dep.topics["features"], src.make, rate=pace.rate, seconds=pace.seconds
        )
        feeder.start()
        feeder.finish(pace.seconds + 60)
        n = feeder.total
        observer.wait(lambda o: o.decided(src.truth) == n, pace.timeout, "every event decided")
        quiesce(dep, observer, pace.timeout)
        observer.wait(
            lambda o: (
                len(o.answered) == len(o.requests) and max_version(o, MODEL) == len(o.answered)
            ),
            pace.timeout,
            "every request answered and applied",
        )
        version = max_version(observer, MODEL)
        wait_until(
            lambda: all(
                w.metric("abstain_model_version", {"model": MODEL}) == version for w in workers
            ),
            30,
            "the workers serving the last version",
        )
        gauges = [w.metric("abstain_risk_estimate", {"model": MODEL}) for w in workers]
        spent = [w.metric("abstain_label_budget_spent_ratio", {"model": MODEL}) for w in workers]
        suppressed = gauge_sum(workers, "abstain_label_requests_suppressed_total")
        stamped = read_stamped(dep.bootstrap, dep.topics["label_requests"])
        events = read_stamped(dep.bootstrap, dep.topics["features"])
        event_times = {str(event["id"]): ts for ts, event in events}
        decisions = [r.json() for r in read_topic(dep.bootstrap, dep.topics["decisions"])]
        with observer.lock:
            seen = {eid: ds[0] for eid, ds in observer.decisions.items()}
            answered = len(observer.answered)
        observer.halt()

    # 1. requests per window, by the broker's clock
    requests = [value for _, value in stamped]
    ids = [r["request_id"] for r in requests]
    t0 = feeder.started_at
    edges = [t0, *(t0 + pace.warmup + k * pace.window for k in range(pace.windows + 1))]
    paced = [event_times[r["event_id"]] for r in requests]
    counts = [sum(1 for ts in paced if a <= ts < b) for a, b in pairwise(edges)]
    written = [sum(1 for ts, _ in stamped if a <= ts < b) for a, b in pairwise(edges)]
    lags = [ts - paced[k] for k, (ts, _) in enumerate(stamped)]
    measured = counts[1:]
    off = [c / pace.per_window - 1.0 for c in measured]
    # each worker banks H of its own mean gaps (its share of the partitions) over a pause
    bank = QueryBudget(0.1).horizon * pace.workers / pace.rate
    lost = lost_to_pauses([ts for ts, _ in events], edges, bank, pace.per_window / pace.window)[1:]

    # 2. the estimate against the true risk of every decision served
    true_risk = float(np.mean([loss(d.label, src.truth[e]) for e, d in seen.items()]))
    mine = estimate(requests, src.truth, pace.max_weight)
    at_100 = estimate(requests, src.truth, 100.0)
    se = standard_error(requests, src.truth, pace.max_weight)
    first = {}
    for d in decisions:
        first.setdefault(d["id"], d)
    design_se = design_standard_error(list(first.values()), src.truth, pace.max_weight)
    tolerance = (
        pace.risk_tolerance if pace.risk_tolerance is not None else max(0.02, 4 * se, 4 * design_se)
    )
    p_sum = sum(float(d["query_probability"]) for d in first.values())
    p_var = sum(
        float(d["query_probability"]) * (1 - float(d["query_probability"])) for d in first.values()
    )
    queried = sum(1 for d in first.values() if d["queried"])
    p_min = min(float(d["query_probability"]) for d in first.values())

    numbers = {
        "size": size,
        "workers": pace.workers,
        "events": n,
        "rate ev/s (offered)": pace.rate,
        "feed s": round(feeder.ended_at - feeder.started_at, 1),
        "feeder late s (max)": round(feeder.late, 3),
        "warm-up s / window s": f"{pace.warmup:g} / {pace.window:g}",
        "budget per window": pace.per_window,
        "per_hour configured": pace.per_hour,
        "labels/h per worker (gauge)": shares,
        "requests per window, by event time (warm-up first)": counts,
        "requests per window, by the broker's time of the request": written,
        "request written after its event s (median / max)": (
            f"{np.median(lags):.3f} / {max(lags):.3f}"
        ),
        "measured windows off target": [f"{x:+.1%}" for x in off],
        "allowance lost to pauses of the feed past the bank": [round(x, 1) for x in lost],
        "requests total": len(requests),
        "decided": len(seen),
        "decisions queried": queried,
        "sum p over decisions (+- sd)": f"{p_sum:.1f} +- {math.sqrt(p_var):.1f}",
        "smallest p": p_min,
        "suppressed (learner wanted, budget said no)": int(suppressed),
        "spent ratio per worker": [round(s, 3) for s in spent],
        "labels applied (model version)": version,
        "true risk": round(true_risk, 5),
        "abstain_risk_estimate per worker": [round(g, 5) for g in gauges],
        "estimate - true": round(gauges[0] - true_risk, 5),
        "estimate SE (from the sample)": round(se, 5),
        "estimate SE (over every decision)": round(design_se, 5),
        "tolerance": round(tolerance, 5),
        f"estimate recomputed (cap {pace.max_weight:g} / default cap 100)": (
            f"{mine:.5f} / {at_100:.5f}"
        ),
        "runtime s (ready / total)": f"{ready_s:.0f} / {time.monotonic() - began:.0f}",
    }
    emit(f"label budget, pacing and risk ({size})", numbers, tmp_path, capsys)

    assert len(set(ids)) == len(ids), "a label request written twice"
    assert queried == len(requests)
    assert answered == len(requests) == version
    for k, (c, gone) in enumerate(zip(measured, lost, strict=True), start=1):
        allowed = pace.per_window - gone
        assert abs(c - allowed) <= 0.05 * pace.per_window, (
            f"window {k}: {c} requests, budget {pace.per_window} less {gone:.1f} lost to "
            f"pauses of the feed, +- 5 % of the budget ({counts})"
        )
    # every decision's query_probability is the probability it was asked with
    assert abs(p_sum - len(requests)) <= 4 * math.sqrt(p_var) + 1, (p_sum, len(requests))
    assert all(g == gauges[0] for g in gauges), gauges
    assert abs(gauges[0] - mine) <= 1e-9, (gauges[0], mine)
    assert abs(gauges[0] - true_risk) <= tolerance, (
        f"estimate {gauges[0]:.4f}, true risk {true_risk:.4f}, SE {se:.4f}"
    )


# --- 3: the open-request cap under a burst ----------------------------------------------
@dataclass(frozen=True, slots=True)
class Burst:
    rate: float  # events per second: ten times the steady rate the budget is sized for
    seconds: float
    per_second: float  # the budget (labels per second)
    cap: int  # max_open_requests


BURST = Burst(rate=2000.0, seconds=8.0, per_second=20.0, cap=50)


def _queue_key(request: dict[str, Any]) -> tuple[float, float, str]:
    """Where a request stands in the learner's queue (``service.stream.labels.state.QueueKey``)."""

    def finite(x: Any) -> float:
        v = float(x)
        return v if math.isfinite(v) else 0.0

    return (
        -finite(request["priority"]),
        finite(request["requested_at"]),
        str(request["request_id"]),
    )


def test_open_request_cap_holds_under_a_burst_with_no_answers(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    b = BURST
    began = time.monotonic()
    models = {
        MODEL: {
            "algorithm": "dsal",
            "cost": COST,
            "n_features": 3,
            "label_budget": {"per_hour": b.per_second * 3600.0},
            "max_open_requests": b.cap,
        }
    }
    with budget_deployment(
        kafka_bootstrap,
        tmp_path,
        partitions={"features": 4, "decisions": 2, "labels": 1, "models": 1},
        models=models,
    ) as dep:
        src = Gaussian("burst", seed=5)
        observer = Observer(kafka_bootstrap, dep.topics, src.truth, budget=0).begin()
        worker = dep.start()
        worker.wait_ready()
        sampler = GaugeSampler(worker, "abstain_pending_requests")
        sampler.start()
        feeder = PacedFeeder(
            dep.bootstrap, dep.topics["features"], src.make, rate=b.rate, seconds=b.seconds
        )
        feeder.start()
        feeder.finish(b.seconds + 60)
        n = feeder.total
        observer.wait(lambda o: o.decided(src.truth) == n, 120, "every event decided")
        quiesce(dep, observer, 60)
        time.sleep(2.0)  # the gauges refresh once a second
        samples = sampler.halt()
        final_gauge = worker.metric("abstain_pending_requests", {"model": MODEL})
        dropped = worker.metric("abstain_label_requests_dropped_total", {"model": MODEL})
        suppressed = worker.metric("abstain_label_requests_suppressed_total", {"model": MODEL})
        spent = worker.metric("abstain_label_budget_spent_ratio", {"model": MODEL})
        changelog = read_topic(dep.bootstrap, dep.changelog("pending"))
        events = read_stamped(dep.bootstrap, dep.topics["features"])
        with observer.lock:
            requests = dict(observer.requests)
            times = [ds[0].ts for ds in observer.decisions.values()]
        observer.halt()

    # the budget paces by event time (each event's Kafka timestamp): the requests it may
    # ask are its rate over the events' span; the decisions' span is longer by however far
    # a busy worker fell behind, and is printed beside it
    stamps = [ts for ts, _ in events]
    span = max(stamps) - min(stamps)
    # one worker banks H of its mean gaps over a pause of the feed (as in the pacing test)
    bank = QueryBudget(0.1).horizon / b.rate
    lost = lost_to_pauses(stamps, [min(stamps), max(stamps)], bank, b.per_second)[0]
    allowed = b.per_second * span - lost
    # the pending table over time, replayed from its changelog (one partition: in order)
    live: set[str] = set()
    most = 0
    for rec in changelog:
        key, value = rec.key.decode() if rec.key else "", rec.json()
        if value is None or value.get("applied"):
            live.discard(key)
        else:
            live.add(key)
        most = max(most, len(live))
    kept = {k for k, v in final_entries(changelog).items() if v is not None}
    urgent = {r["request_id"] for r in sorted(requests.values(), key=_queue_key)[: b.cap]}
    numbers = {
        "events": n,
        "rate ev/s (offered)": b.rate,
        "event-time span s (first to last event)": round(span, 2),
        "scoring span s (first to last decision)": round(max(times) - min(times), 2),
        "budget labels/s": b.per_second,
        "allowance lost to pauses of the feed past the bank": round(lost, 1),
        "requests allowed over the span": round(allowed, 1),
        "requests asked": len(requests),
        "spent ratio (gauge)": round(spent, 3),
        "suppressed (learner wanted, budget said no)": int(suppressed),
        "max_open_requests": b.cap,
        "abstain_pending_requests max (samples)": max(v for _, v in samples),
        "gauge samples": len(samples),
        "abstain_pending_requests at the end": final_gauge,
        "dropped (counter)": int(dropped),
        "pending table entries, most at once (changelog)": most,
        "kept at the end == the 50 most urgent": kept == urgent,
        "runtime s": round(time.monotonic() - began),
    }
    emit("label budget, open-request cap under a burst", numbers, tmp_path, capsys)

    # the budget held under ten times the event rate (asking ten times more would be ~2000)
    assert 0.8 * allowed <= len(requests) <= 1.2 * b.per_second * span + 10, (
        len(requests),
        allowed,
        lost,
    )
    assert len(requests) > b.cap
    assert max(v for _, v in samples) <= b.cap
    assert final_gauge == b.cap
    assert dropped == len(requests) - b.cap > 0
    assert most <= b.cap + 1  # a new request is stored, then the least urgent dropped
    assert kept == urgent, "the requests kept are not the most urgent ones"


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(pytest.main([__file__, "-x", "-q"]))
