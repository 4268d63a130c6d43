"""The demo's bookkeeping and status lines, without Kafka."""

from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from service.config import Settings
from service.demo import DemoStream, Tally, done_line, live_line


def _stream(cost: float = 0.25, events: int = 3, label_delay: float = 0.0) -> DemoStream:
    args = argparse.Namespace(
        cost=cost, events=events, rate=1e6, label_delay=label_delay, web_port=1
    )
    X = np.arange(12, dtype=float).reshape(4, 3)
    y = np.array([1, -1, 1, -1])
    return DemoStream(Settings(), args, X, y, "abc123")


class FakeClient:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str | None, Any]] = []
        self.flushed = 0

    async def send(self, topic: str, key: str | None, value: Any) -> None:
        self.sent.append((topic, key, value))

    async def flush(self) -> None:
        self.flushed += 1


def test_live_line_before_any_label_or_decision_shows_nan_risks() -> None:
    tally = Tally(sent=7, started=100.0)
    line = live_line(tally, now=103.2, rate=199.6, metrics={})
    assert line == (
        "[     3s]    200 ev/s  sent      7  decided      0 predict /      0 reject  "
        "labels asked     0 applied     0  model v0  risk est nan (true nan)"
    )


def test_live_line_reports_metrics_and_true_risk() -> None:
    tally = Tally(sent=1200, predict=900, reject=100, asked=50, answered=40, loss=125.0)
    tally.started = 0.0
    metrics = {
        "abstain_labels_applied_total": 38.0,
        "abstain_risk_estimate": 0.1234,
        "abstain_model_version": 3.0,
    }
    line = live_line(tally, now=12.0, rate=201.0, metrics=metrics)
    assert line == (
        "[    12s]    201 ev/s  sent   1200  decided    900 predict /    100 reject  "
        "labels asked    50 applied    38  model v3  risk est 0.123 (true 0.125)"
    )


def test_live_line_hides_the_estimate_until_a_label_is_applied() -> None:
    tally = Tally(predict=1, started=0.0)
    metrics = {"abstain_risk_estimate": 0.5, "abstain_labels_applied_total": 0.0}
    assert "risk est nan (true 0.000)" in live_line(tally, 1.0, 0.0, metrics)


def test_done_line() -> None:
    tally = Tally(sent=400, predict=390, reject=10, answered=25, loss=22.5)
    assert done_line(tally) == (
        "done: 400 events, 400 decisions (10 rejected), 25 labels given; true 0-d-1 risk 0.056"
    )
    assert done_line(Tally()).endswith("0 labels given; true 0-d-1 risk 0.000")


def test_row_wraps_around_the_dataset() -> None:
    demo = _stream()
    assert demo.row("abc123-2") == 2
    assert demo.row("abc123-9") == 1


def test_record_decision_counts_predictions_rejects_and_their_loss() -> None:
    demo = _stream(cost=0.25)
    demo.record_decision({"id": "abc123-0", "action": "predict", "label": 1})  # right
    demo.record_decision({"id": "abc123-1", "action": "predict", "label": 1})  # wrong
    demo.record_decision({"id": "abc123-2", "action": "reject", "label": None})
    t = demo.tally
    assert (t.predict, t.reject) == (2, 1)
    assert t.loss == pytest.approx(1.25)


def test_client_is_only_available_inside_run() -> None:
    with pytest.raises(RuntimeError, match="inside run"):
        _ = _stream().client


async def test_answer_sends_the_true_label_and_counts_it() -> None:
    demo = _stream()
    fake = FakeClient()
    demo._client = fake  # type: ignore[assignment]
    await demo.answer({"request_id": "r1", "model": "default", "event_id": "abc123-5"})
    [(topic, key, value)] = fake.sent
    assert (topic, key) == (demo.settings.topics.labels, "default")
    assert value["label"] == -1
    assert value["request_id"] == "r1"
    assert value["labelled_by"] == "oracle"
    assert demo.tally.answered == 1


async def test_schedule_tracks_the_answer_until_it_is_done() -> None:
    demo = _stream()
    fake = FakeClient()
    demo._client = fake  # type: ignore[assignment]
    demo.schedule({"request_id": "r1", "model": "default", "event_id": "abc123-0"})
    assert len(demo.pending) == 1
    await next(iter(demo.pending))
    assert not demo.pending
    assert demo.tally.answered == 1


async def test_feed_sends_the_bounded_run_then_flushes() -> None:
    demo = _stream(events=5)
    fake = FakeClient()
    demo._client = fake  # type: ignore[assignment]
    for e in demo.ready:
        e.set()
    await demo.feed()
    assert [key for _, key, _ in fake.sent] == [f"abc123-{i}" for i in range(5)]
    assert fake.sent[4][2]["features"] == [0.0, 1.0, 2.0]  # row 4 wraps to row 0
    assert demo.tally.sent == 5
    assert fake.flushed == 1


def test_importing_the_demo_does_not_import_the_kafka_client() -> None:
    code = "import sys, service.demo; print('service.stream.client' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
