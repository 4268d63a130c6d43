"""In-memory ports of the desk: a lease log folded in order, a label sink that can fail."""

from __future__ import annotations

import asyncio

from service.desk.errors import Unavailable
from service.desk.leases import LeaseBook, LeaseRecord
from service.records import Label, LabelRequest, request_id


class MemoryLeaseLog:
    """Every replica's records in one order (one partition), folded into each book.

    With ``lag``, a record is folded only after the writer yields (as a write to Kafka and
    its fold by the reader take a round trip): records written meanwhile by other calls
    take their offsets in write order, so concurrent claims race as they do on the topic.
    """

    def __init__(self, *books: LeaseBook, lag: bool = False) -> None:
        self.books = list(books)
        self.records: list[LeaseRecord] = []
        self.down = False
        self.lag = lag
        self.folded = 0

    async def publish(self, record: LeaseRecord) -> bool:
        if self.down:
            raise Unavailable("broker down")
        offset = len(self.records)
        self.records.append(record)
        if self.lag:
            await asyncio.sleep(0)
        while self.folded <= offset:
            outcomes = {book.apply(self.folded, self.records[self.folded]) for book in self.books}
            assert len(outcomes) == 1  # every replica folds to the same outcome
            self.folded += 1
        outcomes = {book.outcome(offset) for book in self.books}
        assert len(outcomes) == 1
        return bool(outcomes.pop())


class MemorySink:
    def __init__(self) -> None:
        self.labels: list[Label] = []
        self.down = False

    async def send(self, label: Label) -> None:
        if self.down:
            raise Unavailable("broker down")
        self.labels.append(label)


def request(
    event: str,
    *,
    model: str = "m",
    priority: float = 0.5,
    at: float = 0.0,
    ttl: float = 600.0,
    n: int = 3,
) -> LabelRequest:
    return LabelRequest(
        request_id(model, event),
        event,
        model,
        [0.1 * i for i in range(n)],
        0.2,
        1.0,
        0,
        0.5,
        1,
        at,
        at + ttl,
        priority,
    )
