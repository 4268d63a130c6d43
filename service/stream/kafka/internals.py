"""Every use of faust-streaming internals, in one place.

faust runs the worker (its lifecycle, the web server, the timer and the app tasks); the
worker's inputs are read by its own aiokafka consumers (:mod:`service.stream.scoring.loop`,
:mod:`service.stream.labels.loop`), so no faust consumer, stream or table internals are used
any more. When faust is upgraded, this module is what to read again: each access below
names the version it was written against and why it is needed.

- ``Worker._setup_spinner_handler``'s side effect on the root logger: :class:`Worker`.

aiokafka 0.14.0 (pinned exactly, with its codecs) is used through its public API, but for one
reading, where a failed ``getmany`` failed (:func:`failed_fetch`), and one replacement: the
decoders it inflates a compressed batch with (:func:`bound_inflation`).
"""

from __future__ import annotations

import functools
import gc
import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import faust
from aiokafka import TopicPartition

from service.stream.kafka import inflate

__all__ = [
    "App",
    "FailedFetch",
    "Worker",
    "bound_inflation",
    "failed_fetch",
    "inflation_bound",
]

#: the modules of aiokafka 0.14.0 that inflate a record batch, each with the decoders it
#: imported from ``aiokafka.codec`` under its own names (the C extension's ``_crecords``
#: modules look those names up in their module globals at every call, as the pure-Python
#: ones do)
_DECODING_MODULES = {
    "aiokafka.codec": ("gzip_decode", "snappy_decode", "lz4_decode", "zstd_decode"),
    "aiokafka.record.default_records": (
        "gzip_decode",
        "snappy_decode",
        "lz4_decode",
        "zstd_decode",
    ),
    "aiokafka.record.legacy_records": ("gzip_decode", "snappy_decode", "lz4_decode"),
    "aiokafka.record._crecords.default_records": (
        "gzip_decode",
        "snappy_decode",
        "lz4_decode",
        "zstd_decode",
    ),
    "aiokafka.record._crecords.legacy_records": ("gzip_decode", "snappy_decode", "lz4_decode"),
}


class App(faust.App):
    """The faust app of a worker: carries its parts (set by
    :func:`service.stream.app.create_app`)."""

    parts: Any = None  # service.stream.app.Parts


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
        # what start-up made (modules, faust's services, aiokafka's clients: ~90,000 objects)
        # lives as long as the process: out of the collector's sight, a full collection no
        # longer walks it (measured ~50 ms each, a stall of every event in flight)
        gc.collect()
        gc.freeze()


@dataclass(frozen=True, slots=True)
class FailedFetch:
    """Where a ``getmany`` that raised met a record batch it could not read.

    ``tp``: the partition; ``first``: the first offset of it not read (a batch is read in one
    piece: the batch's first offset, or the one after the last record of it that was read);
    ``end``: the offset after the batch; ``drained``: the records of other partitions the
    call had already taken off the consumer (their positions moved on: they would be lost)."""

    tp: TopicPartition
    first: int
    end: int
    drained: Mapping[TopicPartition, list[Any]] = field(default_factory=dict)


def failed_fetch(exc: BaseException) -> FailedFetch | None:
    """Where ``exc``, raised by ``AIOKafkaConsumer.getmany``, met the batch it could not read
    (a codec that is not installed, a CRC that fails, a record that does not parse); None
    when it did not come from reading a batch (a broker error).

    aiokafka 0.14.0 reads a fetched batch in ``PartitionRecords._unpack_records`` (a
    generator: locals ``tp``, ``next_batch`` and ``self.next_fetch_offset``, the offset after
    the last record it gave out) for ``Fetcher.fetched_records``, whose local ``drained``
    holds what the call took from other partitions. The error leaves the position of ``tp``
    where it was and drops ``drained``: the next ``getmany`` fetches the same batch again and
    fails again, and the records in ``drained`` are never returned. Both are read off the
    traceback here (nothing is changed); ``tests/stream/kafka/test_internals.py`` fails if
    an upgrade moves them.

    >>> failed_fetch(ValueError("not from a fetch")) is None
    True
    """
    batch: FailedFetch | None = None
    drained: Mapping[TopicPartition, list[Any]] = {}
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        names = frame.f_locals
        if frame.f_code.co_name == "fetched_records" and isinstance(names.get("drained"), dict):
            drained = dict(names["drained"])
        elif frame.f_code.co_name == "_unpack_records" and "next_batch" in names:
            read = names["self"]
            found = names["next_batch"]
            first = max(int(read.next_fetch_offset), int(found.base_offset))
            end = max(int(found.next_offset), first + 1)
            batch = FailedFetch(names["tp"], first, end)
        tb = tb.tb_next
    if batch is None:
        return None
    return FailedFetch(batch.tp, batch.first, batch.end, drained)


def bound_inflation(limit: int) -> None:
    """Make every record batch this process reads inflate within ``limit`` bytes, or fail to
    read (:class:`~service.stream.errors.InflateRefused`), as a batch that does not decode
    does: :func:`failed_fetch` finds it and the reader stops at it or skips it.

    aiokafka 0.14.0 inflates a compressed batch whole (``DefaultRecordBatch._maybe_uncompress``
    and ``LegacyRecordBatch._decompress``, pure Python or the ``_crecords`` C extension) with
    the ``*_decode`` functions of ``aiokafka.codec`` (cramjam, gzip), which have no bound: a
    58 KB zstd batch of zeros takes 1.9 GB before a record of it is read. Those names are
    replaced, in every module that holds them (:data:`_DECODING_MODULES`), by the decoders of
    :mod:`service.stream.kafka.inflate` bound to ``limit``: for every consumer of the
    process (the worker's loops, faust's, the desk's, ``abstain skip``). Installed again with
    another limit, the last one holds. A name aiokafka no longer holds is an error here
    (``tests/stream/kafka/test_inflate.py`` reads every one back); the C extension's modules
    may be missing (a platform without its wheel reads with the pure-Python ones).
    """
    for module_name, names in _DECODING_MODULES.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            if "._crecords." in module_name:
                continue
            raise
        for name in names:
            if not callable(getattr(module, name, None)):
                raise RuntimeError(f"aiokafka: {module_name}.{name} is gone; see bound_inflation")
            setattr(module, name, functools.partial(inflate.DECODERS[name], limit=limit))


def inflation_bound() -> int | None:
    """The bound :func:`bound_inflation` installed (None: aiokafka's own decoders)."""
    import aiokafka.codec  # noqa: PLC0415

    decode = aiokafka.codec.zstd_decode
    if isinstance(decode, functools.partial):
        return int(decode.keywords["limit"])
    return None
