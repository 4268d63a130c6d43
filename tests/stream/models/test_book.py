"""The models topic as untrusted input: what a worker refuses to serve, and which of the
snapshots it accepts wins (no broker)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from service.learning import Adaptive
from service.records import BadMessage, Label, ModelEnvelope, RawMessage, Signer, request_id
from service.records.skips import SkipOrder
from service.stream.kafka.unreadable import UnreadableBatch
from service.stream.labels.protocol import apply_label
from service.stream.models.book import HOLD_BACK, ModelBook, signer_for
from service.stream.models.served import initial_envelope, served_learner
from service.stream.scoring.scorer import Scorer

from ..memory import CFG, MemoryKafka, msg, outputs, pending, score, settings

KEY, OLD_KEY = b"k" * 32, b"o" * 32


def learned(version: int) -> bytes:
    """A snapshot the learner could have written: ``version`` labels applied."""
    model = initial_envelope("m", CFG)
    for i in range(version):
        entry = pending([1.0, -2.0, 0.5 * i], f"r{i}")
        out = apply_label(CFG, model, entry, _label(entry.request_id), i, now=1.0)
        assert out.model is not None
        model = out.model
    return model.to_json()


def _label(rid: str) -> Label:
    return Label(rid, "m", 1, "t", None)


def reason(book: ModelBook, key: bytes | None, raw: bytes | None, sig: bytes | None = None) -> str:
    with pytest.raises(BadMessage) as info:
        book.offer(key, raw, signature=sig)
    return str(info.value.reason)


def edited(raw: bytes, **changes: object) -> bytes:
    record = orjson.loads(raw)
    for path, value in changes.items():
        target = record
        *parents, leaf = path.split("__")
        for p in parents:
            target = target[p]
        if value is None:
            del target[leaf]
        else:
            target[leaf] = value
    return orjson.dumps(record)


def test_hostile_snapshots_are_refused_and_the_served_model_stays() -> None:
    book = ModelBook(settings())
    good = learned(2)
    w = orjson.loads(good)["learner"]["champion"]["learned"]["w"]  # inside the wrapper
    assert reason(book, b"m", edited(good, labels_applied=None)) == "schema"  # a field missing
    assert reason(book, b"m", edited(good, learner__champion__learned__w=w + [1.0])) == "schema"
    assert reason(book, b"m", edited(good, learner__detector__format="x")) == "schema"
    wider = initial_envelope("m", CFG.model_copy(update={"n_features": 4})).to_json()
    assert reason(book, b"m", edited(wider, version=7)) == "feature_count"
    assert reason(book, b"m", edited(good, version=2**60)) == "schema"  # beyond any counter
    assert reason(book, b"m", good.replace(b'"rho":', b'"rho":NaN,"x":', 1)) == "not_json"
    assert reason(book, b"m", edited(good, model="n")) == "schema"  # stored under another name
    assert reason(book, b"zzz", good) == "unknown_model"
    assert reason(book, None, good) == "unknown_model"
    assert reason(book, b"m", None) == "not_json"  # a tombstone
    assert reason(book, b"m", b"garbage") == "not_json"
    other = initial_envelope("m", CFG.model_copy(update={"algorithm": "dral"})).to_json()
    assert reason(book, b"m", other) == "schema"  # another algorithm
    assert book.models["m"].version == 0
    assert book.offer(b"m", good)
    assert book.models["m"].version == 2


def test_without_a_key_the_newest_record_wins_so_a_forged_version_cannot_pin() -> None:
    now = [0.0]
    book = ModelBook(settings(), clock=lambda: now[0])
    book.loaded.set()  # read to the end: what comes now is live
    assert book.offer(b"m", learned(3))
    forged = edited(learned(1), version=10**15)
    assert book.offer(b"m", forged)
    assert book.models["m"].version == 10**15
    assert not book.offer(b"m", learned(4))  # the learner's next publication: held back
    now[0] += HOLD_BACK  # nobody published the forged version again
    assert book.snapshot()["m"].version == 4
    assert not book.offer(b"m", learned(4))  # a republished copy changes nothing


def test_without_a_key_a_copy_of_an_older_version_is_never_served() -> None:
    now = [0.0]
    book = ModelBook(settings(), clock=lambda: now[0])
    assert book.offer(b"m", learned(3))
    assert book.offer(b"m", learned(1))  # while the topic is read: the newest record wins
    assert book.offer(b"m", learned(3))
    book.loaded.set()
    assert not book.offer(b"m", learned(2))  # an older version, written again: held back
    assert book.held() == {"m": 2}
    now[0] += 1.0
    assert not book.offer(b"m", learned(3))  # the learner publishes its newest again
    assert book.held() == {}
    now[0] += 10 * HOLD_BACK
    assert book.serving()[0]["m"].version == 3


def test_with_a_key_only_signed_snapshots_are_served_and_versions_only_grow() -> None:
    signer = Signer(KEY, [OLD_KEY])
    book = ModelBook(settings(), signer=signer)
    v2, v3 = learned(2), learned(3)
    assert reason(book, b"m", v2) == "unsigned"
    assert reason(book, b"m", v2, Signer(b"x" * 32).sign(b"m", v2)) == "bad_signature"
    assert reason(book, b"m", v2, signer.sign(b"n", v2)) == "bad_signature"  # another key's
    assert reason(book, b"m", v3, signer.sign(b"m", v2)) == "bad_signature"  # another value
    assert reason(book, b"m", v2, b"v1:zz") == "bad_signature"
    assert book.offer(b"m", v3, signature=Signer(OLD_KEY).sign(b"m", v3))  # rotated out: ok
    assert not book.offer(b"m", v2, signature=signer.sign(b"m", v2))  # an older one replayed
    assert book.models["m"].version == 3


def test_the_signer_comes_from_the_settings() -> None:
    assert signer_for(settings()) is None
    s = settings(snapshot_key="k" * 32, snapshot_key_previous="o" * 32)
    signer = signer_for(s)
    assert signer is not None
    raw = learned(1)
    assert Signer(OLD_KEY).verify(b"m", raw, signer.sign(b"m", raw)) == "bad_signature"
    assert signer.verify(b"m", raw, Signer(OLD_KEY).sign(b"m", raw)) is None
    assert request_id("m", "x") != request_id("n", "x")


def _changed_envelope(version: int) -> tuple[Adaptive, ModelEnvelope]:
    """A model whose labels flipped: its learner (fed directly, the pipeline never learns,
    so an event's features are the learner's inputs) has detected the change."""
    learner = served_learner(CFG, initial_envelope("m", CFG).learner, serving=False)
    rng = np.random.default_rng(0)
    for t in range(2000):
        x = np.r_[rng.normal(size=3), 1.0]
        learner.update(x, (1 if x[0] > 0 else -1) * (1 if t < 600 else -1))
        if learner.changes_detected:
            break
    assert learner.changes_detected == 1
    return learner, initial_envelope("m", CFG).replace(version=version, learner=learner.to_state())


async def test_a_model_without_a_budget_asks_a_window_of_decisions_after_a_change() -> None:
    book, kafka = ModelBook(settings()), MemoryKafka()
    s = settings()
    out = outputs(kafka, s, CollectorRegistry())
    scorer = Scorer(s, book.serving, out, out.metrics, clock=lambda: 50.0)
    learner, envelope = _changed_envelope(7)
    assert book.offer(b"m", envelope.to_json())
    floor = book.models["m"].learner.explore_decisions
    assert floor == 20

    def sure(n: int, start: int) -> list[RawMessage]:  # the champion's own p is ~0 there
        return [
            msg({"id": f"e{i}", "features": [25.0, 0.0, 0.0]}, i) for i in range(start, start + n)
        ]

    first = await score(scorer, sure(12, 0))
    assert [d.query_probability for d in first.decisions] == [1.0] * 12
    learner.update(np.array([0.3, 0.1, 0.2, 1.0]), -1)  # a label: the label path's next version
    assert learner.changes_detected == 1
    assert learner.explored == 0
    assert book.offer(b"m", envelope.replace(version=8, learner=learner.to_state()).to_json())
    assert book.models["m"].learner.explored == 12  # the scorer's count goes on
    later = await score(scorer, sure(40, 12))
    probs = [d.query_probability for d in later.decisions]
    assert probs[:8] == [1.0] * 8
    assert max(probs[8:]) < 0.06  # the champion's own p and the model's 5 % audit


def test_skip_orders_are_checked_like_snapshots() -> None:
    s = settings()
    features = s.topics.features
    order = SkipOrder(features, 0, first=10, end=13, detail="d", by="ops", at=1.0)
    key, raw = order.key.encode(), order.to_json()
    signer = Signer(KEY)
    book = ModelBook(s, signer=signer)
    assert reason(book, key, raw) == "unsigned"
    assert reason(book, key, raw, Signer(b"x" * 32).sign(key, raw)) == "bad_signature"
    assert reason(book, key, None, signer.sign(key, b"")) == "not_json"  # a tombstone
    other = SkipOrder(features, 0, first=11, end=13).to_json()
    assert reason(book, key, other, signer.sign(key, other)) == "bad_key"  # not its own key
    models = SkipOrder(s.topics.models, 0, first=1, end=2)
    mk, mraw = models.key.encode(), models.to_json()
    assert reason(book, mk, mraw, signer.sign(mk, mraw)) == "schema"  # not a topic we stop at
    bad = edited(raw, end=5)  # end before first
    assert reason(book, key, bad, signer.sign(key, bad)) == "schema"
    assert book.skips.orders == {}
    assert book.offer(key, raw, signature=signer.sign(key, raw))
    assert not book.offer(key, raw, signature=signer.sign(key, raw))  # known
    batch = UnreadableBatch(features, 0, 10, 13, "E")
    assert book.skips.order_for(batch) == order
    assert book.skips.order_for(UnreadableBatch(features, 0, 10, 14, "E")) is None
    assert book.models["m"].version == 0  # no model touched
    assert ModelBook(s).offer(key, raw)  # without a key: taken unsigned


def test_the_gauges_show_the_size_of_the_version_served_and_its_share_of_the_limit() -> None:
    from service.metrics import Metrics  # noqa: PLC0415 - this test only

    registry = CollectorRegistry()
    metrics = Metrics(registry, models=["m"])
    s = settings()
    book = ModelBook(
        s, on_swap=lambda m: metrics.set_model(m.name, **m.gauges(), version_bytes=10_000)
    )

    def gauges() -> tuple[float | None, float | None]:
        return (
            registry.get_sample_value("abstain_model_version_bytes", {"model": "m"}),
            registry.get_sample_value("abstain_model_version_share", {"model": "m"}),
        )

    assert gauges() == (0.0, 0.0)  # the initial version is made, not read
    v2, v3 = learned(2), learned(3)
    assert book.offer(b"m", v2)
    assert gauges() == (len(v2), len(v2) / 10_000)
    assert book.offer(b"m", v3)
    assert gauges() == (len(v3), len(v3) / 10_000)
    assert book.models["m"].record_bytes == len(v3)


def _read(raw: bytes) -> RawMessage:
    return RawMessage(raw, "abstain.models", 0, 0, b"m")


async def test_a_snapshot_is_built_aside_while_the_loop_goes_on_with_the_version_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wide model's version takes milliseconds to build; it is built on a thread of its
    own, so the loop (the scorer) goes on with the version served until the new one is
    ready, and a refused one is refused as :meth:`ModelBook.offer` refuses it."""
    import asyncio  # noqa: PLC0415
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    from service.stream.models import book as book_module  # noqa: PLC0415

    build = book_module.ServedModel.from_envelope
    threads: list[str] = []

    def slow(*args: object, **kwargs: object) -> object:
        threads.append(threading.current_thread().name)
        time.sleep(0.3)  # a wide model's arrays, made whole
        return build(*args, **kwargs)  # type: ignore[arg-type]

    book = ModelBook(settings())
    monkeypatch.setattr(book_module.ServedModel, "from_envelope", slow)
    ticks = 0

    async def loop_goes_on() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(loop_goes_on())
    try:
        offered = asyncio.create_task(book.offer_aside(_read(learned(2)), learned(2)))
        await asyncio.sleep(0.15)
        assert book.models["m"].version == 0  # still served while the next one is built
        assert await offered
        assert book.models["m"].version == 2
        assert ticks >= 10  # the loop ran while it was built
        assert threads == ["abstain-model-build_0"]
        bad = edited(learned(3), labels_applied=None)
        with pytest.raises(BadMessage) as info:
            await book.offer_aside(_read(bad), bad)
        assert info.value.reason == "schema"
        assert book.models["m"].version == 2
        assert await book.offer_aside(_read(learned(3)), learned(3))
    finally:
        ticker.cancel()
        book.close()
    assert book.models["m"].version == 3
