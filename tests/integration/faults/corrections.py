"""A worker whose model learned a known label log, for tests of corrections and orders.

:func:`learned` starts a worker (a deployment from ``service_factory``), streams events of a
known concept and answers every label request it makes until the model learned ``labels``
of them. :class:`Learned` then reads what it serves, writes signed corrections (through
``abstain labels correct`` or straight on the labels topic), replays records, and compares
what the learner serves with ``abstain rebuild`` of the log (the offline replay).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.records import SIGNATURE_HEADER, Signer

from .kafkaio import Out, Rec, produce_records
from .workers import wait_until

__all__ = ["Learned", "concept", "learned", "truthful"]


def concept(x: Sequence[float]) -> int:
    """The known truth of an event."""
    return 1 if x[0] - 0.5 * x[2] > 0 else -1


def truthful(requests: Sequence[Mapping[str, Any]], by: str = "alice") -> list[Any]:
    """The true label of each of model ``m``'s ``requests`` (:func:`concept`), as ``by``
    answers it: (key, label) pairs for the labels topic."""
    return [
        (
            "m",
            {
                "request_id": q["request_id"],
                "model": "m",
                "label": concept(q["features"]),
                "labelled_by": by,
            },
        )
        for q in requests
    ]


@dataclass
class Learned:
    """A deployment (``service``) with a running ``worker`` whose model ``model`` learned the
    label of every request in ``requests`` (in the order of their labels)."""

    service: Any
    worker: Any
    kio: Any
    key: str | None
    requests: list[dict[str, Any]]
    model: str = "m"
    answers: dict[str, int] = field(default_factory=dict)  # request id -> label in force

    @property
    def topics(self) -> dict[str, str]:
        return dict(self.service.topics)

    def states(self, model: str | None = None) -> list[dict[str, Any]]:
        """Every snapshot of ``model`` on the models topic, oldest first."""
        name = (model or self.model).encode()
        return [r.json() for r in self.kio.read(self.topics["models"]) if r.key == name]

    def records(self, topic: str) -> list[Rec]:
        return list(self.kio.read(self.topics.get(topic, topic)))

    def version(self, model: str | None = None) -> float:
        return float(self.worker.metric("abstain_model_version", {"model": model or self.model}))

    def dead(self) -> list[dict[str, Any]]:
        """The dead letters, oldest first."""
        return [r.json() for r in self.kio.read(self.topics["dead_letters"])]

    def sign(self, key: bytes, value: bytes) -> tuple[tuple[str, bytes], ...]:
        if self.key is None:
            return ()
        return ((SIGNATURE_HEADER, Signer(self.key.encode()).sign(key, value)),)

    def write(self, topic: str, records: list[Out]) -> list[tuple[int, int]]:
        return produce_records(self.service.bootstrap, self.topics.get(topic, topic), records)

    def correct(self, request_id: str, label: int | None, by: str, role: str = "reviewer") -> None:
        """``abstain labels correct`` (signed by the command when a key is set)."""
        self.service.cli(
            "labels",
            "correct",
            "--request-id",
            request_id,
            "--label",
            "none" if label is None else str(label),
            "--by",
            by,
            "--role",
            role,
        )
        self.answers[request_id] = 0 if label is None else label

    def corrections_applied(self) -> float:
        return float(self.worker.metric("abstain_corrections_total", {"model": self.model}))

    def rebuild(self, *, publish: bool = False) -> dict[str, Any]:
        args = ["rebuild", "--model", self.model] + (["--publish"] if publish else [])
        return dict(json.loads(self.service.cli(*args).stdout))

    def served_equals_rebuild(self) -> dict[str, Any]:
        """``abstain rebuild --publish`` of the log and what the learner serves agree, field
        by field (``updated_at`` aside); returns what the learner serves."""
        served = self.states()[-1]
        out = self.rebuild(publish=True)
        rebuilt = self.states()[-1]
        assert out["version"] == served["version"], (out, served["version"])
        for key in (
            "version",
            "learner",
            "pipeline",
            "labels_offset",
            "labels_applied",
            "corrections_from",
            "estimate",
        ):
            assert rebuilt[key] == served[key], key
        assert rebuilt["iw_loss"] == served["iw_loss"]
        return served


def _events(prefix: str, n: int, rng: np.random.Generator, n_features: int) -> list[Any]:
    return [
        (
            f"{prefix}{i}",
            {
                "id": f"{prefix}{i}",
                "model": "m",
                "features": rng.normal(size=n_features).round(4).tolist(),
            },
        )
        for i in range(n)
    ]


def learned(
    service_factory: Callable[..., Any],
    kio: Any,
    *,
    models: dict[str, Any],
    labels: int,
    key: str | None,
    n_features: int = 3,
    seed: int = 23,
    **overrides: Any,
) -> Learned:
    """Start a worker of model ``m`` (``models``, signed with ``key``) and teach it the
    label of ``labels`` requests (by alice, the truth of :func:`concept`)."""
    settings: dict[str, Any] = {
        "models": models,
        "default_model": "m",
        "partitions": {"features": 1, "decisions": 1, "labels": 1, "models": 1},
    }
    if key is not None:
        settings["snapshot_key"] = key
    service = service_factory(**{**settings, **overrides})
    worker = service.start()
    worker.wait_ready()
    t = service.topics
    rng = np.random.default_rng(seed)
    answered: list[dict[str, Any]] = []
    seen: set[str] = set()
    rounds = 0
    while len(answered) < labels:
        rounds += 1
        assert rounds <= 40, f"only {len(answered)} requests after {rounds} rounds"
        events = _events(f"learn{rounds}-", 200, rng, n_features)
        kio.produce_json(t["features"], events)
        kio.wait_for(t["decisions"], lambda rs, n=200 * rounds: len(rs) >= n, timeout=90)
        time.sleep(0.5)  # the requests follow their decisions
        fresh = [
            r.json() for r in kio.read(t["label_requests"]) if r.json()["request_id"] not in seen
        ]
        fresh = fresh[: labels - len(answered)]
        seen.update(q["request_id"] for q in fresh)
        # the first label alone, so that version 1 is on the models topic (which carries the
        # newest version of each of the learner's batches): tests copy an older snapshot
        for part in (fresh[:1], fresh[1:]) if not answered else (fresh,):
            kio.produce_json(t["labels"], truthful(part))
            answered += part
            count = len(answered)
            wait_until(
                lambda n=count: worker.metric("abstain_model_version", {"model": "m"}) >= n,
                120,
                f"{count} labels learned",
            )
    run = Learned(service, worker, kio, key, answered)
    run.answers = {q["request_id"]: concept(q["features"]) for q in answered}
    return run
