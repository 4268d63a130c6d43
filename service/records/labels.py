"""Everything the labels topic carries (key = the model's group, the champion's name) and its
one parser, :func:`parse_labels_record`:

- a :class:`~service.records.wire.Label`: a person's answer to a label request;
- a :class:`Correction` (``"kind": "correction"``): a later answer that supersedes the
  label a request received, by its author or a reviewer; ``label: null`` withdraws it
  (undo). The learner makes the model what it would be had the corrected label been the one
  given (docs/learn/corrections.md);
- an :class:`Opinion` (``"kind": "opinion"``): a second person's answer to a request already
  answered, for agreement and review; it teaches no model;
- a :class:`Rollback` order (``"kind": "rollback"``, ``abstain models rollback``) and a
  :class:`Seed` order (``"kind": "seed"``, ``abstain models seed``).

Orders and corrections are signed like snapshots when ``snapshot_key`` is set (the HMAC
header of :mod:`service.records.signing` over the record's key and value): whoever reads
them checks the signature. What the signature covers also tells a copy from a new record:
a correction carries a unique ``id`` (one read without it, written before it existed, is
known by the digest of its bytes), an order the version of its target it was written
against (``base_version``), so a record written again later is refused as ``replayed``.

>>> c = Correction("r1", "fraud", None, "alice", "author", 5.0, id="c1")
>>> parse_labels_record(c.to_json()) == c, c.withdraws
(True, True)
>>> old = parse_labels_record(b'{"kind": "correction", "request_id": "r", "model": "m", '
...                           b'"label": 1, "labelled_by": "bob", "role": "author"}')
>>> old.id
'sha256:c68ff3c6ebd4fd4103baed64f647af9d'

>>> parse_labels_record(b'{"kind": "correction", "request_id": "r", "model": "m", '
...                     b'"label": 1, "labelled_by": "bob", "role": "boss"}')
Traceback (most recent call last):
...
service.records.codec.BadMessage: schema: role must be 'author' or 'reviewer', got 'boss'
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Final, Literal

from service.records.codec import (
    BadMessage,
    decode_json,
    dumps,
    field,
    ident,
    integer,
    number,
    obj,
    text,
)
from service.records.wire import Label, label_from_dict

__all__ = [
    "ROLES",
    "Correction",
    "LabelsRecord",
    "Opinion",
    "Role",
    "Rollback",
    "Seed",
    "new_id",
    "parse_labels_record",
]

Role = Literal["author", "reviewer"]
#: who may write a correction: the person who gave the label (``author``), or a reviewer
ROLES: Final[tuple[Role, ...]] = ("author", "reviewer")
#: what an ``id`` may look like: a writer's fresh random id, or a digest of the bytes
_ID: Final = re.compile(r"[A-Za-z0-9:_-]{1,80}")


def new_id() -> str:
    """A fresh random id for a record (128 random bits, hex)."""
    return uuid.uuid4().hex


def _digest_id(raw: bytes) -> str:
    """The id of a record written before records carried one: a digest of its bytes (a
    copy has the same bytes, hence the same id)."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Rollback:
    """An order on the labels topic (key = the group's model, like its labels): serve
    ``target``'s ``to_version`` again, as a new version (``abstain models rollback``)."""

    model: str  # the group's name (the key), as a label's
    target: str  # the member rolled back
    to_version: int
    by: str
    ts: float | None
    #: the version of ``target`` served when the order was written (None: an order written
    #: before orders carried it); a copy written after the model's line changed is refused
    base_version: int | None = None

    def to_json(self) -> bytes:
        """The record on the labels topic."""
        return dumps(
            {
                "kind": "rollback",
                "model": self.model,
                "target": self.target,
                "to_version": self.to_version,
                "labelled_by": self.by,
                "ts": self.ts,
                **_base(self.base_version),
            }
        )


@dataclass(frozen=True, slots=True)
class Seed:
    """An order on the labels topic (key = the group's model, like its labels): serve the
    model state ``envelope`` (the exact bytes ``abstain models seed`` published on the
    models topic, with their ``signature`` there when ``snapshot_key`` is set) as
    ``target``'s next version, and learn on from it. The envelope is checked by whoever
    reads the order (the learner, ``abstain rebuild``), like a snapshot."""

    model: str  # the group's name (the key), as a label's
    target: str  # the member seeded
    envelope: bytes  # a ModelEnvelope's JSON
    signature: str | None
    by: str
    ts: float | None
    rows: int = 0  # the labelled rows it was trained on
    #: the version of ``target`` served when the order was written (None: an order written
    #: before orders carried it); a copy written after the model's line changed is refused
    base_version: int | None = None

    def to_json(self) -> bytes:
        """The record on the labels topic."""
        return dumps(
            {
                "kind": "seed",
                "model": self.model,
                "target": self.target,
                "envelope": self.envelope.decode("utf-8"),
                "signature": self.signature,
                "rows": self.rows,
                "labelled_by": self.by,
                "ts": self.ts,
                **_base(self.base_version),
            }
        )


@dataclass(frozen=True, slots=True)
class Correction:
    """A later answer to request ``request_id`` of ``model`` that supersedes the label it
    received: ``label`` +1 / -1 replaces it, ``None`` withdraws it (the model becomes what
    it would be had the request never been answered; the request is not offered again, and
    a later correction with a value gives the label back at its place). ``by`` gave it as
    the ``role``: ``author`` (the person who gave the label being corrected) or
    ``reviewer``. ``id`` names this correction (a fresh random id by default): the
    learner applies a correction of a given id once, and refuses a copy as ``replayed``."""

    request_id: str
    model: str
    label: int | None
    by: str
    role: Role
    ts: float | None
    id: str = dataclass_field(default_factory=new_id)

    @property
    def withdraws(self) -> bool:
        """True for an undo: the label is withdrawn, not replaced."""
        return self.label is None

    def to_json(self) -> bytes:
        """The record on the labels topic."""
        return dumps(
            {
                "kind": "correction",
                "id": self.id,
                "request_id": self.request_id,
                "model": self.model,
                "label": self.label,
                "labelled_by": self.by,
                "role": self.role,
                "ts": self.ts,
            }
        )


@dataclass(frozen=True, slots=True)
class Opinion:
    """A second person's answer ``label`` to request ``request_id`` of ``model``, already
    answered by someone else (the label desk asks for it). It teaches no model: it is
    compared with the label, and a disagreement goes to a reviewer."""

    request_id: str
    model: str
    label: int
    by: str
    ts: float | None

    def to_json(self) -> bytes:
        """The record on the labels topic."""
        return dumps(
            {
                "kind": "opinion",
                "request_id": self.request_id,
                "model": self.model,
                "label": self.label,
                "labelled_by": self.by,
                "ts": self.ts,
            }
        )


#: what :func:`parse_labels_record` returns
LabelsRecord = Label | Correction | Opinion | Rollback | Seed


def _base(version: int | None) -> dict[str, int]:
    return {} if version is None else {"base_version": version}


def _base_version(record: dict[str, Any]) -> int | None:
    if record.get("base_version") is None:
        return None
    version = integer(record, "base_version")
    if not 0 <= version < 2**53:
        raise BadMessage("schema", f"base_version out of range: {version}")
    return version


def _record_id(record: dict[str, Any], raw: bytes) -> str:
    """The record's ``id``, or the digest of its bytes when it has none."""
    value = record.get("id")
    if value is None:
        return _digest_id(raw)
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        raise BadMessage("schema", "field 'id' must be 1 to 80 letters, digits, ':', '_' or '-'")
    return value


def _by_and_ts(record: dict[str, Any]) -> tuple[str, float | None]:
    by = record.get("labelled_by", "")
    if not isinstance(by, str) or len(by) > 256:
        raise BadMessage("schema", "field 'labelled_by' must be a short string")
    ts = number(record, "ts") if record.get("ts") is not None else None
    return text(by, "field 'labelled_by'"), ts


def _answer(record: dict[str, Any], *, allow_none: bool) -> int | None:
    """The ``label`` field: +1 or -1 (``None`` too when ``allow_none``)."""
    value = field(record, "label")
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value not in (1, -1):
        wanted = "1, -1 or null" if allow_none else "1 or -1"
        raise BadMessage("bad_label", f"label must be {wanted}, got {value!r}")
    return value


def _named(record: dict[str, Any]) -> str:
    """The person a correction or an opinion is by: a name is required."""
    by, _ = _by_and_ts(record)
    if not by.strip():
        raise BadMessage("schema", "field 'labelled_by' must name the person")
    return by


def _correction_from_dict(record: dict[str, Any], raw: bytes) -> Correction:
    role = record.get("role")
    if role not in ROLES:
        raise BadMessage("schema", f"role must be 'author' or 'reviewer', got {role!r}")
    _, ts = _by_and_ts(record)
    return Correction(
        ident(record, "request_id"),
        ident(record, "model"),
        _answer(record, allow_none=True),
        _named(record),
        role,
        ts,
        id=_record_id(record, raw),
    )


def _opinion_from_dict(record: dict[str, Any], raw: bytes) -> Opinion:
    label = _answer(record, allow_none=False)
    assert label is not None  # noqa: S101 - allow_none=False
    _, ts = _by_and_ts(record)
    return Opinion(ident(record, "request_id"), ident(record, "model"), label, _named(record), ts)


def _seed_from_dict(record: dict[str, Any], raw: bytes) -> Seed:
    envelope = record.get("envelope")
    if not isinstance(envelope, str) or not envelope:
        raise BadMessage("schema", "field 'envelope' must be a model state (a JSON string)")
    signature = record.get("signature")
    if signature is not None and (not isinstance(signature, str) or len(signature) > 256):
        raise BadMessage("schema", "field 'signature' must be a short string")
    rows = integer(record, "rows") if record.get("rows") is not None else 0
    if not 0 <= rows < 2**53:
        raise BadMessage("schema", f"rows out of range: {rows}")
    by, ts = _by_and_ts(record)
    return Seed(
        ident(record, "model"),
        ident(record, "target"),
        envelope.encode("utf-8"),
        signature,
        by,
        ts,
        rows,
        _base_version(record),
    )


def _rollback_from_dict(record: dict[str, Any], raw: bytes) -> Rollback:
    version = integer(record, "to_version")
    if not 0 <= version < 2**53:
        raise BadMessage("schema", f"to_version out of range: {version}")
    by, ts = _by_and_ts(record)
    return Rollback(
        ident(record, "model"), ident(record, "target"), version, by, ts, _base_version(record)
    )


def _label_from_dict(record: dict[str, Any], raw: bytes) -> Label:
    return label_from_dict(record)


def parse_labels_record(raw: bytes, *, max_bytes: int | None = None) -> LabelsRecord:
    """A record of the labels topic (module docstring); a record without ``kind`` is a
    label, an unknown ``kind`` is refused.

    >>> order = Seed("m", "m", b'{"model": "m"}', None, "cli", 1.0, rows=3)
    >>> parse_labels_record(order.to_json()) == order
    True
    >>> parse_labels_record(b'{"kind": "vote", "request_id": "r", "model": "m"}')
    Traceback (most recent call last):
    ...
    service.records.codec.BadMessage: schema: unknown kind 'vote' of a labels record
    """
    record = obj(decode_json(raw, max_bytes=max_bytes))
    kind = record.get("kind")
    if kind is None:
        return label_from_dict(record)
    parse = _PARSERS.get(kind) if isinstance(kind, str) else None
    if parse is None:
        raise BadMessage("schema", f"unknown kind {kind!r} of a labels record"[:300])
    return parse(record, raw)


_PARSERS: Final[dict[str, Callable[[dict[str, Any], bytes], LabelsRecord]]] = {
    "label": _label_from_dict,
    "correction": _correction_from_dict,
    "opinion": _opinion_from_dict,
    "seed": _seed_from_dict,
    "rollback": _rollback_from_dict,
}
