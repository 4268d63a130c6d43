"""The champions record: which model of each group serves, on the models topic.

A group is a model that decides (its *route*: the name events and labels are addressed
to) with the models that name it ``champion`` (its shadows). By default the route itself
serves; ``abstain models promote NAME`` writes one record, key :data:`CHAMPIONS_KEY` on the
compacted models topic, that maps routes to the member that serves them instead. Every
worker's model book reads it like a snapshot (signed the same way when a key is set), and a
newer ``serial`` replaces the whole mapping: one record, one switch.

Champions record (JSON)::

    {"format": "abstain.champions", "format_version": 1, "serial": int,
     "servers": {route: serving model}, "updated_at": float}

>>> rec = Champions(serial=2, servers={"c": "s"}, updated_at=1.0)
>>> parse_champions(rec.to_json()) == rec, rec.server("c"), rec.server("x")
(True, 's', 'x')
>>> parse_champions(b'{"format": "abstain.champions", "format_version": 1, "serial": -1}')
Traceback (most recent call last):
...
service.records.codec.BadMessage: schema: the champions record's serial is out of range
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from service.records.codec import BadMessage, decode_versioned, dumps, ident, integer, number

__all__ = [
    "CHAMPIONS_FORMAT",
    "CHAMPIONS_KEY",
    "CHAMPIONS_MAX_SERIAL",
    "Champions",
    "parse_champions",
]

#: the key of the champions record on the models topic (no model may be named so)
CHAMPIONS_KEY: Final = "__champions__"
CHAMPIONS_FORMAT: Final = "abstain.champions"
_VERSION: Final = 1
#: every serial a reader takes is below this (a JSON number stays exact below it)
CHAMPIONS_MAX_SERIAL: Final = 2**53


@dataclass(frozen=True, slots=True)
class Champions:
    """Route -> serving model (a route missing from ``servers`` serves itself)."""

    serial: int = 0
    servers: Mapping[str, str] = field(default_factory=dict)
    updated_at: float = 0.0

    def server(self, route: str) -> str:
        """The model that decides the events addressed to ``route``."""
        return self.servers.get(route, route)

    def to_json(self) -> bytes:
        return dumps(
            {
                "format": CHAMPIONS_FORMAT,
                "format_version": _VERSION,
                "serial": self.serial,
                "servers": dict(self.servers),
                "updated_at": self.updated_at,
            }
        )


def parse_champions(raw: bytes, *, max_bytes: int | None = None) -> Champions:
    """Check and decode a champions record (its names are checked against the settings by
    the reader, which knows the groups)."""
    record = decode_versioned(
        raw,
        fmt=CHAMPIONS_FORMAT,
        version=_VERSION,
        what="the champions record",
        max_bytes=max_bytes,
    )
    serial = integer(record, "serial")
    if not 0 <= serial < CHAMPIONS_MAX_SERIAL:
        raise BadMessage("schema", "the champions record's serial is out of range")
    servers = record.get("servers")
    if not isinstance(servers, dict) or len(servers) > 10_000:
        raise BadMessage("schema", "field 'servers' must be an object")
    checked: dict[str, str] = {}
    for route in servers:
        checked[ident({"route": route}, "route")] = ident(servers, route)
    return Champions(serial, checked, number(record, "updated_at"))
