"""Which codec suits what abstain writes: decisions and label requests, each codec measured
against ``none`` in the same run, on the same broker.

    python loadtest/compression.py [--broker HOST:PORT] [--records 20000] [--rounds 3]

For every codec (none, gzip, snappy, lz4, zstd) and round: the records a worker writes for
``--records`` Phishing events (a decision each, and a label request for 80 % of them, as a
fresh model asks: the real record classes of :mod:`service.records`) are written with the
workers' own producer options (``producer_options``, acks=all, the scoring loop's batch size)
to a fresh topic, then read back with the workers' consumer options. Reported per record:
the producer's CPU (process time while writing), the consumer's CPU, and the bytes the broker
stores (its log segments for the topic). Codecs run in a rotating order in each round; cells
are medians over rounds; the last columns are ratios to ``none`` of the same rounds.

Starts its own Kafka (service.localkafka) unless ``--broker`` is given; stops it by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from harness import features  # noqa: E402

from service.config import Settings  # noqa: E402
from service.localkafka import LocalKafka, find_free_ports  # noqa: E402
from service.records import Action, Decision, LabelRequest, request_id  # noqa: E402
from service.stream.kafka.clients import consumer_options, producer_options  # noqa: E402

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def records(n: int) -> list[tuple[bytes, bytes]]:
    """What a worker writes for ``n`` events: (key, value) of decisions and label requests."""
    X = features(68)
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        x = [float(v) for v in X[i % len(X)]]
        eid = f"{uuid.UUID(int=int(rng.integers(2**63)))}"  # ids as producers make them
        score, p, ts = float(rng.normal()), float(rng.uniform(0.05, 1)), 1.7e9 + i * 0.0137
        label = 1 if score > 0 else -1
        action = Action.REJECT if abs(score) < 0.3 else Action.PREDICT
        decided = None if action is Action.REJECT else label
        decision = Decision(eid, "default", action, decided, score, 0.3, 12, i % 5 != 4, p, ts)
        out.append((eid.encode(), decision.to_json()))
        if i % 5 != 4:
            request = LabelRequest(
                request_id("default", eid),
                eid,
                "default",
                x,
                score,
                0.3,
                label,
                p,
                12,
                ts,
                ts + 3600,
                1 - abs(score),
            )
            out.append((b"default", request.to_json()))
    return out


async def _write(settings: Settings, topic: str, batch: list[tuple[bytes, bytes]]) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        acks="all",
        max_batch_size=1_048_576 - 1024,
        linger_ms=5,
        **producer_options(settings),
    )
    await producer.start()
    try:
        began = time.process_time()
        futures = [await producer.send(topic, value, key=key) for key, value in batch]
        await asyncio.gather(*futures)
        return time.process_time() - began
    finally:
        await producer.stop()


async def _read(settings: Settings, topic: str, count: int) -> float:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.bootstrap_servers,
        group_id=None,
        auto_offset_reset="earliest",
        **consumer_options(settings),
    )
    await consumer.start()
    try:
        began, seen = time.process_time(), 0
        while seen < count:
            for rs in (await consumer.getmany(timeout_ms=1000, max_records=10_000)).values():
                seen += len(rs)
        return time.process_time() - began
    finally:
        await consumer.stop()


def _stored(data: Path, topic: str) -> int:
    return sum(f.stat().st_size for f in data.glob(f"**/{topic}-0/*.log"))


async def _round(
    bootstrap: str,
    data: Path,
    batch: list[tuple[bytes, bytes]],
    codec: str,
) -> tuple[float, float, int]:
    settings = Settings(broker=(bootstrap,), compression=codec)
    topic = f"compression-{codec}-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()
    wrote = await _write(settings, topic, batch)
    read = await _read(settings, topic, len(batch))
    await asyncio.sleep(0.5)
    return wrote, read, _stored(data, topic)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default=None)
    parser.add_argument("--records", type=int, default=20_000, help="events (records: ~1.8x)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    batch = records(args.records)
    with tempfile.TemporaryDirectory() as tmp:
        kafka = None
        data = Path(tmp) / "kafka"
        if args.broker is None:
            port, controller = find_free_ports(2)
            kafka = LocalKafka(port=port, controller_port=controller, data_dir=data)
            kafka.start()
        bootstrap = args.broker or kafka.bootstrap  # type: ignore[union-attr]
        try:
            rows: dict[str, list[tuple[float, float, int]]] = {c: [] for c in CODECS}
            for r in range(args.rounds):
                for codec in CODECS[r % len(CODECS) :] + CODECS[: r % len(CODECS)]:
                    rows[codec].append(asyncio.run(_round(bootstrap, data, batch, codec)))
        finally:
            if kafka is not None:
                kafka.stop()
    n = len(batch)

    def med(codec: str, i: int) -> float:
        return statistics.median(row[i] for row in rows[codec])

    print(
        f"{n} records ({args.records} decisions, label requests for 80 %), "
        f"{args.rounds} rounds, medians"
    )
    print(
        "| codec | write CPU µs/record | read CPU µs/record | bytes/record stored | "
        "write CPU / none | read CPU / none | bytes / none |"
    )
    print("|---|---|---|---|---|---|---|")
    for codec in CODECS:
        w, r, b = med(codec, 0), med(codec, 1), med(codec, 2)
        print(
            f"| {codec} | {w / n * 1e6:.1f} | {r / n * 1e6:.1f} | {b / n:.0f} | "
            f"{w / med('none', 0):.2f} | {r / med('none', 1):.2f} | "
            f"{b / med('none', 2):.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
