"""The desk's decisions without Kafka: one request to one person at a time, leases that
return, exactly one label per request, refusals that say why."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from service.config import Settings, load_settings
from service.desk.auth.accounts import Person
from service.desk.backlog import DeskQueue
from service.desk.core import Desk
from service.desk.errors import Refused, Unavailable
from service.desk.leases import LeaseBook
from service.desk.metrics import DeskMetrics

from .fakes import MemoryLeaseLog, MemorySink, request

ANN, BOB = Person("ann"), Person("bob")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settings() -> Settings:
    return load_settings(models={"m": {"n_features": 3}, "z": {"n_features": 3}}, default_model="m")


def make_desks(
    n: int = 1, clock: Clock | None = None, *, lag: bool = False
) -> tuple[list[Desk], MemoryLeaseLog, MemorySink, Clock]:
    """``n`` replicas over one lease log (``lag``: claims race as on the topic)."""
    clock = clock or Clock()
    books = [LeaseBook(lease_seconds=120.0) for _ in range(n)]
    log, sink = MemoryLeaseLog(*books, lag=lag), MemorySink()
    desks = []
    for i, book in enumerate(books):
        desk = Desk(
            settings(),
            queue=DeskQueue(clock=clock),
            leases=book,
            log=log,
            sink=sink,
            metrics=DeskMetrics(CollectorRegistry(), models=["m", "z"]),
            clock=clock,
            replica=f"r{i}",
        )
        desk.ready = True
        desks.append(desk)
    return desks, log, sink, clock


def offer(desks: list[Desk], *requests: object) -> None:
    for desk in desks:
        for r in requests:
            desk.queue.offer(r)  # type: ignore[arg-type]


async def test_the_most_urgent_request_goes_first_and_a_person_keeps_theirs() -> None:
    (desk,), _, _, clock = make_desks()
    low, high = (
        request("low", priority=0.1, at=clock.now),
        request("high", priority=0.9, at=clock.now),
    )
    offer([desk], low, high)
    first = await desk.next(ANN)
    assert first is not None
    assert first.request is high
    again = await desk.next(ANN)  # a reload / a second tab: the same request
    assert again is not None
    assert again.request is high
    other = await desk.next(BOB)
    assert other is not None
    assert other.request is low


async def test_ties_in_priority_go_to_the_request_closest_to_expiry() -> None:
    (desk,), _, _, clock = make_desks()
    late, soon = request("late", ttl=900, at=clock.now), request("soon", ttl=300, at=clock.now)
    offer([desk], late, soon)
    got = await desk.next(ANN)
    assert got is not None
    assert got.request is soon


async def test_two_replicas_never_give_one_request_to_two_people() -> None:
    (d1, d2), _, _, clock = make_desks(2)
    only = request("only", at=clock.now)
    offer([d1, d2], only)
    got = await asyncio.gather(d1.next(ANN), d2.next(BOB))
    assert sorted(g is not None for g in got) == [False, True]


async def test_an_abandoned_lease_returns_the_request() -> None:
    (desk,), _, _, clock = make_desks()
    only = request("only", at=clock.now)
    offer([desk], only)
    assert await desk.next(ANN) is not None
    assert await desk.next(BOB) is None
    clock.now += desk.lease_seconds + 1
    got = await desk.next(BOB)
    assert got is not None
    assert got.request is only
    with pytest.raises(Refused, match="no longer yours"):
        await desk.renew(ANN, only.request_id)


async def test_renewing_keeps_the_request_past_the_first_lease() -> None:
    (desk,), _, _, clock = make_desks()
    only = request("only", at=clock.now)
    offer([desk], only)
    await desk.next(ANN)
    clock.now += desk.lease_seconds * 0.75
    await desk.renew(ANN, only.request_id)
    clock.now += desk.lease_seconds * 0.75
    assert await desk.next(BOB) is None


async def test_an_answer_is_sent_once_and_a_second_is_refused() -> None:
    (desk,), _, sink, clock = make_desks()
    only = request("only", at=clock.now)
    offer([desk], only)
    await desk.next(ANN)
    results = await asyncio.gather(
        desk.answer(ANN, only.request_id, 1),
        desk.answer(ANN, only.request_id, 1),
        return_exceptions=True,
    )
    assert len(sink.labels) == 1
    assert sink.labels[0].labelled_by == "ann"
    assert sink.labels[0].label == 1
    refused = [r for r in results if isinstance(r, Refused)]
    assert [r.code for r in refused] == ["already_answered"]
    assert await desk.next(ANN) is None


async def test_a_second_replica_refuses_an_answer_the_first_is_sending() -> None:
    (d1, d2), log, sink, clock = make_desks(2)
    only = request("only", at=clock.now)
    offer([d1, d2], only)
    await d1.next(ANN)
    sink_calls = 0

    class Slow(type(sink)):  # type: ignore[misc]
        async def send(self, label: object) -> None:
            nonlocal sink_calls
            sink_calls += 1
            await asyncio.sleep(0.05)
            await super().send(label)  # type: ignore[arg-type]

    slow = Slow()
    d1.sink = d2.sink = slow
    results = await asyncio.gather(
        d1.answer(ANN, only.request_id, 1),
        d2.answer(ANN, only.request_id, -1),
        return_exceptions=True,
    )
    assert len(slow.labels) == 1
    assert sink_calls == 1
    assert any(isinstance(r, Refused) and r.code == "already_answered" for r in results)


async def test_someone_elses_request_and_an_expired_one_are_refused() -> None:
    (desk,), _, sink, clock = make_desks()
    only = request("only", at=clock.now, ttl=60)
    offer([desk], only)
    await desk.next(ANN)
    with pytest.raises(Refused) as refused:
        await desk.answer(BOB, only.request_id, 1)
    assert refused.value.code == "not_yours"
    clock.now += 61
    with pytest.raises(Refused) as refused:
        await desk.answer(ANN, only.request_id, 1)
    assert (refused.value.status, refused.value.code) == (410, "expired")
    with pytest.raises(Refused) as refused:
        await desk.answer(ANN, "no-such-id", 1)
    assert refused.value.status == 404
    with pytest.raises(Refused):
        await desk.answer(ANN, only.request_id, 0)
    assert sink.labels == []


async def test_a_broker_outage_saves_nothing_and_the_request_stays_for_a_retry() -> None:
    (desk,), log, sink, clock = make_desks()
    only = request("only", at=clock.now)
    offer([desk], only)
    await desk.next(ANN)
    sink.down = True
    with pytest.raises(Unavailable):
        await desk.answer(ANN, only.request_id, 1)
    assert sink.labels == []
    assert desk.queue.is_open(only.request_id, now=clock.now)
    log.down = True
    with pytest.raises(Unavailable):
        await desk.answer(ANN, only.request_id, 1)
    sink.down = log.down = False
    label = await desk.answer(ANN, only.request_id, 1)
    assert sink.labels == [label]


async def test_scopes_and_the_model_filter_choose_what_a_person_gets() -> None:
    (desk,), _, _, clock = make_desks()
    in_m, in_z = (
        request("a", model="m", at=clock.now),
        request("b", model="z", priority=0.9, at=clock.now),
    )
    offer([desk], in_m, in_z)
    scoped = Person("cid", frozenset({"m"}))
    got = await desk.next(scoped)
    assert got is not None
    assert got.request is in_m
    with pytest.raises(Refused) as refused:
        await desk.answer(scoped, in_z.request_id, 1)
    assert refused.value.code == "out_of_scope"
    got = await desk.next(ANN, "z")
    assert got is not None
    assert got.request is in_z


async def test_skip_hands_the_request_to_the_next_person_not_back_to_me() -> None:
    (desk,), _, _, clock = make_desks()
    only = request("only", at=clock.now)
    offer([desk], only)
    await desk.next(ANN)
    await desk.give_back(ANN, only.request_id, "skip")
    assert await desk.next(ANN) is None
    got = await desk.next(BOB)
    assert got is not None
    assert got.request is only


async def test_nothing_is_handed_out_before_the_topics_are_read() -> None:
    (desk,), _, _, _ = make_desks()
    desk.ready = False
    with pytest.raises(Refused) as refused:
        await desk.next(ANN)
    assert refused.value.status == 503
