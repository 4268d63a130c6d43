"""``abstain models seed`` from the command line, without a broker: it trains (``--dry-run``
publishes nothing) and every file that cannot seed stops it with a message and exit code 2
before anything is written. ``abstain models versions`` over a changelog read as given. How
a worker tunes the garbage collector."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from service.__main__ import main
from service.config import Settings
from service.records import SIGNATURE_HEADER, Signer, parse_model_envelope
from service.records.labels import Seed, parse_labels_record
from service.stream import cli
from service.stream.cli import YOUNG_COLLECTION, tune_collector
from service.stream.labels.seed import SeedError, seed_model
from service.stream.models.book import signer_for
from service.stream.models.served import ServedModel, initial_envelope


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "settings.json"
    models = {"m": {"algorithm": "dsal", "cost": 0.25, "feature_names": ["a", "b"]}}
    # a broker nobody listens on: a command that tried to publish would fail, not hang
    path.write_bytes(
        orjson.dumps({"models": models, "default_model": "m", "broker": "127.0.0.1:1"})
    )
    return path


def test_a_dry_run_trains_and_prints_the_summary(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = ["b,a,label"] + [f"{i % 3 - 1},{i % 5 - 2},{1 if i % 5 > 2 else -1}" for i in range(60)]
    data = tmp_path / "history.csv"
    data.write_text("\n".join(rows) + "\n")
    code = main(["models", "seed", "--config", str(config), "--model", "m", str(data), "--dry-run"])
    assert code == 0
    out = orjson.loads(capsys.readouterr().out)
    assert (out["model"], out["rows"], out["published"], out["version"]) == ("m", 60, False, None)
    assert 0.0 <= out["risk"] <= 1.0


@pytest.mark.parametrize(
    ("text", "model", "message"),
    [
        ("a,b,label\n1,2,1\n", "x", "no model named 'x'"),
        ("a,b,label\n1,2,5\n", "m", "label '5' is not one of 0, 1, -1, +1"),
        ("a,b,c,label\n1,2,3,1\n", "m", "unknown ['c']"),
        ("a,b,label\n", "m", "no data rows"),
        ("a,b,label\n1,nan,1\n", "m", "is not finite"),
    ],
)
def test_what_cannot_seed_stops_before_anything_is_published(
    tmp_path: Path,
    config: Path,
    capsys: pytest.CaptureFixture[str],
    text: str,
    model: str,
    message: str,
) -> None:
    data = tmp_path / "history.csv"
    data.write_text(text)
    # not a dry run: had it reached publishing, the dead broker address would fail otherwise
    code = main(["models", "seed", "--config", str(config), "--model", model, str(data)])
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err


class _Book:
    def __init__(self, settings: Settings, version: int) -> None:
        self.models = {
            name: ServedModel.from_envelope(
                cfg, initial_envelope(name, cfg).replace(version=version)
            )
            for name, cfg in settings.models.items()
        }


def _publishing(
    monkeypatch: pytest.MonkeyPatch, served: int
) -> list[tuple[str, bytes, bytes, Any]]:
    """Publishing without a broker: the topics exist, the models topic serves version
    ``served``, and every write is recorded."""
    written: list[tuple[str, bytes, bytes, Any]] = []

    async def ready(settings: Settings) -> None:
        return None

    async def book(settings: Settings) -> _Book:
        return _Book(settings, served)

    async def produce(
        settings: Settings, topic: str, key: bytes, value: bytes, headers: Any = None
    ) -> None:
        written.append((topic, key, value, headers))

    monkeypatch.setattr(cli, "_topics_ready", ready)
    monkeypatch.setattr(cli, "read_book", book)
    monkeypatch.setattr(cli, "produce_one", produce)
    return written


KEY = "seed-key-for-the-cli-tests-0123456789"  # noqa: S105 - >= 32 characters


def test_publish_writes_the_signed_order_first_then_the_same_signed_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(
        models={"m": {"algorithm": "dsal", "cost": 0.25, "n_features": 2}},
        default_model="m",
        snapshot_key=KEY,
    )  # type: ignore[arg-type]
    written = _publishing(monkeypatch, served=7)
    X = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    seeded = seed_model(settings, "m", X, np.array([1, -1, 1]), now=1.0)
    version = asyncio.run(cli.publish_seed(settings, seeded, by="alice"))
    assert version == 8
    (labels_topic, key1, order_raw, signed), (models_topic, key2, state, headers) = written
    assert (labels_topic, models_topic) == (settings.topics.labels, settings.topics.models)
    assert key1 == key2 == b"m"
    signer = Signer(KEY.encode())  # the order is signed itself, over its key and value
    assert signed == [("abstain-signature", signer.sign(b"m", order_raw))]
    order = parse_labels_record(order_raw)
    assert isinstance(order, Seed)
    assert order.base_version == 7  # written against the version served
    assert (order.target, order.by, order.rows, order.envelope) == ("m", "alice", 3, state)
    signature = dict(headers)[SIGNATURE_HEADER]
    assert order.signature == signature.decode()
    signer = signer_for(settings)
    assert signer is not None
    assert signer.verify(b"m", state, signature) is None
    assert parse_model_envelope(state, model="m").version == 8


def test_an_order_too_big_for_the_labels_topic_publishes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = Settings(
        models={"m": {"algorithm": "dsal", "cost": 0.25, "n_features": 2}},
        default_model="m",
        max_message_bytes=256,
    )  # type: ignore[arg-type]
    written = _publishing(monkeypatch, served=0)
    seeded = seed_model(settings, "m", np.ones((2, 2)), np.array([1, -1]), now=1.0)
    with pytest.raises(SeedError, match="over max_message_bytes"):
        asyncio.run(cli.publish_seed(settings, seeded, by="cli"))
    assert written == []


def test_versions_lists_what_the_table_keeps_and_survives_what_it_cannot_read(
    monkeypatch: pytest.MonkeyPatch, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a key (an unsigned deployment) anyone may write the changelog: a record that
    is not a version is reported as unreadable, a tombstone removes its version, and the
    command still lists the rest and exits 0."""
    settings = Settings.model_validate(orjson.loads(config.read_bytes()))
    good = initial_envelope("m", settings.models["m"]).replace(version=7, labels_applied=7)

    class Rec:
        def __init__(self, offset: int, key: bytes, value: bytes | None) -> None:
            self.partition, self.offset, self.key, self.value, self.headers = (
                0,
                offset,
                key,
                value,
                (),
            )

    records = [
        Rec(0, b"m@5", good.replace(version=5, labels_applied=5).to_bytes()),
        Rec(1, b"m@7", good.to_bytes()),
        Rec(2, b"m", b"not an envelope"),
        Rec(3, b"m@6", b"{}"),
        Rec(4, b"m@4", good.replace(version=4).to_bytes()),
        Rec(5, b"m@4", None),  # deleted as it fell out
    ]

    async def read_topic(_settings: Any, topic: str, **_: Any) -> list[Rec]:
        assert topic.endswith("-models-changelog")
        return records

    monkeypatch.setattr(cli, "read_topic", read_topic)
    assert main(["models", "versions", "m", "--config", str(config)]) == 0
    rows = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["version"] for r in rows] == [0, 5, 6, 7]
    assert "unreadable" in rows[2]
    assert [r["labels_applied"] for r in rows if "unreadable" not in r] == [0, 5, 7]
    assert not any(r.get("current") for r in rows)  # the current record is not a version
    assert main(["models", "versions", " ", "--config", str(config)]) == 2
    assert "no model ' ' is configured" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", [["models", "versions", "m"], ["models", "show", "m"], ["labels", "list"]]
)
def test_a_broker_that_cannot_be_reached_is_one_line_and_exit_code_2(
    config: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    assert main([*command, "--config", str(config)]) == 2  # 127.0.0.1:1: nobody listens
    err = capsys.readouterr().err
    assert err.startswith("abstain: Kafka: ")
    assert "Traceback" not in err


def test_a_worker_freezes_what_it_started_with_and_collects_the_young_less_often() -> None:
    before = gc.get_threshold()
    try:
        tune_collector()
        assert gc.get_threshold() == (YOUNG_COLLECTION, *before[1:])
        assert gc.get_freeze_count() > 0
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
