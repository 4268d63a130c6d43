"""When the learner's effects become durable and when its offsets are committed: the one
owner of that order.

A label's effects and the offset that caused them reach Kafka in this order, and no other:

1. **mark**: the label's pending entry is written with its *applied* mark (the version it
   produces for its champion and for each shadow) by
   :class:`~service.stream.labels.joiner.LabelJoiner`;
2. **flush**: the joiner asks for durability (``outputs.durable()``, which is
   :meth:`LearnerSink.flush`): every table write made so far is sent and acknowledged;
3. **model write**: only then the models table and the snapshots are written, so a crash
   between the two leaves a mark ahead of the model, and the redelivered label is applied
   once more and then never again (:func:`~service.stream.labels.protocol.apply_label`).
   The learn loop does 2 and 3 once per fetched batch (group commit: the joiner stages
   the batch's model versions and writes them after one flush of every mark);
4. **commit**: at the end of each batch :meth:`Checkpoint.durable` flushes again; only then
   :meth:`Checkpoint.handled` takes the batch's offsets and :meth:`Checkpoint.commit` commits
   them (every ``commit_interval_seconds``, and before partitions go). An offset is never
   committed before every effect of the records before it is durable.

A produce or fetch that fails: :meth:`Checkpoint.forget` drops what was not durable, and the
learn loop reads its tables again from their changelogs and consumes again from the committed
offsets: exactly a restart after kill -9, which the order above makes safe.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from service.stream.kafka.groups import commit
from service.stream.kafka.produce import BatchProducer, Headers
from service.stream.labels.tables import TableWriteError, Writes

__all__ = ["Checkpoint", "LearnerSink"]


class LearnerSink:
    """The learner's :class:`~service.stream.outputs.Sink`: its own producer (started and
    stopped with the loop, so a worker that is stopping never hands the learner a stopped
    producer). ``send`` (snapshots, the learner's dead letters) queues one record at once;
    the table writes wait in :class:`Writes` and ``flush`` sends them as produce batches,
    then waits until everything is acknowledged: the joiner's ``outputs.durable()`` (the
    applied mark before the model write) covers both."""

    def __init__(self, writes: Writes) -> None:
        self.writes = writes
        self.producer: BatchProducer | None = None  # the learner's, once it runs

    def _started(self) -> BatchProducer:
        if self.producer is None:
            raise TableWriteError("the learner's producer has not started")
        return self.producer

    async def send(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None = None
    ) -> None:
        await self._started().producer.send(topic, value, key=key, headers=headers or [])

    async def flush(self) -> None:
        """Send the table writes made so far, then wait until they and everything else
        sent is acknowledged (raises the broker's error if a write failed)."""
        producer = self._started()
        records = self.writes.take()
        if records:
            await (await producer.send_many(records))
        await producer.producer.flush()


class Checkpoint:
    """The learner's table writes, its producer and its offsets on their way to a commit (the
    order: module docstring). ``sink`` is what the joiner's outputs write to."""

    def __init__(
        self,
        writes: Writes,
        *,
        commit_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.writes = writes
        self.sink = LearnerSink(writes)
        self.commit_interval = commit_interval
        self.clock = clock
        self.uncommitted: dict[TopicPartition, int] = {}  # durable, not yet committed
        self._committed_at = clock()

    def start(self, producer: BatchProducer) -> None:
        """The learner's producer is running: writes can go out."""
        self.sink.producer = producer

    async def durable(self) -> None:
        """Send the table writes made so far and wait until they, and everything else the
        learner sent, are acknowledged (raises the broker's error if one failed)."""
        await self.sink.flush()

    def handled(self, tp: TopicPartition, next_offset: int) -> None:
        """``tp`` is done up to ``next_offset`` and its effects are durable (call after
        :meth:`durable`): the offset may be committed."""
        self.uncommitted[tp] = next_offset

    async def commit(
        self,
        consumer: AIOKafkaConsumer,
        committed: dict[TopicPartition, int],
        *,
        force: bool = False,
    ) -> None:
        """Commit the offsets made durable, of partitions still assigned, at most every
        ``commit_interval`` unless ``force`` (a revoke, the way out); ``committed`` (the
        loop's) is updated. A commit the broker failed is tried again next time."""
        now = self.clock()
        if not force and now - self._committed_at < self.commit_interval:
            return
        self._committed_at = now
        offsets, self.uncommitted = self.uncommitted, {}
        if await commit(consumer, offsets, committed, "learned") is None:
            self.uncommitted = {**offsets, **self.uncommitted}  # next time

    async def forget(self) -> None:
        """A produce or fetch failed: drop the table writes not sent and the offsets not
        committed, and let the producer finish what it holds (its errors do not matter now:
        the loop reads its state again)."""
        self.writes.take()
        self.uncommitted.clear()
        if self.sink.producer is not None:
            with contextlib.suppress(Exception):
                await self.sink.producer.producer.flush()
