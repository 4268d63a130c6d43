"""What corrections cost the learner: per label (the history a correction needs) and per
correction (the labels applied again), through the worker's own LabelJoiner.

Usage: ``python loadtest/correction_cost.py [--features 68] [--labels 400] [--repeats 3]
[--shadow]``. A :class:`~service.stream.labels.joiner.LabelJoiner` over in-memory tables
(what a worker's learner does, without Kafka) learns the same ``--labels`` labels with the
default configuration (served inside ``Adaptive``, corrections reaching back 200 labels) and
with ``corrections.reach = 0`` (no history kept), alternately, ``--repeats`` times; then the
first is corrected at 1, 50, 100 and 200 labels back. Prints the median time per label of
each, their ratio, the history kept (bytes) and the median time per correction by depth.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.config import ModelConfig, Settings  # noqa: E402
from service.metrics import Metrics  # noqa: E402
from service.records import Correction, Label, LabelRequest, RawMessage, request_id
from service.stream.labels.admission import admission  # noqa: E402
from service.stream.labels.history import History  # noqa: E402
from service.stream.labels.joiner import LabelJoiner  # noqa: E402
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore  # noqa: E402
from service.stream.models.served import initial_envelope  # noqa: E402
from service.stream.outputs import Outputs  # noqa: E402

DEPTHS = (1, 50, 100, 200)


class Sink:
    """An in-memory producer: everything is acknowledged at once."""

    async def send(self, topic: str, key: bytes | None, value: bytes, headers: Any = None) -> None:
        pass

    async def flush(self) -> None:
        pass


def learner(n_features: int, *, reach: int, shadow: bool) -> tuple[LabelJoiner, dict[bytes, bytes]]:
    model: dict[str, Any] = {
        "algorithm": "dsal",
        "n_features": n_features,
        "corrections": {"reach": reach},
    }
    models = {"m": ModelConfig.model_validate(model)}
    if shadow:
        models["m-dral"] = ModelConfig.model_validate(
            {"algorithm": "dral", "n_features": n_features, "champion": "m"}
        )
    s = Settings(models=models, default_model="m", partitions={"labels": 1})  # type: ignore[arg-type]
    initial = {name: initial_envelope(name, cfg) for name, cfg in s.models.items()}
    history: dict[bytes, bytes] = {}
    metrics = Metrics(CollectorRegistry(), models=s.models)
    joiner = LabelJoiner(
        s,
        pending=PendingStore({}, admission(s)),
        parked=ParkedStore({}),
        models=ModelStore({}, initial),
        history=History(history, s, admission(s)),
        outputs=Outputs(Sink(), s.topics, metrics),
        metrics=metrics,
        clock=time.time,
    )
    joiner.own(frozenset({0}))
    return joiner, history


async def feed(joiner: LabelJoiner, X: np.ndarray, w: np.ndarray) -> list[float]:
    """One request and its label per row; the time of each label."""
    s, times = joiner.settings, []
    for i, x in enumerate(X):
        rid = request_id("m", f"e{i}")
        request = LabelRequest(rid, f"e{i}", "m", x.tolist(), 0.0, 1.0, 0, 0.3, 0, 0.0, 1e12, 0.5)
        await joiner.handle(RawMessage(request.to_json(), s.topics.label_requests, 0, i, b"m"))
        y = 1 if x @ w > 0 else -1
        label = Label(rid, "m", y, "bench", None).to_json()
        tic = time.perf_counter()
        await joiner.handle(RawMessage(label, s.topics.labels, 0, i, b"m"))
        times.append(time.perf_counter() - tic)
    return times


async def correct(joiner: LabelJoiner, n: int, depth: int, offset: int) -> float:
    rid = request_id("m", f"e{n - depth}")
    stored = joiner.history.step("m", rid)
    assert stored is not None  # noqa: S101 - within the reach
    body = Correction(rid, "m", -(stored.label or 1), "bench", "reviewer", None).to_json()
    tic = time.perf_counter()
    await joiner.handle(RawMessage(body, joiner.settings.topics.labels, 0, offset, b"m"))
    return time.perf_counter() - tic


async def main_async(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.labels, args.features))
    w = rng.normal(size=args.features)
    per: dict[int, list[float]] = {0: [], 200: []}
    fixes: dict[int, list[float]] = {d: [] for d in DEPTHS}
    kept = 0
    for _ in range(args.repeats):
        for reach in (0, 200):
            joiner, history = learner(args.features, reach=reach, shadow=args.shadow)
            per[reach].append(statistics.median(await feed(joiner, X, w)))
            if reach:
                kept = sum(len(k) + len(v) for k, v in history.items())
                for j, depth in enumerate(DEPTHS):
                    fixes[depth].append(await correct(joiner, args.labels, depth, args.labels + j))
    off, on = statistics.median(per[0]), statistics.median(per[200])
    members = "champion and a shadow" if args.shadow else "champion"
    print(f"{args.features} features, {args.labels} labels, {members}, adaptive (default)")
    print(f"per label, no history (reach 0): {1e3 * off:.2f} ms")
    print(
        f"per label, reach 200:            {1e3 * on:.2f} ms ({on / off:.2f} x); "
        f"history kept {kept / 1024:.0f} KiB"
    )
    for depth in DEPTHS:
        ms = 1e3 * statistics.median(fixes[depth])
        print(f"a correction {depth:>3} labels back: {ms:.0f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", type=int, default=68)
    p.add_argument("--labels", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shadow", action="store_true", help="a DRAL shadow in the group")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
