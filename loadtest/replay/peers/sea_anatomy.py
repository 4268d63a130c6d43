"""What the expected loss is made of after the SEA shift, 100 events at a time.

Usage: ``python loadtest/replay/peers/sea_anatomy.py [RUNS]`` (default 20). The peers benchmark's
SEA-shift runs (threshold 8 to 9.5 at event 5,000) at 10 % labels: DSAL bare, and as a
worker serves it with the tracking steps off (``Parts(steps=False)``) and on (the default).
Per block of 100 events around the change, the mean over runs of: the share of the events
rejected inside the band that changed class (``8 < x1 + x2 <= 9.5``), rejected outside it,
decided wrong (against the clean label) inside it, and the expected loss of the block
(0.1 right, 0.9 wrong, d rejected); then the median width rho at the change and its peak in
the 1,000 events after.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from service.learning import Parts, default_pipeline  # noqa: E402
from service.replay.options import ReplayOptions  # noqa: E402
from service.replay.results import Variant  # noqa: E402
from service.replay.sequential import learn_function, variant_learner  # noqa: E402
from service.replay.streams import sea_shift  # noqa: E402

COST = 0.25
BLOCKS = range(-300, 1500, 100)


def run(seed: int, parts: Parts | None) -> tuple[np.ndarray, list[float]]:
    """Per block: (rejected in band, rejected outside, wrong in band, expected loss); and
    rho at every event from 100 before the change to 1,000 after."""
    s = sea_shift(seed=seed)
    options = ReplayOptions(algorithms=("dsal",), costs=(COST,), seed=0, adaptive=parts)
    model = variant_learner(Variant("dsal", 0.1, "budget"), COST, 4, options)
    pipe, learn = default_pipeline(3), learn_function(model)
    coins = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(seed,))).random(s.n)
    decision = np.empty(s.n, dtype=np.int8)
    rho: list[float] = []
    for t in range(s.n):
        x = pipe.transform(s.X[t])
        d = model.decide(x, coin=float(coins[t]))
        decision[t] = d.label
        if s.change - 100 <= t < s.change + 1000:
            rho.append(float(d.rho))
        if d.query:
            pipe.learn(s.X[t])
            learn(pipe.transform(s.X[t]), int(s.y[t]), d.query_probability)
    total = s.X[:, 0] + s.X[:, 1]
    band = (total > 8.0) & (total <= 9.5)
    expected = s.expected_loss(decision, COST)
    rows = []
    for a in BLOCKS:
        sl = slice(s.change + a, s.change + a + 100)
        d, b = decision[sl], band[sl]
        wrong = (d != 0) & (d != s.clean[sl])
        rows.append(
            [((d == 0) & b).mean(), ((d == 0) & ~b).mean(), (wrong & b).mean(), expected[sl].mean()]
        )
    return np.array(rows), rho


def main(runs: int) -> None:
    arms = {"DSAL": None, "served, steps off": Parts(steps=False), "served": Parts()}
    results = {name: [run(r, parts) for r in range(runs)] for name, parts in arms.items()}
    print(
        "| events after the change | "
        + " | ".join(f"{n}: rejected in band / outside, wrong in band, expected loss" for n in arms)
        + " |"
    )
    print("|---|" + "---|" * len(arms))
    for i, a in enumerate(BLOCKS):
        cells = []
        for name in arms:
            m = np.mean([rows for rows, _ in results[name]], axis=0)[i]
            cells.append(f"{m[0]:.3f} / {m[1]:.3f}, {m[2]:.3f}, {m[3]:.4f}")
        print(f"| {a} to {a + 100} | " + " | ".join(cells) + " |")
    for name in arms:
        at = statistics.median(rho[100] for _, rho in results[name])
        peak = statistics.median(max(rho[100:]) for _, rho in results[name])
        print(
            f"{name}: rho at the change {at:.2f}, peak in the 1,000 events after {peak:.2f} "
            f"(medians of {runs} runs)"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
