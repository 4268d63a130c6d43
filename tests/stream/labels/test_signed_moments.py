"""Signed moments (``snapshot_key``): the scorer signs the moments it attaches, the learner
merges signed ones unjudged and refuses unsigned or tampered ones (no Kafka)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from service.learning import Pipeline
from service.learning.moments import Moments
from service.records import Champions, Label, PendingEntry, parse_label_request
from service.records.moments import moments_trust
from service.records.signing import Signer, moments_message
from service.records.wire import FeatureMoments
from service.stream.labels.protocol import apply_label
from service.stream.models.book import signer_for
from service.stream.models.served import initial_envelope
from service.stream.scoring.scorer import Scorer, feature_moments

from ..memory import CFG, MemoryKafka, msg, outputs, pending, score, settings, trained

KEY = "signed-moments-key-0123456789abcdef"  # noqa: S105 - a test key, >= 32 characters
SIGNER = Signer(KEY.encode())


def _moments(rows: np.ndarray) -> Moments:
    seen = Moments(rows.shape[1])
    seen.add_many(rows)
    return seen


def _entry(x: list[float], rid: str, carried: FeatureMoments | None) -> PendingEntry:
    entry = pending(x, rid)
    return replace(entry, request=replace(entry.request, moments=carried))


def _signed(rows: np.ndarray, rid: str, signer: Signer = SIGNER) -> FeatureMoments:
    return feature_moments(_moments(rows), signer=signer, model="m", request_id=rid)


def test_the_signature_covers_model_request_id_count_mean_and_m2() -> None:
    carried = _signed(np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]]), "r1")
    assert carried.signature is not None
    header = carried.signature.encode()
    m, rid, c, mean, m2 = "m", "r1", carried.count, carried.mean, carried.m2
    assert SIGNER.verify(*moments_message(m, rid, c, mean, m2), header) is None
    changed = [
        ("other", rid, c, mean, m2),
        (m, "r2", c, mean, m2),
        (m, rid, c + 1, mean, m2),
        (m, rid, c, (mean[0] + 1e-9, *mean[1:]), m2),
        (m, rid, c, mean, (*m2[:2], m2[2] * 2)),
    ]
    for parts in changed:
        assert SIGNER.verify(*moments_message(*parts), header) == "bad_signature"
    # the previous key still verifies during a rotation; an unknown key does not
    rotated = Signer(b"n" * 32, previous=[KEY.encode()])
    assert rotated.verify(*moments_message(m, rid, c, mean, m2), header) is None
    assert Signer(b"z" * 32).verify(*moments_message(m, rid, c, mean, m2), header) == (
        "bad_signature"
    )


async def test_a_keyed_scorer_writes_signed_moments_that_survive_the_topic() -> None:
    s = settings(snapshot_key=KEY)
    kafka, registry = MemoryKafka(), CollectorRegistry()
    out = outputs(kafka, s, registry)
    book = {"m": trained(CFG, 30)}
    scorer = Scorer(
        s,
        lambda: (book, Champions()),
        out,
        out.metrics,
        clock=lambda: 5.0,
        signer=signer_for(s),
    )
    rows = np.random.default_rng(3).normal(size=(40, 3))
    for start in range(0, 40, 8):
        await score(
            scorer,
            [
                msg({"id": f"v{i}", "features": rows[i].tolist()}, i)
                for i in range(start, start + 8)
            ],
        )
    raw = [r.value or b"" for r in kafka.sent("abstain.label-requests")]
    requests = [parse_label_request(v) for v in raw]
    carrying = [q for q in requests if q.moments is not None]
    assert carrying
    for value, q in zip(raw, requests, strict=True):
        assert value == q.to_json()  # the fast encoder's bytes are the record's
        if q.moments is not None:
            assert orjson.loads(value)["moments"]["signature"] == q.moments.signature
            assert moments_trust(SIGNER, q) == "trusted"
            assert moments_trust(Signer(b"z" * 32), q) == "bad_signature"


def _shifted() -> tuple[np.ndarray, np.ndarray]:
    """Events nearly constant for a long while, then varying: an abrupt honest change."""
    rng = np.random.default_rng(4)
    still = rng.normal(0.5, 0.01, 300)
    calm = np.column_stack([rng.normal(size=300), still, rng.normal(size=300)])
    moved = np.column_stack([rng.normal(size=300), rng.normal(3.0, 1.0, 300), rng.normal(size=300)])
    return calm, moved


def _teach(trust_signer: Signer | None, sign: bool) -> tuple[list[object], Pipeline]:
    """Labels in batches of 20 events, calm then moved; each request carries the batch's
    moments (signed when ``sign``); verdicts with ``trust_signer``."""
    calm, moved = _shifted()
    rows = np.vstack([calm, moved])
    state = initial_envelope("m", CFG)
    refused: list[object] = []
    for i in range(0, rows.shape[0], 20):
        rid = f"r{i}"
        carried = (
            _signed(rows[i : i + 20], rid) if sign else feature_moments(_moments(rows[i : i + 20]))
        )
        entry = _entry(rows[i + 19].tolist(), rid, carried)
        y = 1 if rows[i + 19, 0] > 0 else -1
        out = apply_label(
            CFG,
            state,
            entry,
            Label(rid, "m", y, "t", None),
            i,
            now=1.0,
            trust=moments_trust(trust_signer, entry.request),
        )
        assert out.model is not None  # the label is applied in every case
        state = out.model
        refused.append(None if out.moments_refused is None else out.moments_refused.kind)
    return refused, Pipeline.from_state(dict(state.pipeline))


def test_trusted_moments_follow_an_abrupt_change_that_the_gate_refuses() -> None:
    gated, gate_pipe = _teach(None, sign=False)
    trusted, trust_pipe = _teach(SIGNER, sign=True)
    after = gated[15:]  # the moved events' records
    assert sum(k is not None for k in after) >= len(after) // 2  # the gate refuses most
    assert trusted == [None] * len(trusted)
    first = trust_pipe.steps[0]
    assert first.count == 600  # every event, once
    assert first.mean[1] == pytest.approx((0.5 + 3.0) / 2, abs=0.15)
    assert first.std[1] > 1.0  # the variance of the change, taken at once
    assert gate_pipe.steps[0].count < first.count


@pytest.mark.parametrize("forgery", ["unsigned", "tampered", "other key"])
def test_moments_not_signed_by_the_key_are_refused_and_the_label_still_applied(
    forgery: str,
) -> None:
    rows = np.random.default_rng(6).normal(size=(20, 3))
    honest = _entry(rows[-1].tolist(), "r1", _signed(rows, "r1"))
    state = apply_label(
        CFG,
        initial_envelope("m", CFG),
        honest,
        Label("r1", "m", 1, "t", None),
        0,
        now=1.0,
        trust=moments_trust(SIGNER, honest.request),
    ).model
    assert state is not None
    signed = _signed(rows[:5] * 1e6, "r2")
    carried = {
        "unsigned": replace(signed, signature=None),
        "tampered": replace(signed, count=10**12),
        "other key": _signed(rows[:5] * 1e6, "r2", Signer(b"z" * 32)),
    }[forgery]
    entry = _entry(rows[0].tolist(), "r2", carried)
    trust = moments_trust(SIGNER, entry.request)
    out = apply_label(CFG, state, entry, Label("r2", "m", -1, "t", None), 1, now=2.0, trust=trust)
    assert out.outcome == "applied"
    assert out.model is not None
    assert out.model.version == state.version + 1
    assert out.moments_refused is not None
    assert out.moments_refused.kind == ("unsigned" if forgery == "unsigned" else "bad_signature")
    assert out.moments_refused.detail
    before = Pipeline.from_state(dict(state.pipeline)).steps[0]
    first = Pipeline.from_state(dict(out.model.pipeline)).steps[0]
    assert (first.count, first.mean.tolist()) == (before.count, before.mean.tolist())
    # the same record gives the same verdict and the same model again (rebuilds, corrections)
    again = apply_label(CFG, state, entry, Label("r2", "m", -1, "t", None), 1, now=2.0, trust=trust)
    assert again.model is not None
    assert again.model.pipeline == out.model.pipeline


@pytest.mark.parametrize("keyed", [False, True])
def test_moments_of_another_width_are_refused_signed_or_not_and_the_label_still_applied(
    keyed: bool,
) -> None:
    rows = np.random.default_rng(7).normal(size=(20, 3))
    state = initial_envelope("m", CFG)
    for width in (1, 2):  # the model gathers all 3 of its features
        rid = f"r{width}"
        carried = _signed(rows[:, :width], rid) if keyed else _signed(rows[:, :width], rid, None)
        entry = _entry(rows[-1].tolist(), rid, carried)
        trust = moments_trust(SIGNER, entry.request) if keyed else None
        assert trust in ((None,) if not keyed else ("trusted",))
        out = apply_label(
            CFG, state, entry, Label(rid, "m", 1, "t", None), width, now=1.0, trust=trust
        )
        assert out.outcome == "applied"
        assert out.model is not None
        assert out.moments_refused is not None
        assert out.moments_refused.kind == "width"
        assert f"moments of {width} features" in out.moments_refused.detail
        first = Pipeline.from_state(dict(out.model.pipeline)).steps[0]
        assert first.count == Pipeline.from_state(dict(state.pipeline)).steps[0].count
        state = out.model
