"""What one label costs the served learner at each width of a hashed model (library only).

Usage: ``python loadtest/label_width.py [--bits 12,14,16,18] [--labels 400] [--tokens 300]
[--repeats 3]``.

A model of four numbers and ``2^bits`` hashed buckets (the served stack: the two
standardisers, the intercept, an adaptive DSAL with its detectors, challengers and recall)
learns ``--labels`` labels of events that set the numbers and ``--tokens`` buckets each,
drawn from 5,000 words (labels that flip halfway, so the challengers run). Each label is
learnt as the learn loop does: the first standardiser merges the moments of the numbers
every 20 labels, the second learns the row, the learner learns the transformed row.

Two ways in, alternating by round: ``rows``, each event as the entries it sets (what a
declared model's label request gives the learner); ``whole``, the same event as its whole
vector (what a learner took before rows). Printed: CPU ms per label (the median of
``--repeats`` rounds), the first one at the narrowest width, and each width's ratio to it.
A width the learner does not feel prints ratios near 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.learning import serving_pipeline  # noqa: E402
from service.learning.adaptive.parts import Parts, serving_learner  # noqa: E402
from service.learning.moments import Moments  # noqa: E402
from service.learning.sparse import SparseRow  # noqa: E402

NUMBERS = 4
WORDS = 5000


def stream(bits: int, labels: int, tokens: int, seed: int) -> list[tuple[SparseRow, int]]:
    """Rows of ``4 + 2^bits`` inputs (four numbers, then ``tokens`` buckets), labelled."""
    rng = np.random.default_rng(seed)
    width = NUMBERS + (1 << bits)
    bucket = rng.integers(0, 1 << bits, size=WORDS) + NUMBERS  # each word's bucket
    out = []
    for t in range(labels):
        words = rng.integers(0, WORDS, size=tokens)
        idx = np.concatenate((np.arange(NUMBERS), bucket[words]))
        val = np.concatenate((rng.normal(size=NUMBERS), np.ones(tokens)))
        y = 1 if (val[0] > 0) != (1 in words) else -1
        out.append((SparseRow.of(idx, val, width), y if t < labels // 2 else -y))
    return out


def learn(bits: int, rows: list[tuple[SparseRow, int]], whole: bool) -> float:
    """CPU ms per label of the served stack learning ``rows`` (as whole vectors if
    ``whole``)."""
    width = NUMBERS + (1 << bits)
    pipeline = serving_pipeline(width, hashed_from=NUMBERS)
    learner = serving_learner(
        "dsal",
        n_features=width + 1,
        cost=0.25,
        seed=0,
        hyperparameters={"update_rule": "normalized"},
        parts=Parts(),
    )
    seen = Moments(NUMBERS)
    spent = 0.0
    for t, (row, y) in enumerate(rows):
        seen.add_many(row.toarray()[None, :NUMBERS])
        x = row.toarray() if whole else row
        tic = time.process_time()
        moments = seen if t % 20 == 0 else None
        with np.errstate(all="ignore"):
            pipeline.learn_label(x, moments, trusted=True)
            learner.update(pipeline.transform(x), y)
        spent += time.process_time() - tic
        if moments is not None:
            seen = Moments(NUMBERS)
    return 1e3 * spent / len(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bits", default="12,14,16,18")
    p.add_argument("--labels", type=int, default=400)
    p.add_argument("--tokens", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    widths = [int(b) for b in args.bits.split(",")]
    got: dict[tuple[str, int], list[float]] = {}
    for r in range(args.repeats):
        for bits in widths:
            rows = stream(bits, args.labels, args.tokens, seed=r)
            for way in ("rows", "whole") if r % 2 == 0 else ("whole", "rows"):
                got.setdefault((way, bits), []).append(learn(bits, rows, way == "whole"))
    print(f"{args.labels} labels of {args.tokens} tokens, medians of {args.repeats} rounds")
    print(f"buckets   rows ms/label (x 2^{widths[0]})   whole ms/label (x 2^{widths[0]})")
    base = {way: statistics.median(got[(way, widths[0])]) for way in ("rows", "whole")}
    for bits in widths:
        a = statistics.median(got[("rows", bits)])
        b = statistics.median(got[("whole", bits)])
        print(
            f"2^{bits:<6}  {a:8.3f} ({a / base['rows']:5.2f}x)"
            f"          {b:8.3f} ({b / base['whole']:5.2f}x)"
        )


if __name__ == "__main__":
    main()
