"""What a hashed model of the default width (2^18 buckets) writes as it learns: the models
topic's record (what a scorer reads) holds the champion's weights of the buckets a stream
touched, so an untrained model is a small record, and one whose stream of 300-token events
touched about 40,000 buckets stays under Kafka's default record of 1,000,000 bytes, also
while its challengers run after the stream turned. The learner's state (its table), which
holds the challengers and what it remembers, takes what ``state_bytes`` gives it. The labels
come as a worker's label requests (scored by the served model, then applied by the learn
path), so every part of a version grows as it does in service."""

from __future__ import annotations

from typing import Any

import numpy as np

from service.config import ModelConfig, Settings
from service.features import MAX_HASH_BITS
from service.records import Label, PendingEntry, parse_label_request
from service.stream.labels.protocol import apply_label
from service.stream.models.served import ServedModel, initial_envelope
from service.stream.scoring.decide import Limits, score_batch

from ..memory import msg

FIELDS = {
    "amount": "number",
    "age": "number",
    "country": "category",
    "merchant": {"kind": "category", "missing": "indicator"},
    "new_device": "boolean",
    "text": "tokens",
}
WORDS = 60_000  # words the stream draws its tokens from: ~40,000 buckets by 300 labels
KIB = 1024


def _config() -> ModelConfig:
    # DSOL: every event is asked about, so each label below is one a worker asked for
    return ModelConfig(algorithm="dsol", fields={"fields": FIELDS})


def _events(rng: np.random.Generator, n: int) -> list[tuple[dict[str, Any], int]]:
    out = []
    for t in range(n):
        text = [f"w{int(k)}" for k in rng.integers(0, WORDS, size=300)]
        fields = {
            "amount": float(rng.lognormal(3, 1)),
            "age": float(rng.integers(18, 90)),
            "country": str(rng.choice(["SE", "NO", "DE", "FR", "US"])),
            "merchant": None if rng.random() < 0.2 else f"m{int(rng.integers(0, 300))}",
            "new_device": bool(rng.random() < 0.3),
            "text": text,
        }
        y = 1 if fields["new_device"] or "w1" in text[:50] else -1
        out.append((fields, y if t < n // 2 else -y))  # the stream turns halfway
    return out


def test_a_2_18_model_is_a_small_record_untrained_and_under_900_kib_after_40000_buckets() -> None:
    cfg = _config()
    assert cfg.fields is not None
    assert cfg.fields.hash_bits == MAX_HASH_BITS == 18  # the default width, the most
    settings = Settings(models={"m": cfg.model_dump()}, default_model="m")
    untrained = initial_envelope("m", cfg)
    assert len(untrained.served().to_bytes()) <= 16 * KIB
    served = ServedModel.initial("m", cfg)
    stream = _events(np.random.default_rng(3), 300)
    result = score_batch(
        {"m": served},
        [msg({"id": f"e{i}", "features": f}, i) for i, (f, _) in enumerate(stream)],
        limits=Limits(default_model="m", request_ttl=3600.0),
        now=1.0,
    )
    assert not result.dead_letters
    raw = [r.to_json() for r in result.label_requests]
    assert len(raw) == len(stream)
    assert max(len(r) for r in raw) <= 4 * KIB  # the fields as sent, not 2^18 inputs
    requests = [parse_label_request(r) for r in raw]
    model, changes, sizes, states, running = untrained, 0, [], [], []
    for i, (request, (_, y)) in enumerate(zip(requests, stream, strict=True)):
        label = Label(request.request_id, "m", y, "test", None)
        out = apply_label(cfg, model, PendingEntry(request, 0), label, i, now=2.0, defer=True)
        assert out.model is not None, out.detail
        model, changes = out.model, changes + out.changes
        if i % 25 == 24:
            sizes.append(len(model.served().to_bytes()))
            states.append(len(model.to_bytes()))
            running.append(len(model.learner["contest"]["challengers"]))
    assert changes >= 1  # the turn was seen: challengers learned beside the champion
    assert max(running) == 3
    weights = ServedModel.from_envelope(cfg, model).learner.w
    buckets = int(np.count_nonzero(weights[2:-1]))  # the numbers first, the intercept last
    assert 35_000 <= buckets <= 45_000, buckets
    assert model.labels_applied == len(stream)
    assert max(sizes) <= 900 * KIB, sizes  # every version, the contest's too
    assert max(states) > 1_000_000  # the learner's state would not fit a default record
    assert max(states) <= settings.state_bytes  # and its table takes it
    print(
        f"2^18: {buckets:,} buckets learned; untrained {len(untrained.served().to_bytes()):,} "
        f"bytes; every 25 labels, what a scorer reads {sizes}, the learner's state {states}, "
        f"challengers {running}; a request at most {max(len(r) for r in raw):,} bytes"
    )
