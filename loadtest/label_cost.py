"""The learner's cost per label through the worker's label path, adaptive or not.

Usage: ``python loadtest/label_cost.py [--features 68] [--labels 600] [--repeats 3]``.
Applies the same labels (a concept that flips halfway, asked with p = 0.3) through
:func:`service.stream.labels.protocol.apply_label` to a model with the default
configuration (served inside ``Adaptive``) and to the same model with
``adaptive.enabled = false``, alternately, ``--repeats`` times; prints the median time per
label (load the state, learn, write and check the new snapshot) and the snapshot's size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.config import ModelConfig  # noqa: E402
from service.records import Label, LabelRequest, PendingEntry, request_id  # noqa: E402
from service.stream.labels.protocol import apply_label  # noqa: E402
from service.stream.models.served import initial_envelope  # noqa: E402


def run(enabled: bool, X: np.ndarray, w: np.ndarray) -> tuple[list[float], list[int]]:
    config = ModelConfig.model_validate(
        {"algorithm": "dsal", "n_features": X.shape[1], "adaptive": {"enabled": enabled}}
    )
    model = initial_envelope("m", config)
    times, sizes = [], []
    n = X.shape[0]
    for i in range(n):
        y = (1 if X[i] @ w > 0 else -1) * (1 if i < n // 2 else -1)
        rid = request_id("m", f"e{i}")
        request = LabelRequest(request_id=rid, event_id=f"e{i}", model="m",
                               features=X[i].tolist(), score=0.0, rho=1.0, decided_label=0,
                               query_probability=0.3, model_version=model.version,
                               requested_at=0.0, expires_at=1e12, priority=0.5)  # fmt: skip
        tic = time.perf_counter()
        out = apply_label(config, model, PendingEntry(request, 0),
                          Label(rid, "m", y, "bench", None), i, now=1.0)  # fmt: skip
        times.append(time.perf_counter() - tic)
        assert out.model is not None  # noqa: S101 - every label applies
        assert out.encoded is not None  # noqa: S101
        model = out.model
        sizes.append(len(out.encoded))
    return times, sizes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--features", type=int, default=68)
    p.add_argument("--labels", type=int, default=600)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(args.labels, args.features))
    w = rng.normal(size=args.features)
    per: dict[bool, list[float]] = {False: [], True: []}
    size: dict[bool, list[int]] = {False: [], True: []}
    for _ in range(args.repeats):
        for enabled in (False, True):
            times, sizes = run(enabled, X, w)
            per[enabled].append(statistics.median(times))
            size[enabled] = sizes
    base = statistics.median(per[False])
    for enabled in (False, True):
        ms = statistics.median(per[enabled])
        print(f"adaptive {'on ' if enabled else 'off'}: {1e3 * ms:.2f} ms per label "
              f"({ms / base:.1f} x), snapshot median {statistics.median(size[enabled]) / 1024:.1f} "
              f"KiB, max {max(size[enabled]) / 1024:.1f} KiB")  # fmt: skip


if __name__ == "__main__":
    main()
