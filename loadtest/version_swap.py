"""What a new model version costs the loop that scores: a model learns ``--labels`` labels of
``loadtest/wide.py``'s stream (each applied as the learner applies it, a version written
every 100), then a worker's :class:`~service.stream.models.book.ModelBook` is offered those
versions one after the other, as the follower offers what it reads, while a task on the
same loop ticks every millisecond. No Kafka.

    python loadtest/version_swap.py [--labels 1200] [SHAPE ...]

Prints per shape: a version's record, the median time from offer to swap, and the longest
the loop went without a tick while the versions were offered (with a tree whose book builds
versions on the loop, that is about the time of a build; run it from both trees to compare).
Shapes are ``loadtest/wide.py``'s (default: ``dense68 hashed12-300 hashed18-300``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from label_cost import moments_of, request_of  # noqa: E402
from wide import BETWEEN, TRUST, config_of, events  # noqa: E402

from service.config import Settings  # noqa: E402
from service.features import encoder_of  # noqa: E402
from service.records import Label, PendingEntry, RawMessage, request_id  # noqa: E402
from service.stream.labels.protocol import apply_label  # noqa: E402
from service.stream.models.book import ModelBook  # noqa: E402
from service.stream.models.served import initial_envelope  # noqa: E402


def versions(shape: str, labels: int) -> list[bytes]:
    """The records a learner writes to the models topic, one every 100 labels."""
    config = config_of(shape)
    stream = events(shape, labels, np.random.default_rng(3))
    encoder = None if config.fields is None else encoder_of(config.fields)
    k = config.moments_inputs
    heads = []
    for features, _ in stream:  # the numbers a scorer gathers the moments of
        if encoder is None:
            heads.append(np.asarray(features, dtype=np.float64)[:k])
            continue
        idx, val = encoder.sparse(features)
        head = np.zeros(k)
        np.add.at(head, idx[idx < k], val[idx < k])
        heads.append(head)
    model, out = initial_envelope("m", config), []
    for i, (features, y) in enumerate(stream):
        seen = moments_of(np.vstack(heads[max(0, i - BETWEEN + 1) : i + 1]))
        x = heads[i] if encoder is None else np.zeros(1)
        request = request_of(i, x, model.version, seen)
        if encoder is not None:  # what a worker's request of a declared model carries
            request = dataclasses.replace(request, features=None, fields=encoder.shown(features))
        label = Label(request_id("m", f"e{i}"), "m", y, "bench", None)
        outcome = apply_label(
            config, model, PendingEntry(request, 0), label, i, now=1.0, trust=TRUST,
            defer=i % 100 != 99,
        )  # fmt: skip
        assert outcome.model is not None  # noqa: S101 - every label applies
        model = outcome.model
        if i % 100 == 99:
            out.append(outcome.serve())
    return out


async def swaps(shape: str, records: list[bytes]) -> tuple[float, float]:
    """(median seconds from offer to swap, longest gap between ticks) over ``records``."""
    settings = Settings(models={"m": config_of(shape).model_dump()}, default_model="m")
    book = ModelBook(settings)
    offer: Any = getattr(book, "offer_aside", None)
    gaps: list[float] = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    gaps.clear()
    took = []
    try:
        for raw in records:
            tic = time.perf_counter()
            if offer is not None:
                await offer(RawMessage(raw, "abstain.models", 0, 0, b"m"), raw)
            else:  # a book that builds on the loop
                book.offer(b"m", raw)
            took.append(time.perf_counter() - tic)
            await asyncio.sleep(0.005)
    finally:
        ticker.cancel()
        getattr(book, "close", lambda: None)()
    return statistics.median(took), max(gaps)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--labels", type=int, default=1200)
    p.add_argument("shapes", nargs="*", default=["dense68", "hashed12-300", "hashed18-300"])
    args = p.parse_args()
    for shape in args.shapes:
        records = versions(shape, args.labels)
        took, gap = asyncio.run(swaps(shape, records))
        print(
            f"{shape:>13}: a version {len(records[-1]) / 1024:6.1f} KiB, offer to swap "
            f"{took * 1e3:5.1f} ms (median of {len(records)}), longest the loop went "
            f"without a tick {gap * 1e3:5.1f} ms"
        )


if __name__ == "__main__":
    main()
