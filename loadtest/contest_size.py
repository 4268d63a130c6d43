"""The size of a model version while challengers run: a model learns every label of a stream
whose labels flip after ``--flip``, each label applied as the learner applies it
(:func:`~service.stream.labels.protocol.apply_label`, the request carrying the moments of the
last events, merged as a keyed worker's, as ``loadtest/wide.py``), and every 10th version is
encoded; printed per shape: the median and the largest version while three challengers run,
and the largest otherwise, of what a scorer reads (the models topic's record) and of the
learner's state (its table's).

    python loadtest/contest_size.py [--labels 1000] [--flip 400] [SHAPE ...]

Shapes are ``loadtest/wide.py``'s (default: ``hashed12-30 hashed12-300 dense68``). No Kafka.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from label_cost import moments_of, request_of  # noqa: E402
from wide import BETWEEN, TRUST, config_of, events, vector  # noqa: E402

from service.records import Label, PendingEntry, request_id  # noqa: E402
from service.stream.labels.protocol import apply_label  # noqa: E402
from service.stream.models.served import initial_envelope  # noqa: E402

Sizes = tuple[list[tuple[int, int]], list[tuple[int, int]]]


def sizes(shape: str, labels: int, flip: int) -> Sizes:
    """(served, state) bytes of every 10th version: (while three challengers run,
    otherwise)."""
    config = config_of(shape)
    stream = events(shape, labels, np.random.default_rng(5))
    X = np.vstack([vector(config, f) for f, _ in stream])
    model = initial_envelope("m", config)
    running: list[tuple[int, int]] = []
    idle: list[tuple[int, int]] = []
    for i, (_, y) in enumerate(stream):
        label = y if i < flip else -y
        seen = moments_of(X[max(0, i - BETWEEN + 1) : i + 1, : config.moments_inputs])
        request = request_of(i, X[i], model.version, seen)
        rid = request_id("m", f"e{i}")
        answer = Label(rid, "m", label, "b", None)
        out = apply_label(config, model, PendingEntry(request, 0), answer, i, now=1.0, trust=TRUST)
        assert out.model is not None  # noqa: S101 - every label applies
        model = out.model
        if i % 10 == 0:
            three = len(model.learner["contest"]["challengers"]) == 3
            (running if three else idle).append((len(out.serve()), len(out.encode())))
    return running, idle


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("shapes", nargs="*", default=["hashed12-30", "hashed12-300", "dense68"])
    p.add_argument("--labels", type=int, default=1000)
    p.add_argument("--flip", type=int, default=400)
    args = p.parse_args()
    for shape in args.shapes:
        running, idle = sizes(shape, args.labels, args.flip)
        for i, what in enumerate(("what a scorer reads", "the learner's state")):
            busy, calm = [r[i] for r in running], [r[i] for r in idle]
            otherwise = f"otherwise at most {max(calm) / 1024:.1f} KiB" if calm else ""
            if busy:
                print(
                    f"{shape:>13}, {what}: while three challengers run "
                    f"{statistics.median(busy) / 1024:.1f} KiB (median), at most "
                    f"{max(busy) / 1024:.1f} KiB, {len(busy)} versions; {otherwise}"
                )
            else:
                print(f"{shape:>13}, {what}: no challengers ran; {otherwise}")


if __name__ == "__main__":
    main()
