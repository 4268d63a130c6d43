"""The catalogue of topics and tables: what the worker declares, checks and reads, and
what the docs list, all from one list."""

from __future__ import annotations

from service.config import Settings, TopicPolicy, Topics
from service.stream.kafka.topics import (
    CATALOGUE,
    TABLES,
    declared,
    desk_topics,
    learned,
    markdown_table,
    topic_specs,
    watched,
)


def settings(**policy: object) -> Settings:
    return Settings(app_id="app", topic_policy=TopicPolicy(**policy))  # type: ignore[arg-type]


def test_specs_name_every_topic_changelog_and_the_leader_topic() -> None:
    s = settings()
    specs = {spec.name: spec for spec in topic_specs(s)}
    assert set(specs) == {
        *s.topics.model_dump().values(),
        "app-pending-changelog",
        "app-orphans-changelog",
        "app-models-changelog",
        "app-history-changelog",
        "app-__assignor-__leader",
    }
    labels = s.partitions.labels
    fixed = {name for name, spec in specs.items() if spec.copartitioned}
    assert fixed == {s.topics.label_requests, s.topics.labels} | {
        f"app-{t}-changelog" for t in ("pending", "orphans", "models", "history")
    }
    assert {specs[name].partitions for name in fixed} == {labels}
    assert {n for n, spec in specs.items() if spec.compacted} == {s.topics.models} | {
        f"app-{t}-changelog" for t in ("pending", "orphans", "models", "history")
    }


def test_every_topic_setting_is_in_the_catalogue_once() -> None:
    named = [e.field for e in CATALOGUE if e.kind == "topic"]
    assert sorted(named) == sorted(Topics.model_fields)


def test_the_worker_declares_every_topic_but_fausts_own() -> None:
    s = settings()
    names = {name for name, _, _ in declared(s)}
    assert names == {spec.name for spec in topic_specs(s)} - {"app-__assignor-__leader"}
    assert ("app-orphans-changelog", 2, True) in declared(s)  # the parked table's changelog


def test_the_loops_and_the_desk_read_what_the_catalogue_says() -> None:
    s = settings()
    assert learned(s) == ("abstain.label-requests", "abstain.labels")  # requests first
    assert set(watched(s)) == {"abstain.features", *learned(s)}
    assert desk_topics(s) == ("abstain.label-requests", "abstain.labels", "app-pending-changelog")
    assert [t.field for t in TABLES] == ["pending", "parked", "models", "history"]


def test_the_docs_table_has_a_row_per_entry() -> None:
    rows = markdown_table().splitlines()[2:]
    assert len(rows) == len(CATALOGUE)
    assert "| `<app_id>-orphans-changelog` (compacted) | request id | `ParkedLabel` |" in "\n".join(
        rows
    )
