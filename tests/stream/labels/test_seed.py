"""Seeding a model from labelled history without Kafka: reading the file (CSV by name,
LIBSVM by index), training through the label protocol in file order, refusing what cannot
seed, and the learner adopting a seed order at its place in the labels log."""

from __future__ import annotations

import gzip
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from service.config import ModelConfig, Settings
from service.records import (
    BadMessage,
    Label,
    LabelRequest,
    Signer,
    parse_model_envelope,
    request_id,
)
from service.records.labels import Seed
from service.stream.labels.joiner import LabelJoiner
from service.stream.labels.rebuild import LogRecord, rebuild_model
from service.stream.labels.seed import SeedError, adopt_seed, read_rows, seed_model
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore
from service.stream.models.served import ServedModel, initial_envelope

from ..memory import MemoryKafka, msg, outputs

NAMED = ModelConfig(algorithm="dsal", cost=0.25, feature_names=["a", "b", "c"])
PLAIN = ModelConfig(algorithm="dral", cost=0.25, n_features=3)
SETTINGS = Settings(models={"m": NAMED, "p": PLAIN}, default_model="m")
LABELS, MODELS, DEAD = "abstain.labels", "abstain.models", "abstain.dead-letters"


def _rows(n: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """A separable stream: y = sign(a + 2b - c)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = np.where(X @ np.array([1.0, 2.0, -1.0]) >= 0, 1, -1)
    return X, y.astype(np.int64)


def _csv(
    path: Path,
    X: np.ndarray,
    y: np.ndarray,
    header: list[str] | None,
    order: list[int] | None = None,
    labels01: bool = False,
) -> Path:
    order = order if order is not None else [0, 1, 2]
    lines = [] if header is None else [",".join(header)]
    for x, label in zip(X, y, strict=True):
        value = (1 if label > 0 else 0) if labels01 else int(label)
        lines.append(",".join([*(repr(float(x[j])) for j in order), str(value)]))
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------ reading the file


def test_a_csv_header_in_another_order_is_reordered_by_name(tmp_path: Path) -> None:
    X, y = _rows(20)
    same = read_rows(_csv(tmp_path / "a.csv", X, y, ["a", "b", "c", "label"]), "m", NAMED)
    moved = read_rows(
        _csv(tmp_path / "b.csv", X, y, ["c", "a", "b", "label"], order=[2, 0, 1]), "m", NAMED
    )
    np.testing.assert_array_equal(same[0], X)
    np.testing.assert_array_equal(moved[0], X)
    np.testing.assert_array_equal(moved[1], y)


def test_labels_0_1_and_a_label_column_anywhere_and_gzip(tmp_path: Path) -> None:
    X, y = _rows(10)
    lines = ["label,b,a,c"] + [
        f"{int(v > 0)},{float(x[1])!r},{float(x[0])!r},{float(x[2])!r}"
        for x, v in zip(X, y, strict=True)
    ]
    path = tmp_path / "h.csv.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    Xr, yr = read_rows(path, "m", NAMED)
    np.testing.assert_array_equal(Xr, X)
    np.testing.assert_array_equal(yr, y)


def test_libsvm_is_read_by_index(tmp_path: Path) -> None:
    path = tmp_path / "s.libsvm"
    path.write_text("+1 1:0.5 3:2\n-1 2:-1\n0 1:1 2:1 3:1\n")
    X, y = read_rows(path, "p", PLAIN)
    np.testing.assert_array_equal(X, [[0.5, 0, 2], [0, -1, 0], [1, 1, 1]])
    assert y.tolist() == [1, -1, -1]


@pytest.mark.parametrize(
    ("text", "name", "error"),
    [
        ("a,b,label\n1,2,1\n", "m", "missing ['c']"),
        ("a,b,c,d,label\n1,2,3,4,1\n", "m", "unknown ['d']"),
        ("1,2,3,1\n", "m", "no header"),
        ("1,2,1\n", "p", "rows have 2 features, model 'p' takes 3"),
        ("a,b,c,label\n", "m", "no data rows"),
        ("", "p", "no data rows"),
        ("a,b,c,label\n1,nan,3,1\n", "m", "not finite"),
        ("a,b,c,label\n1,inf,3,1\n", "m", "not finite"),
        ("a,b,c,label\n1,2,3,2\n", "m", "not one of 0, 1, -1, +1"),
        ("a,b,c,label\n1,2,3,yes\n", "m", "is not a number"),
        ("a,b,c,label\n1,2,3\n", "m", "expected 4 fields"),
    ],
)
def test_a_file_that_cannot_seed_says_why(tmp_path: Path, text: str, name: str, error: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(SeedError, match=re.escape(error)):
        read_rows(path, name, SETTINGS.models[name])


def test_libsvm_wider_than_the_model_and_unreadable_files_are_refused(tmp_path: Path) -> None:
    wide = tmp_path / "w.libsvm"
    wide.write_text("+1 1:1 4:1\n")
    with pytest.raises(SeedError, match="exceeds n_features=3"):
        read_rows(wide, "p", PLAIN)
    with pytest.raises(SeedError, match="no such file"):
        read_rows(tmp_path / "missing.csv", "p", PLAIN)
    binary = tmp_path / "b.csv.gz"
    binary.write_bytes(b"not gzip at all")
    with pytest.raises(SeedError, match="cannot read"):
        read_rows(binary, "p", PLAIN)


# ------------------------------------------------------------------------ training


def _as_label_log(
    name: str, X: np.ndarray, y: np.ndarray
) -> tuple[list[LogRecord], list[LogRecord]]:
    """The rows as the stream would carry them: a request asked with p = 1, then its label."""
    requests, labels = [], []
    for i, (x, v) in enumerate(zip(X, y, strict=True)):
        rid = request_id(name, f"e{i}")
        req = LabelRequest(rid, f"e{i}", name, x.tolist(), 0.0, 1.0, 0, 1.0, 0, 10.0, 1e9, 0.0)
        requests.append(LogRecord(0, i, 10_000, req.to_json()))
        labels.append(LogRecord(0, i, 20_000, Label(rid, name, int(v), "ops", None).to_json()))
    return requests, labels


@pytest.mark.parametrize("name", ["m", "p"])
def test_seeding_makes_the_updates_a_stream_of_the_same_labels_makes(name: str) -> None:
    X, y = _rows(300)
    seeded = seed_model(SETTINGS, name, X, y, now=5.0)
    streamed = rebuild_model(SETTINGS, name, *_as_label_log(name, X, y)).model
    assert seeded.model.learner == streamed.learner
    assert seeded.model.pipeline == streamed.pipeline
    assert (seeded.rows, seeded.model.labels_applied, seeded.model.version) == (300, 300, 300)
    # the order is the file's: the same rows in another order teach another state
    back = seed_model(SETTINGS, name, X[::-1], y[::-1], now=5.0)
    assert back.model.learner != seeded.model.learner


def test_a_seeded_model_decides_where_version_0_rejects() -> None:
    X, y = _rows(400)
    seeded = seed_model(SETTINGS, "m", X, y, now=5.0)
    fresh = ServedModel.initial("m", NAMED)
    served = ServedModel.from_envelope(NAMED, seeded.model)
    Xt, yt = _rows(200, seed=8)
    before = [fresh.learner.decide(fresh.pipeline.transform(x), coin=0.0).label for x in Xt]
    after = [served.learner.decide(served.pipeline.transform(x), coin=0.0).label for x in Xt]
    assert set(before) == {0}  # w = 0: everything rejected
    decided = [(d, t) for d, t in zip(after, yt, strict=True) if d != 0]
    assert len(decided) > 150
    assert sum(d == t for d, t in decided) / len(decided) > 0.9
    # its risk estimate is the prequential risk on the file: what the model did before each
    assert 0 < seeded.risk < 0.25
    assert seeded.rejected + seeded.wrong > 0


def test_seed_model_refuses_an_unknown_model_and_bad_rows() -> None:
    X, y = _rows(5)
    with pytest.raises(SeedError, match="no model named 'x'"):
        seed_model(SETTINGS, "x", X, y, now=0.0)
    with pytest.raises(SeedError, match="no rows"):
        seed_model(SETTINGS, "m", X[:0], y[:0], now=0.0)
    with pytest.raises(SeedError, match="not finite"):
        seed_model(SETTINGS, "m", np.where(X > 1, np.nan, X), y, now=0.0)
    bad = y.copy()
    bad[3] = 0
    with pytest.raises(SeedError, match="row 4: label 0"):
        seed_model(SETTINGS, "m", X, bad, now=0.0)


def test_an_update_that_overflows_stops_the_seed() -> None:
    X = np.array([[1e300] * 3, [-1e300] * 3, [1.0] * 3])  # the standardiser's sums overflow
    with pytest.raises(SeedError, match=r"row [12]: non_finite"):
        seed_model(SETTINGS, "m", X, np.array([1, -1, 1]), now=0.0)


# ------------------------------------------------------------------------ the learner adopts it


class _Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def _joiner(settings: Settings) -> tuple[LabelJoiner, MemoryKafka]:
    kafka = MemoryKafka()
    initial = {n: initial_envelope(n, c) for n, c in settings.models.items()}
    out = outputs(kafka, settings, CollectorRegistry())
    joiner = LabelJoiner(
        settings,
        pending=PendingStore(kafka.table("pending")),
        parked=ParkedStore(kafka.table("orphans")),
        models=ModelStore(kafka.table("models"), initial),
        outputs=out,
        metrics=out.metrics,
        clock=_Clock(),
    )
    return joiner, kafka


def _order(
    settings: Settings,
    envelope: bytes,
    *,
    key: bytes | None = None,
    signature: str | None = None,
    base: int | None = 0,
) -> bytes:
    if key is not None:
        signature = Signer(key).sign(b"m", envelope).decode()
    return Seed("m", "m", envelope, signature, "ops", 1.0, rows=10, base_version=base).to_json()


async def _feed(
    joiner: LabelJoiner, value: bytes, offset: int, topic: str = LABELS, key: bytes | None = None
) -> None:
    """``value`` at ``offset`` of ``topic``, signed with ``key`` (the record's own HMAC)."""
    message = msg(value, offset, topic, 0, b"m")
    if key is not None:
        message = replace(message, signature=Signer(key).sign(b"m", value))
    await joiner.handle(message)


async def test_the_learner_adopts_a_seed_and_applies_later_labels_on_top_once() -> None:
    settings = Settings(models={"m": NAMED}, default_model="m")
    joiner, kafka = _joiner(settings)
    X, y = _rows(200)
    # the learner has learned a label already: version 1
    first = LabelRequest(
        request_id("m", "e0"), "e0", "m", [1.0, 2.0, 3.0], 0.0, 1.0, 0, 1.0, 0, 50.0, 1e9, 0.0
    )
    await _feed(joiner, first.to_json(), 0, "abstain.label-requests")
    await _feed(joiner, Label(first.request_id, "m", 1, "ops", None).to_json(), 0)
    assert joiner.models.get("m").version == 1
    seeded = seed_model(settings, "m", X, y, now=5.0).model.replace(version=2)
    await _feed(joiner, _order(settings, seeded.to_json()), 1)
    adopted = joiner.models.get("m")
    assert (adopted.version, adopted.labels_offset, adopted.labels_partition) == (2, 1, 0)
    assert adopted.learner == seeded.learner
    assert adopted.pipeline == seeded.pipeline
    published = [parse_model_envelope(r.value or b"", model="m") for r in kafka.sent(MODELS)]
    assert [p.version for p in published] == [1, 2]
    assert published[-1].learner == seeded.served().learner  # what a scorer reads of it
    assert all(p.serving for p in published)
    # a redelivered order changes nothing
    await _feed(joiner, _order(settings, seeded.to_json()), 1)
    assert joiner.models.get("m").version == 2
    # a later label is applied on top of the seeded state, once
    later = LabelRequest(
        request_id("m", "e1"), "e1", "m", [0.5, -1.0, 2.0], 0.0, 1.0, 0, 1.0, 0, 60.0, 1e9, 0.0
    )
    await _feed(joiner, later.to_json(), 1, "abstain.label-requests")
    label = Label(later.request_id, "m", -1, "ops", None).to_json()
    await _feed(joiner, label, 2)
    await _feed(joiner, label, 2)  # redelivered
    top = joiner.models.get("m")
    assert (top.version, top.labels_applied) == (3, seeded.labels_applied + 1)
    rebuilt = rebuild_model(
        settings,
        "m",
        [LogRecord(0, 0, 50_000, first.to_json()), LogRecord(0, 1, 60_000, later.to_json())],
        [
            LogRecord(0, 0, 100_000, Label(first.request_id, "m", 1, "", None).to_json()),
            LogRecord(0, 1, 100_000, _order(settings, seeded.to_json())),
            LogRecord(0, 2, 100_000, label),
        ],
    ).model
    assert (rebuilt.version, rebuilt.learner, rebuilt.pipeline) == (3, top.learner, top.pipeline)
    assert [r.json()["reason"] for r in kafka.sent(DEAD)] == []


@pytest.mark.parametrize(
    ("key", "signed_with", "reason"),
    [(b"k" * 32, None, "unsigned"), (b"k" * 32, b"x" * 32, "bad_signature"), (None, None, None)],
)
async def test_with_a_key_only_a_signed_seed_is_adopted(
    key: bytes | None, signed_with: bytes | None, reason: str | None
) -> None:
    extra = {} if key is None else {"snapshot_key": key.decode()}
    settings = Settings(models={"m": NAMED}, default_model="m", **extra)  # type: ignore[arg-type]
    joiner, kafka = _joiner(settings)
    X, y = _rows(50)
    envelope = seed_model(settings, "m", X, y, now=5.0).model.to_json()
    await _feed(joiner, _order(settings, envelope, key=signed_with), 0, key=signed_with)
    dead = [r.json()["reason"] for r in kafka.sent(DEAD)]
    if reason is None:
        assert joiner.models.get("m").version == 1
        assert dead == []
    else:
        assert joiner.models.get("m").version == 0
        assert dead == [reason]
    if key is not None:  # and the right key is taken
        await _feed(joiner, _order(settings, envelope, key=key), 1, key=key)
        assert joiner.models.get("m").version == 1


async def test_a_seed_that_does_not_fit_the_model_is_dead_lettered() -> None:
    settings = Settings(models={"m": NAMED, "p": PLAIN}, default_model="m")
    joiner, kafka = _joiner(settings)
    X, y = _rows(20)
    other = seed_model(settings, "p", X, y, now=5.0).model.replace(model="m")  # DRAL, not DSAL
    wide = initial_envelope("m", ModelConfig(algorithm="dsal", cost=0.25, n_features=4))
    broken = orjson.dumps({**orjson.loads(other.to_json()), "learner": {"x": 1}})
    for offset, value in enumerate([other.to_json(), wide.to_json(), broken, b"{"]):
        await _feed(joiner, _order(settings, value), offset)
    assert joiner.models.get("m").version == 0
    reasons = [r.json()["reason"] for r in kafka.sent(DEAD)]
    assert reasons == ["schema", "feature_count", "schema", "not_json"]


def test_adopt_seed_numbers_the_state_after_the_current_one() -> None:
    X, y = _rows(30)
    seeded = seed_model(SETTINGS, "m", X, y, now=5.0).model.replace(version=99)
    current = initial_envelope("m", NAMED).replace(version=7, labels_partition=2, labels_offset=40)
    order = Seed("m", "m", seeded.to_json(), None, "ops", None)
    adopted = adopt_seed(SETTINGS, current, order, (2, 12), now=9.0)
    assert (adopted.version, adopted.labels_partition, adopted.labels_offset) == (8, 2, 40)
    assert adopted.updated_at == 9.0
    assert math.isfinite(adopted.risk)
    # what the models topic carries (abstain models show) is no state to learn on
    shown = Seed("m", "m", seeded.served().to_json(), None, "ops", None)
    with pytest.raises(BadMessage, match="a record read to serve"):
        adopt_seed(SETTINGS, current, shown, (2, 12), now=9.0)


async def test_a_challenger_is_seeded_through_its_champions_log() -> None:
    challenger = ModelConfig(
        algorithm="dral", cost=0.25, feature_names=["a", "b", "c"], champion="m"
    )
    settings = Settings(models={"m": NAMED, "c": challenger}, default_model="m")
    joiner, kafka = _joiner(settings)
    X, y = _rows(100)
    seeded = seed_model(settings, "c", X, y, now=5.0).model
    order = Seed("m", "c", seeded.to_json(), None, "ops", 1.0, rows=100).to_json()
    await _feed(joiner, order, 0)  # key and partition: the champion's
    assert joiner.models.get("c").version == 1
    assert joiner.models.get("c").learner == seeded.learner
    assert joiner.models.get("m").version == 0
    # an order naming a model outside the group, or sent under a challenger's key, is refused
    await _feed(joiner, Seed("m", "x", seeded.to_json(), None, "ops", 1.0).to_json(), 1)
    await joiner.handle(
        msg(Seed("c", "c", seeded.to_json(), None, "o", 1.0).to_json(), 2, LABELS, 0, b"c")
    )
    assert [r.json()["reason"] for r in kafka.sent(DEAD)] == ["unknown_model", "unknown_model"]
    assert joiner.models.get("c").version == 1
