"""The learner a model serves: adaptive by default through version 0, the label path, the
envelope and its snapshots; an envelope written before the wrapper still loads."""

from __future__ import annotations

import numpy as np
import pytest

from service.config import ModelConfig
from service.learning import DSAL, Adaptive, make_learner
from service.learning.adaptive import tracking_steps
from service.records import Label, ModelEnvelope, parse_model_envelope
from service.stream.labels.protocol import apply_label
from service.stream.models.served import (
    ServedModel,
    build_pipeline,
    initial_envelope,
    served_learner,
)

from ..memory import CFG, pending


def with_adaptive(**parts: bool) -> ModelConfig:
    return ModelConfig.model_validate({**CFG.model_dump(), "adaptive": parts})


OFF = with_adaptive(enabled=False)


def flip_stream(n: int, flip: int, seed: int = 3) -> list[tuple[list[float], int]]:
    rng = np.random.default_rng(seed)
    out = []
    for t in range(n):
        x = rng.normal(size=3)
        y = (1 if x[0] + 0.5 * x[1] > 0 else -1) * (1 if t < flip else -1)
        out.append(([float(v) for v in x], y))
    return out


def labelled(
    cfg: ModelConfig, envelope: ModelEnvelope, stream: list[tuple[list[float], int]], p: float = 0.5
) -> ModelEnvelope:
    for i, (x, y) in enumerate(stream):
        entry = pending(x, f"r{envelope.version}-{i}", query_probability=p)
        out = apply_label(
            cfg,
            envelope,
            entry,
            Label(entry.request_id, "m", y, "t", None),
            envelope.labels_offset + 1,
            now=1.0,
        )
        assert out.outcome == "applied", out.detail
        assert out.model is not None
        envelope = out.model
    return envelope


def test_version_zero_is_adaptive_by_default_and_bare_when_turned_off() -> None:
    served = ServedModel.initial("m", CFG)
    assert isinstance(served.learner, Adaptive)
    assert served.envelope.learner["format"] == "abstain.adaptive"
    assert served.learner.seed == CFG.seed
    bare = ServedModel.initial("m", OFF)
    assert isinstance(bare.learner, DSAL)
    assert bare.envelope.learner["format"] != "abstain.adaptive"


def test_an_envelope_from_before_the_wrapper_loads_wrapped_and_learns_on() -> None:
    old_learner = make_learner("dsal", n_features=4, cost=0.25, seed=0)
    old = ModelEnvelope(
        model="m",
        version=0,
        pipeline=build_pipeline(CFG).to_state(),
        learner=old_learner.to_state(),
    )
    served = ServedModel.from_envelope(CFG, old)
    assert isinstance(served.learner, Adaptive)
    champion = served.learner.champion.to_state()  # what it learned, and the tracking steps
    assert champion["learned"] == old_learner.to_state()["learned"]
    assert {
        k: v for k, v in champion["params"].items() if k not in tracking_steps(old_learner)
    } == (old_learner.to_state()["params"])
    after = labelled(CFG, old, flip_stream(5, flip=99))
    assert after.learner["format"] == "abstain.adaptive"
    assert ServedModel.from_envelope(CFG, after).learner.labels == 5
    # and an adaptive envelope served by a configuration without the wrapper: its champion
    bare = ServedModel.from_envelope(OFF, after).learner
    assert bare.to_state() == ServedModel.from_envelope(CFG, after).learner.champion.to_state()


def test_a_label_flip_through_the_label_path_is_detected_and_recovered() -> None:
    envelope = labelled(CFG, initial_envelope("m", CFG), flip_stream(700, flip=300), p=0.25)
    learner = ServedModel.from_envelope(CFG, envelope).learner
    assert learner.labels == 700
    assert learner.changes_detected >= 1
    assert learner.takeovers >= 1
    # every label since the last change was weighed by 1/p with p = 0.25
    risk = learner.risk_since_change
    assert risk.weight == pytest.approx(4.0 * risk.labels)
    assert risk.risk < 0.25  # it decides again, better than rejecting everything
    quiet = with_adaptive(detector=False)
    stuck = ServedModel.from_envelope(
        quiet, labelled(quiet, initial_envelope("m", quiet), flip_stream(700, flip=300), p=0.25)
    ).learner
    assert (stuck.changes_detected, stuck.takeovers) == (0, 0)


def test_checkpoint_then_restore_gives_the_identical_model() -> None:
    envelope = labelled(CFG, initial_envelope("m", CFG), flip_stream(400, flip=200))
    raw = envelope.to_json()
    restored = parse_model_envelope(raw, model="m")
    assert restored.to_json() == raw
    a = served_learner(CFG, dict(envelope.learner), serving=False)
    b = served_learner(CFG, dict(restored.learner), serving=False)
    assert a.to_state() == b.to_state()
    more = flip_stream(50, flip=0, seed=9)
    assert labelled(CFG, envelope, more).to_json() == labelled(CFG, restored, more).to_json()


def test_the_decisions_query_probability_is_the_explored_one() -> None:
    served = ServedModel.initial("m", CFG)
    z = served.pipeline.transform(np.array([0.1, -2.0, 3.0]))
    labels, _, probs, _ = served.learner.decide_many(np.array([z]), coins=np.array([0.9]))
    assert served.learner.exploring
    assert probs[0] >= 0.5  # the floor of the first labels, the probability it asks with
    plain = ServedModel.initial("m", OFF).learner.decide_many(np.array([z]), coins=[0.9])
    assert labels[0] == plain[0][0]  # the same champion decides


def test_the_gauges_show_the_risk_since_the_last_change() -> None:
    from prometheus_client import CollectorRegistry  # noqa: PLC0415 - this test only

    from service.metrics import Metrics  # noqa: PLC0415

    envelope = labelled(CFG, initial_envelope("m", CFG), flip_stream(40, flip=99), p=0.5)
    served = ServedModel.from_envelope(CFG, envelope)
    risk, labels = served.gauges()["since_change"]
    assert labels == 40
    assert risk == pytest.approx(served.learner.risk_since_change.risk)
    registry = CollectorRegistry()
    Metrics(registry, models=["m"]).set_model("m", **served.gauges())
    assert registry.get_sample_value("abstain_labels_since_change", {"model": "m"}) == 40
    assert registry.get_sample_value("abstain_risk_since_change", {"model": "m"}) == risk
    assert ServedModel.initial("m", OFF).gauges()["since_change"] is None


def test_a_declared_model_never_centres_its_buckets_so_a_label_and_a_version_stay_sparse() -> None:
    """A declared model's standardisers never centre its hashed buckets: after labels
    with a worker's moments, an event's row is zero on every bucket the event did not set,
    and the rows the wrapper remembers in a version are as sparse as their events."""
    from service.features import encoder_of
    from service.learning.moments import Moments
    from service.learning.preprocessing import OnlineStandardizer
    from service.records.wire import FeatureMoments

    cfg = ModelConfig.model_validate(
        {
            "algorithm": "dsol",
            "fields": {
                "hash_bits": 8,
                "fields": {"amount": "number", "country": "category", "text": "tokens"},
            },
        }
    )
    encoder = encoder_of(cfg.fields)  # type: ignore[arg-type]
    rng = np.random.default_rng(8)

    def event() -> list[float]:
        words = [f"w{int(i)}" for i in rng.zipf(1.3, 12) if i < 400]
        return encoder.dense(
            {"amount": float(rng.normal(50, 10)), "country": f"c{rng.integers(9)}", "text": words}
        ).tolist()

    envelope = initial_envelope("m", cfg)
    steps = ServedModel.from_envelope(cfg, envelope).pipeline.steps
    first, second = steps[:2]
    assert isinstance(first, OnlineStandardizer)
    assert isinstance(second, OnlineStandardizer)
    assert (first.passes_from, second.squares_from) == (1, 1)
    assert cfg.moments_inputs == 1  # the scorers gather the number's moments alone
    for i in range(60):
        rows = [event() for _ in range(5)]
        seen = Moments(cfg.moments_inputs)
        seen.add_many([row[:1] for row in rows])
        moments = FeatureMoments(seen.count, tuple(seen.mean.tolist()), tuple(seen.m2.tolist()))
        entry = pending(rows[-1], f"r{i}", moments=moments)
        y = 1 if rows[-1][0] > 50 else -1
        out = apply_label(
            cfg, envelope, entry, Label(entry.request_id, "m", y, "t", None), i, now=1.0
        )
        assert out.outcome == "applied", out.detail
        assert out.model is not None
        envelope = out.model
    served = ServedModel.from_envelope(cfg, envelope)
    for _ in range(20):
        x = np.array(event())
        z = served.pipeline.transform(x)
        assert np.array_equal(z[1:-1] == 0.0, x[1:] == 0.0)  # the intercept last
    remembered = envelope.learner["recall"]["labels"]
    assert len(remembered) >= 40
    for item in remembered:  # ~13 of 258 inputs set: the number, a category, the words
        assert "x" not in item  # written as where it is set
        assert 3 <= np.count_nonzero(item["x_to"]) <= 16
        assert len(item["x_at"]) == len(item["x_to"])
