"""A decompression bomb: one record batch of a few tens of KB on the wire that inflates to
gigabytes of zeros under zstd, built without ever holding it inflated, and written to a
partition as it is (a raw produce request: no client would compress it for us)."""

from __future__ import annotations

import asyncio
import functools
import struct
import time

import cramjam
from aiokafka import TopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.record.util import calc_crc32c, encode_varint

__all__ = ["GIB", "write_batch", "zstd_bomb"]

GIB = 1 << 30
_ZSTD = 4  # the batch attributes' codec bits
_CHUNK = bytes(1 << 24)


def _varint(value: int) -> bytes:
    out = bytearray()
    encode_varint(value, out.append)
    return bytes(out)


@functools.cache
def zstd_bomb(value_bytes: int) -> bytes:
    """A v2 record batch at offset 0 holding one record whose value is ``value_bytes`` zeros,
    zstd-compressed (streamed: memory stays at the compressed size)."""
    # the record, but for its value: attributes, timestamp delta, offset delta, a null key,
    # the value's length; after the value, no headers
    head = b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(value_bytes)
    tail = _varint(0)
    body_length = len(head) + value_bytes + len(tail)
    compressor = cramjam.zstd.Compressor(level=3)
    compressor.compress(_varint(body_length) + head)
    left = value_bytes
    while left > 0:
        step = min(left, len(_CHUNK))
        compressor.compress(_CHUNK[:step])
        left -= step
    compressor.compress(tail)
    records = bytes(compressor.finish())
    now = int(time.time() * 1000)
    # from the attributes on: what the CRC covers
    after_crc = struct.pack(">hiqqqhii", _ZSTD, 0, now, now, -1, -1, -1, 1) + records
    crc = calc_crc32c(after_crc)
    # base offset, length (of what follows it), partition leader epoch, magic, CRC
    length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", 0, length, -1, 2, crc) + after_crc


def write_batch(bootstrap: str, tp: TopicPartition, batch: bytes) -> None:
    """Append ``batch`` to ``tp`` as it is (acks=all); an assertion error if the broker
    refuses it."""

    async def run() -> None:
        client = AIOKafkaClient(bootstrap_servers=bootstrap)
        await client.bootstrap()
        try:
            for _ in range(50):  # the partition's leader, once the metadata knows it
                await client.force_metadata_update()
                leader = client.cluster.leader_for_partition(tp)
                if leader is not None and leader >= 0:
                    break
                await asyncio.sleep(0.2)
            else:
                raise AssertionError(f"no leader for {tp}")
            request = ProduceRequest(
                transactional_id=None,
                required_acks=-1,
                timeout=30_000,
                topics=[(tp.topic, [(tp.partition, batch)])],
            )
            response = await client.send(leader, request)
            ((_, partitions),) = response.topics
            error_code = partitions[0][1]
            assert error_code == 0, f"the broker refused the batch: error {error_code}"
        finally:
            await client.close()

    asyncio.run(run())
