"""The served risk estimate's 95 % interval holds the true risk from the first line the demo
prints (30 labels applied): the model served as the demo serves it (DSAL at d = 0.25 with a
5 % audit, Phishing in random orders), each event decided by the served pipeline and
learner with the scorer's coins and audit, each asked event's label applied ``DELAY`` events
later (the demo's labeller answers after a second) through the learner's own path
(:func:`~service.stream.labels.protocol.apply_label`, the moments of the
events since the last request attached), and the interval read from the version served
(:meth:`~service.stream.models.served.ServedModel.interval`) against the true 0-d-1 risk of
every decision served so far."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.config import ModelConfig
from service.datasets import load_dataset, resolve_dataset_path
from service.learning.moments import Moments
from service.records import Label, LabelRequest, PendingEntry, request_id
from service.records.ids import coins
from service.stream.labels.protocol import apply_label
from service.stream.models.served import ServedModel, initial_envelope
from service.stream.scoring.scorer import feature_moments

FIRST_LINE = 30  # service.demo.MIN_LABELS: the first line with an estimate
LAST_LINE = 60
ORDERS = 50
COST = 0.25
AUDIT = 0.05  # the demo's audit rate: weights capped at 1 / 0.05
MAX_WEIGHT = 1.0 / AUDIT
DELAY = 20  # events decided while a label is on its way (the demo: 1 s at 20 events/s)


@dataclass(frozen=True)
class Line:
    """What a live line shows once ``labels`` are applied, and the truth beside it."""

    labels: int
    true_risk: float
    low: float
    high: float

    @property
    def covered(self) -> bool:
        return self.low <= self.true_risk <= self.high


def served_lines(x: np.ndarray, y: np.ndarray, config: ModelConfig, seed: int) -> list[Line]:
    """The lines of one random order, from the first with an estimate to ``LAST_LINE``."""
    envelope = initial_envelope("m", config)
    served = ServedModel.from_envelope(config, envelope)
    seen = Moments(x.shape[1])
    loss, lines, offset = 0.0, [], 0
    on_their_way: list[tuple[int, LabelRequest, Label]] = []  # (due at event, request, label)
    for t, i in enumerate(np.random.default_rng(seed).permutation(len(y)).tolist(), start=1):
        row, event = x[i], f"{seed}-{i}"
        seen.add_many(row[None, :])
        z = served.pipeline.transform_many(row[None, :])
        labels, scores, probs, queries = served.learner.decide_many(
            z, coins=coins("m", [event], served.version)
        )
        decided, p = int(labels[0]), float(probs[0])
        asked = bool(queries[0]) or coins("m", [event], served.version, "audit")[0] < AUDIT
        p = p + AUDIT - p * AUDIT  # the scorer's: asked if either coin says so
        loss += COST if decided == 0 else float(decided != y[i])
        if asked:
            request = LabelRequest(
                request_id=request_id("m", event),
                event_id=event,
                model="m",
                features=row.tolist(),
                score=float(scores[0]),
                rho=float(served.learner.rho),
                decided_label=decided,
                query_probability=p,
                model_version=served.version,
                requested_at=0.0,
                expires_at=1e12,
                priority=0.5,
                moments=feature_moments(seen.take()),
            )
            label = Label(request.request_id, "m", int(y[i]), "", None)
            on_their_way.append((t + DELAY, request, label))
        while on_their_way and on_their_way[0][0] <= t:
            _, request, label = on_their_way.pop(0)
            out = apply_label(
                config, envelope, PendingEntry(request, offset), label, offset, now=1.0,
                max_weight=MAX_WEIGHT,
            )  # fmt: skip
            offset += 1
            assert out.model is not None
            envelope = out.model
            served = ServedModel.from_envelope(config, envelope)
            r = served.interval()
            if r.labels >= FIRST_LINE:
                lines.append(Line(r.labels, loss / t, r.low, r.high))
                if r.labels >= LAST_LINE:
                    return lines
    return lines


def test_the_live_interval_holds_the_true_risk_from_the_first_line() -> None:
    x, y = load_dataset(resolve_dataset_path("phishing"))
    config = ModelConfig(algorithm="dsal", cost=COST, n_features=x.shape[1], audit_rate=AUDIT)
    runs = [served_lines(x, y, config, seed) for seed in range(ORDERS)]
    assert all(run and run[0].labels == FIRST_LINE for run in runs)
    first = np.mean([run[0].covered for run in runs])
    every = np.mean([line.covered for run in runs for line in run])
    assert first >= 0.9, f"the first line's interval held the true risk in {first:.0%}"
    assert every >= 0.9, f"the lines' intervals held the true risk in {every:.0%}"
    # and it says something: narrower than [0, 1] by far, and narrowing as labels come
    assert np.median([run[0].high - run[0].low for run in runs]) < 0.3
    assert np.median([run[-1].high - run[-1].low for run in runs]) < 0.15
