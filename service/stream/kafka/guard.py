"""The check that the cluster's topics are fit for the worker.

:func:`layout_problems` compares the catalogue's :func:`~service.stream.kafka.topics.topic_specs`
with what the cluster holds (one sentence per problem, nothing written: the topics are listed
first and only existing ones are described, so no broker auto-creates a topic for a check).
:class:`TopicGuard` runs that check when the worker starts, before its producer and consumer
do, and again every :data:`RECHECK_SECONDS` while it runs.

What is refused, and why:

- the label topics (label requests, labels) and the learner's changelogs must have
  the same, configured number of partitions: the learner owns a model's requests and labels
  because both are keyed by model and land on the same partition; with another count, a
  model moves to another partition and its pending requests are orphaned. A change of that
  count while the worker runs stops the worker (``docs``: README, "Kafka");
- the models topic and the changelogs must be compacted (they hold the latest value per key
  and are read from the beginning), and the topics keyed by model (label requests, labels)
  must not be (compaction would keep one record per model);
- a topic the worker writes must take its largest record (``max.message.bytes``, the
  broker's ``message.max.bytes`` unless set): what a scorer reads of a model version, up to
  ``version_bytes``, on the models topic, the learner's state of one, up to ``state_bytes``,
  in its changelogs, an input of up to ``max_message_bytes`` elsewhere. A record the broker
  refuses fails its batch at every retry: the learner would stop there (topics the worker
  creates are given room for it: :func:`~service.stream.kafka.topics.largest_record`);
- with ``topic_policy.creation = "check"``: every topic must exist, with the configured
  partitions, at least ``replication_factor`` replicas and ``min.insync.replicas`` at least
  as configured; a topic whose ``min.insync.replicas`` exceeds its replicas accepts no write.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from mode import Service

from service.config import Settings, TopicPolicy
from service.stream.errors import TopicError
from service.stream.kafka.topics import TopicSpec, topic_specs

__all__ = [
    "RECHECK_SECONDS",
    "START_ATTEMPTS",
    "TopicFacts",
    "TopicGuard",
    "TopicLayoutError",
    "describe_topics",
    "guard_topics",
    "layout_problems",
    "problems_of",
]

log = logging.getLogger(__name__)

RECHECK_SECONDS = 10.0  # how often a running worker looks at its topics' partition counts
START_ATTEMPTS = 60  # a second apart: how long a starting worker waits for the brokers


class TopicLayoutError(TopicError):
    """Topics exist with partitions, policies or replicas the worker cannot work with."""


@dataclass(frozen=True, slots=True)
class TopicFacts:
    """What the cluster holds for one topic."""

    partitions: int
    replicas: int  # the smallest replica count of its partitions
    cleanup_policy: str
    min_insync_replicas: int
    max_message_bytes: int | None = None  # the largest record batch it takes (None: not said)


def problems_of(
    specs: Sequence[TopicSpec], facts: Mapping[str, TopicFacts], settings: Settings
) -> list[str]:
    """One sentence per problem of ``facts`` (the existing topics) against ``specs``.

    >>> s = Settings()
    >>> specs = [x for x in topic_specs(s) if x.role in ("topics.labels", "topics.models")]
    >>> facts = {"abstain.labels": TopicFacts(3, 1, "delete", 1),
    ...          "abstain.models": TopicFacts(1, 1, "delete", 1)}
    >>> for line in problems_of(specs, facts, s):
    ...     print(line)
    abstain.labels (topics.labels) has 3 partitions, the learner needs 2 (partitions.labels): the label topics and the learner's changelogs must all have the same count; see README, "Kafka", to change it
    abstain.models (topics.models) is not compacted (cleanup.policy=delete): it must be (cleanup.policy=compact)
    """  # noqa: E501
    problems = []
    for spec in specs:
        problems += _problems_of_one(spec, facts.get(spec.name), settings.topic_policy)
    return problems


def _problems_of_one(spec: TopicSpec, fact: TopicFacts | None, policy: TopicPolicy) -> list[str]:
    check = policy.creation == "check"
    where = f"{spec.name} ({spec.role})"
    if fact is None:
        if not check:
            return []
        compact = ", cleanup.policy=compact" if spec.compacted else ""
        made = _count(spec.partitions, "partition") + compact
        return [f"{where} does not exist (topic_policy.creation=check: create it with {made})"]
    problems = []
    if fact.partitions != spec.partitions and (spec.copartitioned or check):
        need = "the learner needs" if spec.copartitioned else "the settings say"
        field = "partitions.labels" if spec.copartitioned else _field(spec)
        has = _count(fact.partitions, "partition")
        line = f"{where} has {has}, {need} {spec.partitions} ({field})"
        if spec.copartitioned:
            line += (
                ": the label topics and the learner's changelogs must all have the same "
                'count; see README, "Kafka", to change it'
            )
        problems.append(line)
    policy_text = f"cleanup.policy={fact.cleanup_policy}"
    compacted = "compact" in fact.cleanup_policy.split(",")
    if spec.compacted and not compacted:
        problems.append(
            f"{where} is not compacted ({policy_text}): it must be (cleanup.policy=compact)"
        )
    if spec.keyed_by_model and compacted:
        problems.append(
            f"{where} is compacted ({policy_text}): its records are keyed by "
            "model, compaction would keep one per model; use "
            "cleanup.policy=delete"
        )
    takes = fact.max_message_bytes
    if spec.largest is not None and takes is not None and takes < spec.largest:
        problems.append(
            f"{where} takes records of at most {takes} bytes (max.message.bytes), and the "
            f"worker may write one of {spec.largest} there ({spec.largest_is[0]}, with room "
            f"for its key and headers): set its max.message.bytes to at least "
            f"{spec.largest}, or lower {spec.largest_is[1]}"
        )
    replicas, isr = _count(fact.replicas, "replica"), fact.min_insync_replicas
    if isr > fact.replicas:
        problems.append(
            f"{where} has min.insync.replicas={isr} but {replicas}: no write can succeed"
        )
    if check and policy.replication_factor and fact.replicas < policy.replication_factor:
        problems.append(
            f"{where} has {replicas}, topic_policy.replication_factor asks for "
            f"{policy.replication_factor}"
        )
    wanted = policy.min_insync_replicas
    if check and wanted and isr < wanted:
        problems.append(
            f"{where} has min.insync.replicas={isr}, "
            f"topic_policy.min_insync_replicas asks for {wanted}"
        )
    return problems


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _field(spec: TopicSpec) -> str:
    return "partitions." + spec.role.removeprefix("topics.").replace("label_requests", "labels")


async def describe_topics(
    admin: AIOKafkaAdminClient, names: Iterable[str]
) -> dict[str, TopicFacts]:
    """Facts of those of ``names`` that exist. The topics are listed first and only existing
    ones described: a Metadata request naming a missing topic makes a broker with
    ``auto.create.topics.enable`` create it."""
    existing = set(await admin.list_topics())
    wanted = sorted(set(names) & existing)
    if not wanted:
        return {}
    described = await admin.describe_topics(wanted)
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in wanted]
    configs = _configs(await admin.describe_configs(resources))
    facts = {}
    for meta in described:
        name = meta["topic"]
        if meta.get("error_code") or name not in configs:
            raise TopicError(f"cannot describe topic {name!r} (error {meta.get('error_code')})")
        parts = meta["partitions"]
        conf = configs[name]
        facts[name] = TopicFacts(
            partitions=len(parts),
            replicas=min((len(p["replicas"]) for p in parts), default=0),
            cleanup_policy=conf.get("cleanup.policy", "delete"),
            min_insync_replicas=int(conf.get("min.insync.replicas", "1")),
            max_message_bytes=_int(conf.get("max.message.bytes")),
        )
    return facts


def _int(text: str | None) -> int | None:
    """A config's number (None: absent, or not a number)."""
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _configs(responses: Iterable[Any]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for response in responses:
        for resource in response.resources:
            error_code, _message, _type, name, entries = resource[:5]
            if error_code:
                raise TopicError(f"cannot read the configs of topic {name!r} (error {error_code})")
            out[name] = {entry[0]: entry[1] for entry in entries if entry[1] is not None}
    return out


async def layout_problems(settings: Settings) -> list[str]:
    """:func:`problems_of` the worker's topics as the cluster holds them now."""
    problems, _ = await _survey(settings, with_default=False)
    return problems


async def _survey(settings: Settings, *, with_default: bool) -> tuple[list[str], int | None]:
    """The problems of the topics and, if asked, the brokers' ``default.replication.factor``."""
    specs = topic_specs(settings)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers,
        client_id=f"{settings.app_id}-topics",
        **settings.security.aiokafka_kwargs(),
    )
    try:
        await admin.start()
        facts = await describe_topics(admin, (spec.name for spec in specs))
        default = await default_replication_factor(admin) if with_default else None
    except KafkaError as exc:
        raise TopicError(f"cannot describe the topics: {exc!r}") from exc
    finally:
        await admin.close()
    return problems_of(specs, facts, settings), default


async def default_replication_factor(admin: AIOKafkaAdminClient) -> int:
    """The brokers' ``default.replication.factor`` (1 when they do not say)."""
    brokers = (await admin.describe_cluster())["brokers"]
    node = min(int(b["node_id"]) for b in brokers)
    key = "default.replication.factor"
    resource = ConfigResource(ConfigResourceType.BROKER, str(node), configs={key: None})
    configs = _configs(await admin.describe_configs([resource]))
    return int(configs.get(str(node), {}).get(key, "1"))


def _refusal(problems: Sequence[str], settings: Settings) -> str:
    mode = settings.topic_policy.creation
    head = f"the topics do not fit this worker (topic_policy.creation={mode}):"
    return "\n".join([head, *(f"  - {p}" for p in problems)])


class TopicGuard(Service):
    """Checks the topics before the worker's producer and consumer start (it is the app's
    first dependency) and every :data:`RECHECK_SECONDS` after: a problem at start-up refuses
    the start; a partition count of the label topics that changes while the worker runs
    stops it. Without ``topic_policy.replication_factor`` it sets faust's
    ``topic_replication_factor`` to the brokers' ``default.replication.factor`` before
    anything is declared (faust accepts no ``-1``, "the broker's default")."""

    def __init__(self, settings: Settings, *, owner: Service, **kwargs: Any) -> None:
        self.settings = settings
        self.owner = owner
        self.owner_conf: Any = getattr(owner, "conf", None)  # faust's settings of the app
        super().__init__(**kwargs)

    async def on_start(self) -> None:
        policy = self.settings.topic_policy
        unset = policy.creation == "create" and policy.replication_factor is None
        for attempt in range(START_ATTEMPTS):  # a broker still starting: ask again
            try:
                problems, default = await _survey(self.settings, with_default=unset)
                break
            except TopicError as exc:
                if attempt == START_ATTEMPTS - 1:
                    raise
                log.warning("topic check: %s; again in 1 s", exc)
                await self.sleep(1.0)
        if problems:
            raise TopicLayoutError(_refusal(problems, self.settings))
        if default is not None:  # faust takes no "-1": the broker's default, read here
            self.owner_conf.topic_replication_factor = default

    @Service.timer(RECHECK_SECONDS)
    async def _recheck(self) -> None:
        try:
            problems = await layout_problems(self.settings)
        except TopicError as exc:  # a broker hiccup: the next check tries again
            log.warning("topic check skipped: %s", exc)
            return
        if problems:
            error = TopicLayoutError(_refusal(problems, self.settings))
            log.critical("%s", error)
            await self.owner.crash(error)


def guard_topics(app: Service, settings: Settings) -> TopicGuard:
    """Make a :class:`TopicGuard` the first dependency of ``app`` (call before it starts)."""
    guard = TopicGuard(settings, owner=app)
    app.add_dependency(guard)
    return guard
