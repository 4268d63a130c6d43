"""Inputs for the fault tests: good events with a known truth, and malformed messages, each
tagged with the dead-letter reason the promise says it must get.

Whether a malformed message is "not JSON" is decided by the standard library's parser
(the JSON the service accepts is a superset: ``NaN``/``Infinity`` parse), never by the
service's own code.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Bad",
    "EventSource",
    "bad_feature_events",
    "bad_label_requests",
    "bad_labels",
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
