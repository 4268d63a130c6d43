"""Shared test helpers for the learning tests: Hypothesis strategies and synthetic streams."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as hst

from service.learning import DRAL, DSAL, DSOL, KernelDRAL, KernelDSAL, KernelDSOL, make_learner
from service.learning.registry import ALGORITHM_NAMES

costs = hst.floats(min_value=0.01, max_value=0.49)
gammas = hst.floats(min_value=0.1, max_value=5.0)
rhos = hst.floats(min_value=0.0, max_value=5.0)
margins = hst.floats(min_value=-8.0, max_value=8.0)
huge = hst.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
labels = hst.sampled_from([1.0, -1.0])


@hst.composite
def vectors(draw: Any, n: int, scale: float = 2.0) -> np.ndarray:
    """A finite float64 vector of length ``n`` with entries in ``[-scale, scale]``."""
    values = draw(
        hst.lists(
            hst.floats(min_value=-scale, max_value=scale, allow_nan=False),
            min_size=n,
            max_size=n,
        )
    )
    return np.array(values, dtype=np.float64)


LEARNER_FACTORIES = {
    "dral": lambda n, **kw: DRAL(n_features=n, cost=0.25, eta=0.5, **kw),
    "dsal": lambda n, **kw: DSAL(n_features=n, cost=0.25, eta=0.5, **kw),
    "dsol": lambda n, **kw: DSOL(n_features=n, cost=0.25, eta=0.5, **kw),
    "kernel-dral": lambda n, **kw: KernelDRAL(
        n_features=n, cost=0.25, eta=0.5, budget=7, kernel={"kind": "rbf", "gamma": 0.3}, **kw
    ),
    "kernel-dsal": lambda n, **kw: KernelDSAL(
        n_features=n,
        cost=0.25,
        eta=0.5,
        budget=7,
        kernel={"kind": "polynomial", "degree": 2, "gamma": 0.5, "coef0": 1.0},
        **kw,
    ),
    "kernel-dsol": lambda n, **kw: KernelDSOL(
        n_features=n, cost=0.25, eta=0.5, budget=7, kernel="linear", **kw
    ),
}
"""A small configuration for the algorithms the defaults would not exercise well (kernel
budgets small so removal happens, one kernel each); every other learner of the registry is
built by :func:`learner_factory` with its defaults."""


def learner_factory(name: str) -> Any:
    """How the suites build the learner ``name`` of the registry: its small configuration,
    else :func:`~service.learning.make_learner` with what every learner takes (cost 0.25,
    eta 0.5) and its own defaults for the rest."""
    known = LEARNER_FACTORIES.get(name)
    if known is not None:
        return known
    return lambda n, **kw: make_learner(name, n_features=n, cost=0.25, eta=0.5, **kw)


#: every learner the registry knows: what the contract suite runs over
LEARNER_NAMES: tuple[str, ...] = ALGORITHM_NAMES


def noisy_stream(
    n: int, d: int, seed: int, *, scale: float = 1.0, sharpness: float = 3.0
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian features, labels from a logistic model around a random hyperplane.

    ``P(y = +1 | x) = 1 / (1 + exp(-sharpness * (u . x + 0.3)))`` with a unit vector ``u``:
    separable far from the plane, noisy near it, so rejecting has a real use. ``scale``
    multiplies the features after the labels are drawn (to make badly scaled streams).
    """
    rng = np.random.default_rng(seed)
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    X = rng.normal(size=(n, d))
    p = 1.0 / (1.0 + np.exp(-sharpness * (X @ u + 0.3)))
    y = np.where(rng.random(n) < p, 1.0, -1.0)
    return X * scale, y
