"""``abstain models seed`` from the command line, without a broker: it trains (``--dry-run``
publishes nothing) and every file that cannot seed stops it with a message and exit code 2
before anything is written."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from service.__main__ import main


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "settings.json"
    models = {"m": {"algorithm": "dsal", "cost": 0.25, "feature_names": ["a", "b"]}}
    # a broker nobody listens on: a command that tried to publish would fail, not hang
    path.write_bytes(orjson.dumps({"models": models, "default_model": "m",
                                   "broker": "127.0.0.1:1"}))  # fmt: skip
    return path


def test_a_dry_run_trains_and_prints_the_summary(
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = ["b,a,label"] + [f"{i % 3 - 1},{i % 5 - 2},{1 if i % 5 > 2 else -1}" for i in range(60)]
    data = tmp_path / "history.csv"
    data.write_text("\n".join(rows) + "\n")
    code = main(["models", "seed", "--config", str(config), "--model", "m", str(data),
                 "--dry-run"])  # fmt: skip
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
    tmp_path: Path, config: Path, capsys: pytest.CaptureFixture[str], text: str, model: str,
    message: str,
) -> None:  # fmt: skip
    data = tmp_path / "history.csv"
    data.write_text(text)
    # not a dry run: had it reached publishing, the dead broker address would fail otherwise
    code = main(["models", "seed", "--config", str(config), "--model", model, str(data)])
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err
