"""Pieces shared by the fault tests: a deployment with its topics made up front, and the
learning report (model chain, its explanation label by label, offline replay and the
accounting of label requests) read back from Kafka after a run."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.config import ModelConfig
from service.records.signing import signer_of

from . import HarnessError
from .checks import (
    Chain,
    Explained,
    Replay,
    check_decisions,
    explain_chain,
    final_entries,
    model_chain,
    replay,
    version_marks,
)
from .data import EventSource, Hostile
from .kafkaio import Rec, create_topics, group_lag, produce, produce_records, read_topic
from .oracle import Observer
from .report import Summary
from .workers import Deployment, WorkerProcess, service_config

log = logging.getLogger(__name__)

__all__ = [
    "Feeder",
    "LearningReport",
    "Settled",
    "assert_learning",
    "assert_promise",
    "await_dead_letters",
    "dead_letters_at",
    "deployment",
    "learning_report",
    "max_version",
    "quiesce",
    "settle",
    "tick_labels",
    "write_hostile",
]


@contextmanager
def deployment(
    bootstrap: str, tmp: Path, *, env: dict[str, str] | None = None, **overrides: Any
) -> Iterator[Deployment]:
    """A fresh configuration with its topics created (partition counts as configured);
    every worker started through it is stopped, by PID, on the way out."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = service_config(tmp, **overrides)
    dep = Deployment(bootstrap, tmp, config, env=dict(env or {}))
    t, p = dep.topics, config["partitions"]
    create_topics(
        bootstrap,
        {
            t["features"]: p.get("features", 8),
            t["decisions"]: p.get("decisions", 8),
            t["label_requests"]: p.get("labels", 2),
            t["labels"]: p.get("labels", 2),
            t["models"]: p.get("models", 1),
            t["dead_letters"]: p.get("dead_letters", 1),
        },
        compacted=[t["models"]],
    )
    try:
        yield dep
    finally:
        dep.close()


@dataclass
class LearningReport:
    """What the labels did to one model, read back from Kafka."""

    chain: Chain
    explained: Explained
    replay: Replay
    answered: set[str]  # request ids the oracle answered
    applied: list[str]  # request ids, in the order the model absorbed them
    lost: list[str]  # answered but never applied
    extra: list[str]  # applied but not answered by the oracle
    requests: int  # distinct requests on the topic
    pending: list[str]  # requests neither applied nor removed, per the pending changelog
    missing: list[str]  # requests in neither state (lost while pending)
    offered_again: list[str]  # applied, yet pending again: a second answer would apply twice
    dead_letters: Counter[str]


def learning_report(
    dep: Deployment,
    observer: Observer,
    model: str,
    *,
    answered: set[str] | None = None,
    keep: Callable[[Rec], bool] | None = None,
) -> LearningReport:
    """Read the model's versions, the labels and the pending table back and check them
    against the oracle's answers (``answered`` overrides which labels count as valid).
    ``keep``: which records of the models and labels topics count (default all; a test that
    writes hostile records there itself leaves them out)."""
    b, t = dep.bootstrap, dep.topics
    config = ModelConfig(**dep.config["models"][model])
    kept = keep if keep is not None else (lambda rec: True)
    snapshots = [r for r in read_topic(b, t["models"]) if kept(r)]
    chain = model_chain(model, config, snapshots, read_topic(b, dep.changelog("models")))
    labels = [r for r in read_topic(b, t["labels"]) if r.key == model.encode() and kept(r)]
    with observer.lock:
        requests = {
            rid: r
            for rid, r in observer.requests.items()
            if r.get("model") == model and isinstance(r.get("features"), list)
        }
        valid = set(observer.answered) & set(requests) if answered is None else set(answered)
        dead = Counter(str(d.get("reason")) for d in observer.dead)
    features = {rid: dict(r) for rid, r in requests.items()}  # features and moments
    key = dep.config.get("snapshot_key")
    signer = signer_of(None if key is None else str(key))  # the moments it signed are trusted
    pending_log = read_topic(b, dep.changelog("pending"))
    marks = version_marks(pending_log, model)
    explained = explain_chain(chain, labels, features, marks, signer)
    labelled = []
    by_rid = {}
    for rec in labels:
        try:
            obj = rec.json()
            by_rid.setdefault(str(obj["request_id"]), int(obj["label"]))
        except (ValueError, TypeError, KeyError):
            continue
    for rid in explained.order:
        labelled.append((features[rid], by_rid[rid]))
    result = replay(model, config, labelled, chain.final, signer)
    pending_table = final_entries(pending_log)
    applied = set(explained.order)
    pending = [
        rid
        for rid in requests
        if rid not in applied
        and isinstance(pending_table.get(rid), dict)
        and not pending_table[rid].get("applied")
    ]
    missing = [rid for rid in requests if rid not in applied and rid not in pending]
    offered_again = [
        rid
        for rid in applied
        if isinstance(pending_table.get(rid), dict) and not pending_table[rid].get("applied")
    ]
    return LearningReport(
        chain=chain,
        explained=explained,
        replay=result,
        answered=valid,
        applied=explained.order,
        lost=sorted(valid - applied),
        extra=sorted(applied - valid),
        requests=len(requests),
        pending=pending,
        missing=missing,
        offered_again=offered_again,
        dead_letters=dead,
    )


def write_hostile(
    dep: Deployment, hostile: Sequence[Hostile]
) -> dict[tuple[str, int, int], Hostile]:
    """Produce hostile records, each to its topic; (topic, partition, offset) -> record."""
    out: dict[tuple[str, int, int], Hostile] = {}
    for key in dict.fromkeys(h.topic for h in hostile):
        batch = [h for h in hostile if h.topic == key]
        topic = dep.topics[key]
        where = produce_records(dep.bootstrap, topic, [h.out() for h in batch])
        out.update({(topic, p, o): h for (p, o), h in zip(where, batch, strict=True)})
    return out


def tick_labels(
    dep: Deployment, sent: dict[tuple[str, int, int], Hostile], model: str = "m"
) -> None:
    """Write one malformed label for ``model`` (dead-lettered ``not_json``; added to
    ``sent``): the learner sweeps a partition when it handles a record of it (with
    ``sweep_every`` 1), so labels waiting there for a request that never comes are let go."""
    tick = Hostile("labels", "tick", "not_json", model.encode(), b"{tick")
    sent.update(write_hostile(dep, [tick]))


def dead_letters_at(observer: Observer) -> dict[tuple[str, int, int], list[str]]:
    """(topic, partition, offset) -> the reasons of every dead letter seen for it."""
    out: dict[tuple[str, int, int], list[str]] = {}
    with observer.lock:
        for d in observer.dead:
            if isinstance(d, dict):
                out.setdefault((d["topic"], d["partition"], d["offset"]), []).append(d["reason"])
    return out


def await_dead_letters(
    observer: Observer,
    where: Iterable[tuple[str, int, int]],
    timeout: float,
    *,
    copies: int = 1,
    nudge: Callable[[], None] | None = None,
    every: float = 1.0,
) -> float:
    """Wait until each (topic, partition, offset) in ``where`` has ``copies`` dead letters or
    more; ``nudge()`` every ``every`` s meanwhile (e.g. a malformed label, so the learner
    sweeps labels that wait for a request). Seconds taken; HarnessError naming what is
    missing after ``timeout``."""
    want = list(where)
    began = time.monotonic()
    nudged = began
    while True:
        with observer.lock:
            got = Counter(
                (d["topic"], d["partition"], d["offset"])
                for d in observer.dead
                if isinstance(d, dict)
            )
        missing = [w for w in want if got[w] < copies]
        if not missing:
            return time.monotonic() - began
        now = time.monotonic()
        if now - began > timeout:
            raise HarnessError(
                f"{len(missing)} of {len(want)} records not dead-lettered {copies}x after "
                f"{timeout:.0f}s, e.g. {missing[:5]}"
            )
        if nudge is not None and now - nudged >= every:
            nudge()
            nudged = now
        time.sleep(0.2)


def max_version(observer: Observer, model: str) -> int:
    """Newest version of ``model`` seen on the models topic (0 if none)."""
    key = model.encode()
    return max((int(s["version"]) for k, s in observer.models if k == key), default=0)


@dataclass
class Settled:
    """Whether a run settled, and if not, where it stood."""

    ok: bool
    why: str = ""
    lag: dict[str, int] | None = None  # committed lag per topic[partition], non-zero only
    health: dict[int, Any] | None = None  # live workers: pid -> /healthz answer

    def __bool__(self) -> bool:
        return self.ok


def settle(
    dep: Deployment,
    observer: Observer,
    events: Iterable[str],
    model: str,
    timeout: float,
    *,
    version: int | None = None,
    stagnant: float = 30.0,
) -> Settled:
    """Wait until every event is decided, every answered label is reflected in the model's
    version and the workers have committed everything on their input topics. Not settled
    after ``timeout``, or when nothing has moved for ``stagnant`` s: the result says what
    was left (lag per partition, the live workers' /healthz) and the checks that follow say
    what is missing. ``version``: the model version to wait for (default: one per answer)."""
    ids = list(events)
    observer.top_up()
    t = dep.topics
    inputs = [t["features"], t["label_requests"], t["labels"]]
    deadline = time.monotonic() + timeout
    seen: tuple[int, int, int, int] = (-1, -1, -1, -1)
    still_since = time.monotonic()
    why = f"timeout {timeout:.0f}s"
    lag: dict[str, int] = {}
    while time.monotonic() < deadline:
        with observer.lock:
            mine = [r for r in observer.answered if observer.requests[r].get("model") == model]
            want = len(mine) if version is None else version
            done = (
                observer.decided(ids) == len(ids)
                and max_version(observer, model) >= want
                and observer.labels_sent == observer.queued
            )
            budget_met = len(observer.answered) >= observer.budget
            now_seen = (
                observer.decision_records,
                max_version(observer, model),
                len(observer.dead),
                observer.request_records,
            )
        lag = {k: v for k, v in group_lag(dep.bootstrap, dep.app_id, inputs).items() if v}
        if done and not budget_met:
            observer.top_up()
        elif done and not lag:
            return Settled(True)
        if now_seen != seen:
            seen, still_since = now_seen, time.monotonic()
        elif time.monotonic() - still_since > stagnant:
            why = (
                f"nothing moved for {stagnant:.0f}s (done={done}, budget met={budget_met}: "
                f"decided {observer.decided(ids)}/{len(ids)}, version "
                f"{max_version(observer, model)}/{want}, labels sent {observer.labels_sent}/"
                f"{observer.queued})"
            )
            break
        time.sleep(0.5)
    health = {}
    for worker in dep.processes:
        if worker.alive():
            try:
                health[worker.pid] = json.loads(worker.get("/healthz")[1])
                health[worker.pid]["lag (worker's view)"] = {
                    f"{lab['topic']}[{lab['partition']}]": v
                    for n, lab, v in worker.samples()
                    if n == "abstain_consumer_lag" and v
                }
            except (OSError, ValueError) as exc:
                health[worker.pid] = repr(exc)
    log.warning("not settled (%s): lag %s, health %s", why, lag, health)
    return Settled(False, why, lag, health)


def assert_promise(
    dep: Deployment,
    observer: Observer,
    events: Iterable[str],
    model: str,
    summary: Summary,
    *,
    answered: set[str] | None = None,
    worker: WorkerProcess | None = None,
    keep: Callable[[Rec], bool] | None = None,
) -> LearningReport:
    """Check the promise after a run and fill ``summary``:

    - every event has a decision; copies for one (event id, model version) agree;
    - every version step of the model is one answered label, none twice, none lost, and
      the final state equals the offline replay of the applied labels in order;
    - every label request is applied or still pending (nothing lost while pending);
    - ``worker``'s gauges agree (version, pending requests).

    ``keep``: as for :func:`learning_report`."""
    with observer.lock:
        decisions = dict(observer.decisions)
        summary.labels_sent = observer.labels_sent
        summary.dead_lettered = len(observer.dead)
        dead = Counter(str(d.get("reason")) for d in observer.dead)
    ids = list(events)
    dr = check_decisions(decisions, ids)
    report = learning_report(dep, observer, model, answered=answered, keep=keep)
    summary.events_sent = dr.sent
    summary.decided = dr.decided
    summary.decision_records = dr.records
    summary.duplicates = dr.duplicates
    summary.contradictions = len(dr.contradictions)
    summary.labels_applied = report.chain.version
    summary.labels_lost = len(report.lost)
    summary.applied_twice = len(report.explained.twice)
    summary.requests = report.requests
    summary.requests_pending = len(report.pending)
    summary.notes.update(
        {
            "dead letters by reason": dict(dead),
            "label steps applied out of offset order (label before its request)": (
                report.explained.parked
            ),
            "model copies read (topic + changelog)": report.chain.copies,
            "replay": (
                f"bit-identical={report.replay.equal}, max |diff|={report.replay.max_abs_diff:g}"
            ),
        }
    )
    assert not dr.missing, (
        f"{dr.sent - dr.decided} events never decided, e.g. {dr.missing}; where they are: "
        f"{_where(dep, [i for i in ids if i not in decisions])}"
    )
    assert not dr.contradictions, f"contradicting decisions: {dr.contradictions}"
    assert not dr.unexpected, f"decisions for events never sent: {dr.unexpected}"
    assert_learning(report)
    if worker is not None:
        assert worker.metric("abstain_model_version", {"model": model}) == report.chain.version
        deadline = time.monotonic() + 10  # gauges refresh once a second
        while time.monotonic() < deadline:
            gauge = worker.metric("abstain_pending_requests", {"model": model})
            if gauge == len(report.pending):
                break
            time.sleep(0.5)
        assert gauge == len(report.pending), (gauge, len(report.pending))
    return report


def _where(dep: Deployment, ids: list[str]) -> dict[int, tuple[int, int, int]]:
    """partition -> (first offset, last offset, count) of the events ``ids``."""
    want = set(ids)
    spots: dict[int, list[int]] = {}
    for rec in read_topic(dep.bootstrap, dep.topics["features"]):
        if rec.key is not None and rec.key.decode() in want:
            spots.setdefault(rec.partition, []).append(rec.offset)
    return {p: (min(o), max(o), len(o)) for p, o in sorted(spots.items())}


def assert_learning(report: LearningReport) -> None:
    """Every version step is one valid label, none twice, none lost; the final state is the
    offline replay; every label request is applied or still pending."""
    assert not report.chain.forks, f"versions written twice, differently: {report.chain.forks}"
    assert not report.explained.twice, f"labels applied twice: {report.explained.twice}"
    assert not report.explained.unexplained, (
        f"versions no single marked label explains: {report.explained.unexplained[:10]}"
    )
    assert not report.lost, f"{len(report.lost)} answered labels never applied: {report.lost[:5]}"
    assert not report.extra, f"labels applied that nobody sent: {report.extra[:5]}"
    assert report.chain.version == len(report.answered)
    assert report.replay.equal, f"final state differs from the replay by {report.replay}"
    assert not report.missing, (
        f"{len(report.missing)} label requests neither applied nor pending: {report.missing[:5]}"
    )
    assert not report.offered_again, (
        f"{len(report.offered_again)} requests already applied to the model are pending again "
        f"(offered for labelling; a second answer would be applied twice): "
        f"{report.offered_again[:5]}"
    )


class Feeder(threading.Thread):
    """Produces events from ``sources`` (round robin) in chunks, ``pause`` s apart, until
    each has made ``total`` of them; ``hold()`` / ``go()`` stop and restart it between
    chunks."""

    def __init__(
        self,
        dep: Deployment,
        sources: Sequence[EventSource],
        total: int,
        chunk: int,
        *,
        pause: float = 0.05,
    ) -> None:
        super().__init__(name="faults-feeder", daemon=True)
        self.dep, self.sources, self.total, self.chunk = dep, list(sources), total, chunk
        self.pause = pause
        self.done = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while any(s.count < self.total for s in self.sources):
                self._go.wait()
                for src in self.sources:
                    k = min(self.chunk, self.total - src.count)
                    if k > 0:
                        produce(self.dep.bootstrap, self.dep.topics["features"], src.make(k))
                time.sleep(self.pause)
        except BaseException as exc:  # noqa: BLE001 - handed to the test by finish()
            self.error = exc
        finally:
            self.done.set()

    def hold(self) -> None:
        self._go.clear()

    def go(self) -> None:
        self._go.set()

    def finish(self, timeout: float) -> None:
        """Wait until everything is produced; raise what the thread met."""
        self.go()
        if not self.done.wait(timeout):
            raise HarnessError(f"the feeder did not finish in {timeout:.0f}s")
        if self.error is not None:
            raise HarnessError(f"the feeder failed: {self.error!r}") from self.error


def quiesce(dep: Deployment, observer: Observer, timeout: float) -> float:
    """Wait until the workers have committed everything on their inputs and the oracle has
    sent all it meant to, twice in a row one and a half seconds apart; seconds taken."""
    t = dep.topics
    inputs = [t["features"], t["label_requests"], t["labels"]]
    began = time.monotonic()
    calm = 0
    while calm < 2:
        if time.monotonic() - began > timeout:
            raise HarnessError(f"no quiet moment within {timeout:.0f}s")
        with observer.lock:
            sent = observer.labels_sent == observer.queued
        lag = group_lag(dep.bootstrap, dep.app_id, inputs)
        calm = calm + 1 if sent and not any(lag.values()) else 0
        time.sleep(1.5 if calm else 0.3)
    return time.monotonic() - began
