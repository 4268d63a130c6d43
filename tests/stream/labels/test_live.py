"""The objects a label keeps live for the next one (protocol.LIVE) change no
byte of what is written: a stream of labels applied with them, and with the states read
back before every label, writes the same versions; a version once written never changes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import service.stream.labels.protocol as protocol
from service.config import ModelConfig
from service.learning.moments import Moments
from service.records import Label, LabelRequest, ModelEnvelope, PendingEntry
from service.records.state import parse_model_envelope
from service.records.wire import FeatureMoments
from service.stream.labels.protocol import (
    LIVE,
    LabelOutcome,
    LiveModels,
    apply_label,
    apply_shadow_label,
)
from service.stream.models.served import initial_envelope

N = 240  # labels; the concept flips at N // 2
D = 6  # features


def _config(algorithm: str, **settings: Any) -> ModelConfig:
    return ModelConfig.model_validate({"algorithm": algorithm, "n_features": D, **settings})


CHAMPION = _config("dsal")  # adaptive, as by default
QUIET = _config("dsal", adaptive={"challengers": False, "explore": False})  # other parts
SHADOW = _config("dral")


def _moments(rows: np.ndarray) -> FeatureMoments:
    m = Moments(rows.shape[1])
    m.add_many(rows)
    return FeatureMoments(m.count, tuple(m.mean.tolist()), tuple(m.m2.tolist()))


def _request(i: int, x: np.ndarray, version: int, moments: FeatureMoments | None) -> LabelRequest:
    return LabelRequest(
        request_id=f"r{i}",
        event_id=f"e{i}",
        model="m",
        features=x.tolist(),
        score=0.0,
        rho=1.0,
        decided_label=(-1, 0, 1)[i % 3],
        query_probability=(0.3, 0.05, 1.0, 0.6)[i % 4],
        model_version=version,
        requested_at=0.0,
        expires_at=1e12,
        priority=0.5,
        shadow_labels={"s": (1, -1, 0)[i % 3]} if i % 5 else {},
        moments=moments,
    )


def _outcome(out: LabelOutcome) -> tuple[Any, ...]:
    """Everything a label's outcome says (the model by its bytes)."""
    return (
        out.outcome,
        out.reason,
        out.detail,
        out.encode() if out.model is not None else None,
        out.pending.to_json() if out.pending is not None else None,
        out.iw_loss,
        out.turnaround,
        out.clipped,
        out.changes,
        out.takeovers,
        out.moments_refused,
    )


@dataclass
class _Run:
    """What a stream wrote, and every version it made (to check none changed later)."""

    outcomes: list[tuple[Any, ...]] = field(default_factory=list)
    versions: list[tuple[ModelEnvelope, bytes]] = field(default_factory=list)

    def record(self, out: LabelOutcome) -> None:
        self.outcomes.append(_outcome(out))
        if out.model is not None:  # its bytes as they are now, before the objects move on
            self.versions.append((out.model, out.encode()))


def _stream(read_back: bool) -> _Run:
    """Labels of a concept that flips halfway for champion ``m`` (DSAL) and its shadow ``s``
    (DRAL), with moments (two implausible), a redelivery, a non-finite row (refused),
    versions replaced by equal ones read from their bytes and by an older one (a rollback),
    a label applied twice to one version (the first result dropped, as when its write is
    lost) and the champion's adaptive parts changed for a while; ``read_back``: the live
    objects are forgotten before every label, so each reads its states."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(N, D)) * [1.0, 3.0, 0.5, 1.0, 10.0, 1.0] + [0.0, 2.0, 0.0, 0, 5, 0]
    w = rng.normal(size=D)
    model, shadow = initial_envelope("m", CHAMPION), initial_envelope("s", SHADOW)
    run = _Run()
    kept: list[ModelEnvelope] = []

    def fresh() -> None:
        if read_back:
            LIVE.clear()

    LIVE.clear()
    for i in range(N):
        y = (1 if X[i] @ w > 0 else -1) * (1 if i < N // 2 else -1)
        x = X[i]
        seen = None if i % 4 == 3 else _moments(np.vstack([rng.normal(size=(9, D)), x]))
        if i in (90, 91):  # moments no scorer could have gathered: refused, the row learnt
            seen = _moments(rng.normal(size=(10, D)) * 1e3 + 1e6)
        if i == 77:  # a row whose update is not finite: refused, after the objects moved
            x, seen = np.full(D, 1e200), None
        entry = PendingEntry(_request(i, x, model.version, seen), 0)
        label = Label(f"r{i}", "m", y, "t", None)
        config = QUIET if 150 <= i < 170 else CHAMPION
        fresh()
        out = apply_label(config, model, entry, label, i, now=1.0 + i)
        run.record(out)
        if i == 77:
            assert out.outcome == "refused"
        if i == 60:  # the same label again: a redelivery, nothing learnt
            fresh()
            again = apply_label(config, out.model or model, entry, label, i, now=2.0 + i)
            assert again.outcome == "ignored"
            run.record(again)
        if i == 100 and out.model is not None:  # the version is not kept: learn it again
            fresh()
            lost = apply_label(config, model, entry, label, i, now=1.0 + i)
            assert lost.encode() == out.encode()
            run.record(lost)
            out = lost
        if out.model is not None and out.pending is not None:
            model = out.model
            kept.append(model)
            fresh()
            shadowed = apply_shadow_label(
                SHADOW, shadow, out.pending, label, i, now=1.0 + i, partition=0, max_weight=100.0
            )
            run.record(shadowed)
            shadow = shadowed.model or shadow
        if i in (40, 180):  # another process's version, equal to ours
            model = parse_model_envelope(out.encode(), model="m")
        if i == 120:  # a rollback to a version ten labels back
            model = kept[-10]
    return run


@pytest.fixture
def live_models() -> Iterator[None]:
    LIVE.clear()
    yield
    LIVE.clear()


@pytest.mark.usefixtures("live_models")
def test_labels_write_the_same_bytes_with_live_objects_and_with_states_read_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[str] = []
    learner_for = protocol.learner_for

    def counted(state: Any, parts: Any) -> Any:
        reads.append("learner")
        return learner_for(state, parts)

    monkeypatch.setattr(protocol, "learner_for", counted)
    read_back = _stream(read_back=True)
    reads_back = len(reads)
    reads.clear()
    live = _stream(read_back=False)
    assert live.outcomes == read_back.outcomes  # byte for byte, every outcome
    learnt = [o for o in live.outcomes if o[0] == "applied"]
    assert len(learnt) > 2 * N - 20
    assert sum(o[8] for o in learnt) >= 1  # changes detected
    assert sum(o[9] for o in learnt) >= 1  # and a challenger took over
    assert any(o[10] is not None for o in learnt)  # moments refused, once at least
    # the states were read back only where the version came from elsewhere
    assert reads_back > 2 * N - 20
    assert len(reads) < 20
    # a version, once written, never changes: nothing of it is shared with the objects
    for model, encoded in live.versions:
        assert model.to_bytes() == encoded


@pytest.mark.usefixtures("live_models")
def test_a_version_not_written_by_the_last_label_is_read_from_its_states() -> None:
    model = initial_envelope("m", CHAMPION)
    rng = np.random.default_rng(0)
    label = Label("r0", "m", 1, "t", None)
    entry = PendingEntry(_request(0, rng.normal(size=D), 0, None), 0)
    first = apply_label(CHAMPION, model, entry, label, 0, now=1.0)
    assert first.model is not None
    assert len(LIVE) == 1
    equal = parse_model_envelope(first.model.to_json(), model="m")
    assert equal == first.model
    assert LIVE.take(equal, CHAMPION.adaptive.parts()) is None  # equal is not the same
    assert len(LIVE) == 0  # and taking forgets
    second = apply_label(CHAMPION, first.model, entry, label, 0, now=1.0, parked=True)
    assert second.model is not None
    parts = CHAMPION.adaptive.parts()
    assert LIVE.take(second.model, QUIET.adaptive.parts()) is None  # other parts
    apply_label(CHAMPION, first.model, entry, label, 0, now=1.0, parked=True)
    assert LIVE.take(second.model, parts) is None  # the last label wrote another version


def test_live_models_keep_the_most_recent() -> None:
    live = LiveModels(size=2)
    envelopes = [initial_envelope(name, CHAMPION) for name in "abc"]
    for e in envelopes:
        live.keep(e, None, object(), object())  # type: ignore[arg-type]
    assert len(live) == 2
    assert live.take(envelopes[0], None) is None
    assert live.take(envelopes[2], None) is not None


@pytest.mark.usefixtures("live_models")
async def test_the_joiners_next_label_takes_the_objects_of_the_version_it_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The learner's model store gives back the very envelope it was given while its table
    holds the bytes written with it, so a worker's labels after the first read no state."""
    from .test_joiner import Learner

    reads: list[str] = []
    learner_for = protocol.learner_for
    monkeypatch.setattr(
        protocol, "learner_for", lambda s, p: reads.append("learner") or learner_for(s, p)
    )
    learner = Learner.start()
    for i in range(6):
        await learner.request(f"r{i}", i)
        await learner.label(f"r{i}", i, y=1 if i % 2 else -1)
    assert learner.versions() == [1, 2, 3, 4, 5, 6]
    assert reads == ["learner"]  # the first label, from the configured version 0
