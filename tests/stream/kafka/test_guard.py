"""service.stream.kafka.guard without a broker: every problem the start-up check names (the
real-broker side: tests/integration/test_topics_check.py)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from service.config import ConfigError, ModelConfig, Settings, TopicPolicy, load_settings
from service.stream.errors import TopicError
from service.stream.kafka import guard as topics
from service.stream.kafka.guard import TopicFacts, problems_of
from service.stream.kafka.topics import TopicSpec, topic_specs


def settings(**policy: Any) -> Settings:
    return Settings(app_id="app", topic_policy=TopicPolicy(**policy))


def fitting(specs: list[TopicSpec], *, replicas: int = 3, isr: int = 2) -> dict[str, TopicFacts]:
    return {
        s.name: TopicFacts(s.partitions, replicas, "compact" if s.compacted else "delete", isr)
        for s in specs
    }


@pytest.mark.parametrize("creation", ["create", "check"])
def test_topics_that_fit_have_no_problem(creation: str) -> None:
    s = settings(creation=creation, replication_factor=3, min_insync_replicas=2)
    specs = topic_specs(s)
    assert problems_of(specs, fitting(specs), s) == []


def test_create_mode_accepts_missing_topics_check_mode_names_each() -> None:
    specs = topic_specs(settings())
    assert problems_of(specs, {}, settings()) == []
    problems = problems_of(specs, {}, settings(creation="check"))
    assert len(problems) == len(specs)
    assert all("does not exist (topic_policy.creation=check" in p for p in problems)
    assert problems[4] == (
        "abstain.models (topics.models) does not exist (topic_policy.creation=check: create it "
        "with 1 partition, cleanup.policy=compact)"
    )


@pytest.mark.parametrize("creation", ["create", "check"])
@pytest.mark.parametrize("which", ["label_requests", "labels", "changelog"])
def test_a_label_topic_with_another_partition_count_is_refused_in_both_modes(
    creation: str, which: str
) -> None:
    s = settings(creation=creation)
    specs = topic_specs(s)
    facts = fitting(specs)
    name = "app-pending-changelog" if which == "changelog" else getattr(s.topics, which)
    facts[name] = TopicFacts(5, 3, facts[name].cleanup_policy, 2)
    (problem,) = problems_of(specs, facts, s)
    assert problem.startswith(f"{name} (")
    assert "has 5 partitions, the learner needs 2 (partitions.labels)" in problem


def test_other_partition_counts_matter_only_when_checking() -> None:
    specs = topic_specs(settings())
    facts = fitting(specs)
    facts["abstain.features"] = TopicFacts(3, 3, "delete", 2)
    assert problems_of(specs, facts, settings()) == []
    (problem,) = problems_of(specs, facts, settings(creation="check"))
    assert problem == (
        "abstain.features (topics.features) has 3 partitions, the settings say 8 "
        "(partitions.features)"
    )


def test_compaction_is_required_where_values_are_latest_and_refused_where_keyed_by_model() -> None:
    s = settings()
    specs = topic_specs(s)
    facts = fitting(specs)
    facts["app-models-changelog"] = TopicFacts(2, 3, "delete", 2)
    facts["abstain.labels"] = TopicFacts(2, 3, "compact,delete", 2)
    problems = problems_of(specs, facts, s)
    assert problems == [
        "abstain.labels (topics.labels) is compacted (cleanup.policy=compact,delete): its "
        "records are keyed by model, compaction would keep one per model; use "
        "cleanup.policy=delete",
        "app-models-changelog (table models) is not compacted (cleanup.policy=delete): it "
        "must be (cleanup.policy=compact)",
    ]


def test_replicas_are_checked_against_the_policy_only_when_checking() -> None:
    specs = topic_specs(settings())
    thin = fitting(specs, replicas=1, isr=1)
    assert problems_of(specs, thin, settings(replication_factor=3, min_insync_replicas=2)) == []
    problems = problems_of(
        specs, thin, settings(creation="check", replication_factor=3, min_insync_replicas=2)
    )
    assert len(problems) == 2 * len(specs)
    assert (
        "abstain.decisions (topics.decisions) has 1 replica, topic_policy.replication_factor "
        "asks for 3" in problems
    )
    assert (
        "abstain.decisions (topics.decisions) has min.insync.replicas=1, "
        "topic_policy.min_insync_replicas asks for 2" in problems
    )


def test_a_topic_that_can_take_no_write_is_refused_in_both_modes() -> None:
    specs = topic_specs(settings())
    facts = fitting(specs)
    facts["abstain.decisions"] = TopicFacts(8, 1, "delete", 2)
    (problem,) = problems_of(specs, facts, settings())
    assert problem == (
        "abstain.decisions (topics.decisions) has min.insync.replicas=2 but 1 replica: "
        "no write can succeed"
    )


@pytest.mark.parametrize("creation", ["create", "check"])
def test_a_written_topic_that_would_refuse_the_workers_largest_record_is_refused(
    creation: str,
) -> None:
    """Each topic the worker writes must take its largest record: a model version where
    versions go, an input as large as ``max_message_bytes`` elsewhere (framing included);
    the brokers' default takes the default settings' records; a topic the worker only reads
    is not its to size."""
    default = Settings(app_id="app", topic_policy=TopicPolicy(creation=creation))
    specs = topic_specs(default)
    broker = {n: replace(f, max_message_bytes=1_048_588) for n, f in fitting(specs).items()}
    assert problems_of(specs, broker, default) == []
    raised = default.model_copy(update={"max_message_bytes": 4_000_000})
    specs = topic_specs(raised)
    problems = problems_of(specs, broker, raised)
    written = {s.name for s in specs if s.largest is not None}
    assert {p.split(" ")[0] for p in problems} == written
    assert "abstain.features" not in written  # producers write it
    assert {"abstain.models", "app-models-changelog", "app-history-changelog"} <= written
    models = next(p for p in problems if p.startswith("abstain.models "))
    assert models == (
        "abstain.models (topics.models) takes records of at most 1048588 bytes "
        "(max.message.bytes), and the worker may write one of 4004096 there (a model "
        "version: version_bytes, with room for its key and headers): set its "
        "max.message.bytes to at least 4004096, or lower max_message_bytes"
    )
    roomy = {n: replace(f, max_message_bytes=4_004_096) for n, f in broker.items()}
    assert problems_of(specs, roomy, raised) == []
    unsaid = {n: replace(f, max_message_bytes=None) for n, f in broker.items()}
    assert problems_of(specs, unsaid, raised) == []  # a broker that does not say: not judged
    # a wide declared model: the learner's changelogs take its whole state, the models
    # topic what a scorer reads (within the broker's default)
    wide = default.model_copy(
        update={"models": {"default": ModelConfig(fields={"fields": {"t": "tokens"}})}}
    )
    specs = topic_specs(wide)
    problems = problems_of(specs, broker, wide)
    assert {p.split(" ")[0] for p in problems} == {"app-models-changelog", "app-history-changelog"}
    state = wide.state_bytes + 4096
    assert state > 18_000_000
    assert (
        f"the worker may write one of {state} there (the learner's state of a model: "
        f"state_bytes, with room for its key and headers): set its max.message.bytes to at "
        f"least {state}, or lower max_state_bytes"
    ) in problems[0]


def test_policy_comes_from_the_environment_and_is_validated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ABSTAIN_TOPIC_POLICY__REPLICATION_FACTOR", "3")
    monkeypatch.setenv("ABSTAIN_TOPIC_POLICY__MIN_INSYNC_REPLICAS", "2")
    monkeypatch.setenv("ABSTAIN_TOPIC_POLICY__CREATION", "check")
    policy = load_settings().topic_policy
    assert (policy.creation, policy.replication_factor, policy.min_insync_replicas) == (
        "check",
        3,
        2,
    )
    assert policy.topic_configs == {"min.insync.replicas": "2"}
    monkeypatch.setenv("ABSTAIN_TOPIC_POLICY__CREATION", "auto")
    with pytest.raises(ConfigError, match="topic_policy.creation"):
        load_settings()


def test_unset_policy_leaves_replication_to_the_broker() -> None:
    policy = Settings().topic_policy
    assert (policy.creation, policy.replication_factor, policy.min_insync_replicas) == (
        "create",
        None,
        None,
    )
    assert policy.topic_configs == {}


async def test_the_guard_waits_for_brokers_then_sets_their_replication_factor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers: list[Any] = [TopicError("no broker"), TopicError("no broker"), ([], 3)]

    async def survey(settings: Settings, *, with_default: bool) -> Any:
        assert with_default  # unset replication factor: the brokers' default is asked for
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    naps: list[float] = []

    async def nap(seconds: float) -> None:
        naps.append(seconds)

    monkeypatch.setattr(topics, "_survey", survey)
    owner = SimpleNamespace(conf=SimpleNamespace(topic_replication_factor=1))
    guard = topics.TopicGuard(settings(), owner=owner)  # type: ignore[arg-type]
    monkeypatch.setattr(guard, "sleep", nap)
    await guard.on_start()
    assert owner.conf.topic_replication_factor == 3
    assert naps == [1.0, 1.0]


async def test_the_guard_refuses_a_start_with_every_problem_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def survey(settings: Settings, *, with_default: bool) -> Any:
        return ["a has 3 partitions", "b is not compacted"], None

    monkeypatch.setattr(topics, "_survey", survey)
    owner = SimpleNamespace(conf=SimpleNamespace(topic_replication_factor=1))
    guard = topics.TopicGuard(settings(creation="check"), owner=owner)  # type: ignore[arg-type]
    with pytest.raises(topics.TopicLayoutError) as caught:
        await guard.on_start()
    assert str(caught.value) == (
        "the topics do not fit this worker (topic_policy.creation=check):\n"
        "  - a has 3 partitions\n"
        "  - b is not compacted"
    )
    assert owner.conf.topic_replication_factor == 1
