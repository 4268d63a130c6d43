"""SEA shift at 10 % labels: does a larger or non-decaying DSAL step bring the recovery down?

Usage: ``python loadtest/replay/peers/sea_steps.py [RUNS] [PARTS]`` (default 20, and every part
of the wrapper on; PARTS ``nosteps``: the tracking steps off). The adaptive DSAL as a worker
serves it (``serving_learner`` through ``variant_learner``) with other step sizes, on the
peers benchmark's SEA-shift runs (same streams and coins); medians over the runs of the
events to recover (observed and expected losses) and the risk.
"""

import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from service.learning import Parts, default_pipeline  # noqa: E402
from service.replay.options import ReplayOptions  # noqa: E402
from service.replay.prequential import recovery, run_stream  # noqa: E402
from service.replay.results import Variant  # noqa: E402
from service.replay.sequential import variant_learner  # noqa: E402
from service.replay.streams import DRIFT_STREAMS  # noqa: E402


def rng(run: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(0, spawn_key=(run,)))


PARTS = Parts(steps=not (len(sys.argv) > 2 and sys.argv[2] == "nosteps"))
variants = {
    "default": {},
    "constant 1.0": {"eta": {"kind": "constant", "eta": 1.0}},
    "tau 100": {"eta": {"kind": "inverse-time", "eta0": 1.0, "tau": 100.0}},
    "eta0 2": {"eta": {"kind": "inverse-time", "eta0": 2.0, "tau": 1000.0}},
    "constant 0.3": {"eta": {"kind": "constant", "eta": 0.3}},
}
for name, params in variants.items():
    rec, rec_e, risk = [], [], []
    for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 20):
        s = DRIFT_STREAMS["sea-shift"](seed=r)
        opts = ReplayOptions(
            algorithms=("dsal",), costs=(0.25,), seed=0, params=params, adaptive=PARTS
        )
        model = variant_learner(Variant("dsal", 0.1, "budget"), 0.25, s.X.shape[1] + 1, opts)
        tr = run_stream(
            model, s.X, s.y, rng(r).random(s.n), 0.25, pipeline=default_pipeline(s.X.shape[1])
        )
        e = s.expected_loss(tr.decision, 0.25)
        rec.append(recovery(tr.loss, s.change))
        rec_e.append(recovery(e, s.change))
        risk.append(tr.loss.mean())

    def f(v):
        return statistics.median([x if x is not None else 99999 for x in v])

    print(
        f"{name:14s} recover {f(rec):6.0f}  expected {f(rec_e):6.0f}  "
        f"risk {statistics.median(risk):.4f}",
        flush=True,
    )
