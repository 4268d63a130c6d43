"""What the recovery measure reads on SEA streams where nothing changes, and for the oracle.

Usage: ``python loadtest/replay/peers/measure_check.py [RUNS]`` (default 20). SEA variant 0
throughout (``sea_shift(before=0, after=0)``: no change at event 5,000) and variant 3
throughout, the peers benchmark's coins and length; DSAL at 10 % labels, bare and as a worker
serves it (``serving_learner``); then the SEA shift's oracle (the clean label of the concept in
force). For each, the median [min-max] over runs of the events "to recover" at the (absent)
change, on the observed losses and on the losses expected under the known label noise
(:meth:`~service.replay.streams.DriftStream.expected_loss`).
"""

from __future__ import annotations

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
from service.replay.streams import DriftStream, sea_shift  # noqa: E402

COST = 0.25


def coins(run: int, n: int) -> np.ndarray:
    """The peers benchmark's coins of run ``run``."""
    return np.random.default_rng(np.random.SeedSequence(0, spawn_key=(run,))).random(n)


def cell(values: list[int | None]) -> str:
    finite = [v for v in values if v is not None]
    worst = max(finite) if len(finite) == len(values) else "never"
    med = statistics.median([np.inf if v is None else v for v in values])
    return f"{med:.0f} [{min(finite)}-{worst}]"


def measured(stream: DriftStream, decision: np.ndarray, loss: np.ndarray) -> tuple[int | None, ...]:
    expected = stream.expected_loss(decision, COST)
    return recovery(loss, stream.change), recovery(expected, stream.change)


def main(runs: int) -> None:
    print("| stream | model | observed losses | expected losses |")
    print("|---|---|---|---|")
    for variant in (0, 3):
        for name, parts in (("DSAL @10%", None), ("DSAL @10%, served (adaptive)", Parts())):
            out: list[tuple[int | None, ...]] = []
            for r in range(runs):
                s = sea_shift(seed=r, before=variant, after=variant)
                options = ReplayOptions(algorithms=("dsal",), costs=(COST,), seed=0, adaptive=parts)
                model = variant_learner(Variant("dsal", 0.1, "budget"), COST, 4, options)
                trace = run_stream(
                    model, s.X, s.y, coins(r, s.n), COST, pipeline=default_pipeline(3)
                )
                out.append(measured(s, trace.decision, trace.loss))
            rows = list(zip(*out, strict=True))
            print(
                f"| SEA {variant}, no change | {name} | {cell(list(rows[0]))} | "
                f"{cell(list(rows[1]))} |",
                flush=True,
            )
    oracle = []
    for r in range(runs):
        s = sea_shift(seed=r)
        clean = s.clean.astype(np.int8)
        oracle.append(measured(s, clean, (clean != s.y).astype(np.float64)))
    rows = list(zip(*oracle, strict=True))
    print(f"| SEA shift 0 to 3 | oracle | {cell(list(rows[0]))} | {cell(list(rows[1]))} |")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
