"""A writer of the label-requests topic cannot take over the model's scaling, on a real
broker and without a snapshot key (the default settings).

After 300 honest events and their labels, 30 well-formed label requests (ids derived with
the public hash, made-up events of the real distribution, honest labels for them) claim
moments that lie: first a variance of 1e12 in every feature, then a mean six standard
deviations out, each claiming 10**12 rows. Every one of their moments is refused: each
request is dead-lettered (``moments``) at its own offset and counted
(``abstain_moments_refused_total``), its label is still applied, the first standardiser
does not move, and the model served is exactly the one the same labels make without any
moments: of the decisions on a fixed probe set, none differs from that model's (before the
fix, 83 % did: the statistics rested wholly on the lie).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from faults.moments import LIES, Taught, lie, taught

from service.learning import Pipeline

pytestmark = pytest.mark.integration

Service = KafkaIO = Any  # fixtures' types live in conftest.py


@pytest.fixture(scope="module")
def honest(service_factory: Callable[..., Service], kafka_io: KafkaIO) -> Taught:
    """A model taught 300 honest events in batches, every request answered (no key)."""
    return taught(service_factory, kafka_io)


def _variance(first: Any) -> dict[str, Any]:
    return {"count": 10**12, "mean": first.mean.tolist(), "m2": [1e12 * 10**12] * 3}


def _shift(first: Any) -> dict[str, Any]:
    return {
        "count": 10**12,
        "mean": (first.mean + 6.0 * first.std).tolist(),
        "m2": (first.std**2 * 10**12).tolist(),
    }


@pytest.mark.parametrize("kind", ["variance", "shift"])
def test_thirty_lying_moments_are_refused_and_change_fewer_than_5_percent_of_decisions(
    honest: Taught, kafka_io: KafkaIO, kind: str
) -> None:
    claimed = _variance if kind == "variance" else _shift
    out = lie(kafka_io, honest.service, kind, claimed, 11 if kind == "variance" else 12)
    changed = out.changed
    by_labels = f"{out.learnt:.1%} by the labels"
    assert changed < 0.05, f"{changed:.1%} of the probe decisions changed ({by_labels})"
    # the moments never reached the scaling: exactly the model of the labels alone
    assert changed == 0.0
    assert [s["learned"] for s in out.after["pipeline"]["steps"]] == [
        s["learned"] for s in out.control.to_state()["steps"]
    ]
    first = Pipeline.from_state(out.before["pipeline"]).steps[0]
    assert Pipeline.from_state(out.after["pipeline"]).steps[0].count == first.count
    # each lie dead-lettered at its own offset, with the reason and the feature named
    assert sorted(d["offset"] for d in out.dead) == out.offsets
    assert all(d["detail"].startswith("feature ") for d in out.dead)
    reason = "spread" if kind == "variance" else "mean"
    refused = {"model": "m", "reason": reason}
    assert honest.worker.metric("abstain_moments_refused_total", refused) == LIES
