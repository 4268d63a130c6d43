"""The demo's bookkeeping and status lines, without Kafka."""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.config import Settings, load_settings
from service.demo import (
    DESK_USER,
    MIN_LABELS,
    ORACLE,
    DemoStream,
    Tally,
    _config,
    _parser,
    done_line,
    live_line,
    write_users,
)
from service.desk.auth.accounts import Accounts
from service.desk.leases import LeaseRecord


def _stream(
    cost: float = 0.25, events: int = 3, label_delay: float = 0.0, desk: bool = False
) -> DemoStream:
    args = argparse.Namespace(
        cost=cost, events=events, rate=1e6, label_delay=label_delay, web_port=1, desk=desk
    )
    X = np.arange(12, dtype=float).reshape(4, 3)
    y = np.array([1, -1, 1, -1])
    return DemoStream(Settings(), args, X, y, "abc123")


class FakeClient:
    """Records what is sent; with ``demo``, the leases topic is folded back into it at once,
    in send order (as if the demo's follower read it), sharing one offset counter with the
    people's records a test adds with :meth:`person`."""

    def __init__(self, demo: DemoStream | None = None) -> None:
        self.sent: list[tuple[str, str | None, Any]] = []
        self.flushed = 0
        self.demo = demo
        self.offset = 0

    async def send(self, topic: str, key: str | None, value: Any) -> None:
        self.sent.append((topic, key, value))
        if self.demo is not None and topic == self.demo.settings.desk.leases_topic:
            self.demo.on_lease(self.offset, value)
            self.offset += 1

    async def flush(self) -> None:
        self.flushed += 1

    def person(self, kind: str, rid: str, who: str = "ann", attempt: str | None = None) -> None:
        assert self.demo is not None
        now = time.time()
        record = LeaseRecord(rid, kind, who, at=now, expires_at=now + 120, attempt=attempt)  # type: ignore[arg-type]
        self.demo.on_lease(self.offset, record.to_json())
        self.offset += 1

    def labels(self) -> list[dict[str, Any]]:
        return [v for topic, _, v in self.sent if topic == Settings().topics.labels]

    def claims(self) -> list[LeaseRecord]:
        from service.desk.leases import parse_lease_record  # noqa: PLC0415

        topic = Settings().desk.leases_topic
        return [parse_lease_record(v) for t, _, v in self.sent if t == topic]


def test_live_line_before_any_label_or_decision_says_so() -> None:
    tally = Tally(sent=7, started=100.0)
    line = live_line(tally, now=103.2, rate=199.6, metrics={})
    assert line == (
        "[     3s]    200 ev/s  sent      7  decided      0 predict /      0 reject  "
        "labels asked     0 applied     0  model v0  risk est: not enough labels yet, 0 of 30 "
        "(true nan)"
    )


def test_live_line_reports_the_estimate_with_its_interval_and_the_true_risk() -> None:
    tally = Tally(sent=1200, predict=900, reject=100, asked=50, answered=40, loss=125.0)
    tally.started = 0.0
    metrics = {
        "abstain_labels_applied_total": 38.0,
        "abstain_risk_estimate": 0.1234,
        "abstain_risk_estimate_low": 0.0912,
        "abstain_risk_estimate_high": 0.1651,
        "abstain_model_version": 3.0,
    }
    line = live_line(tally, now=12.0, rate=201.0, metrics=metrics)
    assert line == (
        "[    12s]    201 ev/s  sent   1200  decided    900 predict /    100 reject  "
        "labels asked    50 applied    38  model v3  risk est 0.123 [0.091, 0.165] "
        "(true 0.125)"
    )


def test_live_line_hides_the_estimate_until_enough_labels_are_applied() -> None:
    tally = Tally(predict=1, started=0.0)
    for applied in (0, 1, MIN_LABELS - 1):
        metrics = {"abstain_risk_estimate": 0.5, "abstain_labels_applied_total": applied}
        line = live_line(tally, 1.0, 0.0, metrics)
        assert f"not enough labels yet, {applied} of {MIN_LABELS} (true 0.000)" in line
        assert "0.500" not in line
    metrics = {"abstain_risk_estimate": 0.5, "abstain_labels_applied_total": MIN_LABELS}
    assert "risk est 0.500" in live_line(tally, 1.0, 0.0, metrics)


def test_lines_count_what_people_answered_at_the_desk() -> None:
    tally = Tally(sent=400, predict=390, reject=10, answered=25, people=3, loss=22.5)
    assert done_line(tally) == (
        "done: 400 events, 400 decisions (10 rejected), 25 labels given (and 3 by people at "
        "the desk); true 0-d-1 risk 0.056"
    )
    assert live_line(tally, 1.0, 0.0, {}).endswith("  answered at the desk 3")


def test_done_line() -> None:
    tally = Tally(sent=400, predict=390, reject=10, answered=25, loss=22.5)
    assert done_line(tally) == (
        "done: 400 events, 400 decisions (10 rejected), 25 labels given; true 0-d-1 risk 0.056"
    )
    assert done_line(Tally()).endswith("0 labels given; true 0-d-1 risk 0.000")


def test_done_line_carries_the_model_s_estimate_when_the_worker_answers() -> None:
    tally = Tally(sent=400, predict=390, reject=10, answered=60, loss=22.5)
    metrics = {
        "abstain_labels_applied_total": 60.0,
        "abstain_risk_estimate": 0.061,
        "abstain_risk_estimate_low": 0.031,
        "abstain_risk_estimate_high": 0.118,
    }
    assert done_line(tally, metrics).endswith(
        "true 0-d-1 risk 0.056; the model's risk est 0.061 [0.031, 0.118]"
    )


def test_a_quarter_of_the_requests_are_left_to_people_only_with_a_desk() -> None:
    demo = _stream(desk=True)
    demo.args.left_to_you = 0.25
    requests = [{"request_id": f"{i:032x}"} for i in range(4000)]
    left = [r for r in requests if demo.left_to_people(r)]
    assert 0.22 < len(left) / len(requests) < 0.28
    assert left == [r for r in requests if demo.left_to_people(r)]  # the same every time
    alone = _stream(desk=False)
    alone.args.left_to_you = 0.25
    assert not any(alone.left_to_people(r) for r in requests)
    demo.args.left_to_you = 0.0
    assert not any(demo.left_to_people(r) for r in requests)


def test_the_demo_runs_until_ctrl_c_at_a_pace_a_person_can_follow() -> None:
    args = _parser().parse_args([])
    assert (args.events, args.rate, args.left_to_you) == (0, 20.0, 0.25)
    with pytest.raises(SystemExit):
        _parser().parse_args(["--left-to-you", "1.5"])


def test_the_demo_model_names_the_phishing_features(tmp_path: Path) -> None:
    from service.datasets import feature_names  # noqa: PLC0415

    args = _parser().parse_args([])
    names = feature_names("phishing", 68)
    assert names is not None
    config = _config(args, "run1", 68, tmp_path, names)
    assert config["models"]["default"]["feature_names"][:2] == [
        "having_ip_address=-1",
        "url_length=1",
    ]
    assert "n_features" not in config["models"]["default"]
    assert config["desk"]["answer_names"] == {"default": ["legitimate", "phishing"]}
    assert load_settings(tmp_path / "demo.json").models["default"].n_inputs == 68
    assert _config(args, "run2", 4, tmp_path)["models"]["default"]["n_features"] == 4


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
    code = "import sys, service.demo; print('service.stream.kafka.clients' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- with the desk


def _desk_stream() -> tuple[DemoStream, FakeClient]:
    demo = _stream(desk=True, label_delay=60.0)  # rechecks far in the future
    fake = FakeClient(demo)
    demo._client = fake  # type: ignore[assignment]
    return demo, fake


REQ = {"request_id": "r1", "model": "default", "event_id": "abc123-5", "expires_at": 1e12}


async def test_with_the_desk_the_oracle_claims_a_request_before_it_answers() -> None:
    demo, fake = _desk_stream()
    assert len(demo.ready) == 3  # the leases topic is followed too
    await demo.answer(REQ)
    [claim] = fake.claims()
    assert (claim.request_id, claim.kind, claim.holder) == ("r1", "claim", ORACLE)
    assert claim.expires_at > claim.at
    assert [lab["label"] for lab in fake.labels()] == [-1]
    assert demo.leases.holder("r1", now=time.time()).holder == ORACLE  # type: ignore[union-attr]
    assert (demo.tally.answered, demo.tally.people) == (1, 0)
    assert demo.claims == {}


async def test_a_request_a_person_holds_is_left_to_them_then_counted_as_theirs() -> None:
    demo, fake = _desk_stream()
    fake.person("claim", "r1")
    await demo.answer(REQ)
    assert fake.labels() == []  # the claim was lost: the oracle stays out
    assert len(fake.claims()) == 1
    assert demo.tally.answered == 0
    fake.person("answer", "r1", attempt="a1")
    await demo.answer(REQ)  # the recheck: the person answered it
    await demo.answer(REQ)
    assert fake.labels() == []
    assert len(fake.claims()) == 1  # no more claims once a person answered
    assert (demo.tally.answered, demo.tally.people) == (0, 1)


async def test_a_request_a_person_gives_back_is_answered_by_the_oracle() -> None:
    demo, fake = _desk_stream()
    fake.person("claim", "r1")
    await demo.answer(REQ)
    assert fake.labels() == []
    fake.person("release", "r1")  # skip / can't tell
    await demo.answer(REQ)
    assert [lab["labelled_by"] for lab in fake.labels()] == [ORACLE]
    assert demo.tally.answered == 1


async def test_a_held_request_is_looked_at_again_until_it_expires() -> None:
    demo, fake = _desk_stream()
    demo.args.label_delay = 0.01
    fake.person("claim", "r1")
    await demo.answer(REQ)
    assert demo.pending == set()
    await asyncio.sleep(0.7)  # at least 0.5 s between looks
    assert len(fake.claims()) >= 2
    expired = {**REQ, "request_id": "r2", "expires_at": time.time() - 1}
    fake.person("claim", "r2")
    before = len(fake.claims())
    await demo.answer(expired)
    await asyncio.sleep(0.7)
    assert [c.request_id for c in fake.claims()[before:]].count("r2") == 1  # not again
    for task in list(demo.pending):
        task.cancel()


def test_unreadable_lease_records_are_skipped() -> None:
    demo = _stream(desk=True)
    demo.on_lease(0, b"not json")
    demo.on_lease(1, None)
    assert demo.leases.position == 2
    assert demo.leases.leases == {}


def test_the_demo_users_file_lets_demo_log_in_with_the_printed_password(tmp_path: Path) -> None:
    path = tmp_path / "desk-users.toml"
    write_users(path, "a-printed-password")
    accounts = Accounts.load(path)
    assert accounts.check(DESK_USER, "a-printed-password") is not None
    assert accounts.check(DESK_USER, "another-password") is None
    assert path.stat().st_mode & 0o077 == 0


def test_the_desk_is_on_unless_asked_off_and_the_help_explains_the_oracle() -> None:
    parser = _parser()
    assert parser.parse_args([]).desk is True
    assert parser.parse_args(["--no-desk"]).desk is False
    assert parser.parse_args([]).desk_port == 6070
    text = " ".join(parser.format_help().split())
    assert "claims it on the desk's leases topic" in text
    assert "head start" in text


# --------------------------------------------------------------------------- --prometheus


def test_prometheus_is_off_unless_asked() -> None:
    parser = _parser()
    assert parser.parse_args([]).prometheus is False
    assert parser.parse_args(["--prometheus"]).prometheus is True


def test_the_demo_prometheus_scrapes_the_worker_and_the_desk_with_the_alert_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real prometheus (Debian's package) on a free port: it loads the project's rules,
    finds both targets by their instance names, prints its URL and stops by PID."""
    from service.demo import RULES, start_prometheus  # noqa: PLC0415

    assert shutil.which("prometheus"), "install Debian's prometheus package (.ci/run does)"
    prom = start_prometheus(tmp_path, web_port=1, desk_port=2)
    try:
        printed = capsys.readouterr().out
        assert prom.url in printed
        # the printed pages open (Debian's build serves its UI under /classic)
        pages = re.findall(r"http://127\.0\.0\.1:\d+/\S*(?:graph|alerts)", printed)
        assert len(pages) == 2, printed
        for page in pages:
            with urllib.request.urlopen(page, timeout=5) as answer:  # noqa: S310 - local URL
                assert answer.status == 200, page
        groups = prom.api("rules")["groups"]
        assert {g["file"] for g in groups} == {str(RULES)}
        assert sum(len(g["rules"]) for g in groups) == RULES.read_text().count("- alert:")
        deadline = time.monotonic() + 30  # target discovery is batched every 5 s
        found: set[tuple[str, str]] = set()
        while time.monotonic() < deadline and len(found) < 2:
            active = prom.api("targets")["activeTargets"]
            found = {(t["labels"]["job"], t["labels"]["instance"]) for t in active}
            time.sleep(0.5)
        assert found == {("abstain", "worker-0"), ("abstain-desk", "desk-0")}
    finally:
        prom.stop()
    assert prom.proc is not None
    assert prom.proc.returncode is not None


def test_the_demo_runs_signed_with_a_key_of_its_own(tmp_path: Path) -> None:
    args = _parser().parse_args([])
    config = _config(args, "r1", 68, tmp_path)
    (tmp_path / "other").mkdir()
    other = _config(args, "r2", 68, tmp_path / "other")
    key = config["snapshot_key"]
    assert len(key) >= 32
    assert key != other["snapshot_key"]
    settings = load_settings(tmp_path / "demo.json")
    assert settings.snapshot_key is not None
    assert settings.snapshot_key.get_secret_value() == key
    assert (tmp_path / "demo.json").stat().st_mode & 0o077 == 0
