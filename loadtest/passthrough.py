"""The floor a worker is measured against: a minimal raw-aiokafka scorer (no faust).

    python loadtest/passthrough.py --broker HOST:PORT --topic IN --out OUT --group G
                                   [--n-features 68] [--max-records 2000] [--idle-exit 0]
                                   [--requests-topic T --ask F] [--compression CODEC]

Its clients take the options a worker's do (``service.stream.kafka.clients``:
``consumer_options``, ``producer_options``): it reads with the worker's ``isolation_level``
(``read_committed``) and writes with the worker's ``compression`` (``zstd`` unless
``--compression`` says otherwise), acks=all, so the floor pays what the worker pays for them.

Consumes ``IN`` from the group's committed offsets (earliest when it has none), one fetched
batch at a time: orjson-parses every event (``{"id", "features": [...]}``; an object of
fields gives its first ``--n-features`` numbers, nothing hashed), checks the
feature vectors are finite with numpy, scores the batch with one matrix product, writes a
ten-field decision per event to ``OUT`` (key = event id, acks=all), waits until the broker
has acknowledged every one of them, then commits the batch's offsets. Events it cannot
parse are skipped (the floor has no dead-letter topic). Stops on SIGTERM/SIGINT, or after
``--idle-exit`` seconds without a record (0: never).

With ``--requests-topic T --ask F`` it also writes the output a worker's label requests are:
for every event whose coin (its id's CRC-32 mapped to [0, 1)) is below ``F``, a record with
the fields of ``service.records.LabelRequest`` (the 68 features included; key ``default``)
on ``T``, in the same produce batches as the decisions and acknowledged before the commit
like them (a floor that writes what the worker writes; nothing learns from them).

What it does not do is what a worker adds: models that learn, choosing what to ask, dead
letters, metrics, liveness, budgets. Run by ``loadtest/throughput.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import signal
import time
import zlib

import numpy as np
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from service.config import Settings
from service.stream.kafka.clients import consumer_options, producer_options


def _numbers(fields: dict[str, object], n: int) -> list[float]:
    """The first ``n`` numbers among an event's fields (the rest 0): the least a floor can
    make of an object of fields (no strings hashed, no tokens read).

    >>> _numbers({"a": 2, "b": "x", "c": True, "d": 1.5}, 3)
    [2.0, 1.5, 0.0]
    """
    out = [float(v) for v in fields.values() if type(v) is int or type(v) is float][:n]
    return out + [0.0] * (n - len(out))


async def _run(args: argparse.Namespace) -> None:
    w = np.random.default_rng(0).normal(size=args.n_features)
    rho = 0.5
    requests = args.requests_topic if args.ask > 0 else None
    ask_below = int(args.ask * 2**32)  # the coin: crc32(id) < ask * 2**32
    query_probability = args.ask if requests else 0.0
    settings = Settings(compression=args.compression)  # the worker's client options
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.broker,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=32 * 1024 * 1024,
        **consumer_options(settings),
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=args.broker,
        acks="all",
        max_batch_size=262_144,
        **producer_options(settings),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await producer.start()
    await consumer.start()
    last = time.monotonic()
    try:
        while not stop.is_set():
            fetched = await consumer.getmany(timeout_ms=100, max_records=args.max_records)
            if not fetched:
                if args.idle_exit and time.monotonic() - last > args.idle_exit:
                    break
                continue
            last = time.monotonic()
            futures = []
            offsets: dict[TopicPartition, int] = {}
            for tp, records in fetched.items():
                ids, rows = [], []
                for record in records:
                    try:
                        event = orjson.loads(record.value)
                        feats = event["features"]
                        if type(feats) is dict:  # fields: its numbers, in a fixed order
                            feats = _numbers(feats, args.n_features)
                        ids.append(event["id"])
                        rows.append(feats)
                    except (orjson.JSONDecodeError, KeyError, TypeError):
                        continue
                offsets[tp] = records[-1].offset + 1
                if not rows:
                    continue
                x = np.array(rows, dtype=np.float64)
                ok = np.isfinite(x).all(axis=1)
                scores = x @ w
                now = time.time()
                for event_id, row, score, good in zip(
                    ids, rows, scores.tolist(), ok.tolist(), strict=True
                ):
                    if not good:
                        continue
                    key = str(event_id).encode()
                    asked = requests is not None and zlib.crc32(key) < ask_below
                    rejected = abs(score) <= rho
                    decision = {
                        "id": event_id,
                        "model": "default",
                        "action": "reject" if rejected else "predict",
                        "label": None if rejected else (1 if score > 0 else -1),
                        "score": score,
                        "rho": rho,
                        "model_version": 0,
                        "queried": asked,
                        "query_probability": query_probability,
                        "ts": now,
                    }
                    futures.append(await producer.send(args.out, orjson.dumps(decision), key=key))
                    if asked:
                        request = {
                            "request_id": hashlib.blake2b(
                                b"default\x1f" + key, digest_size=16
                            ).hexdigest(),
                            "event_id": event_id,
                            "model": "default",
                            "features": row,
                            "score": score,
                            "rho": rho,
                            "decided_label": decision["label"] or 0,
                            "query_probability": query_probability,
                            "model_version": 0,
                            "requested_at": now,
                            "expires_at": now + 3600.0,
                            "priority": 1.0 / (1.0 + min(abs(score - rho), abs(score + rho))),
                            "shadow_labels": {},
                            "served_by": None,
                        }
                        futures.append(
                            await producer.send(requests, orjson.dumps(request), key=b"default")
                        )
            if futures:
                await asyncio.gather(*futures)
            await consumer.commit(offsets)
    finally:
        await consumer.stop()
        await producer.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--broker", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--n-features", type=int, default=68)
    p.add_argument("--max-records", type=int, default=2000)
    p.add_argument("--idle-exit", type=float, default=0.0)
    p.add_argument("--requests-topic", help="also write label requests here (with --ask)")
    p.add_argument("--ask", type=float, default=0.0, help="the fraction of events asked about")
    p.add_argument(
        "--compression",
        default=Settings().compression,
        help="codec of the batches it writes (default: the worker's default)",
    )
    asyncio.run(_run(p.parse_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
