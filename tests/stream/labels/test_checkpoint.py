"""The learner's sink: table writes sent in batches, durable only once every record is
acknowledged, never silently dropped."""

from __future__ import annotations

import asyncio

import pytest

from service.stream.kafka.produce import OutRecord
from service.stream.kafka.topics import changelog_topic
from service.stream.labels.checkpoint import LearnerSink
from service.stream.labels.tables import ChangelogTable, TableWriteError, Writes

TOPIC = changelog_topic("app", "pending")


class _Client:
    """The aiokafka producer under a BatchProducer: records single sends and flushes."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None]] = []
        self.flushes = 0

    async def send(self, topic: str, value: bytes | None, **_: object) -> None:
        self.sent.append((topic, value))

    async def flush(self) -> None:
        self.flushes += 1


class _Producer:
    """A BatchProducer stand-in: records what was sent, acknowledges (or fails) at once."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[OutRecord] = []
        self.fail = fail
        self.producer = _Client()

    async def send_many(self, records: list[OutRecord]) -> asyncio.Future[None]:
        self.sent += records
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail:
            done.set_exception(OSError("broker away"))
        else:
            done.set_result(None)
        return done


def test_durable_sends_the_table_writes_in_batches_and_waits_for_every_record() -> None:
    async def run() -> None:
        writes, producer = Writes(), _Producer()
        sink = LearnerSink(writes)
        table = ChangelogTable(TOPIC, writes)
        with writes.partition(1):
            table[b"k"] = b"v"
        with pytest.raises(TableWriteError):  # no producer yet: never silently dropped
            await sink.flush()
        with pytest.raises(TableWriteError):
            await sink.send("abstain.models", b"m", b"{}")
        with writes.partition(1):
            table[b"k"] = b"w"  # the refused flush kept the first write
        sink.producer = producer  # type: ignore[assignment]
        await sink.send("abstain.models", b"m", b"{}")  # a snapshot: queued at once
        await sink.flush()
        assert producer.sent == [OutRecord(TOPIC, b"k", b"v", 1), OutRecord(TOPIC, b"k", b"w", 1)]
        assert producer.producer.sent == [("abstain.models", b"{}")]
        assert producer.producer.flushes == 1
        with writes.partition(1):
            table[b"j"] = b"w"
        producer.fail = True
        with pytest.raises(OSError, match="broker away"):  # the learner reads its state again
            await sink.flush()

    asyncio.run(run())
