"""Every use of faust-streaming and aiokafka internals, in one place.

The rest of the streaming layer talks to Kafka through :class:`FaustConsumerView` (the
:class:`~service.stream.partitions.ConsumerView` protocol) and runs faust with
:class:`Transport`. When faust or aiokafka is upgraded, this module is what to read again:
each access below names the version it was written against and why it is needed.

Internals used (faust-streaming 0.15.3), and what for:

- ``Consumer._new_offset``, ``._gap``, ``._acked``, ``._acked_index``: :class:`Consumer`
  merges faust's "gap" into the acknowledged offsets without duplicates (below);
- ``Consumer._committed_offset``: :meth:`FaustConsumerView.committed_next`;
- ``Consumer._gap``: :meth:`FaustConsumerView.chop_gap`;
- ``Consumer._commit_offsets``: :meth:`FaustConsumerView.commit_processed`;
- a ``Message`` built by hand for ``Consumer.ack``: :meth:`FaustConsumerView.acknowledge`;
- ``App.rebalancing``: :attr:`FaustConsumerView.paused`;
- ``App.consumer_generation_id``: :attr:`FaustConsumerView.generation`;
- ``app.tables.recovery`` (``in_recovery``, ``completed``, ``active_offsets``,
  ``active_remaining()``): :meth:`FaustConsumerView.recovery`.

No aiokafka internals are used (aiokafka 0.14.0): :class:`~service.stream.continuity.KafkaGaps`
and the liveness checks use its public API only.

Why the consumer is subclassed: when faust's fetch loop sees an offset jump it records the
range as a "gap" (offsets it takes for compacted or transaction markers) and, when it
computes the offset to commit, appends every offset of the gap to the acknowledged ones
without looking whether they are already there. After a rebalance the same records are
often acknowledged *and* inside a gap; each duplicate ends a run of consecutive offsets, so
the committed offset advances one or two records per commit interval instead of to the end
(traced: 180 records behind, moving one a second). :class:`Consumer` merges the gap into
the acknowledged offsets first, without duplicates and only below the highest acknowledged
offset; faust's own computation then finds no gap left to merge.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, ClassVar

import faust
from aiokafka.errors import IllegalStateError
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP as FaustTP
from faust.types import Message

from service.stream.partitions import TP, ConsumerView, RecoveryState

if TYPE_CHECKING:
    from service.records import RawMessage

__all__ = ["App", "Consumer", "FaustConsumerView", "Transport", "Worker", "merge_gap"]


def merge_gap(acked: list[int], index: set[int], gap: Any) -> None:
    """Move the offsets of ``gap`` (an IntervalTree) below the highest acknowledged one
    into ``acked`` / ``index``, each once, and cut them from ``gap``. Unlike faust's merge,
    no offset is added twice, and nothing above the highest acknowledged offset is taken
    for done (faust's gap ends with the record that revealed it, not yet processed).

    >>> from intervaltree import IntervalTree
    >>> acked = [5, 6, 7]; index = set(acked)
    >>> gap = IntervalTree.from_tuples([(3, 5), (6, 10)])
    >>> merge_gap(acked, index, gap)
    >>> sorted(acked), sorted((iv.begin, iv.end) for iv in gap)
    ([3, 4, 5, 6, 7], [(8, 10)])
    """
    if not acked or not gap:
        return
    top = max(acked)
    below = gap.overlap(0, top + 1)
    if not below:
        return
    add = sorted({o for iv in below for o in range(iv.begin, min(iv.end, top + 1))} - index)
    acked.extend(add)
    index.update(add)
    gap.chop(0, top + 1)


class Consumer(faust_aiokafka.Consumer):
    """The aiokafka-driven faust consumer; commits no longer crawl after a rebalance."""

    def _new_offset(self, tp: FaustTP) -> int | None:
        # faust-streaming 0.15.3: ``_new_offset`` computes the offset to commit from
        # ``_acked`` / ``_acked_index`` (offsets acknowledged) and ``_gap`` (IntervalTree of
        # offsets taken for compacted); its own merge duplicates offsets (module docstring)
        gap = self._gap.get(tp)
        if gap:
            merge_gap(self._acked[tp], self._acked_index[tp], gap)
        result: int | None = super()._new_offset(tp)
        return result


class Transport(faust_aiokafka.Transport):
    """The aiokafka transport with :class:`Consumer`."""

    Consumer: ClassVar[type[Any]] = Consumer


def _faust_tp(tp: TP) -> FaustTP:
    """faust's own ``TP`` for ``tp`` (its bookkeeping dictionaries are keyed by it)."""
    return FaustTP(tp.topic, tp.partition)


class FaustConsumerView:
    """:class:`~service.stream.partitions.ConsumerView` over a running faust ``app``.

    ``app.consumer`` is looked up on every call: faust creates it when the app starts.
    :meth:`committed_next`, :meth:`chop_gap` and :meth:`commit_processed` work on any faust
    consumer, whether or not the app runs with :class:`Transport`.
    """

    def __init__(self, app: Any) -> None:
        self._app = app

    @property
    def _consumer(self) -> Any:
        return self._app.consumer

    @property
    def generation(self) -> int:
        # faust-streaming 0.15.3: ``App.consumer_generation_id`` is set on every rebalance
        # (faust compares it with ``Message.generation_id`` to drop stale records); there
        # is no public accessor
        return int(self._app.consumer_generation_id or 0)

    @property
    def paused(self) -> bool:
        # faust-streaming 0.15.3: ``App.rebalancing`` is True from the revoke to the end of
        # the assignment; there is no public accessor
        return bool(self._app.rebalancing) or self.recovery().pauses_stream

    def assignment(self) -> AbstractSet[TP]:
        assigned: AbstractSet[TP] = self._consumer.assignment()
        return assigned

    def recovery(self) -> RecoveryState:
        # faust-streaming 0.15.3: ``app.tables.recovery`` (``faust.tables.recovery.Recovery``)
        # keeps its state in undocumented attributes: ``in_recovery`` (changelogs being
        # read), ``completed`` (an Event set when the first recovery after an assignment is
        # done; the agents wait for it), ``active_offsets`` (Counter of changelog offsets
        # read) and ``active_remaining()`` (Counter of records left); liveness needs them
        # to tell a slow recovery from a stopped one (faust-streaming#74)
        recovery = self._app.tables.recovery
        offsets = {
            (tp.topic, tp.partition): int(v or 0) for tp, v in recovery.active_offsets.items()
        }
        remaining = sum(max(0, int(v)) for v in recovery.active_remaining().values())
        return RecoveryState(
            in_recovery=bool(recovery.in_recovery),
            completed=bool(recovery.completed.is_set()),
            offsets=offsets,
            remaining=remaining,
        )

    def highwater(self, tp: TP) -> int | None:
        high = self._consumer.highwater(_faust_tp(tp))
        return None if high is None else int(high)

    async def highwaters(self, tps: Sequence[TP]) -> Mapping[tuple[str, int], int]:
        highs = await self._consumer.highwaters(*(_faust_tp(tp) for tp in tps))
        return {(tp.topic, tp.partition): int(h) for tp, h in highs.items() if h is not None}

    async def position(self, tp: TP) -> int | None:
        """None also for a partition revoked since it was listed (a rebalance between the
        assignment and this call: aiokafka raises IllegalStateError)."""
        try:
            position = await self._consumer.position(_faust_tp(tp))
        except IllegalStateError:
            return None
        return None if position is None else int(position)

    def committed_next(self, tp: TP) -> int | None:
        # faust-streaming 0.15.3: ``Consumer._committed_offset`` (a defaultdict: ``get``
        # does not add) holds the committed *next* offset per partition, set on assignment
        # and on every commit; no public accessor, and asking the broker every second
        # would cost a request per partition
        committed = self._consumer._committed_offset.get(_faust_tp(tp))
        return None if committed is None else int(committed)

    async def earliest(self, tp: TP) -> int | None:
        key = _faust_tp(tp)
        earliest = (await self._consumer.earliest_offsets(key)).get(key)
        return None if earliest is None else int(earliest)

    async def seek(self, tp: TP, offset: int) -> None:
        await self._consumer.seek(_faust_tp(tp), offset)

    def chop_gap(self, tp: TP, start: int, end: int) -> None:
        # faust-streaming 0.15.3: ``Consumer._gap`` maps a partition to an IntervalTree of
        # offsets faust took for compacted and counts as done when it commits; records
        # continuity re-reads from there would otherwise be counted twice (commits crawl,
        # see Consumer) or committed before they are processed
        gap = self._consumer._gap.get(_faust_tp(tp))
        if gap:
            gap.chop(start, end)

    async def commit_processed(self, tp: TP, offset: int) -> bool:
        # faust-streaming 0.15.3: ``Consumer._commit_offsets`` flushes the producer, commits
        # and updates ``_committed_offset`` (faust's public ``commit`` only commits what
        # faust itself counts as acknowledged, which is what lost track here)
        return bool(await self._consumer._commit_offsets({_faust_tp(tp): offset}))

    def acknowledge(self, records: Iterable[RawMessage], upto: int) -> None:
        """faust may have recorded the jump as a "gap" (a range it treats as done); that
        range is cut first, or its offsets would be counted twice and the commit would
        crawl. Then each record is acknowledged as if faust had delivered it."""
        rows = list(records)
        if not rows:
            return
        tp = FaustTP(rows[0].topic, rows[0].partition)
        self.chop_gap(tp, rows[0].offset, upto + 1)
        consumer = self._consumer
        for r in rows:
            # faust-streaming 0.15.3: ``Consumer.ack`` takes a ``Message``; records read
            # outside faust have none, so one is built with the fields ``ack`` reads (tp,
            # offset, topic) and placeholders for the rest (timestamp, headers, checksum)
            message = Message(r.topic, r.partition, r.offset, 0.0, 0, None, r.key, r.value, None,
                              tp=tp)  # fmt: skip
            consumer.ack(message)


if TYPE_CHECKING:
    _conforms: type[ConsumerView] = FaustConsumerView  # mypy checks the protocol here


class App(faust.App):
    """The faust app of a worker: runs with :class:`Transport`, carries its parts (set by
    :func:`service.stream.app.create_app`) and closes the gap reader when it stops."""

    parts: Any = None  # service.stream.app.Parts
    gaps: Any = None  # service.stream.continuity.KafkaGaps

    def _new_transport(self) -> Any:
        # faust-streaming 0.15.3: ``App._new_transport`` is the one hook that picks the
        # transport class (the ``broker`` URL scheme only selects faust's own drivers)
        return Transport(self.conf.broker_consumer, self)

    async def on_stop(self) -> None:
        await super().on_stop()
        if self.gaps is not None:
            await self.gaps.close()


class Worker(faust.Worker):
    """faust's worker, with the log level it was given once it has started.

    faust-streaming 0.15.3: at ``warning`` or above, ``Worker._setup_spinner_handler`` sets
    the root logger to DEBUG (so its start-up spinner turns on every record) and never sets
    it back: every aiokafka send then builds a debug record that no handler prints (5 % of
    a busy worker's time). Once started, the root logger gets the configured level back and
    the spinner's handler goes."""

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        root = logging.getLogger()
        for handler in list(root.handlers):
            if type(handler).__name__ == "SpinnerHandler":
                root.removeHandler(handler)
        level = self.loglevel
        root.setLevel(level.upper() if isinstance(level, str) else level or logging.WARNING)
