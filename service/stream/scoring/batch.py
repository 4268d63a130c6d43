"""A fetched batch parsed in one pass: consumed messages in, one feature matrix per model out
(pure: no Kafka, no clock, no metrics).

:class:`Messages` is a batch of consumed messages as columns (values, partitions) with each
message on demand (its :class:`~service.records.RawMessage`, for a dead letter). The scoring
loop makes one from aiokafka's records without a record object per event; a list of
messages is one too (:meth:`Messages.of`).

:func:`parse_batch` gives the valid events of each model as :class:`Rows` (ids, positions
in the batch, one matrix of raw features) and a dead letter for each of the others. The
common shape (``{"id": "...", "features": [numbers], "model"?, "ts"?}`` for a model that
takes a list) is checked for the whole batch at once: the types of each row in one pass,
then one array per model and one finiteness check. Anything else, and any row the batch
check doubts (a non-finite value, an integer beyond a float), goes through
:func:`parse_event` alone, which names the exact problem. Either way an event is what
parsing it alone gives (``tests/stream/scoring/test_decide.py`` holds the two together).
An event the one pass decoded but did not take (an object of fields, for a model that
declares them) is not decoded again; what a person would be shown of it is made only for
the rows that ask for their label (:class:`Shown`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, overload

import numpy as np
import orjson

from service.features import encoder_of
from service.features.raw import RawReader, read_envelope, reader_of
from service.learning.sparse import SparseRows
from service.records import (
    BadMessage,
    Champions,
    DeadLetter,
    FeatureEvent,
    RawMessage,
    feature_event,
    parse_feature_event,
)
from service.records.reasons import Source
from service.stream.models.served import ServedModel

__all__ = [
    "Limits",
    "Messages",
    "ParsedEvent",
    "Rows",
    "Shown",
    "parse_batch",
    "parse_event",
    "whole",
]

_PLAIN: Final[frozenset[type]] = frozenset({float, int})
_UNREAD: Final = object()  # parse_event: the message's value is still to decode


@dataclass(frozen=True, slots=True)
class Limits:
    """What scoring needs from the settings."""

    default_model: str
    request_ttl: float
    max_bytes: int | None = None
    max_features: int = 100_000


class Messages(Sequence[RawMessage]):
    """Consumed messages as columns: ``values`` and ``partitions`` for the whole batch, each
    message's :class:`RawMessage` made from its record (``make``) only when asked for, and
    their Kafka timestamps when a budget asks for them (``timestamps``)."""

    __slots__ = ("_items", "_make", "_stamps", "_timestamps", "partitions", "values")

    def __init__(
        self,
        items: Sequence[Any],
        make: Callable[[Any], RawMessage],
        *,
        values: list[bytes],
        partitions: list[int],
        timestamps: Callable[[], list[float | None]] | None = None,
    ) -> None:
        self._items = items
        self._make = make
        self.values = values
        self.partitions = partitions
        self._timestamps = timestamps
        self._stamps: list[float | None] | None = None

    @classmethod
    def of(cls, messages: Sequence[RawMessage]) -> Messages:
        """``messages`` as a batch (itself if it is one)."""
        if isinstance(messages, Messages):
            return messages
        return cls(
            messages,
            _same,
            values=[m.value for m in messages],
            partitions=[m.partition for m in messages],
        )

    def timestamps(self) -> list[float | None]:
        """Each message's Kafka timestamp in seconds (None: unknown), made once when asked
        (by ``timestamps`` when given: the column without the messages)."""
        if self._stamps is None:
            make = self._timestamps
            self._stamps = [m.timestamp for m in self] if make is None else make()
        return self._stamps

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> RawMessage: ...

    @overload
    def __getitem__(self, index: slice) -> list[RawMessage]: ...

    def __getitem__(self, index: int | slice) -> RawMessage | list[RawMessage]:
        if isinstance(index, slice):
            return [self._make(item) for item in self._items[index]]
        return self._make(self._items[index])

    def __iter__(self) -> Iterator[RawMessage]:
        return map(self._make, self._items)


def _same(message: RawMessage) -> RawMessage:
    return message


@dataclass(slots=True)
class Rows:
    """The valid events of a batch addressed to one model (its *route*), in batch order:
    where each sits in the batch, its id and Kafka timestamp (``ts``: the event's own
    field), and one row of raw features each in ``x`` (a matrix, or the inputs each sets:
    a declared model's that scores sparse rows)."""

    route: str
    model: ServedModel  # the member of the route's group that decides them
    positions: list[int]
    ids: list[str]
    ts: list[float | None]
    x: np.ndarray | SparseRows
    # per row, the fields a person is shown of an event of a model that declares ``fields``
    # (:meth:`~service.features.Encoder.shown`); None: no row has any
    fields: Sequence[dict[str, Any] | None] | None = None

    def __len__(self) -> int:
        return len(self.positions)

    def dense(self) -> np.ndarray:
        """The rows as a matrix."""
        return whole(self.x)

    def fields_of(self, rows: Sequence[int]) -> list[dict[str, Any] | None] | None:
        """The fields of ``rows`` (None when no row has any)."""
        return None if self.fields is None else [self.fields[j] for j in rows]


class Shown(Sequence[dict[str, Any] | None]):
    """What a person answering a label request is shown of each event parsed alone
    (:meth:`~service.stream.models.served.ServedModel.shown`), made when a row is first
    read: only the rows that ask for their label ever are."""

    __slots__ = ("_events", "_made")

    def __init__(self, events: Sequence[ParsedEvent]) -> None:
        self._events = events
        self._made: dict[int, dict[str, Any] | None] = {}

    @staticmethod
    def any_of(events: Sequence[ParsedEvent]) -> bool:
        """Whether any of ``events`` has fields to show (a model that declares them)."""
        return any(
            e.model.config.fields is not None and isinstance(e.event.features, dict) for e in events
        )

    def __len__(self) -> int:
        return len(self._events)

    @overload
    def __getitem__(self, j: int) -> dict[str, Any] | None: ...

    @overload
    def __getitem__(self, j: slice) -> list[dict[str, Any] | None]: ...

    def __getitem__(self, j: int | slice) -> dict[str, Any] | None | list[dict[str, Any] | None]:
        if isinstance(j, slice):
            return [self[k] for k in range(len(self))[j]]
        k = range(len(self))[j]  # an IndexError as a list's
        if k not in self._made:
            event = self._events[k]
            self._made[k] = event.model.shown(event.event)
        return self._made[k]


@dataclass(slots=True)
class _Pending:
    """Rows of one route while the batch is read (the features still lists)."""

    positions: list[int] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    ts: list[float | None] = field(default_factory=list)
    features: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ParsedEvent:
    """A valid event parsed alone, with the model that scores it and its raw features: a
    vector, or (a declared model's that scores sparse rows) the inputs it sets and their
    values."""

    message: RawMessage
    event: FeatureEvent
    model: ServedModel  # the model that decides it (its route's server)
    raw: np.ndarray | tuple[np.ndarray, np.ndarray]

    @property
    def route(self) -> str:
        """The model the event is addressed to (its group's name)."""
        return self.event.model

    @property
    def x(self) -> np.ndarray:
        """The raw feature vector."""
        if isinstance(self.raw, np.ndarray):
            return self.raw
        idx, val = self.raw
        width = self.model.config.n_inputs
        return np.bincount(idx, weights=val, minlength=width).astype(np.float64)


def parse_event(
    message: RawMessage,
    models: Mapping[str, ServedModel],
    limits: Limits,
    champions: Champions | None = None,
    *,
    decoded: Any = _UNREAD,
) -> ParsedEvent:
    """Parse and resolve one message (decided by the server ``champions`` names for its
    model); :class:`BadMessage` says why it cannot be scored. ``decoded``: its value's JSON
    when already decoded (by orjson, from a value within ``limits.max_bytes``)."""
    if decoded is _UNREAD:
        event = parse_feature_event(
            message.value,
            default_model=limits.default_model,
            max_bytes=limits.max_bytes,
            max_features=limits.max_features,
        )
    else:
        event = feature_event(
            decoded, default_model=limits.default_model, max_features=limits.max_features
        )
    served = models.get(event.model)
    if served is None:
        raise BadMessage("unknown_model", f"no model named {event.model!r}")
    champion = served.config.champion
    if champion is not None:
        detail = f"model {event.model!r} is a shadow of {champion!r}: it scores {champion!r}'s"
        raise BadMessage("unknown_model", f"{detail} events and decides none of its own")
    if champions is not None:
        served = models.get(champions.server(event.model), served)
    entries = served.entries(event)
    return ParsedEvent(
        message, event, served, served.raw_vector(event) if entries is None else entries
    )


def parse_batch(
    messages: Messages,
    models: Mapping[str, ServedModel],
    limits: Limits,
    champions: Champions | None = None,
) -> tuple[list[Rows], list[DeadLetter]]:
    """The valid events of ``messages`` by route (routes in the order of their first event)
    and the dead letters of the others (in batch order); see the module docstring."""
    pending, slow, decoded = _read(messages.values, models, limits)
    found: dict[str, Rows] = {}
    for route, rows in pending.items():
        served = models[route]
        if champions is not None:  # the member that serves the group decides
            served = models.get(champions.server(route), served)
        try:
            matrix = np.array(rows.features, dtype=np.float64)
        except OverflowError:  # an integer beyond any float: row by row
            slow += rows.positions
            continue
        finite = np.isfinite(matrix).all(axis=1)
        if not finite.all():
            slow += [rows.positions[k] for k in np.flatnonzero(~finite).tolist()]
            keep = np.flatnonzero(finite).tolist()
            rows.positions = [rows.positions[k] for k in keep]
            rows.ids = [rows.ids[k] for k in keep]
            rows.ts = [rows.ts[k] for k in keep]
            matrix = matrix[finite]
        if rows.positions:
            found[route] = Rows(route, served, rows.positions, rows.ids, rows.ts, matrix)
    dead: list[DeadLetter] = []
    alone: dict[str, list[tuple[int, ParsedEvent]]] = {}
    for i in sorted(slow):  # refusals in batch order
        message = messages[i]
        try:
            one = parse_event(message, models, limits, champions, decoded=decoded.get(i, _UNREAD))
        except BadMessage as bad:
            dead.append(DeadLetter.of(Source.FEATURES, message, bad.reason, bad.detail))
            continue
        alone.setdefault(one.route, []).append((i, one))
    for route, events in alone.items():
        _join(found, route, events)
    return sorted(found.values(), key=lambda r: r.positions[0]), dead


def _read(
    values: Sequence[bytes], models: Mapping[str, ServedModel], limits: Limits
) -> tuple[dict[str, _Pending], list[int], dict[int, Any]]:
    """One pass over the raw values: the events in the common shape by route (features as
    lists), the positions of the others, and the JSON of those of them orjson decoded to
    an object (by position; one the batch check refuses later is decoded again)."""
    # the models that decide events given as lists (a shadow decides none of its own, a
    # model that declares fields takes objects), by their width
    inputs = {
        n: m.config.n_inputs
        for n, m in models.items()
        if m.config.champion is None and m.config.fields is None
    }
    default, max_bytes, max_features = limits.default_model, limits.max_bytes, limits.max_features
    loads, plain, isfinite = orjson.loads, _PLAIN.issuperset, math.isfinite
    pending: dict[str, _Pending] = {}
    slow: list[int] = []
    decoded: dict[int, Any] = {}
    readers = _readers(models)
    for i, raw in enumerate(values):
        if max_bytes is not None and len(raw) > max_bytes:
            slow.append(i)
            continue
        if readers:  # a declared model's event, its tokens read from its bytes
            fast = _read_declared(raw, readers, default)
            if fast is not None:
                slow.append(i)
                decoded[i] = fast
                continue
        try:
            record = loads(raw)  # refuses lone surrogates: every str encodes as UTF-8
        except orjson.JSONDecodeError:
            slow.append(i)
            continue
        if type(record) is not dict:
            slow.append(i)
            continue
        event_id, feats, model, ts = (
            record.get("id"),
            record.get("features"),
            record.get("model"),
            record.get("ts"),
        )
        name = default if model is None else model
        n_inputs = inputs.get(name) if type(name) is str else None
        if (
            n_inputs is None
            or type(event_id) is not str
            or not 0 < len(event_id) <= 256
            or type(feats) is not list
            or len(feats) != n_inputs
            or n_inputs > max_features
            or not (ts is None or (type(ts) in _PLAIN and isfinite(ts)))
            or not plain(map(type, feats))
        ):
            slow.append(i)
            decoded[i] = record  # parsed alone from this, not decoded again
            continue
        rows = pending.get(name)
        if rows is None:
            rows = pending[name] = _Pending()
        rows.positions.append(i)
        rows.ids.append(event_id)
        rows.ts.append(None if ts is None else float(ts))
        rows.features.append(feats)
    return pending, slow, decoded


def _readers(models: Mapping[str, ServedModel]) -> dict[str, RawReader]:
    """The :class:`~service.features.raw.RawReader` of each model that decides events of
    its own and declares a tokens field it reads through a cache."""
    out: dict[str, RawReader] = {}
    for name, served in models.items():
        declared = served.config.fields
        if declared is None or served.config.champion is not None:
            continue
        reader = reader_of(encoder_of(declared))
        if reader is not None:
            out[name] = reader
    return out


def _read_declared(raw: bytes, readers: Mapping[str, RawReader], default: str) -> Any:
    """The event ``raw`` as orjson decodes it, each cached tokens field read from its bytes,
    when it names (or defaults to) a model of ``readers`` and reads the same as orjson reads
    it; None otherwise (orjson reads it)."""
    env = read_envelope(raw)
    if env is None or type(env.id) is not str:
        return None
    model = default if env.model is None else env.model
    reader = readers.get(model) if type(model) is str else None
    if reader is None:
        return None
    fields = reader.fields(env.features)
    if fields is None:
        return None
    record: dict[str, Any] = {"id": env.id, "features": fields}
    if env.model is not None:
        record["model"] = env.model
    if env.ts is not None:
        record["ts"] = env.ts
    return record


def whole(x: np.ndarray | SparseRows, rows: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """``x`` (rows of raw features, or ``rows`` of them) as a matrix."""
    if isinstance(x, SparseRows):
        return x.toarray(rows)
    return x if rows is None else x[rows]


def _join(found: dict[str, Rows], route: str, events: list[tuple[int, ParsedEvent]]) -> None:
    """Add the events of ``route`` parsed alone (at their batch positions, in order) to its
    rows, all at once, in batch order."""
    parsed = [event for _, event in events]
    x: np.ndarray | SparseRows
    if all(type(event.raw) is tuple for event in parsed):  # a declared model's entries
        width = parsed[0].model.config.n_inputs
        x = SparseRows.of([event.raw for event in parsed], width)  # type: ignore[misc]
    else:
        x = np.vstack([event.x for event in parsed])
    alone = Rows(
        route,
        events[0][1].model,
        [i for i, _ in events],
        [event.event.id for _, event in events],
        [event.event.ts for _, event in events],
        x,
        Shown(parsed) if Shown.any_of(parsed) else None,
    )
    rows = found.get(route)
    if rows is None:
        found[route] = alone
        return
    order = np.argsort(np.asarray(rows.positions + alone.positions), kind="stable").tolist()

    def merged(a: Sequence[Any], b: Sequence[Any]) -> list[Any]:
        both = [*a, *b]
        return [both[k] for k in order]

    if rows.fields is not None or alone.fields is not None:
        rows.fields = merged(
            rows.fields or [None] * len(rows.positions),
            alone.fields or [None] * len(alone.positions),
        )
    rows.positions = merged(rows.positions, alone.positions)
    rows.ids = merged(rows.ids, alone.ids)
    rows.ts = merged(rows.ts, alone.ts)
    rows.x = np.vstack([rows.dense(), alone.dense()])[order]
