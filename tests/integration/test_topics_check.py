"""Topics as an operator may have made them, on the session's real broker: a worker that
creates no topics (``topic_policy.creation = check``) refuses wrong partition counts,
missing compaction and missing topics with one line per problem and writes nothing; the
learner refuses label topics whose partition counts differ, at start-up and while it runs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import topicadmin as ka
from faults.workers import Deployment, service_config

from service.config import Settings
from service.stream.topics import TopicSpec, topic_specs


def _deployment(bootstrap: str, tmp: Path, **overrides: Any) -> Deployment:
    counts = {"features": 2, "decisions": 1, "labels": 2, "models": 1, "dead_letters": 1}
    config = service_config(tmp, partitions=counts, **overrides)
    tmp.mkdir(parents=True, exist_ok=True)
    return Deployment(bootstrap, tmp, config)


def _specs(dep: Deployment) -> list[TopicSpec]:
    settings = Settings(**{k: v for k, v in dep.config.items() if k != "datadir"})
    return topic_specs(settings)


def _wanted(spec: TopicSpec, **change: Any) -> ka.Wanted:
    configs = {"cleanup.policy": "compact"} if spec.compacted else {}
    return ka.Wanted(change.get("partitions", spec.partitions), 1,
                     change.get("configs", configs))  # fmt: skip


def _refused(dep: Deployment, timeout: float = 90.0) -> str:
    """Start a worker that must refuse; its stderr."""
    worker = dep.start()
    try:
        worker.proc.wait(timeout)
    finally:
        dep.close()
    assert worker.proc.returncode not in (0, None), worker.tail()
    return worker.stderr.read_text(errors="replace")


def test_check_mode_refuses_wrong_partitions_and_compaction_and_writes_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = _deployment(kafka_bootstrap, tmp_path, topic_policy={"creation": "check"})
    t = dep.topics
    specs = {s.name: s for s in _specs(dep)}
    made = {  # the six topics made by hand: labels with 3 partitions, models not compacted
        t[k]: _wanted(specs[t[k]]) for k in ("features", "decisions", "label_requests")
    }
    made[t["labels"]] = _wanted(specs[t["labels"]], partitions=3)
    made[t["models"]] = _wanted(specs[t["models"]], configs={"cleanup.policy": "delete"})
    made[t["dead_letters"]] = _wanted(specs[t["dead_letters"]])
    ka.create(kafka_bootstrap, made)
    before_groups = ka.groups(kafka_bootstrap)

    err = _refused(dep)

    assert "the topics do not fit this worker (topic_policy.creation=check)" in err
    assert f"{t['labels']} (topics.labels) has 3 partitions, the learner needs 2" in err
    assert f"{t['models']} (topics.models) is not compacted (cleanup.policy=delete)" in err
    for table in ("pending", "orphans", "models"):
        assert f"{dep.changelog(table)} (table {table}) does not exist" in err
    assert f"{dep.app_id}-__assignor-__leader (faust's leader election) does not exist" in err
    assert t["features"] not in err  # only the problems are named
    assert t["label_requests"] not in err
    # nothing written: no topic created, no record, no consumer group
    assert ka.topics_of(kafka_bootstrap, dep.app_id, t.values()) == set(made)
    assert set(ka.end_offsets(kafka_bootstrap, made).values()) == {0}
    assert dep.app_id not in ka.groups(kafka_bootstrap) - before_groups


def test_check_mode_serves_on_topics_made_by_an_operator(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = _deployment(kafka_bootstrap, tmp_path, topic_policy={"creation": "check"})
    specs = _specs(dep)
    ka.create(kafka_bootstrap, {s.name: _wanted(s) for s in specs})
    before = ka.facts(kafka_bootstrap, [s.name for s in specs])
    try:
        worker = dep.start()
        worker.wait_ready(timeout=120)
        assert worker.alive()
    finally:
        dep.close()
    assert ka.facts(kafka_bootstrap, [s.name for s in specs]) == before


def test_learner_refuses_label_topics_with_different_partition_counts(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = _deployment(kafka_bootstrap, tmp_path)  # creation = create (the default)
    t = dep.topics
    ka.create(kafka_bootstrap, {t["label_requests"]: ka.Wanted(2), t["labels"]: ka.Wanted(4)})
    err = _refused(dep)

    assert "(topic_policy.creation=create)" in err
    assert f"{t['labels']} (topics.labels) has 4 partitions, the learner needs 2" in err
    assert t["label_requests"] not in err
    made = {t["label_requests"], t["labels"]}  # no changelog made for a refused start
    assert ka.topics_of(kafka_bootstrap, dep.app_id, t.values()) == made
    assert set(ka.end_offsets(kafka_bootstrap, [t["label_requests"], t["labels"]]).values()) == {0}


def test_running_worker_stops_when_label_partitions_are_added(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    dep = _deployment(kafka_bootstrap, tmp_path)
    try:
        worker = dep.start()
        worker.wait_ready(timeout=120)
        ka.add_partitions(kafka_bootstrap, dep.topics["labels"], 3)
        began = time.monotonic()
        worker.proc.wait(60)
        stopped_after = time.monotonic() - began
    finally:
        dep.close()
    err = worker.stderr.read_text(errors="replace")
    assert f"{dep.topics['labels']} (topics.labels) has 3 partitions, the learner needs 2" in err
    assert worker.proc.returncode != 0, worker.tail()
    assert stopped_after < 30, stopped_after
