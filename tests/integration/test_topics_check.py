"""Topics as an operator may have made them, on the session's real broker: a worker that
creates no topics (``topic_policy.creation = check``) refuses wrong partition counts,
missing compaction and missing topics with one line per problem and writes nothing; the
learner refuses label topics whose partition counts differ, at start-up and while it runs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import topicadmin as ka
from faults.checks import explain_chain, replay, version_marks
from faults.data import EventSource
from faults.kafkaio import Out, produce, produce_records, read_topic
from faults.oracle import Observer
from faults.scenario import max_version
from faults.workers import Deployment, service_config

from service.config import ModelConfig, Settings
from service.stream.kafka.produce import partition_for
from service.stream.kafka.topics import TopicSpec, topic_specs
from service.stream.models.served import initial_envelope
from service.stream.scoring.loop import score_group


def _deployment(
    bootstrap: str, tmp: Path, *, partitions: dict[str, int] | None = None, **overrides: Any
) -> Deployment:
    counts = {"features": 2, "decisions": 1, "labels": 2, "models": 1, "dead_letters": 1}
    config = service_config(tmp, partitions={**counts, **(partitions or {})}, **overrides)
    tmp.mkdir(parents=True, exist_ok=True)
    return Deployment(bootstrap, tmp, config)


def _specs(dep: Deployment) -> list[TopicSpec]:
    settings = Settings(**{k: v for k, v in dep.config.items() if k != "datadir"})
    return topic_specs(settings)


def _wanted(spec: TopicSpec, **change: Any) -> ka.Wanted:
    configs = {"cleanup.policy": "compact"} if spec.compacted else {}
    return ka.Wanted(change.get("partitions", spec.partitions), 1, change.get("configs", configs))


def _refused(dep: Deployment, timeout: float = 90.0) -> str:
    """Start a worker that must refuse; its stderr."""
    worker = dep.start()
    try:
        worker.proc.wait(timeout)
    finally:
        dep.close()
    assert worker.proc.returncode not in (0, None), worker.tail()
    return worker.stderr.read_text(errors="replace")


def _serves(dep: Deployment) -> None:
    """Start a worker that must come up and serve; stop it."""
    try:
        worker = dep.start()
        worker.wait_ready(timeout=120)
        assert worker.alive()
    finally:
        dep.close()


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
    _serves(dep)
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


def _chain(bootstrap: str, topics: list[str], model: str = "m") -> dict[int, dict[str, Any]]:
    """version -> state of ``model`` in ``topics`` (the models topic, changelogs)."""
    states: dict[int, dict[str, Any]] = {}
    for topic in topics:
        for rec in read_topic(bootstrap, topic):
            if rec.key == model.encode() and rec.value is not None:
                state = rec.json()
                states.setdefault(int(state["version"]), state)
    return states


def _teach(dep: Deployment, src: EventSource, labels: int, events: int, target: int) -> Observer:
    """Feed ``events`` and answer ``labels`` requests; wait for model version ``target``."""
    observer = Observer(dep.bootstrap, dep.topics, src.truth, budget=labels).begin()
    produce(dep.bootstrap, dep.topics["features"], src.make(events))
    observer.wait(lambda o: max_version(o, "m") >= target, 90, f"model version {target}")
    observer.halt()
    return observer


@pytest.mark.slow  # 20 s: make test-long
def test_label_partitions_change_by_a_rebuild_into_new_topics_that_keeps_the_model(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """README, "Kafka": the procedure to change the label topics' partition count."""
    b = kafka_bootstrap
    old = _deployment(b, tmp_path / "old", partitions={"features": 2, "labels": 1})
    src = EventSource("repartition", seed=5)
    try:
        old.start().wait_ready(timeout=120)
        taught = _teach(old, src, labels=6, events=120, target=6)
    finally:
        old.close()  # 1. stop every worker
    before = _chain(b, [old.topics["models"], old.changelog("models")])
    assert max(before) == 6

    # 2. new label topics with the new count, a new app id (new changelogs, new group)
    new_topics = {
        **old.topics,
        "label_requests": old.topics["label_requests"] + "-2",
        "labels": old.topics["labels"] + "-2",
    }
    new = _deployment(
        b, tmp_path / "new", partitions={"features": 2, "labels": 2}, topics=new_topics
    )
    compact = {"cleanup.policy": "compact"}
    ka.create(
        b,
        {
            new_topics["label_requests"]: ka.Wanted(2),
            new_topics["labels"]: ka.Wanted(2),
            new.changelog("models"): ka.Wanted(2, 1, compact),
        },
    )
    # 3. seed the new models changelog with each model's last state, its label position reset
    seed = {**before[6], "labels_offset": -1, "labels_partition": -1}
    home = partition_for(b"m", 2)
    produce_records(b, new.changelog("models"), [Out(b"m", json.dumps(seed).encode(), home)])
    # 4. the new scoring group starts on the features topic where the old one stopped
    offsets = ka.copy_group_offsets(
        b, score_group(old.app_id), score_group(new.app_id), old.topics["features"]
    )
    assert sum(offsets.values()) == 120
    try:
        worker = new.start()
        worker.wait_ready(timeout=120)
        assert worker.metric("abstain_model_version", {"model": "m"}) == 6
        taught_again = _teach(new, src, labels=4, events=80, target=10)
    finally:
        new.close()

    after = _chain(b, [new.topics["models"], new.changelog("models")])
    assert max(after) == 10
    # every version is one label, old ones then new ones, and the end is the offline replay
    features = {rid: r for o in (taught, taught_again) for rid, r in o.requests.items()}
    labelled = []
    config = ModelConfig(**old.config["models"]["m"])
    initial = initial_envelope("m", config).to_dict()
    for dep, first in ((old, 1), (new, 7)):
        labels = {
            str(r.json()["request_id"]): int(r.json()["label"])
            for r in read_topic(b, dep.topics["labels"])
        }
        states = {0: initial, **before} if dep is old else {6: seed, **after}
        chain = SimpleNamespace(states={v: s for v, s in states.items() if v >= first - 1})
        marks = version_marks(read_topic(b, dep.changelog("pending")), "m")
        labels_log = read_topic(b, dep.topics["labels"])
        explained = explain_chain(chain, labels_log, features, marks)  # type: ignore[arg-type]
        assert explained.unexplained == []
        assert explained.twice == []
        labelled += [(features[rid], labels[rid]) for rid in explained.order]
    assert len(labelled) == 10
    assert replay("m", config, labelled, after[10]).equal


def test_a_topic_too_small_for_the_workers_records_is_refused_and_made_with_room(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A topic the worker writes must take its largest record (a record the broker refuses
    would fail its batch at every retry): an operator's models topic that takes 500 kB is
    named at start-up; with ``max_message_bytes`` raised, the topics the worker creates are
    given room for its records, and it serves."""
    dep = _deployment(kafka_bootstrap, tmp_path / "check", topic_policy={"creation": "check"})
    specs = {s.name: s for s in _specs(dep)}
    models = dep.topics["models"]
    made = {name: _wanted(spec) for name, spec in specs.items()}
    small = {"cleanup.policy": "compact", "max.message.bytes": "500000"}
    made[models] = _wanted(specs[models], configs=small)
    ka.create(kafka_bootstrap, made)

    err = _refused(dep)

    assert f"{models} (topics.models) takes records of at most 500000 bytes" in err
    assert "set its max.message.bytes to at least 1004096, or lower max_message_bytes" in err
    assert dep.changelog("models") not in err  # the broker's default takes the defaults'
    raised = _deployment(kafka_bootstrap, tmp_path / "create", max_message_bytes=4_000_000)
    _serves(raised)
    written = _specs(raised)
    facts = ka.facts(kafka_bootstrap, [s.name for s in written])
    for spec in written:
        takes = facts[spec.name].max_message_bytes
        assert takes == (1_048_588 if spec.largest is None else 4_004_096), spec.name
