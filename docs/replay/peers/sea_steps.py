"""SEA shift at 10 % labels: does a larger or non-decaying DSAL step bring the recovery down?

Usage: ``python docs/replay/peers/sea_steps.py [RUNS]`` (default 20). The adaptive DSAL as a
worker serves it (``serving_learner`` through ``variant_learner``) with other step sizes, on
the peers benchmark's SEA-shift runs (same streams and coins); medians over the runs of the
events to recover (observed and expected losses) and the risk.
"""

import statistics
import sys

import numpy as np

from service.learning import Parts, default_pipeline
from service.replay.options import ReplayOptions
from service.replay.prequential import recovery, run_stream
from service.replay.results import Variant
from service.replay.sequential import variant_learner
from service.replay.streams import DRIFT_STREAMS


def rng(run: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(0, spawn_key=(run,)))


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
            algorithms=("dsal",), costs=(0.25,), seed=0, params=params, adaptive=Parts()
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
