"""What a wide or a declared model costs, per event and per label, against a dense model of
68 features in the same run (the library paths a worker runs; no Kafka).

Usage: ``python loadtest/wide.py [--labels 300] [--batches 30] [--repeats 3]``.

Shapes (each a DSAL model with the served defaults):

* ``dense68``, ``dense1000`` — events of 68 / 1,000 numbers (a list: the scorers' batched
  path);
* ``hashed8-30``, ``hashed9-30``, ``hashed9-300``, ``hashed10-300``, ``hashed12-30``,
  ``hashed12-300`` — a ``fields`` model of four numbers, two categories, a boolean and a
  tokens field, in 2^8 / 2^9 / 2^10 / 2^12 buckets, events of 30 / 300 tokens
  (as producers write them: each event encoded under the declaration).

Per shape: CPU seconds per decided event (:func:`~service.stream.scoring.decide.score_batch`
on batches of 100, the moments gathered as a scorer does), per applied label
(:func:`~service.stream.labels.protocol.apply_label`: load, learn, write and check the
version; each request's moments, of the last 20 events, signed as a keyed worker's are, so
merged), the size of the version record and of a label request; the medians of
``--repeats`` alternating rounds, and each as a ratio to ``dense68``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from label_cost import moments_of, request_of  # noqa: E402

from service.config import ModelConfig  # noqa: E402
from service.features import encoder_of  # noqa: E402
from service.learning.moments import Moments  # noqa: E402
from service.records import Label, PendingEntry, RawMessage, request_id  # noqa: E402
from service.stream.labels.protocol import apply_label  # noqa: E402
from service.stream.models.served import ServedModel, initial_envelope  # noqa: E402
from service.stream.scoring.decide import Limits, score_batch  # noqa: E402

SHAPES = (
    "dense68",
    "dense1000",
    "hashed8-30",
    "hashed9-30",
    "hashed9-300",
    "hashed10-300",
    "hashed12-30",
    "hashed12-300",
)
BETWEEN = 20  # events scored per request (a 5 % budget): the moments a request carries
#: the moments merged as a keyed worker's are (the chart always sets ``snapshot_key``):
#: signed, so never refused by the plausibility gate
TRUST = "trusted"
WORDS = [f"w{i}" for i in range(5000)]


def config_of(shape: str) -> ModelConfig:
    if shape.startswith("dense"):
        return ModelConfig.model_validate({"algorithm": "dsal", "n_features": int(shape[5:])})
    bits = int(shape[6:].split("-")[0])
    fields = {
        "amount": "number",
        "age": "number",
        "score": "number",
        "items": "number",
        "country": "category",
        "merchant": {"kind": "category", "missing": "indicator"},
        "new_device": "boolean",
        "text": "tokens",
    }
    return ModelConfig.model_validate(
        {"algorithm": "dsal", "fields": {"hash_bits": bits, "fields": fields}}
    )


def events(shape: str, n: int, rng: np.random.Generator) -> list[tuple[Any, int]]:
    """``n`` events as producers write them (their ``features``), each with a label."""
    out: list[tuple[Any, int]] = []
    if shape.startswith("dense"):
        d = int(shape[5:])
        w = np.random.default_rng(7).normal(size=d)
        for x in rng.normal(size=(n, d)):
            out.append((x.round(6).tolist(), 1 if x @ w > 0 else -1))
        return out
    tokens = int(shape.split("-")[1])
    for _ in range(n):
        text = [str(t) for t in rng.choice(WORDS, size=tokens)]
        fields = {
            "amount": float(rng.lognormal(3, 1)),
            "age": float(rng.integers(18, 90)),
            "score": float(rng.normal()),
            "items": float(rng.integers(1, 9)),
            "country": str(rng.choice(["SE", "NO", "DE", "FR", "US"])),
            "merchant": None if rng.random() < 0.2 else f"m{int(rng.integers(0, 300))}",
            "new_device": bool(rng.random() < 0.3),
            "text": text,
        }
        y = 1 if (fields["new_device"] and fields["country"] == "US") or "w1" in text else -1
        out.append((fields, y))
    return out


def vector(config: ModelConfig, features: Any) -> np.ndarray:
    if config.fields is None:
        return np.asarray(features, dtype=np.float64)
    return encoder_of(config.fields).dense(features)


def learn(shape: str, stream: list[tuple[Any, int]]) -> tuple[float, int, int, Any]:
    """CPU seconds per label (median), the last version's and a request's bytes, the model."""
    config = config_of(shape)
    model = initial_envelope("m", config)
    X = np.vstack([vector(config, f) for f, _ in stream])
    times: list[float] = []
    size = asked = 0
    for i, (_, y) in enumerate(stream):
        rid = request_id("m", f"e{i}")
        seen = moments_of(X[max(0, i - BETWEEN + 1) : i + 1, : config.moments_inputs])
        request = request_of(i, X[i], model.version, seen)
        if config.fields is not None:  # what a worker's request of a declared model carries
            shown = encoder_of(config.fields).shown(stream[i][0])
            request = dataclasses.replace(request, features=None, fields=shown)
        asked = len(request.to_json())
        tic = time.process_time()
        label = Label(rid, "m", y, "bench", None)
        out = apply_label(config, model, PendingEntry(request, 0), label, i, now=1.0, trust=TRUST)
        times.append(time.process_time() - tic)
        assert out.model is not None  # noqa: S101 - every label applies
        model, size = out.model, len(out.encode())
    return statistics.median(times), size, asked, model


def decide(shape: str, model: Any, stream: list[tuple[Any, int]], batches: int) -> float:
    """CPU seconds per decided event, batches of 100, with the moments a scorer gathers."""
    config = config_of(shape)
    served = ServedModel.from_envelope(config, model)
    limits = Limits(default_model="m", request_ttl=1e9)
    messages = [
        RawMessage(orjson.dumps({"id": f"d{i}", "features": f}), "abstain.features", 0, i)
        for i, (f, _) in enumerate(stream[:100])
    ]
    gathered = Moments(config.moments_inputs)
    tic = time.process_time()
    for _ in range(batches):
        result = score_batch({"m": served}, messages, limits=limits, now=1.0)
        assert not result.dead_letters  # noqa: S101 - every event fits
        for seen in result.moments.values():
            gathered.merge(seen)
    return (time.process_time() - tic) / (100 * batches)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--labels", type=int, default=300)
    p.add_argument("--batches", type=int, default=30, help="batches of 100 decided per round")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    streams = {s: events(s, max(args.labels, 100), np.random.default_rng(1)) for s in SHAPES}
    per_label: dict[str, list[float]] = {s: [] for s in SHAPES}
    per_event: dict[str, list[float]] = {s: [] for s in SHAPES}
    sizes: dict[str, tuple[int, int]] = {}
    for _ in range(args.repeats):
        for shape in SHAPES:  # alternately, so the machine's load weighs on each alike
            seconds, version, request, model = learn(shape, streams[shape][: args.labels])
            per_label[shape].append(seconds)
            per_event[shape].append(decide(shape, model, streams[shape], args.batches))
            sizes[shape] = (version, request)
    base_label = statistics.median(per_label["dense68"])
    base_event = statistics.median(per_event["dense68"])
    print(f"{args.labels} labels, {args.repeats} rounds; CPU time; medians; x = / dense68")
    for shape in SHAPES:
        label, event = statistics.median(per_label[shape]), statistics.median(per_event[shape])
        version, request = sizes[shape]
        print(
            f"{shape:>13}: {config_of(shape).n_inputs:>5} inputs | "
            f"{1e6 * event:8.1f} us/event ({event / base_event:5.2f} x) | "
            f"{1e3 * label:7.2f} ms/label ({label / base_label:5.2f} x, "
            f"{1 / label:6.0f} labels/s) | version {version / 1024:7.1f} KiB | "
            f"request {request / 1024:6.1f} KiB"
        )


if __name__ == "__main__":
    main()
