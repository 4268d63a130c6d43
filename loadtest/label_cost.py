"""The cost of a label and of a decision through the worker's paths, for the stack a model
serves now and the one it served before, in the same run.

Usage: ``python loadtest/label_cost.py [--features 68] [--labels 600] [--repeats 3]``.

* *now*: the default configuration (inside ``Adaptive``, ``update_rule="normalized"``, the
  serving pipeline: a standardiser of every event's moments, then one of the labelled rows),
  each request carrying the moments of the 20 events scored before it (a 5 % budget);
* *before*: the same model with the paper's update (``update_rule="sgd"``) and the pipeline
  models had before (one standardiser of the labelled rows), requests without moments;
* *bare*: *before* with ``adaptive.enabled = false`` (the reference of the first
  measurements, ``docs/learn/corrections.md``).

Per label: :func:`service.stream.labels.protocol.apply_label` (load the state, learn, write
and check the new snapshot), labels of a concept that flips halfway asked with p = 0.3.
Per decision: :func:`service.stream.scoring.decide.score_batch` on batches of 100 events,
and for *now* the moments a scorer gathers of them. Prints medians over ``--repeats``
alternating rounds, the ratios to *before*, and the snapshot's size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.config import ModelConfig  # noqa: E402
from service.learning import default_pipeline  # noqa: E402
from service.learning.moments import Moments
from service.records import Label, LabelRequest, ModelEnvelope, PendingEntry, RawMessage, request_id
from service.records.wire import FeatureMoments
from service.stream.labels.protocol import apply_label  # noqa: E402
from service.stream.models.served import ServedModel, initial_envelope  # noqa: E402
from service.stream.scoring.decide import Limits, score_batch  # noqa: E402

STACKS = ("now", "before", "bare")
BETWEEN = 20  # events scored per request (a 5 % budget)


def config_of(stack: str, n: int) -> ModelConfig:
    settings: dict[str, object] = {"algorithm": "dsal", "n_features": n}
    if stack != "now":
        settings["update_rule"] = "sgd"
    if stack == "bare":
        settings["adaptive"] = {"enabled": False}
    return ModelConfig.model_validate(settings)


def start(stack: str, config: ModelConfig) -> ModelEnvelope:
    model = initial_envelope("m", config)
    if stack == "now":
        return model
    return model.replace(pipeline=default_pipeline(config.n_inputs).to_state())


def moments_of(rows: np.ndarray) -> FeatureMoments:
    m = Moments(rows.shape[1])
    m.add_many(rows)
    return FeatureMoments(m.count, tuple(m.mean.tolist()), tuple(m.m2.tolist()))


def request_of(i: int, x: np.ndarray, version: int, moments: FeatureMoments | None) -> LabelRequest:
    """The request of event ``e{i}`` (raw features ``x``) of model ``m`` at ``version``,
    asked with p = 0.3, carrying ``moments``."""
    return LabelRequest(
        request_id=request_id("m", f"e{i}"),
        event_id=f"e{i}",
        model="m",
        features=x.tolist(),
        score=0.0,
        rho=1.0,
        decided_label=0,
        query_probability=0.3,
        model_version=version,
        requested_at=0.0,
        expires_at=1e12,
        priority=0.5,
        moments=moments,
    )


def labels(
    stack: str, X: np.ndarray, w: np.ndarray
) -> tuple[list[float], list[int], ModelEnvelope]:
    """Seconds per label and snapshot sizes; the model at the end."""
    config = config_of(stack, X.shape[1])
    model = start(stack, config)
    rng = np.random.default_rng(1)
    times, sizes = [], []
    n = X.shape[0]
    for i in range(n):
        y = (1 if X[i] @ w > 0 else -1) * (1 if i < n // 2 else -1)
        rid = request_id("m", f"e{i}")
        seen = None
        if stack == "now":  # the moments of the events scored since the last request
            seen = moments_of(np.vstack([rng.normal(size=(BETWEEN - 1, X.shape[1])), X[i]]))
        request = request_of(i, X[i], model.version, seen)
        tic = time.perf_counter()
        out = apply_label(
            config, model, PendingEntry(request, 0), Label(rid, "m", y, "bench", None), i, now=1.0
        )
        times.append(time.perf_counter() - tic)
        assert out.model is not None  # noqa: S101 - every label applies
        model = out.model
        sizes.append(len(out.encode()))
    return times, sizes, model


def decisions(stack: str, model: ModelEnvelope, X: np.ndarray, batches: int) -> float:
    """Seconds per decided event, batches of 100 (with the moments a scorer gathers)."""
    config = config_of(stack, X.shape[1])
    served = ServedModel.from_envelope(config, model)
    limits = Limits(default_model="m", request_ttl=1e9)
    rows = X[:100]
    messages = [
        RawMessage(
            orjson.dumps({"id": f"d{i}", "features": rows[i].tolist()}), "abstain.features", 0, i
        )
        for i in range(100)
    ]
    gathered = Moments(X.shape[1])
    tic = time.perf_counter()
    for _ in range(batches):
        result = score_batch({"m": served}, messages, limits=limits, now=1.0)
        if stack == "now":
            for seen in result.moments.values():
                gathered.merge(seen)
    return (time.perf_counter() - tic) / (100 * batches)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--features", type=int, default=68)
    p.add_argument("--labels", type=int, default=600)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batches", type=int, default=200, help="batches of 100 decided per round")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.labels, args.features))
    w = rng.normal(size=args.features)
    per_label: dict[str, list[float]] = {s: [] for s in STACKS}
    per_event: dict[str, list[float]] = {s: [] for s in STACKS}
    size: dict[str, list[int]] = {s: [] for s in STACKS}
    for _ in range(args.repeats):
        for stack in STACKS:  # alternately, so the machine's load weighs on each alike
            times, sizes, model = labels(stack, X, w)
            per_label[stack].append(statistics.median(times))
            size[stack] = sizes
            per_event[stack].append(decisions(stack, model, X, args.batches))
    label_base = statistics.median(per_label["before"])
    event_base = statistics.median(per_event["before"])
    for stack in STACKS:
        ms = statistics.median(per_label[stack])
        us = statistics.median(per_event[stack])
        print(
            f"{stack:>6}: {1e3 * ms:.3f} ms per label ({ms / label_base:.2f} x before), "
            f"{1e6 * us:.2f} us per decision ({us / event_base:.2f} x before), snapshot "
            f"median {statistics.median(size[stack]) / 1024:.1f} KiB, "
            f"max {max(size[stack]) / 1024:.1f} KiB"
        )


if __name__ == "__main__":
    main()
