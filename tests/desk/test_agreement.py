"""The desk and the learner agree on what is open: the same hostile label requests, labels
and changelog records go to the learner's joiner (in memory) and to the desk's reader, and
afterwards the requests the desk offers are exactly those the learner holds unanswered."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from stream.memory import MemoryKafka, msg, outputs

from service.config import ModelConfig, Settings
from service.desk.auth.sessions import Sessions
from service.desk.feeds import Feeds
from service.records import Correction, Label, LabelRequest, Opinion, PendingEntry, request_id
from service.records.state import parse_pending_entry
from service.stream.kafka.produce import partition_for
from service.stream.kafka.topics import table_topic
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore
from service.stream.models.served import initial_envelope

from .review.harness import deployment
from .test_core import Clock, make_desks

CFG = ModelConfig(algorithm="dsal", cost=0.25, n_features=3)


def settings() -> Settings:
    return Settings(
        models={"m": CFG, "z": CFG, "sh": CFG.model_copy(update={"champion": "m"})},
        default_model="m",
        partitions={"labels": 4},  # type: ignore[arg-type]
    )


@dataclass
class Both:
    """One learner and one desk reading the same records."""

    settings: Settings
    joiner: LabelJoiner
    feeds: Feeds
    kafka: MemoryKafka
    offset: int = 0

    @classmethod
    def start(cls, *, review: bool = False) -> Both:
        """A learner and a desk (``review``: with its book of answers, over the same
        models and partitions)."""
        s, kafka, clock = settings(), MemoryKafka(), Clock()
        if review:
            topics, (replica,) = deployment(1)
            s, clock = topics.settings, topics.clock
        out = outputs(kafka, s, CollectorRegistry())
        initial = {name: initial_envelope(name, cfg) for name, cfg in s.models.items()}
        joiner = LabelJoiner(
            s,
            pending=PendingStore(kafka.table("abstain-pending")),
            parked=ParkedStore(kafka.table("abstain-orphans")),
            models=ModelStore(kafka.table("abstain-models"), initial),
            outputs=out,
            metrics=out.metrics,
            clock=clock,
        )
        if review:
            return cls(s, joiner, replica.feeds, kafka)
        (desk,), *_ = make_desks(clock=clock)
        desk.settings = s
        sessions = Sessions(b"k" * 32, lifetime=60.0, clock=clock)
        return cls(s, joiner, Feeds(s, desk, asyncio.Condition(), sessions, clock=clock), kafka)

    def where(self, model: str) -> int:
        return partition_for(model.encode(), 4)

    async def both(self, topic: str, value: bytes | None, key: bytes | None, part: int) -> None:
        self.offset += 1
        self.feeds.handle(topic, part, self.offset, key, value)
        if value is not None:
            await self.joiner.handle(msg(value, self.offset, topic, part, key))

    async def request(
        self, req: LabelRequest, *, key: bytes | None = None, part: int | None = None
    ) -> None:
        await self.both(
            self.settings.topics.label_requests,
            req.to_json(),
            req.model.encode() if key is None else key,
            self.where(req.model) if part is None else part,
        )

    async def label(
        self, label: Label, *, key: bytes | None = None, part: int | None = None
    ) -> None:
        await self.both(
            self.settings.topics.labels,
            label.to_json(),
            label.model.encode() if key is None else key,
            self.where(label.model) if part is None else part,
        )

    def changelog(self, key: bytes, value: bytes | None, part: int) -> None:
        """A record of the pending changelog, read by the desk (the running learner writes
        that topic and does not read it)."""
        self.offset += 1
        self.feeds.handle(table_topic(self.settings, "pending"), part, self.offset, key, value)

    def learners_changelog(self) -> None:
        """What the learner wrote to its changelog, read by the desk."""
        where: dict[bytes, int] = {}
        for sent in self.kafka.sent("abstain-pending-changelog"):
            assert sent.key is not None
            if sent.value is not None:
                where[sent.key] = self.where(parse_pending_entry(sent.value).model)
            self.changelog(sent.key, sent.value, where[sent.key])

    def open_at_learner(self) -> set[str]:
        return {e.request_id for e in self.joiner.pending.entries() if not e.applied}

    def open_at_desk(self) -> set[str]:
        return set(self.feeds.queue.requests)


def req(event: str, model: str = "m", n: int = 3, **kw: object) -> LabelRequest:
    fields: dict[str, object] = {
        "request_id": request_id(model, event),
        "event_id": event,
        "model": model,
        "features": [0.5] * n,
        "score": 0.1,
        "rho": 1.0,
        "decided_label": 0,
        "query_probability": 0.5,
        "model_version": 0,
        "requested_at": 1000.0,
        "expires_at": 9000.0,
        "priority": 0.5,
    }
    fields.update(kw)
    return LabelRequest(**fields)  # type: ignore[arg-type]


async def test_hostile_requests_labels_and_changelog_records_leave_them_in_agreement() -> None:
    both = Both.start()
    good_m, good_z, served = req("a"), req("b", "z"), req("c", served_by="sh")
    for r in (good_m, good_z, served):
        await both.request(r)
    hostile = [
        (req("d", "ghost"), {}),  # no such model
        (req("e", n=2), {}),  # the wrong width
        (req("f", request_id="f" * 32), {}),  # an id not derived from (model, event)
        (req("g"), {"key": b"z"}),  # keyed by another model
        (req("h"), {"part": (both.where("m") + 1) % 4}),  # on another partition
        (req("i", "sh"), {}),  # a shadow asks for nothing
        (req("j", served_by="z"), {}),  # served by a model outside the group
        (req("a", features=[9.0, 9.0, 9.0]), {}),  # an event id reused with other features
    ]
    for r, where in hostile:
        await both.request(r, **where)  # type: ignore[arg-type]
    await both.both(both.settings.topics.label_requests, None, b"m", both.where("m"))
    await both.both(both.settings.topics.label_requests, b"{not json", b"m", both.where("m"))
    expected = {good_m.request_id, good_z.request_id, served.request_id}
    assert both.open_at_learner() == both.open_at_desk() == expected

    await both.label(Label(good_m.request_id, "m", 1, "ann", None))  # applied
    await both.label(Label(good_z.request_id, "z", 1, "eve", None), key=b"m")  # bad key
    await both.label(Label(served.request_id, "m", 1, "eve", None), part=(both.where("m") + 1) % 4)
    await both.label(Label(served.request_id, "sh", 1, "eve", None))  # a shadow's name
    await both.label(Label(good_z.request_id, "ghost", 1, "eve", None), key=b"ghost")
    await both.label(Label(good_z.request_id, "m", 1, "eve", None))  # another model's
    expected = {good_z.request_id, served.request_id}
    assert both.open_at_learner() == both.open_at_desk() == expected

    both.learners_changelog()  # the learner's own records change nothing at the desk
    m = both.where("m")
    forged = [
        PendingEntry(req("k", "ghost"), m),  # the 500 of the issue: a model not configured
        PendingEntry(req("l", n=5), m),  # shown with some features, parked by the learner
        PendingEntry(req("n"), m),  # well-formed, but the learner never read its request
        PendingEntry(req("o"), (m + 1) % 4),  # an entry claiming another partition
    ]
    for entry in forged:
        both.changelog(entry.request_id.encode(), entry.to_json(), m)
    both.changelog(b"\xff\xfe", PendingEntry(req("p"), m).to_json(), m)
    both.changelog(b"x" * 32, b"[" * 3000 + b"]" * 3000, m)
    assert both.open_at_learner() == both.open_at_desk() == expected
    skipped = both.feeds.desk.metrics.registry.get_sample_value(
        "abstain_desk_records_skipped_total", {"topic": "pending_changelog"}
    )
    assert skipped == 5  # all but the well-formed forged entry, which opens nothing anyway


async def test_corrections_and_second_opinions_leave_them_agreeing_on_what_is_open() -> None:
    """Undo does not reopen a request, at the learner or at the desk; forged corrections
    and opinions open or close nothing at either. (Which corrections the model applies is
    the learner's: this learner dead-letters every correction, a later one applies them; the
    desk's refusals are listed here for that comparison.)"""
    both = Both.start(review=True)
    a, b, heavy = req("a"), req("b"), req("heavy", query_probability=0.02)
    for r in (a, b, heavy):
        await both.request(r)
    await both.label(Label(a.request_id, "m", 1, "ann", None))
    await both.label(Label(heavy.request_id, "m", 1, "ann", None))
    labels, m = both.settings.topics.labels, both.where("m")
    records = [
        (Correction(a.request_id, "m", None, "ann", "author", None), None),  # undo
        (Correction(a.request_id, "m", 1, "eve", "author", None), "not_author"),
        (Correction(b.request_id, "m", None, "ann", "author", None), "not_answered"),
        (Correction("f" * 32, "m", None, "ann", "author", None), "unknown_request"),
        (Correction(a.request_id, "m", -1, "ann", "author", None), None),  # answer again
        (Opinion(heavy.request_id, "m", 1, "ann", None), "own_answer"),
        (Opinion(a.request_id, "m", 1, "bob", None), "not_asked"),
        (Opinion(heavy.request_id, "m", -1, "bob", None), None),
        (Correction(heavy.request_id, "m", 1, "rita", "reviewer", None), None),
        (Correction(heavy.request_id, "m", None, "ann", "author", None), "not_author"),
    ]
    book = both.feeds.desk.review.book  # type: ignore[union-attr]
    outcomes = []
    for record, _ in records:
        await both.both(labels, record.to_json(), b"m", m)
        folded, refused = book.result(m, both.offset)
        assert folded
        outcomes.append(None if refused is None else refused.code)
    assert outcomes == [why for _, why in records]
    assert both.open_at_learner() == both.open_at_desk() == {b.request_id}
    assert (book.items[a.request_id].current, book.items[heavy.request_id].current) == (-1, 1)
