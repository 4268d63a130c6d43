"""The team view's learning rows: a model whose detector fired is marked relearning for
the window after the change, then steady with its counts; a model without the wrapper
shows no change detection; names are escaped; rows are reread only for a new snapshot."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import numpy as np

from service.config import AdaptiveConfig, ModelConfig
from service.desk.changes import (
    WAIT_AT_MOST,
    ChangeRow,
    Changes,
    CorrectionsWaiting,
    change_of,
)
from service.desk.pages import team_page
from service.desk.team import ModelRow, TeamStats
from service.learning import DSAL, Adaptive
from service.stream.models.served import ServedModel, initial_envelope

from .test_web import login, serve

EVIL = '<img src=x onerror="alert(1)">&'


def served(name: str = "m", *, adaptive: bool = True, version: int = 7) -> ServedModel:
    config = ModelConfig(
        n_features=2, intercept=False, standardize=False, adaptive=AdaptiveConfig(enabled=adaptive)
    )
    envelope = initial_envelope(name, config)
    model = ServedModel.from_envelope(config, envelope)
    return dataclasses.replace(model, envelope=dataclasses.replace(envelope, version=version))


def learned(flip_at: int | None, n: int, *, seed: int = 0) -> Adaptive:
    """An adaptive DSAL after ``n`` labels of a concept whose labels flip at ``flip_at``."""
    model = Adaptive(DSAL(n_features=2, cost=0.25))
    rng = np.random.default_rng(seed)
    for t in range(n):
        x = [float(rng.normal()), 1.0]
        y = (1 if x[0] > 0 else -1) * (-1 if flip_at is not None and t >= flip_at else 1)
        model.update(x, y)
    return model


def with_learner(model: ServedModel, learner: Any) -> ServedModel:
    return dataclasses.replace(model, learner=learner)


def stats(*names: str) -> TeamStats:
    return TeamStats([ModelRow(n, 3, 12.0, 4, 0, 1) for n in names], [], 4)


def test_a_model_whose_detector_fired_is_relearning_with_its_change_and_risk_since() -> None:
    learner = learned(flip_at=300, n=360)
    assert learner.changes_detected == 1  # the detector fired, once
    row = change_of(with_learner(served(), learner))
    assert row is not None
    assert (row.version, row.labels, row.changes) == (7, 360, 1)
    assert row.last_change == learner.last_change
    assert row.since is not None
    assert 0 <= row.since <= 60  # after the flip at label 300
    assert row.relearning
    assert row.window == 200  # the model's patience
    assert row.takeovers == learner.takeovers
    assert row.risk is not None
    assert 0.0 <= row.risk <= 1.0
    assert row.risk_labels == learner.risk_since_change.labels > 0


def test_long_after_the_change_the_model_is_steady_and_keeps_its_counts() -> None:
    learner = learned(flip_at=300, n=900)
    row = change_of(with_learner(served(), learner))
    assert row is not None
    assert row.changes >= 1
    assert row.takeovers >= 1
    assert row.since is not None
    assert row.since >= row.window
    assert row.challengers == ()
    assert not row.relearning


def test_a_model_that_never_changed_is_steady_with_none_yet() -> None:
    row = change_of(with_learner(served(), learned(flip_at=None, n=300)))
    assert row is not None
    assert (row.changes, row.takeovers, row.last_change, row.since) == (0, 0, None, None)
    assert not row.relearning
    page = team_page("ann", "t", stats("m"), {"m": row})
    assert "Steady" in page
    assert "none yet" in page
    assert "Relearning" not in page


def test_the_mark_window_and_running_challengers() -> None:
    base = ChangeRow(
        version=1,
        labels=500,
        detects=True,
        changes=1,
        takeovers=0,
        last_change=400,
        risk=0.1,
        risk_labels=100,
        challengers=(),
        window=200,
    )
    assert base.since == 100
    assert base.relearning
    assert not dataclasses.replace(base, last_change=300).relearning  # 200 labels ago
    assert dataclasses.replace(base, last_change=300, challengers=("fresh",)).relearning
    assert not dataclasses.replace(base, last_change=None, changes=0).relearning


def test_a_model_served_without_the_wrapper_shows_no_change_detection() -> None:
    plain = served("plain", adaptive=False)
    assert not isinstance(plain.learner, Adaptive)
    assert change_of(plain) is None
    assert change_of(None) is None
    rows = Changes().rows({"plain": plain})
    assert rows == {}
    page = team_page("ann", "t", stats("plain"), rows)
    learning = re.search(r'<table id="learning">.*?</table>', page, re.S)
    assert learning is not None
    assert "no change detection" in learning.group(0)
    assert "Relearning" not in page
    assert "relearning-note" not in page
    assert "None" not in learning.group(0)
    assert "nan" not in learning.group(0).lower()


def test_the_page_marks_the_relearning_model_and_escapes_every_name() -> None:
    hot = change_of(with_learner(served(EVIL), learned(flip_at=300, n=360)))
    calm = change_of(with_learner(served("calm"), learned(flip_at=None, n=300)))
    assert hot is not None
    assert calm is not None
    page = team_page("<b>ann</b>", "t", stats(EVIL, "calm", "plain"), {EVIL: hot, "calm": calm})
    assert "<img" not in page
    assert "<b>ann" not in page
    escaped = "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;"
    note = re.search(r'<p class="relearning-note".*?</p>', page, re.S)
    assert note is not None
    assert escaped in note.group(0)
    assert "calm" not in note.group(0)
    # marked in the requests table and in its learning row, and only there
    models = re.search(r'<table id="models">.*?</table>', page, re.S)
    assert models is not None
    marked = [r for r in re.findall(r"<tr>.*?</tr>", models.group(0), re.S) if "mark" in r]
    assert len(marked) == 1
    assert escaped in marked[0]
    rows = re.findall(r"<tr[^>]*>.*?</tr>", page.split('<table id="learning">')[1], re.S)
    hot_row = next(r for r in rows if escaped in r)
    assert hot_row.startswith('<tr class="relearning">')
    assert f"{hot.since} labels ago" in hot_row
    assert f"at label {hot.last_change:,}" in hot_row
    assert f"{hot.risk:.3f}" in hot_row
    assert "<td>1</td>" in hot_row  # one change
    calm_row = next(r for r in rows if ">calm<" in r)
    assert "Steady" in calm_row
    assert "relearning" not in calm_row


def test_rows_are_reread_only_when_a_snapshot_is_replaced() -> None:
    changes = Changes()
    first = with_learner(served(), learned(flip_at=None, n=50))
    row = changes.rows({"m": first})["m"]
    assert changes.rows({"m": first})["m"] is row  # the same snapshot: the same row
    learner = first.learner
    learner.update([1.0, 1.0], 1)  # (a snapshot is never mutated; this shows it is not reread)
    assert changes.rows({"m": first})["m"].labels == row.labels
    newer = with_learner(served(version=8), learner)
    assert changes.rows({"m": newer})["m"].labels == row.labels + 1
    assert changes.rows({"m": newer})["m"].version == 8


async def test_the_team_page_shows_the_mark_of_the_served_model(tmp_path: Path) -> None:
    c, web = await serve(tmp_path)
    try:
        hot = with_learner(served(), learned(flip_at=300, n=360))
        web.models = lambda: {"m": hot}
        await login(c)
        page = await (await c.get("/team")).text()
        assert 'class="relearning-note"' in page
        assert '<tr class="relearning"><th scope=row>m</th>' in page
        web.models = lambda: {"m": with_learner(served(), learned(flip_at=None, n=100))}
        page = await (await c.get("/team")).text()
        assert "Relearning" not in page
        assert "Steady" in page
    finally:
        await c.close()
        web.logins.close()


def test_corrections_the_served_model_does_not_hold_are_shown_queued() -> None:
    waiting = CorrectionsWaiting()
    for offset in (40, 41, 45):
        waiting.add(EVIL, 0, offset)
    model = served(EVIL)
    holding = dataclasses.replace(
        model, envelope=dataclasses.replace(model.envelope, labels_partition=0, corrected_to=41)
    )
    counts = waiting.counts({EVIL: holding})
    assert counts == {EVIL: 1}
    page = team_page("ann", "t", stats(EVIL), {}, waiting=counts)
    assert "Corrections queued" in page
    assert EVIL not in page  # escaped
    done = dataclasses.replace(
        holding, envelope=dataclasses.replace(holding.envelope, corrected_to=45)
    )
    assert waiting.counts({EVIL: done}) == {}
    assert "Corrections queued" not in team_page("ann", "t", stats(EVIL), {}, waiting={})


def test_a_correction_the_learner_refused_is_not_shown_queued_for_ever() -> None:
    now = [0.0]
    waiting = CorrectionsWaiting(clock=lambda: now[0])
    waiting.add("m", 0, 40)
    model = served("m")
    assert waiting.counts({"m": model}) == {"m": 1}
    now[0] += WAIT_AT_MOST + 1.0
    assert waiting.counts({"m": model}) == {}


def test_the_challengers_running_are_read_from_what_the_models_topic_carries() -> None:
    """The desk reads a model from the models topic, which carries what a scorer reads (no
    challengers' learners): the kinds running are still named there, and shown."""
    config = ModelConfig(n_features=2, intercept=False, standardize=False)
    learner = next(
        m for n in range(305, 420, 5) if (m := learned(flip_at=300, n=n)).running
    )  # just after the change, while the challengers run
    envelope = initial_envelope("m", config).replace(version=9, learner=learner.to_state())
    on_topic = ServedModel.from_envelope(config, envelope.served())
    row = change_of(on_topic)
    assert row is not None
    assert row.challengers == learner.running
    assert row.relearning
