"""A background observer of a deployment's output topics, and the labeller (oracle).

One thread, one event loop, one consumer assigned to every partition of the decisions,
label-requests, dead-letters and models topics (from the beginning, no consumer group).
It records what it reads and, acting as the staff who label, answers each new label request
whose event it knows with the true label, up to a budget, on the labels topic (key = model).
Some answers are sent twice on purpose (``duplicate_every``): a resent label must not
change the model a second time. Records a test wrote to the label-requests or models topic
as an attacker are left out when ``ignore`` says so (they are neither answered nor taken
for the learner's snapshots).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from . import HarnessError
from .kafkaio import MAX_REQUEST, STUCK_SECONDS, abandon, loads, partitions_of, started_producer

__all__ = ["Observer", "SeenDecision", "answer_fraction"]


@dataclass(frozen=True, slots=True)
class SeenDecision:
    """The parts of a decision that must never differ for one (event id, model version)."""

    model_version: int
    action: str
    label: int | None
    queried: bool
    ts: float


@dataclass(eq=False)
class Observer(threading.Thread):
    """Follows the output topics of one deployment; answers label requests from ``truth``."""

    bootstrap: str
    topics: Mapping[str, str]
    truth: Mapping[str, int]  # event id -> true label (read live: the test keeps adding)
    budget: int = 0  # distinct requests to answer
    duplicate_every: int = 0  # every n-th answer is sent twice (0 = never)
    answer: Callable[[dict[str, Any]], bool] = lambda request: True  # answer this one?
    # a consumed record of label-requests or models (aiokafka's) the test wrote itself
    ignore: Callable[[Any], bool] | None = None
    ignored: int = 0
    decisions: dict[str, list[SeenDecision]] = field(default_factory=lambda: defaultdict(list))
    decision_records: int = 0
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)  # request id -> first
    request_records: int = 0
    answered: dict[str, int] = field(default_factory=dict)  # request id -> label sent
    labels_sent: int = 0
    queued: int = 0  # label messages decided on (sent once labels_sent catches up)
    dead: list[dict[str, Any]] = field(default_factory=list)
    models: list[tuple[bytes | None, dict[str, Any]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, name="faults-observer", daemon=True)
        self.lock = threading.Lock()
        self._stop_flag = threading.Event()
        self._assigned = threading.Event()
        self._top_up = threading.Event()
        self.last_decision_at = 0.0

    # --- thread -----------------------------------------------------------------------
    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as exc:  # noqa: BLE001 - reported to the test through .errors
            self.errors.append(repr(exc))
            self._assigned.set()

    async def _main(self) -> None:
        t = self.topics
        names = [t["decisions"], t["label_requests"], t["dead_letters"], t["models"]]
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=MAX_REQUEST,
            fetch_max_bytes=4 * MAX_REQUEST,
            metadata_max_age_ms=2000,
        )
        await consumer.start()
        producer = await started_producer(self.bootstrap, linger_ms=2)
        try:
            tps = await self._partitions(names)
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            self._assigned.set()
            while not self._stop_flag.is_set():
                try:
                    batch = await consumer.getmany(timeout_ms=200, max_records=5000)
                except KafkaError as exc:  # broker away: keep trying
                    self.errors.append(f"transient: {exc!r}")
                    await asyncio.sleep(0.5)
                    continue
                out: list[tuple[str, bytes]] = []
                with self.lock:
                    for tp, recs in batch.items():
                        for rec in recs:
                            if self._ignored(tp.topic, rec):
                                continue
                            out += self._on_record(tp.topic, rec.key, rec.value)
                    if self._top_up.is_set():
                        self._top_up.clear()
                        for request in list(self.requests.values()):
                            if str(request["request_id"]) not in self.answered:
                                out += self._maybe_answer(request, force=True)
                for model, value in out:
                    producer = await self._send(producer, model, value)
        finally:
            await abandon(producer)
            await consumer.stop()

    def _ignored(self, topic: str, record: Any) -> bool:
        t = self.topics
        if self.ignore is None or topic not in (t["label_requests"], t["models"]):
            return False
        if self.ignore(record):
            self.ignored += 1
            return True
        return False

    async def _partitions(self, names: list[str]) -> list[Any]:
        deadline = time.monotonic() + 60
        while True:
            tps = [tp for name in names for tp in await partitions_of(self.bootstrap, name)]
            if len({tp.topic for tp in tps}) == len(names):
                return tps
            if time.monotonic() > deadline:
                raise HarnessError(f"topics {names} do not all exist")
            await asyncio.sleep(0.5)

    async def _send(self, producer: AIOKafkaProducer, model: str, value: bytes) -> AIOKafkaProducer:
        """Send one label; the producer to send the next with. A send that fails or hangs is
        retried by a new producer (see :func:`~faults.kafkaio.produce_records`: a failed
        idempotent producer may never write that partition again)."""
        for _ in range(120):
            try:
                await asyncio.wait_for(
                    producer.send_and_wait(self.topics["labels"], value, key=model.encode()),
                    STUCK_SECONDS,
                )
                with self.lock:
                    self.labels_sent += 1
                return producer
            except (KafkaError, TimeoutError) as exc:  # broker away: retry for a while
                self.errors.append(f"transient: {exc!r}")
                await abandon(producer)
                await asyncio.sleep(1.0)
                producer = await started_producer(self.bootstrap, linger_ms=2)
        raise HarnessError("oracle could not send a label 120 times")

    def _on_record(
        self, topic: str, key: bytes | None, value: bytes | None
    ) -> list[tuple[str, bytes]]:
        t = self.topics
        try:
            obj = loads(value)
        except (ValueError, RecursionError):  # garbage a test wrote to label-requests
            obj = None
        if topic == t["decisions"]:
            self.decision_records += 1
            self.last_decision_at = time.time()
            self.decisions[obj["id"]].append(
                SeenDecision(
                    int(obj["model_version"]),
                    obj["action"],
                    obj["label"],
                    bool(obj["queried"]),
                    float(obj["ts"]),
                )
            )
        elif topic == t["dead_letters"]:
            self.dead.append(obj)
        elif topic == t["models"]:
            self.models.append((key, obj))
        elif topic == t["label_requests"]:
            self.request_records += 1
            if not isinstance(obj, dict) or "request_id" not in obj:
                return []
            rid = str(obj["request_id"])
            if rid in self.requests:
                return []
            self.requests[rid] = obj
            return self._maybe_answer(obj)
        return []

    def _maybe_answer(
        self, request: dict[str, Any], *, force: bool = False
    ) -> list[tuple[str, bytes]]:
        label = self.truth.get(str(request.get("event_id")))
        if label is None or len(self.answered) >= self.budget:
            return []
        if not (force or self.answer(request)):
            return []
        rid = str(request["request_id"])
        self.answered[rid] = label
        msg = {
            "request_id": rid,
            "model": request["model"],
            "label": label,
            "labelled_by": "oracle",
            "ts": time.time(),
        }
        value = json.dumps(msg).encode()
        n = len(self.answered)
        copies = 2 if self.duplicate_every and n % self.duplicate_every == 0 else 1
        self.queued += copies
        return [(str(request["model"]), value)] * copies

    # --- test side --------------------------------------------------------------------
    def begin(self, timeout: float = 60.0) -> Observer:
        """Start the thread and wait until it follows every topic."""
        self.start()
        if not self._assigned.wait(timeout) or self.errors:
            raise HarnessError(f"observer did not start: {self.errors}")
        return self

    def top_up(self) -> None:
        """Answer requests seen but skipped so far, until the budget is spent."""
        self._top_up.set()

    def halt(self) -> None:
        self._stop_flag.set()
        self.join(30)

    def wait(self, check: Callable[[Observer], bool], timeout: float, what: str) -> float:
        """Poll ``check(self)`` (under the lock) until true; seconds taken."""
        began = time.monotonic()
        while True:
            fatal = [e for e in self.errors if not e.startswith("transient")]
            if fatal or not self.is_alive():
                raise HarnessError(f"observer failed: {fatal or 'thread ended'}")
            with self.lock:
                if check(self):
                    return time.monotonic() - began
            if time.monotonic() - began > timeout:
                with self.lock:
                    state = self.snapshot()
                raise HarnessError(f"timed out after {timeout:.0f}s waiting for {what}: {state}")
            time.sleep(0.2)

    def decided(self, ids: Mapping[str, Any]) -> int:
        """How many of ``ids`` have at least one decision."""
        return sum(1 for i in ids if i in self.decisions)

    def snapshot(self) -> dict[str, Any]:
        return {
            "decided": len(self.decisions),
            "decision_records": self.decision_records,
            "requests": len(self.requests),
            "answered": len(self.answered),
            "labels_sent": self.labels_sent,
            "dead": len(self.dead),
            "models": len(self.models),
            "dead_by_reason": dict(Counter(d.get("reason") for d in self.dead)),
        }


def answer_fraction(q: float) -> Callable[[dict[str, Any]], bool]:
    """Answer a request with probability ``q``, decided by a hash of its id (so a request
    seen again gets the same choice), which spreads a label budget over a whole stream."""

    def pick(request: dict[str, Any]) -> bool:
        digest = hashlib.blake2b(str(request["request_id"]).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2.0**64 < q

    return pick
