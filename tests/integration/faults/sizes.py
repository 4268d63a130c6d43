"""How big each fault scenario runs: ``ci`` (marker ``integration``, minutes for all of them
on two cores) or ``full`` (marker ``slow``, the sizes the reliability promise is stated
for). Tests are parametrised over both; ``-m "not slow"`` keeps the CI size only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

__all__ = ["SIZES", "Size", "size_params"]


@dataclass(frozen=True, slots=True)
class Size:
    """Counts for one run of one scenario."""

    events: int  # good feature events
    labels: int  # labels the oracle answers (distinct requests)
    bad: int = 0  # malformed messages (fuzz; hostile: per topic)
    kills: int = 0  # SIGKILLs (kill -9)
    outage_seconds: float = 0.0  # broker down (outage)
    timeout: float = 120.0  # bound on the wait for the stream to drain


SIZES: dict[str, dict[str, Size]] = {
    "fuzz": {
        "ci": Size(events=400, labels=60, bad=2_000, timeout=120),
        "full": Size(events=2_000, labels=300, bad=10_000, timeout=600),
    },
    "kill": {
        "ci": Size(events=5_000, labels=500, kills=3, timeout=240),
        "full": Size(events=50_000, labels=5_000, kills=5, timeout=1_800),
    },
    "rebalance": {
        "ci": Size(events=3_000, labels=300, timeout=180),
        "full": Size(events=30_000, labels=3_000, timeout=1_200),
    },
    "outage": {
        "ci": Size(events=2_000, labels=200, outage_seconds=20.0, timeout=180),
        "full": Size(events=20_000, labels=2_000, outage_seconds=20.0, timeout=900),
    },
    "hostile": {
        "ci": Size(events=400, labels=60, bad=1_000, timeout=120),
        "full": Size(events=2_000, labels=300, bad=10_000, timeout=600),
    },
    "numeric": {
        "ci": Size(events=200, labels=40, bad=20, timeout=90),
        "full": Size(events=2_000, labels=400, bad=200, timeout=300),
    },
}


def size_params() -> list[Any]:
    """``ci`` always, ``full`` marked ``slow``."""
    return [pytest.param("ci", id="ci"), pytest.param("full", id="full", marks=pytest.mark.slow)]
