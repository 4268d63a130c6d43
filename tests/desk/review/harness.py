"""Desk replicas with the review, over in-memory topics each replica reads through its real
reader (:class:`service.desk.feeds.Feeds`): label requests, labels (answers, corrections,
second opinions, signed when a key is set) and the leases (claims, requests for review), in
one order per partition. A replica started later reads every topic from the beginning."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from service.config import Settings, load_settings
from service.desk.auth.accounts import Person
from service.desk.auth.sessions import Sessions
from service.desk.backlog import DeskQueue
from service.desk.core import Desk
from service.desk.errors import Refused, Unavailable
from service.desk.feeds import Feeds
from service.desk.leases import LeaseBook, LeaseRecord
from service.desk.metrics import DeskMetrics
from service.desk.review import Review, ReviewBook
from service.records import SIGNATURE_HEADER, Correction, Label, LabelRequest, Opinion, Signer
from service.records import request_id as derive
from service.stream.kafka.produce import partition_for
from service.stream.models.served import ServedModel

from ..test_core import Clock

ANN, BOB, CAT = Person("ann"), Person("bob"), Person("cat")
RITA = Person("rita", reviewer=True)
KEY = "k" * 40


def settings(**desk: Any) -> Settings:
    """Models ``m`` and ``z`` (3 features), a shadow ``sh`` of ``m``; no second opinion at
    random, one for every answer that trains with weight >= 20 (query probability <= 0.05);
    ``reach``: how many labels ``m`` can still correct (the default else)."""
    opinions = {
        "share": 0.0,
        "min_weight": 20.0,
        "confident_margin": 1.0,
        **desk.pop("second_opinions", {}),
    }
    extra = {k: desk.pop(k) for k in ("snapshot_key",) if k in desk}
    reach = desk.pop("reach", None)
    corrections = {} if reach is None else {"corrections": {"reach": reach}}
    return load_settings(
        models={
            "m": {"n_features": 3, **corrections},
            "z": {"n_features": 3},
            "sh": {"n_features": 3, "champion": "m"},
        },
        default_model="m",
        partitions={"labels": 4},
        desk={"answer_names": {"m": ["fraud", "legitimate"]}, **desk, "second_opinions": opinions},
        **extra,
    )


def req(
    event: str,
    *,
    model: str = "m",
    p: float = 0.5,
    score: float = 0.2,
    decided: int = 0,
    at: float = 1000.0,
    ttl: float = 600.0,
    priority: float = 0.5,
) -> LabelRequest:
    return LabelRequest(
        derive(model, event),
        event,
        model,
        [0.1, 0.2, 0.3],
        score,
        1.0,
        decided,
        p,
        0,
        at,
        at + ttl,
        priority,
    )


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    at: float
    headers: list[tuple[str, bytes]] | None = None


@dataclass
class Topics:
    """The topics, written in order, read by every replica's reader as they are written."""

    settings: Settings
    clock: Clock
    records: list[Record] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    replicas: list[Replica] = field(default_factory=list)
    down: bool = False

    def write(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> Record:
        if self.down:
            raise Unavailable("broker down")
        n = self.settings.partitions.labels
        part = partition_for(key or b"", n) if partition is None else partition
        offset = self.offsets.get((topic, part), 0)
        self.offsets[(topic, part)] = offset + 1
        record = Record(topic, part, offset, key, value, self.clock.now, headers)
        self.records.append(record)
        for replica in self.replicas:
            replica.read(record)
        return record

    def request(self, r: LabelRequest) -> None:
        self.write(self.settings.topics.label_requests, r.model.encode(), r.to_json())

    def label(self, label: Label, **where: Any) -> Record:
        return self.write(
            self.settings.topics.labels, label.model.encode(), label.to_json(), **where
        )

    def signed(
        self, record: Correction | Opinion, *, key: str | None = None, sign: bool = True
    ) -> Record:
        """A correction or an opinion on the labels topic, signed with the settings' key."""
        k, value = record.model.encode(), record.to_json()
        headers = None
        if sign and self.settings.snapshot_key is not None:
            signer = Signer((key or self.settings.snapshot_key.get_secret_value()).encode())
            headers = [(SIGNATURE_HEADER, signer.sign(k, value))]
        return self.write(self.settings.topics.labels, k, value, headers=headers)


class Sink:
    """The labels topic as the desk's ports see it: labels, corrections, opinions."""

    def __init__(self, topics: Topics, replica: Replica) -> None:
        self.topics, self.replica = topics, replica

    async def send(self, label: Label) -> None:
        self.topics.label(label)

    async def publish(self, record: Correction | Opinion) -> Refused | None:
        written = self.topics.signed(record)
        await asyncio.sleep(0)
        return self.replica.review.book.result(written.partition, written.offset)[1]


class LeaseLog:
    """The leases topic: one partition, folded by every replica as written."""

    def __init__(self, topics: Topics, replica: Replica) -> None:
        self.topics, self.replica = topics, replica

    async def publish(self, record: LeaseRecord) -> bool:
        topic = self.topics.settings.desk.leases_topic
        written = self.topics.write(
            topic, record.request_id.encode(), record.to_json(), partition=0
        )
        return bool(self.replica.leases.outcome(written.offset))


class Replica:
    """One desk replica with its review: queue, leases, book of answers, reader."""

    def __init__(self, topics: Topics, name: str, models: dict[str, ServedModel]) -> None:
        s, clock = topics.settings, topics.clock
        self.topics, self.models = topics, models
        self.leases = LeaseBook(lease_seconds=s.desk.lease_seconds)
        self.metrics = DeskMetrics(CollectorRegistry(), models=s.models)
        self.book = ReviewBook(s, clock=clock)
        self.review = Review(
            s,
            book=self.book,
            leases=self.leases,
            lease_log=LeaseLog(topics, self),
            labels=Sink(topics, self),
            metrics=self.metrics,
            clock=clock,
            replica=name,
            models=lambda: self.models,
        )
        self.desk = Desk(
            s,
            queue=DeskQueue(clock=clock),
            leases=self.leases,
            log=LeaseLog(topics, self),
            sink=Sink(topics, self),
            metrics=self.metrics,
            clock=clock,
            replica=name,
            review=self.review,
        )
        self.desk.ready = True
        assert self.desk.opinions is not None
        self.opinions = self.desk.opinions
        sessions = Sessions(b"k" * 32, lifetime=60.0, clock=clock)
        self.feeds = Feeds(s, self.desk, asyncio.Condition(), sessions, clock=clock)
        for record in topics.records:  # from the beginning
            self.read(record)
        topics.replicas.append(self)

    def read(self, r: Record) -> None:
        self.feeds.handle(
            r.topic,
            r.partition,
            r.offset,
            r.key,
            r.value,
            timestamp_ms=int(r.at * 1000),
            headers=r.headers,
        )

    def skipped(self, topic: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "abstain_desk_records_skipped_total", {"topic": topic}
        )
        return value or 0.0

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def deployment(n: int = 1, **desk: Any) -> tuple[Topics, list[Replica]]:
    """``n`` replicas over fresh topics (``desk``: settings of the desk section)."""
    s = settings(**desk)
    topics = Topics(s, Clock())
    models = {name: ServedModel.initial(name, cfg) for name, cfg in s.models.items()}
    return topics, [Replica(topics, f"r{i}", models) for i in range(n)]


async def answered(
    topics: Topics,
    desk: Desk,
    person: Person,
    r: LabelRequest,
    value: int = 1,
) -> None:
    """``r`` on the requests topic, then ``person`` takes it at ``desk`` and answers."""
    topics.request(r)
    got = await desk.next(person)
    assert got is not None
    assert got.request.request_id == r.request_id, "another request came first"
    await desk.answer(person, r.request_id, value)


def ids(items: Sequence[Any]) -> list[str]:
    return [i.request_id for i in items]
