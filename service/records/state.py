"""State records: what the learner keeps in its tables and publishes as model snapshots.

- :class:`ModelEnvelope`: one model at one version (``models`` table, ``abstain.models``);
- :class:`PendingEntry`: a label request waiting for its answer (``pending`` table);
- :class:`ParkedLabel`: a label that arrived before its request (the parked table, whose
  changelog keeps its earlier name ``<app_id>-orphans-changelog``).

They are written by this service, but a table's changelog and the models topic are topics
like any other: whoever can write them can put anything there, so ``parse_*`` checks every
field as strictly as the wire records are checked.

Model envelope (JSON)::

    {"format": "abstain.model", "format_version": 1, "model": name, "version": int,
     "pipeline": Pipeline.to_state(), "learner": learner.to_state(),
     "labels_offset": int (-1 = none), "labels_applied": int,
     "iw_loss": float, "iw_weight": float, "updated_at": float,
     "labels_partition": int (-1 = none; absent in records written before it existed),
     "corrections_from": int (the labels offset of the oldest label a correction can still
                              reach; -1 = none; absent in records written before it existed),
     "corrected_to": int (the labels offset of the newest correction the state holds; -1 =
                          none; absent in records written before it existed),
     "line_from": int (the version at which the state's line began: a seed or rollback
                       order served it; 0 = version 0; absent in records before it existed),
     "serving": true (present only in a record read to serve: the models topic carries
                      what a scorer reads, :meth:`ModelEnvelope.served`; the learner's
                      tables the whole state)}

Risk: a label for a served decision carries the effective query probability p. The sums
``iw_loss = sum L_d / p`` and ``iw_weight = sum 1 / p`` estimate the total 0-d-1 loss and the
number of decisions without bias; their ratio is the running risk (self-normalised).

>>> env = ModelEnvelope("m", 3, {"steps": []}, {"kind": "dsal"}, iw_loss=1.0, iw_weight=4.0)
>>> parse_model_envelope(env.to_json(), model="m") == env, env.risk
(True, 0.25)
>>> parse_model_envelope(b'{"format": "abstain.model", "format_version": 2}', model="m")
Traceback (most recent call last):
...
service.records.codec.BadMessage: schema: model state for 'm' has format_version 2; this worker reads 1: upgrade the worker
"""  # noqa: E501

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from service.learning import serving_state
from service.records.codec import (
    MAX_MAGNITUDE,
    BadMessage,
    RecordError,
    decode_object,
    dumps,
    encode_finite,
    field,
    ident,
    integer,
    number,
    text,
)
from service.records.packed import checked, header_of, is_packed, pack, squeeze, unpack
from service.records.wire import Label, LabelRequest, label_from_dict, label_request_from_dict

__all__ = [
    "MAX_MAGNITUDE",
    "MODEL_FORMAT",
    "MODEL_FORMAT_VERSION",
    "Deferred",
    "Limits",
    "Stale",
    "TooLarge",
    "ModelEnvelope",
    "ParkedLabel",
    "PendingEntry",
    "parse_model_envelope",
    "parse_parked_label",
    "parse_pending_entry",
]

MODEL_FORMAT: Final = "abstain.model"
MODEL_FORMAT_VERSION: Final = 1
#: versions, offsets and counts stay below 2**53 (exact in every JSON reader)
MAX_COUNTER: Final = 2**53
# a number of 1e100 or more as orjson writes it: its shortest form, an exponent of three
# digits after "e+" (every finite float of 1e16 or more is written so; a literal parsed from
# elsewhere, 1E100 or a 101-digit mantissa, is written so again once re-encoded)
_BIG: Final = re.compile(rb"e\+\d{3}")


def _beyond(value: Any) -> bool:
    """True if a learned number in ``value`` has magnitude >= :data:`MAX_MAGNITUDE`."""
    if isinstance(value, float):
        return abs(value) >= MAX_MAGNITUDE
    if isinstance(value, Mapping):
        return any(_beyond(v) for k, v in value.items() if k != "params")
    if isinstance(value, list | tuple):
        return any(_beyond(v) for v in value)
    if isinstance(value, np.ndarray):
        return (
            value.dtype.kind in "fc"
            and value.size > 0
            and (float(np.abs(value).max()) >= MAX_MAGNITUDE)
        )
    return False


def _out_of_bounds(envelope: ModelEnvelope, encoded: bytes) -> bool:
    """True if ``envelope`` (encoded by orjson as ``encoded``: what :meth:`to_json` writes,
    or its learned parts re-encoded, :func:`_learned_bytes`, or the header of its packed
    form) holds a learned number beyond the bound (a scan of the states only when the bytes
    show a number that large)."""
    if _BIG.search(encoded) is None:
        return False
    return any(_beyond(part) for part in (envelope.pipeline, envelope.learner, envelope.estimate))


class Stale(Exception):  # noqa: N818 - what a state it raises for is
    """A :class:`Deferred` state read after the objects it was to be made from moved on."""


class Deferred(Mapping[str, Any]):
    """A state made when it is first read, from the objects that hold it now.

    A learner applies the labels of a group one after the other to the same objects, but
    writes only each model's newest version of the group: making the state of every version
    between (and checking it) would cost more than the label. So a version made in a group
    holds its states as ``Deferred``: made (once, then kept) when read, or never. When the
    next label takes the objects (:meth:`spend`), a state not made by then can no longer be
    made, and reading it raises :class:`Stale`.

    >>> calls = []
    >>> state = Deferred(lambda: calls.append(1) or {"w": [1.0]})
    >>> state.made, state["w"], dict(state), len(calls), state.made
    (False, [1.0], {'w': [1.0]}, 1, True)
    >>> later = Deferred(lambda: {"w": [2.0]}); later.spend(); later["w"]
    Traceback (most recent call last):
    ...
    service.records.state.Stale: a deferred model state was read after its objects moved on
    """

    __slots__ = ("_make", "_state")

    def __init__(self, make: Callable[[], Mapping[str, Any]]) -> None:
        self._make: Callable[[], Mapping[str, Any]] | None = make
        self._state: Mapping[str, Any] | None = None

    @property
    def made(self) -> bool:
        """Whether the state has been made (it is kept, whatever happens to the objects)."""
        return self._state is not None

    def make(self) -> Mapping[str, Any]:
        """The state, made now if it was not (raises :class:`Stale` if it cannot be)."""
        if self._state is None:
            if self._make is None:
                raise Stale("a deferred model state was read after its objects moved on")
            self._state, self._make = self._make(), None
        return self._state

    def spend(self) -> None:
        """The objects move on: a state not made by now never will be."""
        self._make = None

    def __getitem__(self, key: str) -> Any:
        return self.make()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.make())

    def __len__(self) -> int:
        return len(self.make())

    def __repr__(self) -> str:
        return f"Deferred({self._state!r})" if self._state is not None else "Deferred(...)"


def _made(value: Any) -> Any:
    """``value``, or the state a :class:`Deferred` holds."""
    return value.make() if isinstance(value, Deferred) else value


class TooLarge(RecordError):
    """A model version larger than a record may be (``size`` bytes, over ``limit``):
    ``served``, the record a scorer reads (the models topic); else the learner's whole state
    (its tables)."""

    def __init__(self, size: int, limit: int, *, served: bool = False) -> None:
        what = "the version a scorer reads" if served else "the learner's state of the version"
        super().__init__(f"{what} is {size} bytes, over the {limit} it may take")
        self.size, self.limit, self.served = size, limit, served

    @property
    def remedy(self) -> str:
        """What an operator can do about it."""
        if self.served:
            return (
                "raise max_message_bytes with the models topic's max.message.bytes, or give "
                "the model fewer inputs"
            )
        return (
            "raise max_state_bytes with the max.message.bytes of the learner's models and "
            "history changelogs, or give the model fewer inputs"
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """The most bytes a model version may take: ``state``, the learner's whole state (its
    tables' records: ``Settings.state_bytes``), and ``served``, what a scorer reads of it
    (the models topic: ``Settings.version_bytes``)."""

    state: int
    served: int

    @classmethod
    def of(cls, sizes: Any) -> Limits:
        """The limits of settings ``sizes`` (``service.config.Settings``: its ``state_bytes``
        and ``version_bytes``)."""
        return cls(int(sizes.state_bytes), int(sizes.version_bytes))


@dataclass(frozen=True, slots=True)
class ModelEnvelope:
    """A model at one version: preprocessing and learner state plus what it has absorbed.

    ``pipeline`` and ``learner`` are the JSON-safe states of :mod:`service.learning` (checked
    there when a model is built from them); ``labels_offset`` is the last applied offset of
    the labels topic (a redelivered label at or below it is a no-op)."""

    model: str
    version: int
    pipeline: Mapping[str, Any]
    learner: Mapping[str, Any]
    labels_offset: int = -1
    labels_applied: int = 0
    iw_loss: float = 0.0
    iw_weight: float = 0.0
    updated_at: float = 0.0
    labels_partition: int = -1  # the labels partition ``labels_offset`` counts in
    # the risk estimate's sums (``service.learning.RiskEstimate.to_state()``), for the
    # interval; None in records written before it existed (then left out of the JSON)
    estimate: Mapping[str, Any] | None = None
    # the labels offset (in ``labels_partition``) of the oldest label a correction can still
    # reach (service.stream.labels.history); -1: none (no label yet, or corrections off)
    corrections_from: int = -1
    # the labels offset (in ``labels_partition``) of the newest correction whose effect the
    # state holds (corrections are applied in their order in the log); -1: none
    corrected_to: int = -1
    # the version where this line of states began (a seed or a rollback order served it as
    # that version); an order written against an earlier version is a copy (replayed)
    line_from: int = 0
    # a record read to serve (:meth:`served`): what a scorer reads, never a learner's state
    serving: bool = False

    def applied(self, partition: int, offset: int) -> bool:
        """True if the label at ``offset`` of labels ``partition`` is already in the model
        (offsets are compared only within one partition: a model whose key moved to another
        partition, after the labels topic grew, starts counting again there)."""
        return partition == self.labels_partition and offset <= self.labels_offset

    @property
    def risk(self) -> float:
        """Importance-weighted running 0-d-1 risk (NaN before the first label)."""
        return self.iw_loss / self.iw_weight if self.iw_weight > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe form, format header first."""
        out: dict[str, Any] = {"format": MODEL_FORMAT, "format_version": MODEL_FORMAT_VERSION}
        out.update((f.name, _made(getattr(self, f.name))) for f in dataclasses.fields(self))
        if out["estimate"] is None:
            del out["estimate"]
        if not out["serving"]:
            del out["serving"]
        return out

    def served(self) -> ModelEnvelope:
        """What a scorer reads of this version (the models topic's record): the learner's
        state as :func:`service.learning.serving_state` leaves it (no challengers, nothing
        remembered, no normaliser sums), marked ``serving``; it decides as this one does."""
        if self.serving:
            return self
        return dataclasses.replace(self, learner=serving_state(_made(self.learner)), serving=True)

    def to_json(self) -> bytes:
        """Encoded; raises :class:`~service.records.codec.RecordError` if any number in it is
        not finite, or a learned one is beyond :data:`MAX_MAGNITUDE` (a model that cannot be
        stored, or could not score, is never published)."""
        encoded = encode_finite(self.to_dict())
        if _out_of_bounds(self, encoded):
            raise RecordError(
                f"model state holds a learned number of magnitude >= {MAX_MAGNITUDE:g}"
            )
        return encoded

    def to_bytes(self) -> bytes:
        """The record a learner writes: :meth:`to_dict` in the packed form
        (:mod:`service.records.packed`: the arrays as raw doubles; compressed when large),
        with the checks of :meth:`to_json`."""
        encoded = pack(self.to_dict(), bound=MAX_MAGNITUDE)
        if _out_of_bounds(self, header_of(encoded)):
            raise RecordError(
                f"model state holds a learned number of magnitude >= {MAX_MAGNITUDE:g}"
            )
        return squeeze(encoded)

    def check(self, *, limits: Limits | None = None) -> tuple[bytes | None, bytes | None]:
        """Raise what :meth:`to_bytes` raises, without encoding: what a learner checks of
        each version it makes, writing only some (a group's newest). With ``limits``, a
        version whose state, or whose :meth:`served` record, may not fit in its limit
        (:func:`~service.records.packed.checked`) is encoded, and :class:`TooLarge` raised
        if it does not: the records encoded (the bytes they were measured by) are returned,
        ``(state, served)``, None for one that was not."""
        big, most = checked(self.to_dict(), bound=MAX_MAGNITUDE)
        if big and any(_beyond(part) for part in (self.pipeline, self.learner, self.estimate)):
            raise RecordError(
                f"model state holds a learned number of magnitude >= {MAX_MAGNITUDE:g}"
            )
        if limits is None:
            return None, None
        encoded = served = None
        if most > limits.state:
            encoded = self.to_bytes()
            if len(encoded) > limits.state:
                raise TooLarge(len(encoded), limits.state)
        if most > limits.served:  # what a scorer reads is a part of it
            reading = self.served()
            if checked(reading.to_dict(), bound=MAX_MAGNITUDE)[1] > limits.served:
                served = reading.to_bytes()
                if len(served) > limits.served:
                    raise TooLarge(len(served), limits.served, served=True)
        return encoded, served

    def encode(self, limits: Limits) -> tuple[bytes, bytes]:
        """Both records, ``(state, served)``, encoded with :meth:`to_bytes`'s checks and
        :class:`TooLarge` raised for one past its limit (what :meth:`check` spares a
        version that surely fits)."""
        encoded = self.to_bytes()
        if len(encoded) > limits.state:
            raise TooLarge(len(encoded), limits.state)
        served = self.served().to_bytes()
        if len(served) > limits.served:
            raise TooLarge(len(served), limits.served, served=True)
        return encoded, served

    def replace(self, **changes: Any) -> ModelEnvelope:
        """A copy with ``changes`` (the record itself never changes)."""
        return dataclasses.replace(self, **changes)

    @property
    def deferred(self) -> tuple[Deferred, ...]:
        """Its states not made yet (:class:`Deferred`; none in a version read or checked)."""
        parts = (self.pipeline, self.learner)
        return tuple(p for p in parts if isinstance(p, Deferred) and not p.made)

    def make_states(self) -> None:
        """Make its :attr:`deferred` states now (before their objects move on)."""
        for part in self.deferred:
            part.make()


def parse_model_envelope(raw: bytes, *, model: str, max_bytes: int | None = None) -> ModelEnvelope:
    """Check and decode a model state read from a table or the models topic; ``model`` is
    the name it is stored under (a record naming another model is refused)."""
    packed = is_packed(raw)
    if packed:  # every number in it below the bound, or refused (unpack)
        record = unpack(raw, max_bytes=max_bytes, bound=MAX_MAGNITUDE)
    else:
        record = decode_object(raw, max_bytes=max_bytes)
    if record.get("format") != MODEL_FORMAT:
        raise BadMessage("schema", f"model state for {model!r} has an unknown format")
    if record.get("format_version") != MODEL_FORMAT_VERSION:
        raise BadMessage(
            "schema",
            f"model state for {model!r} has format_version {record.get('format_version')!r}; "
            f"this worker reads {MODEL_FORMAT_VERSION}: upgrade the worker",
        )
    if ident(record, "model") != model:
        raise BadMessage("schema", f"model state stored as {model!r} names another model")
    envelope = ModelEnvelope(
        model=model,
        version=integer(record, "version"),
        pipeline=_mapping(record, "pipeline"),
        learner=_mapping(record, "learner"),
        labels_offset=integer(record, "labels_offset"),
        labels_applied=integer(record, "labels_applied"),
        iw_loss=number(record, "iw_loss"),
        iw_weight=number(record, "iw_weight"),
        updated_at=number(record, "updated_at"),
        labels_partition=integer(record, "labels_partition")
        if "labels_partition" in record
        else -1,
        estimate=_mapping(record, "estimate") if record.get("estimate") is not None else None,
        corrections_from=integer(record, "corrections_from")
        if record.get("corrections_from") is not None
        else -1,
        corrected_to=integer(record, "corrected_to")
        if record.get("corrected_to") is not None
        else -1,
        line_from=integer(record, "line_from") if record.get("line_from") is not None else 0,
        serving=_flag(record, "serving"),
    )
    counters = (
        envelope.version,
        envelope.labels_applied,
        envelope.labels_offset + 1,
        envelope.labels_partition + 1,
        envelope.corrections_from + 1,
        envelope.corrected_to + 1,
        envelope.line_from,
    )
    if not all(0 <= c < MAX_COUNTER for c in counters):
        raise BadMessage("schema", f"model state for {model!r} has a counter out of range")
    if envelope.iw_loss < 0 or envelope.iw_weight < 0:
        raise BadMessage("schema", f"model state for {model!r} has a negative risk sum")
    if not packed and _out_of_bounds(envelope, _learned_bytes(envelope)):
        raise BadMessage(
            "schema",
            f"model state for {model!r} holds a learned number of magnitude >= {MAX_MAGNITUDE:g}",
        )
    return envelope


def _flag(record: dict[str, Any], name: str) -> bool:
    """An optional ``true`` (absent: false)."""
    value = record.get(name, False)
    if not isinstance(value, bool):
        raise BadMessage("schema", f"field {name!r} must be true or false")
    return value


def _learned_bytes(envelope: ModelEnvelope) -> bytes:
    """The learned parts of an envelope read from elsewhere, as orjson writes them (numbers
    in its shortest form, whatever form the input had)."""
    return dumps([envelope.pipeline, envelope.learner, envelope.estimate])


def _mapping(record: dict[str, Any], name: str) -> dict[str, Any]:
    value = field(record, name)
    if not isinstance(value, dict):
        raise BadMessage("schema", f"field {name!r} must be an object")
    return value


@dataclass(frozen=True, slots=True)
class PendingEntry:
    """A label request the learner holds until it is answered or expires.

    ``partition`` is the label-requests partition it came from (expiry sweeps go partition by
    partition). Once a label is applied the entry stays, marked, until it expires: a second
    answer is then recognised (``already_applied``), and after a crash between the mark and
    the model write the same label is redone once (``applied_version``)."""

    request: LabelRequest
    partition: int
    applied: bool = False
    label: int | None = None
    labelled_by: str = ""
    applied_at: float | None = None
    applied_offset: int | None = None
    applied_version: int | None = None
    # the version each shadow of the model reaches with this label (the mark of its write,
    # as ``applied_version`` is the champion's); empty before any shadow learned from it
    shadow_versions: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # where the request was read on the label-requests topic (its dead letter names it, if
    # its moments are refused); None: entries written before it was kept
    request_offset: int | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def model(self) -> str:
        return self.request.model

    def answered(
        self,
        label: Label,
        *,
        offset: int,
        version: int,
        now: float,
        shadow_versions: Mapping[str, int] | None = None,
    ) -> PendingEntry:
        """This entry with ``label`` applied at labels ``offset``, giving model ``version``
        (and each shadow the version in ``shadow_versions``)."""
        return dataclasses.replace(
            self,
            applied=True,
            label=label.label,
            labelled_by=label.labelled_by,
            applied_at=now,
            applied_offset=offset,
            applied_version=version,
            shadow_versions=dict(shadow_versions or {}),
        )

    def to_json(self) -> bytes:
        """Encoded :meth:`to_dict`."""
        return dumps(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The request's fields, flat, plus the entry's own (the answer's when applied)."""
        out = self.request.to_dict()
        out.update(partition=self.partition, applied=self.applied)
        if self.request_offset is not None:
            out["request_offset"] = self.request_offset
        if self.applied:
            out.update(
                label=self.label,
                labelled_by=self.labelled_by,
                applied_at=self.applied_at,
                applied_offset=self.applied_offset,
                applied_version=self.applied_version,
            )
            if self.shadow_versions:
                out["shadow_versions"] = dict(self.shadow_versions)
        return out


def parse_pending_entry(raw: bytes) -> PendingEntry:
    """Check and decode a ``pending`` table value."""
    record = decode_object(raw)
    entry = PendingEntry(label_request_from_dict(record), integer(record, "partition"))
    if record.get("request_offset") is not None:
        entry = dataclasses.replace(entry, request_offset=integer(record, "request_offset"))
    applied = field(record, "applied")
    if not isinstance(applied, bool):
        raise BadMessage("schema", "field 'applied' must be true or false")
    if not applied:
        return entry
    label = integer(record, "label")
    if label not in (1, -1):
        raise BadMessage("bad_label", f"applied label must be 1 or -1, got {label}")
    by = record.get("labelled_by", "")
    if not isinstance(by, str):
        raise BadMessage("schema", "field 'labelled_by' must be a string")
    return dataclasses.replace(
        entry,
        applied=True,
        label=label,
        labelled_by=text(by, "field 'labelled_by'"),
        applied_at=number(record, "applied_at"),
        applied_offset=integer(record, "applied_offset"),
        applied_version=integer(record, "applied_version"),
        shadow_versions=_versions(record),
    )


def _versions(record: dict[str, Any]) -> dict[str, int]:
    """The optional ``shadow_versions`` map of an applied pending entry."""
    value = record.get("shadow_versions")
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > 64:
        raise BadMessage("schema", "field 'shadow_versions' must be an object of at most 64")
    out = {text(k, "a shadow model name"): integer(value, k) for k in value}
    if not all(0 <= v < MAX_COUNTER for v in out.values()):
        raise BadMessage("schema", "a shadow version is out of range")
    return out


@dataclass(frozen=True, slots=True)
class ParkedLabel:
    """A label consumed before its request (labels and requests travel on two topics, so a
    fast answer can overtake its request). Kept, with its own offset and bytes, until the
    request arrives or the wait runs out (then it is dead-lettered as ``unknown_request``)."""

    label: Label
    offset: int
    partition: int
    parked_at: float
    raw: bytes = b""  # the label as consumed, for its dead letter
    label_ts: float | None = None  # the label record's Kafka timestamp (None: unknown)

    def to_json(self) -> bytes:
        """The label's fields, flat, plus where it was consumed and when it was parked."""
        return dumps(
            {
                "request_id": self.label.request_id,
                "model": self.label.model,
                "label": self.label.label,
                "labelled_by": self.label.labelled_by,
                "ts": self.label.ts,
                "offset": self.offset,
                "partition": self.partition,
                "parked_at": self.parked_at,
                "raw": self.raw.decode("utf-8", errors="replace"),
                "label_ts": self.label_ts,
            }
        )


def parse_parked_label(raw: bytes) -> ParkedLabel:
    """Check and decode a parked-table value."""
    record = decode_object(raw)
    body = record.get("raw", "")
    if not isinstance(body, str):
        raise BadMessage("schema", "field 'raw' must be a string")
    return ParkedLabel(
        label=label_from_dict(record),
        offset=integer(record, "offset"),
        partition=integer(record, "partition"),
        parked_at=number(record, "parked_at"),
        raw=body.encode("utf-8", errors="replace"),
        label_ts=number(record, "label_ts") if record.get("label_ts") is not None else None,
    )
