"""What the adaptive wrapper costs per decision and per label, against DSAL alone.

Usage: ``python loadtest/replay/peers/timing.py`` (best of 5 x 2,000 decisions; best of 3 x
2,000 labels learned from scratch; widths 5 and 69, svmguide1's and Phishing's with an
intercept; the wrapper's exploration at the start is off so both ask the same).
"""

from __future__ import annotations

import sys
import timeit
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from service.learning import DSAL  # noqa: E402
from service.learning.adaptive import Adaptive  # noqa: E402


def make(name: str, n: int) -> Any:
    learner = DSAL(n_features=n, cost=0.25)
    return learner if name == "dsal" else Adaptive(learner, explore_start=0)


def learn(model: Any, X: np.ndarray, y: np.ndarray) -> Any:
    for x, label in zip(X, y.tolist(), strict=True):
        model.update(x, label)
    return model


def fresh(name: str, n: int, X: np.ndarray, y: np.ndarray) -> Any:
    return learn(make(name, n), X, y)


def decide(model: Any, rows: np.ndarray) -> None:
    for x in rows:
        model.decide(x, coin=0.5)


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"{'width':>5} {'learner':15} {'decide (us)':>12} {'update (us)':>12}")
    for n in (5, 69):
        X = np.c_[rng.normal(size=(4000, n - 1)), np.ones(4000)]
        y = np.where(X[:, 0] > 0, 1, -1)
        for name in ("dsal", "adaptive(dsal)"):
            model = learn(make(name, n), X[:2000], y[:2000])
            d = timeit.repeat(partial(decide, model, X[2000:]), number=1, repeat=5)
            u = timeit.repeat(partial(fresh, name, n, X[:2000], y[:2000]), number=1, repeat=3)
            print(f"{n:>5} {name:15} {min(d) / 2000 * 1e6:12.2f} {min(u) / 2000 * 1e6:12.2f}")


if __name__ == "__main__":
    main()
