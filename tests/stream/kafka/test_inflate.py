"""Decompression with a bound: the same bytes as the client's own decoders below the bound, a
refusal above it that takes no more memory than the bound, and the bound installed where
aiokafka inflates a batch (pure Python and C extension alike)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import aiokafka.codec as kafka
import cramjam
import pytest
from aiokafka.record import default_records, legacy_records

from service.config import ConfigError, Settings
from service.stream.errors import InflateRefused
from service.stream.kafka import inflate, internals
from service.stream.kafka.clients import consumer_options

CODECS = {
    "gzip": (kafka.gzip_encode, kafka.gzip_decode, inflate.gzip_decode),
    "snappy": (kafka.snappy_encode, kafka.snappy_decode, inflate.snappy_decode),
    "snappy-raw": (
        lambda data: kafka.snappy_encode(data, xerial_compatible=False),
        kafka.snappy_decode,
        inflate.snappy_decode,
    ),
    "lz4": (kafka.lz4_encode, kafka.lz4_decode, inflate.lz4_decode),
    "zstd": (kafka.zstd_encode, kafka.zstd_decode, inflate.zstd_decode),
}
#: events as a producer writes them: 300 KB that compress about tenfold
PAYLOAD = b"".join(
    json.dumps({"id": f"e{i}", "model": "m", "features": [i % 7, 1.0, -0.5]}).encode()
    for i in range(6000)
)
ATTR = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.fixture
def restored() -> Iterator[None]:
    """The client's own decoders back after the test."""
    saved = {
        (m, n): getattr(importlib.import_module(m), n)
        for m, names in internals._DECODING_MODULES.items()
        for n in names
    }
    yield
    for (m, n), decode in saved.items():
        setattr(importlib.import_module(m), n, decode)


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_below_the_bound_a_batch_inflates_to_what_the_client_makes_of_it(codec: str) -> None:
    encode, theirs, ours = CODECS[codec]
    data = encode(PAYLOAD)
    assert ours(data, len(PAYLOAD)) == theirs(data) == PAYLOAD
    assert ours(memoryview(data), len(PAYLOAD)) == PAYLOAD


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_one_byte_past_the_bound_is_refused(codec: str) -> None:
    encode, _, ours = CODECS[codec]
    with pytest.raises(InflateRefused, match="inflates beyond"):
        ours(encode(PAYLOAD), len(PAYLOAD) - 1)


@pytest.mark.parametrize("codec", ["zstd", "lz4", "gzip"])
def test_broken_data_is_an_error_of_the_data_not_a_refusal(codec: str) -> None:
    encode, _, ours = CODECS[codec]
    data = encode(PAYLOAD)
    broken = data[: len(data) // 2]
    with pytest.raises((cramjam.DecompressionError, EOFError)):
        ours(broken, 10 * len(PAYLOAD))


BOMB = """
import resource, sys, cramjam
from service.stream.errors import InflateRefused
from service.stream.kafka import inflate
codec = sys.argv[1]
compressor = cramjam.{codec}.Compressor()
zeros = bytes(1 << 24)
for _ in range(32):  # 512 MiB of zeros, never held whole
    compressor.compress(zeros)
data = bytes(compressor.finish())
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize() // 1024
before, rest = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resident()
try:
    getattr(inflate, codec + "_decode")(data, 64 << 20)
except InflateRefused:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(len(data), before, peak, rest, resident())
"""


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_bomb_is_refused_within_the_bound_of_memory(codec: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BOMB.replace("{codec}", codec), codec],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    size, before_kib, peak_kib, rest_kib, after_kib = (int(x) for x in done.stdout.split())
    assert size < 4_000_000  # 512 MiB inflated: the client's own decoder holds it twice
    assert peak_kib - before_kib < 80 * 1024  # the 64 MiB bound, plus the pages around it
    assert after_kib - rest_kib < 8 * 1024  # and the room's pages are given back


@pytest.mark.parametrize("codec", sorted(ATTR))
@pytest.mark.parametrize("batch_class", ["c", "python"])
def test_installed_every_batch_the_client_reads_is_bounded(
    restored: None, codec: str, batch_class: str
) -> None:
    c_builder = default_records.DefaultRecordBatchBuilder
    builder = c_builder(
        magic=2,
        compression_type=ATTR[codec],
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=10_000_000,
    )
    for i in range(3):
        builder.append(i, timestamp=None, key=None, value=PAYLOAD, headers=[])
    raw = bytes(builder.build())
    batch_type: Any = (
        default_records.DefaultRecordBatch
        if batch_class == "c"
        else default_records._DefaultRecordBatchPy
    )
    internals.bound_inflation(4 * len(PAYLOAD))
    assert [r.value for r in batch_type(bytearray(raw))] == [PAYLOAD] * 3
    internals.bound_inflation(2 * len(PAYLOAD))
    assert internals.inflation_bound() == 2 * len(PAYLOAD)
    with pytest.raises(InflateRefused):
        list(batch_type(bytearray(raw)))


def test_installed_legacy_batches_are_bounded_too(restored: None) -> None:
    builder = legacy_records.LegacyRecordBatchBuilder(
        magic=1, compression_type=1, batch_size=10_000_000
    )
    builder.append(0, timestamp=None, key=None, value=PAYLOAD)
    raw = bytes(builder.build())
    internals.bound_inflation(len(PAYLOAD) // 2)
    for batch_type in (legacy_records.LegacyRecordBatch, legacy_records._LegacyRecordBatchPy):
        with pytest.raises(InflateRefused):
            list(batch_type(bytearray(raw), 1))


def test_every_consumer_of_the_settings_installs_their_bound(restored: None) -> None:
    consumer_options(Settings(max_inflated_bytes=5_000_000))
    assert internals.inflation_bound() == 5_000_000


def test_the_bound_is_never_below_what_a_fetch_carries() -> None:
    with pytest.raises((ConfigError, ValueError), match="max_inflated_bytes"):
        Settings(max_message_bytes=4_000_000, max_inflated_bytes=4_000_000)
    assert Settings(max_message_bytes=4_000_000, max_inflated_bytes=8_000_000)
