"""The learner's state, typed, over any key-value table of bytes.

A :class:`Table` is what the learner needs of a table: the worker's is a
:class:`~service.stream.labels.tables.ChangelogTable` (in memory, changelog-backed, one per concern,
co-partitioned with the label topics); tests pass an in-memory one. Values are the
records of :mod:`service.records.state`, encoded by them:

- :class:`PendingStore`: label requests awaiting an answer, with a slim in-memory index
  (no features), per-partition expiry heaps and the label queue in priority order, so sweeps
  pop what is due, the gauges never decode the table and a page of the queue decodes only
  the entries on it;
- :class:`ParkedStore`: labels that arrived before their request;
- :class:`ModelStore`: the current :class:`~service.records.ModelEnvelope` of each model.

A value that does not parse (a changelog is a topic anyone with access can write) is logged
and skipped by scans; a single read raises :class:`~service.records.BadMessage`.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson

from service.records import BadMessage, ModelEnvelope, PendingEntry, parse_model_envelope
from service.records.admission import Admission
from service.records.state import ParkedLabel, parse_parked_label, parse_pending_entry

__all__ = ["ModelStore", "ParkedStore", "PendingStore", "PendingSummary", "QueueKey", "Table"]

log = logging.getLogger(__name__)

#: where an open request stands in the label queue, ``(-priority, requested_at, request_id)``:
#: the queue is sorted by it (highest priority first, then the oldest; the id breaks ties)
QueueKey = tuple[float, float, str]
#: new places are sorted in one by one while there are fewer than 1/64 of the queue's
#: (measured: 50,000 places, one sort of them and 800 new ones costs what 800 insertions do)
_SORT_AFTER = 64


class Table(Protocol):
    """A mutable mapping of bytes to bytes (a changelog table, or a dict in tests)."""

    def get(self, key: bytes, /) -> bytes | None: ...

    def __setitem__(self, key: bytes, value: bytes, /) -> None: ...

    def __delitem__(self, key: bytes, /) -> None: ...

    def __contains__(self, key: object, /) -> bool: ...

    def items(self) -> Iterable[tuple[bytes, bytes]]: ...


def _scan(table: Table, what: str) -> Iterator[tuple[str, bytes]]:
    for key, value in list(table.items()):
        try:
            yield key.decode("utf-8"), value
        except UnicodeDecodeError:
            log.error("skipping a %s entry with a key that is not UTF-8: %r", what, key[:64])


@dataclass(frozen=True, slots=True)
class PendingSummary:
    """What sweeps, gauges and the label queue need of a pending entry (its features stay
    in the table)."""

    model: str
    partition: int
    requested_at: float
    expires_at: float
    applied: bool
    priority: float = 0.0

    @classmethod
    def of(cls, entry: PendingEntry) -> PendingSummary:
        r = entry.request
        return cls(
            r.model, entry.partition, r.requested_at, r.expires_at, entry.applied, r.priority
        )

    def queue_key(self, request_id: str) -> QueueKey:
        """The request's place in the label queue (a value that is not finite counts as 0,
        so the order stays total)."""
        return (-_finite(self.priority), _finite(self.requested_at), request_id)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


class PendingStore:
    """Pending label requests by request id, with an index for sweeps and gauges.

    The index covers what this process wrote plus, after :meth:`refresh`, what the table
    held when the learner's partitions were last assigned (recovery, rebalance). The queue
    (:meth:`page`) holds the index's unanswered requests, sorted by :class:`QueueKey`."""

    def __init__(self, table: Table, admission: Admission | None = None) -> None:
        self._table = table
        # the learner's checks: an entry they refuse (a record forged on the changelog: a
        # model not configured, a width, key or partition the learner would never write)
        # is not there for the learner, as it is not for the label desk
        self._admission = admission
        self._index: dict[str, PendingSummary] = {}
        self._expiry: dict[int, list[tuple[float, str]]] = {}
        self._indexed: frozenset[int] | None = None
        self._queue: list[QueueKey] = []  # sorted; unanswered requests of the index
        self._fresh: list[QueueKey] = []  # queued since the queue was last sorted
        self._open: Counter[str] = Counter()  # queued requests, by model
        # per model, (requested_at, request id) of its queued requests, oldest first; an
        # answered or deleted request leaves when it comes to the top (open_requests)
        self._ages: dict[str, list[tuple[float, str]]] = {}

    def get(self, request_id: str) -> PendingEntry | None:
        """The entry of ``request_id``; None when there is none or the learner's checks
        refuse it (logged). :class:`BadMessage` when it does not parse."""
        raw = self._table.get(request_id.encode())
        if raw is None:
            return None
        entry = parse_pending_entry(raw)
        return entry if self._admitted(request_id, entry) else None

    def _admitted(self, key: str, entry: PendingEntry) -> bool:
        if self._admission is None:
            return True
        try:
            self._admission.pending(entry, key=key.encode(), partition=entry.partition)
        except BadMessage as bad:
            log.error("skipping pending entry %r the learner would not write: %s", key, bad)
            return False
        return True

    def __contains__(self, request_id: str) -> bool:
        if self._admission is None:
            return request_id.encode() in self._table
        try:
            return self.get(request_id) is not None
        except BadMessage:
            return False

    def put(self, entry: PendingEntry) -> None:
        self._table[entry.request_id.encode()] = _encoded(entry)
        self._add(entry.request_id, PendingSummary.of(entry))

    def delete(self, request_id: str) -> None:
        del self._table[request_id.encode()]
        old = self._index.pop(request_id, None)
        if old is not None:
            self._unqueue(request_id, old)

    def entries(self) -> list[PendingEntry]:
        """Every readable entry (decoded: the web page, tools)."""
        out = []
        for key, raw in _scan(self._table, "pending"):
            try:
                entry = parse_pending_entry(raw)
            except BadMessage as bad:
                log.error("skipping unreadable pending entry %r: %s", key, bad)
                continue
            if self._admitted(key, entry):
                out.append(entry)
        return out

    def refresh(self, partitions: frozenset[int]) -> bool:
        """Rebuild the index from the table when the assigned ``partitions`` changed; True
        if they did."""
        if self._indexed == partitions:
            return False
        self._index.clear()
        self._expiry.clear()
        for entry in self.entries():
            self._add(entry.request_id, PendingSummary.of(entry), queue=False)
        self._queue = sorted(s.queue_key(k) for k, s in self._index.items() if not s.applied)
        self._fresh = []
        self._open = Counter(s.model for s in self._index.values() if not s.applied)
        self._ages = {}
        for k, summary in self._index.items():
            if not summary.applied:
                self._age(k, summary, ordered=False)
        for heap in self._ages.values():
            heapq.heapify(heap)
        self._indexed = partitions
        return True

    def _add(self, key: str, summary: PendingSummary, *, queue: bool = True) -> None:
        old = self._index.get(key)
        if old is None:
            heap = self._expiry.setdefault(summary.partition, [])
            heapq.heappush(heap, (summary.expires_at, key))
        elif queue:
            self._unqueue(key, old)
        self._index[key] = summary
        if queue and not summary.applied:
            self._fresh.append(summary.queue_key(key))  # sorted in when the queue is read
            self._open[summary.model] += 1
            self._age(key, summary)

    def _sorted(self) -> list[QueueKey]:
        """The queue, with the requests queued since it was last read sorted in: a few
        one by one, many (a burst) with one sort of the queue and them (a sort looks at
        every place once, an insertion shifts the places after it)."""
        fresh = self._fresh
        if fresh:
            if len(fresh) * _SORT_AFTER < len(self._queue):
                for place in fresh:
                    bisect.insort(self._queue, place)
            else:
                self._queue += fresh
                self._queue.sort()
            self._fresh = []
        return self._queue

    def _unqueue(self, key: str, summary: PendingSummary) -> None:
        if summary.applied:
            return  # answered requests are not queued
        place = summary.queue_key(key)
        queue = self._sorted()
        i = bisect.bisect_left(queue, place)
        if i < len(queue) and queue[i] == place:
            del queue[i]
            self._open[summary.model] -= 1

    def due(self, partition: int, *, now: float, grace: float) -> list[tuple[str, PendingSummary]]:
        """Entries of ``partition`` more than ``grace`` seconds past expiry, taken off the
        heap (each is returned once)."""
        heap = self._expiry.get(partition, [])
        out = []
        while heap and now > heap[0][0] + grace:
            _, key = heapq.heappop(heap)
            summary = self._index.get(key)
            if summary is not None:
                out.append((key, summary))
        return out

    def least_urgent(self, model: str) -> str | None:
        """The open request of ``model`` that comes last in the queue (None: no open one)."""
        for place in reversed(self._sorted()):
            summary = self._index.get(place[2])
            if summary is not None and summary.model == model:
                return place[2]
        return None

    def open_count(self, model: str) -> int:
        """Unanswered requests of ``model`` held (expired ones until the sweep drops them)."""
        return self._open.get(model, 0)

    def page(
        self, *, after: QueueKey | None, limit: int, now: float, max_scan: int = 5_000
    ) -> tuple[list[PendingEntry], QueueKey | None]:
        """Up to ``limit`` open requests (unanswered, unexpired) of the queue that come after
        ``after`` (from the start when None), and where the next page starts (None: no more).

        Only the entries on the page are read from the table and decoded; at most
        ``max_scan`` queue places are looked at (expired requests wait there for the sweep),
        so a page costs O(log n + max_scan + limit) whatever the queue holds."""
        queue = self._sorted()
        start = 0 if after is None else bisect.bisect_right(queue, after)
        end = min(len(queue), start + max_scan)
        out: list[PendingEntry] = []
        i = start
        while i < end and len(out) < limit:
            place = queue[i]
            i += 1
            summary = self._index.get(place[2])
            if summary is None or summary.expires_at < now:
                continue
            entry = self._read(place[2])
            if entry is not None and not entry.applied and entry.request.expires_at >= now:
                out.append(entry)
        return out, (queue[i - 1] if start < i < len(queue) else None)

    def _read(self, request_id: str) -> PendingEntry | None:
        try:
            return self.get(request_id)
        except BadMessage as bad:
            log.error("skipping unreadable pending entry %r: %s", request_id, bad)
            return None

    def open_requests(self, models: Iterable[str], now: float) -> dict[str, tuple[int, float]]:
        """Per model: (unanswered requests, age in seconds of the oldest; 0 if none), from
        the counts and the per-model age heaps (no scan of the index: the one-second check
        asks for it)."""
        out = {}
        for model in dict.fromkeys(models):
            count = self._open.get(model, 0)
            oldest = self._oldest(model) if count else None
            out[model] = (count, 0.0 if oldest is None else now - min(now, oldest))
        return out

    def _age(self, key: str, summary: PendingSummary, *, ordered: bool = True) -> None:
        """Put a queued request's time on its model's age heap (``ordered`` False: at its
        end, the caller heapifies). Requests are stamped with finite times (their parse
        refuses others); one that is not is left out of the age."""
        if not math.isfinite(summary.requested_at):
            return
        heap = self._ages.setdefault(summary.model, [])
        if ordered:
            heapq.heappush(heap, (summary.requested_at, key))
        else:
            heap.append((summary.requested_at, key))

    def _oldest(self, model: str) -> float | None:
        """When the oldest queued request of ``model`` was made (stale tops leave the heap)."""
        heap = self._ages.get(model)
        while heap:
            at, key = heap[0]
            s = self._index.get(key)
            if s is not None and not s.applied and s.model == model and s.requested_at == at:
                return at
            heapq.heappop(heap)
        return None


def _encoded(entry: PendingEntry) -> bytes:
    """``entry.to_json()``: for an entry not yet answered, its request's record with the
    entry's two fields after it (the same bytes, without a dict of the request's fields on
    the way; ``tests/stream/labels/test_state.py`` holds the two together)."""
    request = entry.request
    if (
        entry.applied is not False
        or type(request.shadow_labels) is not dict
        or type(entry.partition) is not int
        or type(entry.request_offset) not in (int, type(None))
    ):
        return entry.to_json()
    try:
        head = request.to_json()
    except orjson.JSONEncodeError:  # what only the entry's own encoding writes (numpy)
        return entry.to_json()
    tail = b',"partition":%d,"applied":false' % entry.partition
    if entry.request_offset is not None:
        tail += b',"request_offset":%d' % entry.request_offset
    return head[:-1] + tail + b"}"


class ParkedStore:
    """Labels waiting for their request, by request id."""

    def __init__(self, table: Table) -> None:
        self._table = table

    def get(self, request_id: str) -> ParkedLabel | None:
        raw = self._table.get(request_id.encode())
        return None if raw is None else parse_parked_label(raw)

    def put(self, parked: ParkedLabel) -> None:
        self._table[parked.label.request_id.encode()] = parked.to_json()

    def delete(self, request_id: str) -> None:
        del self._table[request_id.encode()]

    def entries(self) -> list[tuple[str, ParkedLabel | None]]:
        """Every entry; None for a value that does not parse (the sweep drops it)."""
        out: list[tuple[str, ParkedLabel | None]] = []
        for key, raw in _scan(self._table, "parked-label"):
            try:
                out.append((key, parse_parked_label(raw)))
            except BadMessage as bad:
                log.error("unreadable parked label %r: %s", key, bad)
                out.append((key, None))
        return out


#: versions of each model kept besides the current one (``abstain models rollback``): the
#: last this many written
HISTORY = 20


def _learner_state(raw: bytes, model: str) -> ModelEnvelope:
    """A model's state read from the learner's table: a record read to serve (what the
    models topic carries: no challengers, nothing remembered) is refused, as a state no
    learner can go on from."""
    envelope = parse_model_envelope(raw, model=model)
    if envelope.serving:
        raise BadMessage(
            "schema",
            f"the learner's state of {model!r} is a record read to serve (the models "
            "topic's), not a learner's state",
        )
    return envelope


class ModelStore:
    """The learner's current envelope of each model (``initial`` for a model never
    stored), and the last :data:`HISTORY` versions written under ``<model>@<version>``
    (what a rollback serves again)."""

    def __init__(
        self, table: Table, initial: Mapping[str, ModelEnvelope], *, history: int = HISTORY
    ) -> None:
        self._table = table
        self._initial = initial
        self._history = history
        # model -> (the bytes stored, their envelope): the learner reads each model several
        # times a label; what it wrote (or parsed once) is not parsed again while the table
        # holds those very bytes (a record read back from the changelog is new bytes)
        self._parsed: dict[str, tuple[bytes, ModelEnvelope]] = {}
        # versions made but not yet written (the learner's group commit): read first
        self._staged: dict[str, ModelEnvelope] = {}

    def get(self, model: str, *, staged: bool = True) -> ModelEnvelope:
        """The newest version of ``model``: a staged one first unless ``staged`` is false
        (what is written: a republish never publishes a version whose mark is not durable)."""
        newest = self._staged.get(model) if staged else None
        if newest is not None:
            return newest
        raw = self._table.get(model.encode())
        if raw is None:
            return self._initial[model]
        known = self._parsed.get(model)
        if known is not None and known[0] is raw:
            return known[1]
        envelope = _learner_state(raw, model)
        self._parsed[model] = (raw, envelope)
        return envelope

    def put(self, envelope: ModelEnvelope, encoded: bytes) -> None:
        """Store ``envelope`` as ``encoded`` (its checked :meth:`~ModelEnvelope.to_bytes`),
        as the current version and in the history (the version that falls out of it is
        deleted)."""
        if envelope.serving:
            raise ValueError(f"a record read to serve is not a learner's state: {envelope.model}")
        name, version = envelope.model, envelope.version
        self._table[name.encode()] = encoded
        self._parsed[name] = (encoded, envelope)
        if self._history > 0:
            self._table[f"{name}@{version}".encode()] = encoded
            for old in self.kept(name)[: -self._history]:
                del self._table[f"{name}@{old}".encode()]

    def kept(self, model: str) -> list[int]:
        """The versions of ``model`` kept for a rollback, oldest first (a learner writes
        one version per model per group of labels: their numbers have gaps)."""
        prefix = f"{model}@".encode()
        versions = [key[len(prefix) :] for key, _ in self._table.items() if key.startswith(prefix)]
        return sorted(int(v) for v in versions if v.isdigit())

    def stage(self, envelope: ModelEnvelope) -> None:
        """``envelope`` is what :meth:`get` answers for its model until :meth:`unstage`
        (it is written with :meth:`put` once its label's mark is durable)."""
        self._staged[envelope.model] = envelope

    def unstage(self) -> None:
        """Answer from the table again (what was staged is written, or dropped)."""
        self._staged.clear()

    def version(self, model: str, version: int) -> ModelEnvelope | None:
        """Version ``version`` of ``model`` if it is kept (version 0: the initial one)."""
        if version == 0:
            return self._initial[model]
        raw = self._table.get(f"{model}@{version}".encode())
        return None if raw is None else _learner_state(raw, model)

    def stored(self) -> list[tuple[str, int, bytes]]:
        """(model, version, encoded envelope) of every stored model that is configured and
        readable."""
        out = []
        for name, raw in _scan(self._table, "model"):
            if name not in self._initial:
                continue
            try:
                version = _learner_state(raw, name).version
            except BadMessage as bad:
                log.error("unreadable model state %r: %s", name, bad)
                continue
            out.append((name, version, raw))
        return out
