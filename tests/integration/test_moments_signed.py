"""With ``snapshot_key``, a writer of the label-requests topic without the key cannot touch
the scaling, on a real broker.

After 300 honest events and their labels (every request's moments signed by the worker's
scorer and merged by its learner), 30 well-formed label requests written straight to the
topic carry moments that lie (a variance of 1e12 in every feature, 10**12 rows), unsigned or
with a made-up signature. Every one is dead-lettered (``moments``, the detail saying why) at
its own offset and counted (``abstain_moments_refused_total{reason}``), its label is still
applied, the first standardiser does not move, and the decisions on a probe set are exactly
those of the model the same labels make without any moments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from faults.moments import LIES, Taught, lie, taught, versions

from service.learning import Pipeline

pytestmark = pytest.mark.integration

Service = KafkaIO = Any  # fixtures' types live in conftest.py

KEY = "signed-moments-key-0123456789abcdef"  # noqa: S105 - >= 32 characters


@pytest.fixture(scope="module")
def keyed(service_factory: Callable[..., Service], kafka_io: KafkaIO) -> Taught:
    """A keyed model taught 300 honest events in batches, every request answered."""
    return taught(service_factory, kafka_io, snapshot_key=KEY)


def test_the_workers_own_signed_moments_are_merged(keyed: Taught, kafka_io: KafkaIO) -> None:
    carried = [q["moments"] for q in keyed.requests if q["moments"] is not None]
    assert carried
    assert all(m["signature"] for m in carried)
    newest = versions(kafka_io, keyed.service)[len(keyed.requests)]
    first = Pipeline.from_state(newest["pipeline"]).steps[0]
    assert first.count == sum(m["count"] for m in carried)  # every record merged, in full
    for reason in ("unsigned", "bad_signature", "mean", "spread"):
        refused = {"model": "m", "reason": reason}
        assert keyed.worker.metric("abstain_moments_refused_total", refused) == 0


@pytest.mark.parametrize("forgery", ["unsigned", "bad_signature"])
def test_thirty_lying_unsigned_moments_are_refused_and_change_fewer_than_5_percent_of_decisions(
    keyed: Taught, kafka_io: KafkaIO, forgery: str
) -> None:
    def claimed(first: Any) -> dict[str, Any]:
        moments: dict[str, Any] = {
            "count": 10**12,
            "mean": first.mean.tolist(),
            "m2": [1e12 * 10**12] * 3,
        }
        if forgery == "bad_signature":
            moments["signature"] = "v1:0123456789abcdef:" + "ab" * 32
        return moments

    out = lie(kafka_io, keyed.service, forgery, claimed, 21 if forgery == "unsigned" else 22)
    assert out.changed < 0.05, f"{out.changed:.1%} of the probe decisions changed"
    assert out.changed == 0.0  # the labels alone made the model
    first = Pipeline.from_state(out.before["pipeline"]).steps[0]
    assert Pipeline.from_state(out.after["pipeline"]).steps[0].count == first.count
    assert sorted(d["offset"] for d in out.dead) == out.offsets
    words = "unsigned" if forgery == "unsigned" else "bad signature"
    assert all(words in d["detail"] for d in out.dead)
    refused = {"model": "m", "reason": forgery}
    assert keyed.worker.metric("abstain_moments_refused_total", refused) == LIES
