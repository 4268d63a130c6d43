"""Inputs for the fault tests: good events with a known truth, and malformed messages, each
tagged with the dead-letter reason the promise says it must get.

Whether a malformed message is "not JSON" is decided by the standard library's parser
(the JSON the service accepts is a superset: ``NaN``/``Infinity`` parse), never by the
service's own code.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiokafka.partitioner import murmur2

from service.config import ModelConfig
from service.records import request_id
from service.stream.models.served import initial_envelope

from .kafkaio import Out

__all__ = [
    "HOSTILE_HEADER",
    "SNAPSHOT_KINDS",
    "Bad",
    "EventSource",
    "Genuine",
    "Hostile",
    "SnapshotSigner",
    "bad_feature_events",
    "bad_label_requests",
    "bad_labels",
    "home_partition",
    "hostile_labels",
    "hostile_requests",
    "hostile_snapshots",
    "is_hostile",
    "label_request",
    "truth",
]

N_FEATURES = 3
TRUE_W = np.array([1.0, 0.5, -1.0])


def truth(x: list[float]) -> int:
    """The true label of a feature vector (a fixed linear rule)."""
    return 1 if float(np.dot(TRUE_W, np.asarray(x, dtype=float))) > 0 else -1


@dataclass(frozen=True, slots=True)
class Bad:
    """A malformed message and the (source, reason) its dead letter must carry."""

    value: bytes
    source: str  # "features" | "labels" | "label-requests"
    reason: str
    key: bytes | None = None


class EventSource:
    """Good feature events ``{id, model?, features, ts?}`` with their true labels."""

    def __init__(
        self, prefix: str, *, model: str = "m", seed: int = 0, truth: dict[str, int] | None = None
    ) -> None:
        self.prefix = prefix
        self.model = model
        self.rng = np.random.default_rng(seed)
        self.truth: dict[str, int] = {} if truth is None else truth  # event id -> label
        self.ids: list[str] = []  # this source's events, in order
        self.features: dict[str, list[float]] = {}
        self.count = 0

    def make(self, n: int) -> list[tuple[bytes, bytes]]:
        """``n`` new events as ``(key, value)``; ids are unique across calls."""
        out = []
        for _ in range(n):
            i = self.count
            self.count += 1
            eid = f"{self.prefix}-{i}"
            x = self.rng.normal(size=N_FEATURES).round(4).tolist()
            event: dict[str, Any] = {"id": eid, "features": x}
            if i % 3:  # a third rely on the default model
                event["model"] = self.model
            if i % 2:
                event["ts"] = time.time()
            self.truth[eid] = truth(x)
            self.ids.append(eid)
            self.features[eid] = x
            out.append((eid.encode(), json.dumps(event).encode()))
        return out


def _is_json(raw: bytes) -> bool:
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return True


def _garbage(rng: np.random.Generator) -> bytes:
    while True:
        raw = rng.integers(0, 256, size=int(rng.integers(1, 120)), dtype=np.uint8).tobytes()
        if not _is_json(raw):
            return raw


def _pad(obj: dict[str, Any], size: int) -> bytes:
    """``obj`` with a padding field so that the message is ``size`` bytes or more."""
    base = json.dumps({**obj, "pad": ""}).encode()
    return json.dumps({**obj, "pad": "x" * max(0, size - len(base) + 1)}).encode()


HUGE_INT = "1" + "0" * 400  # an integer literal no float can hold


def _feature_makers(
    max_bytes: int,
) -> list[tuple[str, Callable[[str, np.random.Generator], bytes]]]:
    def ok(eid: str, rng: np.random.Generator) -> list[float]:
        return rng.normal(size=N_FEATURES).round(3).tolist()

    def obj(d: dict[str, Any]) -> bytes:
        return json.dumps(d).encode()

    return [
        ("not_json", lambda e, r: _garbage(r)),
        ("not_json", lambda e, r: obj({"id": e, "features": ok(e, r)})[:-3]),  # truncated
        ("not_json", lambda e, r: b""),
        ("not_json", lambda e, r: b"[" * 2000 + b"]" * 2000),  # deeper than parsers go
        ("schema", lambda e, r: obj([e, ok(e, r)])),  # type: ignore[arg-type]
        ("schema", lambda e, r: b'"just a string"'),
        ("schema", lambda e, r: b"42"),
        ("schema", lambda e, r: b"null"),
        ("schema", lambda e, r: obj({"features": ok(e, r)})),  # no id
        ("schema", lambda e, r: obj({"id": e})),  # no features
        ("schema", lambda e, r: obj({"id": [e], "features": ok(e, r)})),
        ("schema", lambda e, r: obj({"id": True, "features": ok(e, r)})),
        ("schema", lambda e, r: obj({"id": 1.5, "features": ok(e, r)})),
        ("schema", lambda e, r: obj({"id": "", "features": ok(e, r)})),
        ("schema", lambda e, r: obj({"id": "x" * 300, "features": ok(e, r)})),
        ("schema", lambda e, r: obj({"id": e, "features": "1,2,3"})),
        ("schema", lambda e, r: obj({"id": e, "features": None})),
        ("schema", lambda e, r: obj({"id": e, "features": [1, "2", 3]})),
        ("schema", lambda e, r: obj({"id": e, "features": [1, True, 3]})),
        ("schema", lambda e, r: obj({"id": e, "features": [1, [2], 3]})),
        ("schema", lambda e, r: obj({"id": e, "features": [1, None, 3]})),
        ("schema", lambda e, r: obj({"id": e, "features": {"a": 1, "b": 2, "c": 3}})),
        ("schema", lambda e, r: obj({"id": e, "features": ok(e, r), "ts": "yesterday"})),
        ("schema", lambda e, r: obj({"id": e, "model": ["m"], "features": ok(e, r)})),
        # an id that is not text (a lone UTF-16 surrogate cannot be written back out)
        ("schema", lambda e, r: b'{"id": "\\ud800' + e.encode() + b'", "features": [1, 2, 3]}'),
        # ... and a feature name that is not text, in a message refused for its value
        ("schema", lambda e, r: b'{"id": "%s", "features": {"\\udc00": "a"}}' % e.encode()),
        ("non_finite", lambda e, r: f'{{"id": "{e}", "features": [1, NaN, 3]}}'.encode()),
        ("non_finite", lambda e, r: f'{{"id": "{e}", "features": [Infinity, 2, 3]}}'.encode()),
        ("non_finite", lambda e, r: f'{{"id": "{e}", "features": [1, 2, -Infinity]}}'.encode()),
        ("non_finite", lambda e, r: f'{{"id": "{e}", "features": [1e400, 2, 3]}}'.encode()),
        ("non_finite", lambda e, r: f'{{"id": "{e}", "features": [1, -1e999, 3]}}'.encode()),
        ("non_finite", lambda e, r: f'{{"id": "{e}", "features": [1, 2, {HUGE_INT}]}}'.encode()),
        ("non_finite", lambda e, r: f'{{"id": "{e}", "features": [1, 2, 3], "ts": NaN}}'.encode()),
        (
            "non_finite",
            lambda e, r: f'{{"id": "{e}", "features": [1, 2, 3], "ts": 1e999}}'.encode(),
        ),
        ("feature_count", lambda e, r: obj({"id": e, "features": [1.0, 2.0]})),
        ("feature_count", lambda e, r: obj({"id": e, "features": [1.0, 2.0, 3.0, 4.0]})),
        ("feature_count", lambda e, r: obj({"id": e, "features": []})),
        ("feature_count", lambda e, r: obj({"id": e, "model": "m", "features": [0.0] * 40})),
        ("unknown_model", lambda e, r: obj({"id": e, "model": "nope", "features": ok(e, r)})),
        ("unknown_model", lambda e, r: obj({"id": e, "model": 7, "features": ok(e, r)})),
        ("oversize", lambda e, r: _pad({"id": e, "features": ok(e, r)}, max_bytes + 1)),
        ("oversize", lambda e, r: b"\xff" * (max_bytes + 100)),
    ]


def bad_feature_events(n: int, *, prefix: str, max_bytes: int, seed: int = 1) -> list[Bad]:
    """``n`` malformed feature events cycling through every kind of defect."""
    rng = np.random.default_rng(seed)
    makers = _feature_makers(max_bytes)
    out = []
    for i in range(n):
        reason, make = makers[i % len(makers)]
        eid = f"{prefix}-{i}"
        out.append(Bad(make(eid, rng), "features", reason, eid.encode()))
    return out


def bad_labels(n: int, *, model: str, max_bytes: int, seed: int = 2) -> list[Bad]:
    """``n`` malformed labels (defects in the message itself, no request needed)."""
    rng = np.random.default_rng(seed)

    def obj(d: Any) -> bytes:
        return json.dumps(d).encode()

    def lab(**kw: Any) -> dict[str, Any]:
        return {"request_id": "r-none", "model": model, "label": 1, **kw}

    makers: list[tuple[str, Callable[[], bytes]]] = [
        ("not_json", lambda: _garbage(rng)),
        ("not_json", lambda: obj(lab())[:-2]),
        ("schema", lambda: obj([1, 2])),
        ("schema", lambda: obj({"model": model, "label": 1})),
        ("schema", lambda: obj({"request_id": "r", "label": 1})),
        ("schema", lambda: obj({"request_id": "r", "model": model})),
        ("schema", lambda: obj(lab(request_id=2.5))),
        ("schema", lambda: obj(lab(labelled_by=7))),
        ("schema", lambda: obj(lab(ts="now"))),
        (
            "schema",
            lambda: b'{"request_id": "\\ud800", "model": "%s", "label": 1}' % model.encode(),
        ),
        ("schema", lambda: obj(lab())[:-1] + b', "labelled_by": "\\udfff"}'),
        ("bad_label", lambda: obj(lab(label=0))),
        ("bad_label", lambda: obj(lab(label=2))),
        ("bad_label", lambda: obj(lab(label=-2))),
        ("bad_label", lambda: obj(lab(label="1"))),
        ("bad_label", lambda: obj(lab(label=1.0))),
        ("bad_label", lambda: obj(lab(label=True))),
        ("bad_label", lambda: obj(lab(label=None))),
        ("bad_label", lambda: obj(lab(label=[1]))),
        ("bad_label", lambda: b'{"request_id": "r", "model": "%s", "label": NaN}' % model.encode()),
        (
            "non_finite",
            lambda: (
                b'{"request_id": "r", "model": "%s", "label": 1, "ts": Infinity}' % model.encode()
            ),
        ),
        (
            "non_finite",
            lambda: (
                b'{"request_id": "r", "model": "%s", "label": 1, "ts": %s}'
                % (model.encode(), HUGE_INT.encode())
            ),
        ),
        ("unknown_model", lambda: obj(lab(model="nope"))),
        ("oversize", lambda: _pad(lab(), max_bytes + 1)),
    ]
    out = []
    for i in range(n):
        reason, make = makers[i % len(makers)]
        out.append(Bad(make(), "labels", reason, model.encode()))
    return out


def label_request(
    request_id: str, model: str, features: list[float], *, expires_at: float, **kw: Any
) -> dict[str, Any]:
    """A label request as scorers write it (for requests the test injects itself)."""
    now = time.time()
    return {
        "request_id": request_id,
        "event_id": f"ev-{request_id}",
        "model": model,
        "features": features,
        "score": 0.0,
        "rho": 1.0,
        "decided_label": 0,
        "query_probability": 0.5,
        "model_version": 0,
        "requested_at": now,
        "expires_at": expires_at,
        "priority": 0.5,
        **kw,
    }


def bad_label_requests(n: int, *, model: str, max_bytes: int, seed: int = 3) -> list[Bad]:
    """``n`` malformed label requests (anyone can write to the topic)."""
    rng = np.random.default_rng(seed)
    far = time.time() + 3600

    def req(i: int, **kw: Any) -> dict[str, Any]:
        return {**label_request(f"badreq-{i}", model, [0.1, 0.2, 0.3], expires_at=far), **kw}

    def obj(d: Any) -> bytes:
        return json.dumps(d).encode()

    makers: list[tuple[str, Callable[[int], bytes]]] = [
        ("not_json", lambda i: _garbage(rng)),
        ("schema", lambda i: obj([i])),
        ("schema", lambda i: obj({k: v for k, v in req(i).items() if k != "features"})),
        ("schema", lambda i: obj(req(i, decided_label=5))),
        ("schema", lambda i: obj(req(i, query_probability=0.0))),
        ("schema", lambda i: obj(req(i, features="abc"))),
        ("non_finite", lambda i: obj(req(i)).replace(b"0.1, 0.2", b"NaN, 0.2")),
        ("unknown_model", lambda i: obj(req(i, model="nope"))),
        ("oversize", lambda i: _pad(req(i), max_bytes + 1)),
    ]
    out = []
    for i in range(n):
        reason, make = makers[i % len(makers)]
        out.append(Bad(make(i), "label-requests", reason, model.encode()))
    return out


# --- hostile records on the models, label-requests and labels topics ----------------------
#
# What someone who can write those topics could send: tombstones, records with a wrong or no
# key, on the wrong partition, label requests whose id the service would not derive, an
# event id reused with other features, snapshots that are malformed, of the wrong width, of a
# forged huge version, unsigned or mis-signed. Each carries the dead-letter reason the
# service must give it (None: a record that changes nothing and is not dead-lettered, such
# as a replayed older snapshot). Every hostile record also carries the header
# ``HOSTILE_HEADER`` so the harness can tell it from the good traffic when it reads the
# topics back; the service ignores headers it does not know.

HOSTILE_HEADER = "faults-hostile"
_MARK = (HOSTILE_HEADER, b"1")


def is_hostile(headers: Sequence[tuple[str, bytes]] | None) -> bool:
    """True if a record's headers carry the harness's hostile mark."""
    return any(name == HOSTILE_HEADER for name, _ in headers or ())


def home_partition(model: str, partitions: int) -> int:
    """The partition the producers' default partitioner (murmur2 of the key) gives a model's
    records among ``partitions`` (computed here, not taken from the service)."""
    return int(murmur2(model.encode()) & 0x7FFFFFFF) % partitions


class SnapshotSigner:
    """The snapshot signature as SECURITY.md documents it (written here independently of
    ``service.records.signing``): header ``abstain-signature`` = ``v1:<key id>:<hex>``, the
    key id the first 16 hex digits of SHA-256 of the key, the digest HMAC-SHA256(key, record
    key + NUL + value)."""

    HEADER = "abstain-signature"

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.key_id = hashlib.sha256(key).hexdigest()[:16]

    def sign(self, record_key: bytes, value: bytes) -> tuple[str, bytes]:
        digest = hmac.new(self.key, record_key + b"\x00" + value, hashlib.sha256).hexdigest()
        return self.HEADER, f"v1:{self.key_id}:{digest}".encode()


@dataclass(frozen=True, slots=True)
class Hostile:
    """One hostile record: where it goes, what it is, the dead letter it must get."""

    topic: str  # a deployment topic key: "models", "label_requests" or "labels"
    kind: str
    reason: str | None  # the dead-letter reason (None: no dead letter, it changes nothing)
    key: bytes | None
    value: bytes | None  # None: a tombstone
    partition: int | None = None  # None: the producer's partitioner (by key)
    headers: tuple[tuple[str, bytes], ...] = ()

    def out(self) -> Out:
        """The record to produce (with the hostile mark)."""
        return Out(self.key, self.value, self.partition, (*self.headers, _MARK))

    @property
    def source(self) -> str:
        """The ``source`` label of its dead-letter counter."""
        return {"label_requests": "label-requests"}.get(self.topic, self.topic)


@dataclass
class Genuine:
    """What the hostile writer knows of one model's good traffic so far."""

    model: str
    config: ModelConfig
    partitions: int  # of the label-requests and labels topics
    snapshot_key: bytes | None = None  # the workers' snapshot key (None: unsigned)
    requests: list[dict[str, Any]] = field(default_factory=list)  # seen on the topic
    labels: list[dict[str, Any]] = field(default_factory=list)  # sent by the oracle
    snapshots: list[dict[str, Any]] = field(default_factory=list)  # the learner's, in order

    @property
    def home(self) -> int:
        return home_partition(self.model, self.partitions)

    @property
    def away(self) -> int:
        """A partition the model's records never belong on."""
        return (self.home + 1) % self.partitions

    @property
    def latest(self) -> dict[str, Any]:
        """The newest snapshot the learner wrote (version 0 before any)."""
        if self.snapshots:
            return self.snapshots[-1]
        return initial_envelope(self.model, self.config).to_dict()


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def forged_envelope(g: Genuine, version: int, rng: np.random.Generator) -> dict[str, Any]:
    """A well-formed snapshot of ``g.model`` with weights of the attacker's choosing."""
    base = g.latest
    learner = json.loads(json.dumps(base["learner"]))
    inner = learner["champion"] if learner.get("format") == "abstain.adaptive" else learner
    w = inner["learned"]["w"]
    inner["learned"]["w"] = (rng.normal(size=len(w)) * 50).tolist()
    inner["learned"]["rho"] = 0.0  # never abstain
    return {**base, "version": version, "learner": learner}


def wrong_width_envelope(g: Genuine, version: int) -> dict[str, Any]:
    """A well-formed snapshot of ``g.model`` for two more input features than it takes."""
    cfg = g.config.model_copy(update={"n_features": g.config.n_inputs + 2})
    return {**initial_envelope(g.model, cfg).to_dict(), "version": version}


def _snapshot_kinds(g: Genuine, rng: np.random.Generator, i: int) -> list[tuple[str, Any]]:
    """(kind, maker) pairs; a maker returns (key, value, content reason)."""
    m = g.model.encode()
    latest = g.latest
    version = int(latest["version"])
    missing = {k: v for k, v in latest.items() if k != "iw_weight"}
    older = g.snapshots[-(1 + i % max(1, len(g.snapshots)))] if g.snapshots else latest
    return [
        ("tombstone", lambda: (m, None, "not_json")),
        ("tombstone, empty key", lambda: (b"", None, "unknown_model")),
        ("unknown key", lambda: (b"nope", _dumps({**latest, "model": "nope"}), "unknown_model")),
        ("missing field", lambda: (m, _dumps(missing), "schema")),
        ("wrong width", lambda: (m, _dumps(wrong_width_envelope(g, version + 1)), "feature_count")),
        ("version 2**53", lambda: (m, _dumps({**latest, "version": 2**53}), "schema")),
        ("negative counter", lambda: (m, _dumps({**latest, "labels_applied": -1}), "schema")),
        ("NaN", lambda: (m, _dumps({**latest, "iw_loss": float("nan")}), "not_json")),
        ("not JSON", lambda: (m, _dumps(latest)[:-7], "not_json")),
        ("huge version", lambda: (m, _dumps(forged_envelope(g, 10**15 + i, rng)), None)),
        ("replay of an older snapshot", lambda: (m, _dumps(older), None)),
    ]


SNAPSHOT_KINDS = (
    "tombstone",
    "tombstone, empty key",
    "unknown key",
    "missing field",
    "wrong width",
    "version 2**53",
    "negative counter",
    "NaN",
    "not JSON",
    "huge version",
    "replay of an older snapshot",
)
_SIGNATURES = ("none", "attacker", "garbage", "other value", "other model", "real")


def hostile_snapshots(
    n: int,
    g: Genuine,
    *,
    start: int = 0,
    seed: int = 5,
    kinds: Sequence[str] = SNAPSHOT_KINDS,
) -> list[Hostile]:
    """``n`` hostile records for the models topic, cycling ``kinds``.

    Without a snapshot key they are unsigned and refused for their content; two kinds are
    not refused: a well-formed snapshot of a huge version and a replayed older one are
    served (the newest record wins) until the learner's next publication replaces them.
    With a key (``g.snapshot_key``) each record is also, in turn, unsigned, signed by
    another key, given a garbage signature, the real key's signature of another record or
    of another model's key, or -- for the content checks behind the signature -- signed with
    the real key. A well-formed newer snapshot is never signed with the real key (a holder
    of the key can publish any model); a replayed older snapshot keeps its real signature
    and changes nothing (the highest signed version is served)."""
    rng = np.random.default_rng(seed + start)
    real = SnapshotSigner(g.snapshot_key) if g.snapshot_key else None
    attacker = SnapshotSigner(uuid.uuid4().hex.encode() * 2)
    out = []
    for j in range(n):
        i = start + j
        makers = dict(_snapshot_kinds(g, rng, i))
        kind = kinds[i % len(kinds)]
        key, value, reason = makers[kind]()
        headers: tuple[tuple[str, bytes], ...] = ()
        if real is not None and value is not None:
            signature = _SIGNATURES[(i // len(kinds)) % len(_SIGNATURES)]
            if kind == "replay of an older snapshot":
                signature = "real"
            elif reason is None and signature == "real":
                signature = "none"
            headers = {
                "none": (),
                "attacker": (attacker.sign(key or b"", value),),
                "garbage": ((SnapshotSigner.HEADER, b"v1:nonsense"),),
                "other value": (real.sign(key or b"", value + b" "),),
                "other model": (real.sign(b"other", value),),
                "real": (real.sign(key or b"", value),),
            }[signature]
            if key == g.model.encode() and signature != "real":  # the key is checked first
                reason = "unsigned" if signature == "none" else "bad_signature"
            kind = f"{kind}, {'unsigned' if signature == 'none' else 'signed: ' + signature}"
        out.append(Hostile("models", kind, reason, key, value, headers=headers))
    return out


def hostile_requests(n: int, g: Genuine, *, start: int = 0, seed: int = 6) -> list[Hostile]:
    """``n`` hostile label requests for model ``g.model``. Copies of genuine requests (other
    key, other partition, other features) need ``g.requests``; before there are any, made-up
    requests with derived ids stand in for them."""
    rng = np.random.default_rng(seed + start)
    m, model = g.model.encode(), g.model
    width = g.config.n_inputs
    far = time.time() + 3600

    def fresh(i: int, **kw: Any) -> dict[str, Any]:
        eid = f"hostile-{i}-{uuid.uuid4().hex[:8]}"
        x = rng.normal(size=width).round(4).tolist()
        return label_request(request_id(model, eid), model, x, expires_at=far, event_id=eid, **kw)

    def genuine(i: int) -> dict[str, Any] | None:
        return dict(g.requests[i % len(g.requests)]) if g.requests else None

    def copy(i: int) -> dict[str, Any]:
        return genuine(i) or fresh(i)

    def forged(i: int) -> dict[str, Any]:
        x = (rng.normal(size=width) * 1000).round(2).tolist()  # the attacker's features
        return {
            **fresh(i),
            "request_id": uuid.uuid4().hex,
            "features": x,
            "query_probability": 0.001,
        }

    def forged_for_another(i: int) -> tuple[dict[str, Any], str]:
        real = genuine(i)
        if real is None:
            return forged(i), "forged_id"
        return {**real, "event_id": f"{real['event_id']}-other"}, "forged_id"

    def duplicate(i: int) -> tuple[dict[str, Any], str]:
        real = genuine(i)
        if real is None:
            return forged(i), "forged_id"
        x = [v + 1.0 for v in real["features"]]
        return {**real, "features": x}, "duplicate_id"

    def wide(i: int) -> dict[str, Any]:
        return {**fresh(i), "features": [0.5] * (width + 2)}

    def nope(i: int) -> dict[str, Any]:
        eid = f"nope-{i}"
        return {**fresh(i), "model": "nope", "request_id": request_id("nope", eid), "event_id": eid}

    home, away = g.home, g.away
    kinds: list[tuple[str, Callable[[int], tuple[bytes | None, bytes | None, int, str]]]] = [
        ("tombstone", lambda i: (m, None, home, "not_json")),
        ("tombstone, empty key", lambda i: (b"", None, away, "not_json")),
        ("forged id", lambda i: (m, _dumps(forged(i)), home, "forged_id")),
        ("id of another event", lambda i: (m, _dumps((r := forged_for_another(i))[0]), home, r[1])),
        ("wrong width", lambda i: (m, _dumps(wide(i)), home, "feature_count")),
        ("unknown model", lambda i: (m, _dumps(nope(i)), home, "unknown_model")),
        ("wrong key", lambda i: (b"x", _dumps(copy(i)), home, "bad_key")),
        ("no key", lambda i: (None, _dumps(copy(i)), home, "bad_key")),
        ("wrong partition", lambda i: (m, _dumps(copy(i)), away, "wrong_partition")),
        ("reused event id", lambda i: (m, _dumps((r := duplicate(i))[0]), home, r[1])),
    ]
    out = []
    for j in range(n):
        i = start + j
        kind, make = kinds[i % len(kinds)]
        key, value, partition, reason = make(i)
        out.append(Hostile("label_requests", kind, reason, key, value, partition))
    return out


def hostile_labels(n: int, g: Genuine, *, start: int = 0) -> list[Hostile]:
    """``n`` hostile labels for model ``g.model``: copies of genuine labels (``g.labels``)
    with another key or on another partition, labels of requests nobody issued, tombstones.
    A label of an unknown request waits ``orphan_label_seconds`` for it, then is
    dead-lettered at the learner's next sweep of its partition."""
    m, model = g.model.encode(), g.model
    home, away = g.home, g.away

    def copy(i: int) -> dict[str, Any]:
        if g.labels:
            return dict(g.labels[i % len(g.labels)])
        return {"request_id": request_id(model, f"never-{i}"), "model": model, "label": 1}

    def forged(i: int) -> dict[str, Any]:
        return {"request_id": uuid.uuid4().hex, "model": model, "label": 1 - 2 * (i % 2)}

    kinds: list[tuple[str, Callable[[int], tuple[bytes | None, bytes | None, int, str]]]] = [
        ("tombstone", lambda i: (m, None, home, "not_json")),
        ("tombstone, empty key", lambda i: (b"", None, away, "not_json")),
        ("wrong key", lambda i: (b"x", _dumps(copy(i)), home, "bad_key")),
        ("no key", lambda i: (None, _dumps(copy(i)), home, "bad_key")),
        ("wrong partition", lambda i: (m, _dumps(copy(i)), away, "wrong_partition")),
        ("forged request id", lambda i: (m, _dumps(forged(i)), home, "unknown_request")),
        ("forged id, wrong partition", lambda i: (m, _dumps(forged(i)), away, "wrong_partition")),
        (
            "unknown model",
            lambda i: (m, _dumps({**copy(i), "model": "nope"}), home, "unknown_model"),
        ),
    ]
    out = []
    for j in range(n):
        i = start + j
        kind, make = kinds[i % len(kinds)]
        key, value, partition, reason = make(i)
        out.append(Hostile("labels", kind, reason, key, value, partition))
    return out
