"""The skip order: an operator's leave to move a partition past a batch no worker can read.

A record batch can be impossible to read however often it is fetched (a codec the client
lacks, a CRC that fails, a record that does not parse). A worker that meets one in an input
it commits offsets of (features, label requests, labels) stops that partition there and says
so (``/healthz``, ``/readyz``, ``abstain_unreadable_partitions``): it never skips accepted
input on its own. ``abstain skip`` reads the batch again, writes its dead letter, then this
order, key :func:`skip_key` on the compacted models topic (which every worker follows; signed
like a snapshot when a key is set). A worker moves past a batch only when an order names that
batch exactly (topic, partition, first offset and end) and the worker fails to read it there
itself (whether it had stopped at it before the order came or meets it after), so an order
can never skip a record that can be read.

Skip order (JSON)::

    {"format": "abstain.skip", "format_version": 1, "topic": str, "partition": int,
     "first": int, "end": int, "detail": str, "by": str, "at": float}

``first``: the first offset that cannot be read; ``end``: the offset after the batch.

>>> order = SkipOrder("abstain.features", 3, first=120, end=123, detail="d", by="ops", at=1.0)
>>> skip_key(order.topic, order.partition, order.first)
'__skip__/abstain.features/3/120'
>>> parse_skip_order(order.to_json(), key=b"__skip__/abstain.features/3/120") == order
True
>>> parse_skip_order(order.to_json(), key=b"__skip__/abstain.features/3/121")
Traceback (most recent call last):
...
service.records.codec.BadMessage: bad_key: the skip order's key b'__skip__/abstain.features/3/121' is not '__skip__/abstain.features/3/120'
"""  # noqa: E501

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from service.records.codec import BadMessage, decode_versioned, dumps, integer, number

__all__ = ["SKIP_FORMAT", "SKIP_PREFIX", "SkipOrder", "is_skip_key", "parse_skip_order", "skip_key"]

#: the keys of skip orders on the models topic start so (no model may be named so)
SKIP_PREFIX: Final = "__skip__/"
SKIP_FORMAT: Final = "abstain.skip"
_VERSION: Final = 1
_TOPIC: Final = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
#: offsets are below this (Kafka's are signed 64-bit)
_MAX_OFFSET: Final = 2**63


def skip_key(topic: str, partition: int, first: int) -> str:
    """The models-topic key of the order that skips ``topic[partition]`` at ``first``."""
    return f"{SKIP_PREFIX}{topic}/{partition}/{first}"


def is_skip_key(key: bytes | None) -> bool:
    """True for the key of a skip order.

    >>> is_skip_key(b"__skip__/t/0/5"), is_skip_key(b"default"), is_skip_key(None)
    (True, False, False)
    """
    return key is not None and key.startswith(SKIP_PREFIX.encode())


@dataclass(frozen=True, slots=True)
class SkipOrder:
    """Move ``topic[partition]`` from ``first`` to ``end`` (the batch no worker can read)."""

    topic: str
    partition: int
    first: int
    end: int
    detail: str = ""
    by: str = ""
    at: float = 0.0

    @property
    def key(self) -> str:
        return skip_key(self.topic, self.partition, self.first)

    def to_json(self) -> bytes:
        return dumps(
            {
                "format": SKIP_FORMAT,
                "format_version": _VERSION,
                "topic": self.topic,
                "partition": self.partition,
                "first": self.first,
                "end": self.end,
                "detail": self.detail,
                "by": self.by,
                "at": self.at,
            }
        )


def parse_skip_order(raw: bytes, *, key: bytes | None, max_bytes: int | None = None) -> SkipOrder:
    """Check and decode a skip order read under ``key`` (which must name what it holds)."""
    record = decode_versioned(
        raw, fmt=SKIP_FORMAT, version=_VERSION, what="the skip order", max_bytes=max_bytes
    )
    topic = record.get("topic")
    if not isinstance(topic, str) or not _TOPIC.match(topic):
        raise BadMessage("schema", "the skip order's topic is not a topic name")
    partition, first, end = (integer(record, name) for name in ("partition", "first", "end"))
    if not 0 <= partition < 2**31 or not 0 <= first < end < _MAX_OFFSET:
        raise BadMessage("schema", "the skip order's partition or offsets are out of range")
    texts = {name: record.get(name, "") for name in ("detail", "by")}
    if not all(isinstance(v, str) and len(v) <= 2000 for v in texts.values()):
        raise BadMessage("schema", "the skip order's detail and by must be short strings")
    order = SkipOrder(
        topic,
        partition,
        first,
        end,
        texts["detail"],
        texts["by"],
        number(record, "at", default=0.0),
    )
    if key is None or key.decode("utf-8", "replace") != order.key:
        raise BadMessage("bad_key", f"the skip order's key {key!r:.300} is not {order.key!r}")
    return order
