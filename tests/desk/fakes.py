"""In-memory ports of the desk: a lease log folded in order, a label sink that can fail."""

from __future__ import annotations

from service.desk.errors import Unavailable
from service.desk.leases import LeaseBook, LeaseRecord
from service.records import Label, LabelRequest
from service.stream.model import request_id


class MemoryLeaseLog:
    """Every replica's records in one order (one partition), folded into each book."""

    def __init__(self, *books: LeaseBook) -> None:
        self.books = list(books)
        self.records: list[LeaseRecord] = []
        self.down = False

    async def publish(self, record: LeaseRecord) -> bool:
        if self.down:
            raise Unavailable("broker down")
        offset = len(self.records)
        self.records.append(record)
        outcomes = {book.apply(offset, record) for book in self.books}
        assert len(outcomes) == 1  # every replica folds to the same outcome
        return outcomes.pop()


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
