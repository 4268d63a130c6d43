"""What starting the challengers of a change costs a wide model: the CPU time of
:func:`~service.learning.adaptive.challengers.challenger_for` (a mirror and a tail, from the
weights of a snapshot) for a normalised DSOL champion of ``2^bits + 4`` inputs that has
learnt 300 rows of about 300 entries each, and the time of one fresh challenger. No Kafka.

    python loadtest/challenger_cost.py [--bits 12 16 18] [--repeats 5]

Prints per width the median milliseconds a challenger over ``--repeats`` rounds. Run it
from two trees (a ``git worktree`` of the other) to compare two ways of making them.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.learning import DSOL  # noqa: E402
from service.learning.adaptive.challengers import challenger_for  # noqa: E402
from service.learning.sparse import SparseRow  # noqa: E402


def champion(bits: int) -> DSOL:
    """A normalised DSOL of ``2^bits + 4`` inputs after 300 labelled rows."""
    n = (1 << bits) + 4
    out = DSOL(n_features=n, cost=0.25, update_rule="normalized")
    rng = np.random.default_rng(0)
    for _ in range(300):
        at = np.unique(rng.integers(0, n, 300))
        out.update(SparseRow(at, np.ones(at.size), n), 1 if rng.random() < 0.5 else -1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--bits", type=int, nargs="+", default=[12, 16, 18])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    print("bits  mirror+tail ms a challenger  fresh ms")
    for bits in args.bits:
        model = champion(bits)
        w = np.array(model.w)  # a snapshot's weights, as the recall gives them
        made, fresh = [], []
        for _ in range(args.repeats):
            tic = time.process_time()
            for kind in ("mirror", "tail"):
                challenger_for(model, kind, rho=0.5, w=w)
            made.append((time.process_time() - tic) / 2)
            tic = time.process_time()
            challenger_for(model, "fresh")
            fresh.append(time.process_time() - tic)
        print(
            f"{bits:4d}  {statistics.median(made) * 1e3:27.1f}  "
            f"{statistics.median(fresh) * 1e3:8.1f}"
        )


if __name__ == "__main__":
    main()
