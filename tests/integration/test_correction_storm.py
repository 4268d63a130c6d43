"""A storm of corrections does not stall scoring, on a real broker with ``snapshot_key``.

A model of 68 features learned 250 labels. Events stream at 10 a second: 40 s quiet, then
60 s during which reviewers write 300 signed corrections (5 a second), each of a label
about 150 labels back (each flips the label in force: every one is real work), while a
person answers a new request now and then.

- decisions: the event -> decision p99 during the storm stays within 3x the quiet p99 of
  the same run, and ``GET /healthz`` answers within 50 ms (p99);
- every correction is applied exactly once and the model is ``abstain rebuild`` of the log
  (versions included: one per correction);
- a ``kill -9`` of the worker in the middle of the storm, then a restart: once the storm
  is over, the model is the rebuild of the log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from faults.corrections import Learned, learned
from faults.kafkaio import group_lag
from faults.storm import HealthProbe, Storm, cpu_seconds, latencies, percentile
from faults.workers import wait_until

pytestmark = pytest.mark.integration

KEY = "storm-key-" + "s" * 30
FEATURES = 68
MODELS = {"m": {"algorithm": "dsal", "cost": 0.25, "n_features": FEATURES, "audit_rate": 0.05}}
LABELS = 250
QUIET = 40.0
STORM = 60.0
CORRECTIONS = 300


def _learned(service_factory: Callable[..., Any], kafka_io: Any) -> Learned:
    return learned(
        service_factory, kafka_io, models=MODELS, labels=LABELS, key=KEY, n_features=FEATURES
    )


def _settled(run: Learned, timeout: float) -> None:
    """Wait until the learner has read every label and its version stays put for 3 s."""
    topics = [run.topics["labels"], run.topics["label_requests"]]
    group = f"{run.service.app_id}-learn"
    seen: list[tuple[float, float]] = []

    def still() -> bool:
        if sum(group_lag(run.service.bootstrap, group, topics).values()) > 0:
            seen.clear()
            return False
        seen.append((time.monotonic(), run.version()))
        recent = [v for t, v in seen if t > seen[-1][0] - 3.0]
        return seen[-1][0] - seen[0][0] >= 3.0 and len(set(recent)) == 1

    wait_until(still, timeout, "the learner to settle", every=0.5)


@pytest.mark.solo
def test_a_storm_of_corrections_does_not_stall_scoring_and_each_is_applied_once(
    service_factory: Callable[..., Any], kafka_io: Any
) -> None:
    run = _learned(service_factory, kafka_io)
    storm = Storm(run, corrections=CORRECTIONS, seconds=STORM, n_features=FEATURES)
    probe = HealthProbe(lambda: run.worker.url)
    probe.start()
    storm.start()
    cpu = [cpu_seconds(run.worker.pid)]
    time.sleep(QUIET)
    quiet_health = len(probe.times)
    cpu.append(cpu_seconds(run.worker.pid))
    storm.rage()
    assert storm.calm.wait(STORM + 30), "the corrections were not all written"
    cpu.append(cpu_seconds(run.worker.pid))
    time.sleep(2.0)
    health = probe.stop()[quiet_health:]
    storm.stop()
    quiet, raging = latencies(run, storm.phases[0]), latencies(run, storm.phases[1])
    assert len(quiet) >= 0.95 * len(storm.phases[0].sent)
    assert len(raging) >= 0.95 * len(storm.phases[1].sent)
    q99, s99 = percentile(quiet, 99), percentile(raging, 99)
    h99 = percentile(health, 99) * 1000
    print(
        f"\nevent -> decision p99: quiet {q99:.0f} ms ({len(quiet)} events), storm "
        f"{s99:.0f} ms ({len(raging)} events); /healthz p99 {h99:.1f} ms "
        f"({len(health)} probes; quiet {percentile(probe.times[:quiet_health], 99) * 1000:.1f}"
        f" ms), {probe.failed} failed; CPU s of the worker / its derivation process: quiet "
        f"{cpu[1][0] - cpu[0][0]:.1f} / {cpu[1][1] - cpu[0][1]:.1f}, storm "
        f"{cpu[2][0] - cpu[1][0]:.1f} / {cpu[2][1] - cpu[1][1]:.1f}"
    )
    assert s99 <= 3 * max(q99, 5.0), (q99, s99)
    assert h99 <= 50.0, h99
    assert probe.failed == 0
    wait_until(lambda: run.corrections_applied() == CORRECTIONS, 300, "every correction applied")
    _settled(run, 120)
    served = run.served_equals_rebuild()
    assert run.worker.metric("abstain_dead_letters_total") == 0.0
    assert served["version"] == LABELS + len(storm.answered) + CORRECTIONS


#: the kill's storm (corrections, seconds): half the latency test's at the same rate in CI,
#: the same in ``make test-long``
KILL_SIZES = {"ci": (150, 30.0), "full": (CORRECTIONS, STORM)}


@pytest.mark.parametrize("size", [pytest.param("ci"), pytest.param("full", marks=pytest.mark.slow)])
def test_a_kill_9_in_the_middle_of_a_storm_leaves_the_rebuild_after_a_restart(
    size: str, service_factory: Callable[..., Any], kafka_io: Any
) -> None:
    corrections, seconds = KILL_SIZES[size]
    run = _learned(service_factory, kafka_io)
    storm = Storm(run, corrections=corrections, seconds=seconds, n_features=FEATURES)
    storm.start()
    storm.rage()
    time.sleep(seconds / 2)
    run.worker.kill9()
    run.worker = run.service.start()
    run.worker.wait_ready()
    assert storm.calm.wait(seconds + 30), "the corrections were not all written"
    storm.stop()
    _settled(run, 300)
    served = run.served_equals_rebuild()
    assert served["version"] == LABELS + len(storm.answered) + corrections
