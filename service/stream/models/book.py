"""Model snapshots: the learner publishes each new version to the compacted models topic;
every worker follows that topic and scores with the newest version it accepts.

The follower is a plain aiokafka consumer that *assigns* every partition of the models
topic and reads from the beginning (no consumer group, so each worker sees every model);
it is not a faust ``GlobalTable``, whose recovery has known loops. Until a snapshot of a
model arrives, scorers use the configured initial model (version 0, the same everywhere).
``ModelBook.loaded`` is set once the topic has been read up to the end offsets taken at
start-up: part of readiness, and scorers wait for it so a restarted worker never serves an
old version it already knows to be superseded. The follower has each model snapshot checked
and built on a thread of its own (:meth:`ModelBook.offer_aside`: a wide model's takes
milliseconds, its arrays as wide as the model) and swaps it in on the loop, so scoring goes
on with the version served meanwhile.

The models topic is input like any other: whoever can write it could otherwise serve any
model. :meth:`ModelBook.offer` refuses (``BadMessage`` with a reason; the follower
dead-letters it and goes on) a record that is a tombstone, names no configured model, is
not a well-formed envelope with finite numbers, does not fit the model's algorithm and
width, or, when ``snapshot_key`` is set, is unsigned or mis-signed. Which accepted snapshot
is served:

- with a key, the highest version (a replayed older snapshot changes nothing);
- without one, the newest record, except that once the topic is read (``loaded``) an older
  version than the one served waits :data:`HOLD_BACK` seconds first, and is dropped if the
  version served (or a newer one) is published again meanwhile: the learner does so at once
  when its own worker holds back an older version of a model it owns, so a copy of a
  superseded snapshot is never served. A forged record of a higher version is replaced by
  the learner (a model served at another version than the learner holds is republished
  after a few seconds, see :class:`~service.stream.health.housekeeping.Housekeeping`); its
  version goes back after the hold.

The record under key ``__champions__`` (:class:`~service.records.Champions`, written by
``abstain models promote``) says which member of each group serves its route; it is
checked the same way (signature, format, a serial below 2**53; every route a model that
decides, every server a member of its group). Which one is served:

- with a key, the highest :func:`champions_rank`: its ``serial``, then, between records of
  one serial (two promotions that raced), the higher SHA-256 of the record's bytes. The
  order is the records' own, not the order they were read in, so every reader (running,
  restarted, before or after compaction) serves the same one (``promote`` writes the
  winner again when a loser is the last record, which compaction would keep);
- without one, the newest record, as for snapshots: a forged record (whatever serial it
  claims) is replaced by the next ``promote``.

Records under keys ``__skip__/...`` are operators' skip orders
(:class:`~service.records.SkipOrder`, written by ``abstain skip``): checked the same way
(signature, format, a topic the worker stops at) and kept in :attr:`ModelBook.skips`, where the
loops look for an order naming a batch they stopped at. A batch of the models topic itself
that cannot be read is skipped and dead-lettered (the learner publishes its models again).

The scorer reads the models and the champions together, once per batch
(:meth:`ModelBook.serving`). An adaptive learner counts the decisions its exploration floor
raises (:attr:`service.learning.Adaptive.explore_decisions`); the label path's versions never
decide, so a swap keeps the count of the version it replaces under the same floor
(:meth:`service.learning.Adaptive.continue_from`): on each worker, a model without a label
budget asks at most that many events at the floor after a change, however late its labels
come back.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from service.config import Settings
from service.records import (
    SIGNATURE_HEADER,
    BadMessage,
    Champions,
    DeadLetter,
    RawMessage,
    Reason,
    Signer,
    parse_model_envelope,
)
from service.records.champions import CHAMPIONS_KEY, parse_champions
from service.records.reasons import Source
from service.records.signing import signer_of
from service.records.skips import is_skip_key, parse_skip_order
from service.stream.kafka.clients import reader, topic_partitions
from service.stream.kafka.topics import watched
from service.stream.kafka.unreadable import (
    FetchFailed,
    Reader,
    SkipBook,
    Unreadable,
    UnreadableBatch,
)
from service.stream.models.served import ServedModel

__all__ = [
    "HOLD_BACK",
    "ModelBook",
    "Refused",
    "champions_rank",
    "follow_models",
    "signer_for",
]

log = logging.getLogger(__name__)

#: without a key: seconds an older version of a model waits before it is served (longer than
#: the learner's one-second check takes to publish the newest again, when it is a copy)
HOLD_BACK: Final = 2.0

#: what the follower calls with a refused record and why
Refused = Callable[[RawMessage, BadMessage], Awaitable[None]]


def champions_rank(record: Champions, raw: bytes) -> tuple[int, str]:
    """The order of champions records with a key: serial, then the SHA-256 of the bytes.

    >>> a, b = Champions(serial=2).to_json(), Champions(serial=2, updated_at=1.0).to_json()
    >>> champions_rank(Champions(serial=3), b"") > champions_rank(Champions(serial=2), a)
    True
    >>> ra, rb = champions_rank(Champions(2), a), champions_rank(Champions(2), b)
    >>> ra != rb and max(ra, rb) == max(rb, ra)
    True
    """
    return record.serial, hashlib.sha256(raw).hexdigest()


def signer_for(settings: Settings) -> Signer | None:
    """The snapshot signer of ``settings`` (None without ``snapshot_key``)."""
    key, previous = settings.snapshot_key, settings.snapshot_key_previous
    return signer_of(
        None if key is None else key.get_secret_value(),
        None if previous is None else previous.get_secret_value(),
    )


class ModelBook:
    """The models this worker scores with, one version per model.

    ``on_swap(model)`` is called after a model is replaced (metrics hook)."""

    def __init__(
        self,
        settings: Settings,
        *,
        signer: Signer | None = None,
        on_swap: Callable[[ServedModel], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.signer = signer
        self.clock = clock
        # without a key: per model, an older version held back, where it was read, since when
        self._held: dict[str, tuple[ServedModel, RawMessage | None, float]] = {}
        self.models: dict[str, ServedModel] = {
            name: ServedModel.initial(name, cfg) for name, cfg in settings.models.items()
        }
        # per model: the version served and where its record was read (None: not read)
        self._origins: dict[str, tuple[int, RawMessage | None]] = {}
        self.champions = Champions()
        #: the bytes and signature of the champions record served (None: none read yet)
        self.champions_record: tuple[bytes, bytes | None] | None = None
        self._champions_rank = (-1, "")
        #: operators' skip orders (``abstain skip``), checked
        self.skips = SkipBook()
        self.loaded = asyncio.Event()
        self._builder: ThreadPoolExecutor | None = None  # builds snapshots: offer_aside
        self._on_swap = on_swap
        for served in self.models.values():
            self._notify(served)

    def _notify(self, served: ServedModel) -> None:
        if self._on_swap is not None:
            self._on_swap(served)

    def offer(
        self,
        key: bytes | None,
        raw: bytes | None,
        *,
        signature: bytes | None = None,
        origin: RawMessage | None = None,
    ) -> bool:
        """Serve the snapshot ``raw`` of the model named by ``key`` if it is acceptable and
        newer (module docstring); False if it changes nothing. :class:`BadMessage` says why
        a record is refused. ``origin``: where it was read (for :meth:`refuse`)."""
        if key == CHAMPIONS_KEY.encode():
            return self._offer_champions(key, raw, signature)
        if is_skip_key(key):
            return self._offer_skip(key, raw, signature)
        return self._take(self._built(key, raw, signature), origin)

    async def offer_aside(
        self, origin: RawMessage, raw: bytes | None, signature: bytes | None = None
    ) -> bool:
        """:meth:`offer` of the record read at ``origin`` (its key; its value ``raw``, None
        for a tombstone), a model's snapshot checked and built on a thread of its own while
        the loop goes on scoring with the version served (a wide model's version takes
        milliseconds to build: its arrays are as wide as the model); which version is
        served is decided, and swapped in, back on the loop. One record at a time, in
        order (the follower awaits each)."""
        key = origin.key
        if key == CHAMPIONS_KEY.encode() or is_skip_key(key):
            return self.offer(key, raw, signature=signature, origin=origin)
        if self._builder is None:
            self._builder = ThreadPoolExecutor(1, thread_name_prefix="abstain-model-build")
        built = await asyncio.get_running_loop().run_in_executor(
            self._builder, self._built, key, raw, signature
        )
        return self._take(built, origin)

    def close(self) -> None:
        """Stop the thread that builds snapshots (:meth:`offer_aside`), if one started."""
        if self._builder is not None:
            self._builder.shutdown(wait=False)
            self._builder = None

    def _built(self, key: bytes | None, raw: bytes | None, signature: bytes | None) -> ServedModel:
        """The model of snapshot ``raw`` under ``key``, checked and built (nothing of the
        book changes: any thread may call it); :class:`BadMessage` says why it is refused."""
        name = self._model_of(key)
        if raw is None:
            raise BadMessage("not_json", f"a tombstone for model {name!r}")
        if self.signer is not None:
            reason = self.signer.verify(name.encode(), raw, signature)
            if reason is not None:
                raise BadMessage(reason, f"snapshot of model {name!r} is {reason}")
        envelope = parse_model_envelope(raw, model=name, max_bytes=self.settings.fetch_bytes)
        return ServedModel.from_envelope(
            self.settings.models[name], envelope, record_bytes=len(raw)
        )

    def _take(self, served: ServedModel, origin: RawMessage | None) -> bool:
        """Serve the built snapshot ``served`` if it is newer (module docstring); False if
        it changes nothing."""
        name = served.name
        current = self.models[name].version
        if served.version >= current:
            self._held.pop(name, None)  # the line served is confirmed, or moves on
        if served.version == current or (self.signer is not None and served.version < current):
            return False
        if served.version < current and self.loaded.is_set():  # no key: held back (docstring)
            held = self._held.get(name)
            since = held[2] if held is not None else self.clock()
            self._held[name] = (served, origin, since)
            log.warning(
                "model %s: version %s read while %s is served; held back %.1f s",
                name,
                served.version,
                current,
                HOLD_BACK,
            )
            return False
        if served.version < current:
            log.warning(
                "model %s goes from version %s back to %s (the newest record wins "
                "without a snapshot key)",
                name,
                current,
                served.version,
            )
        self._swap(served, origin)
        return True

    def _swap(self, served: ServedModel, origin: RawMessage | None) -> None:
        name = served.name
        continued = getattr(served.learner, "continue_from", None)
        if continued is not None:  # an adaptive learner's floored decisions, counted here
            continued(self.models[name].learner)
        self.models = {**self.models, name: served}  # swap, never mutate in place
        self._origins[name] = (served.version, origin)
        self._notify(served)

    def held(self) -> dict[str, int]:
        """Without a key: the models with an older version held back, and that version."""
        return {name: held[0].version for name, held in self._held.items()}

    def _release(self) -> None:
        """Serve the older versions held back for :data:`HOLD_BACK` seconds (nobody
        published the newest again: the newest was the forgery)."""
        if not self._held:
            return
        now = self.clock()
        for name, (served, origin, since) in list(self._held.items()):
            if now - since >= HOLD_BACK:
                del self._held[name]
                log.warning(
                    "model %s goes from version %s back to %s (without a snapshot "
                    "key the newest record wins)",
                    name,
                    self.models[name].version,
                    served.version,
                )
                self._swap(served, origin)

    def refuse(self, bad: ServedModel, good: ServedModel, detail: str) -> DeadLetter | None:
        """Serve ``good`` again instead of ``bad`` (a snapshot that could not score: the
        scorer found it overflowing where ``good`` did not), unless another version came
        since; the dead letter of ``bad``'s record (``source: models``), if it was read here."""
        name = bad.name
        if self.models.get(name) is bad:
            self.models = {**self.models, name: good}
            self._notify(good)
            log.error(
                "model %s: version %s refused, version %s served again: %s",
                name,
                bad.version,
                good.version,
                detail,
            )
        version, origin = self._origins.get(name, (None, None))
        if origin is None or version != bad.version:
            return None
        del self._origins[name]
        return DeadLetter.of(Source.MODELS, origin, Reason.NON_FINITE, detail)

    def _offer_champions(self, key: bytes, raw: bytes | None, signature: bytes | None) -> bool:
        if raw is None:
            raise BadMessage("not_json", "a tombstone for the champions record")
        if self.signer is not None:
            reason = self.signer.verify(key, raw, signature)
            if reason is not None:
                raise BadMessage(reason, f"the champions record is {reason}")
        record = parse_champions(raw, max_bytes=self.settings.fetch_bytes)
        s = self.settings
        for route, server in record.servers.items():
            if route not in s.models or s.models[route].champion is not None:
                raise BadMessage("unknown_model", f"champions: {route!r} is no model that decides")
            if server not in s.group(route):
                raise BadMessage(
                    "unknown_model",
                    f"champions: {server!r} cannot serve {route!r} "
                    f"(its group is {list(s.group(route))})",
                )
        rank = champions_rank(record, raw)
        if self.signer is not None and rank <= self._champions_rank:
            return False
        if self.signer is None and record == self.champions:
            return False
        log.info("champions (serial %s): %s", record.serial, dict(record.servers))
        self.champions, self._champions_rank = record, rank
        self.champions_record = (raw, signature)
        return True

    def _offer_skip(self, key: bytes | None, raw: bytes | None, signature: bytes | None) -> bool:
        if raw is None:
            raise BadMessage("not_json", "a tombstone for a skip order")
        if self.signer is not None:
            reason = self.signer.verify(key or b"", raw, signature)
            if reason is not None:
                raise BadMessage(reason, f"the skip order is {reason}")
        order = parse_skip_order(raw, key=key, max_bytes=self.settings.fetch_bytes)
        if order.topic not in watched(self.settings):
            raise BadMessage(
                "schema",
                f"a skip order for topic {order.topic!r}, which this worker does not stop at",
            )
        added = self.skips.add(order)
        if added:
            log.warning(
                "skip order: %s[%s] offsets %s-%s, by %r",
                order.topic,
                order.partition,
                order.first,
                order.end - 1,
                order.by,
            )
        return added

    def serving(self) -> tuple[Mapping[str, ServedModel], Champions]:
        """The models and the champions record, taken together (what one batch uses)."""
        self._release()
        return self.models, self.champions

    def _model_of(self, key: bytes | None) -> str:
        try:
            name = (key or b"").decode("utf-8")
        except UnicodeDecodeError:
            name = ""
        if name not in self.settings.models:
            raise BadMessage("unknown_model", f"no configured model named by key {key!r:.80}")
        return name

    def snapshot(self) -> Mapping[str, ServedModel]:
        """The current mapping (replaced, never mutated, on each swap)."""
        self._release()
        return self.models


def _signature(headers: Sequence[tuple[str, bytes]] | None) -> bytes | None:
    for name, value in headers or ():
        if name == SIGNATURE_HEADER:
            return value
    return None


async def follow_models(
    settings: Settings,
    book: ModelBook,
    *,
    consumer_kwargs: Mapping[str, Any],
    refused: Refused | None = None,
    skipped: Callable[[UnreadableBatch], Awaitable[None]] | None = None,
    unreadable: Unreadable | None = None,
    poll_ms: int = 500,
) -> None:
    """Follow the models topic forever (until cancelled), feeding ``book``; each refused
    record goes to ``refused`` (the worker dead-letters it) and is otherwise skipped, each
    batch that cannot be read to ``skipped`` (counted in ``unreadable``)."""
    topic = settings.topics.models
    consumer = reader(
        settings.bootstrap_servers,
        f"{settings.app_id}-model-follower",
        max_partition_fetch_bytes=settings.fetch_bytes,
        client_kwargs=consumer_kwargs,
        fetch_max_bytes=max(52_428_800, settings.fetch_bytes * 2),
    )
    fetch = Reader(consumer, policy="skip", unreadable=unreadable, on_skip=skipped)
    await consumer.start()
    try:
        tps = await topic_partitions(
            settings.bootstrap_servers, topic, client_kwargs=settings.security.aiokafka_kwargs()
        )
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        while True:
            if not book.loaded.is_set():
                positions = {tp: await consumer.position(tp) for tp in tps}
                if all(positions[tp] >= end[tp] for tp in tps):
                    book.loaded.set()
                    log.info("models loaded: %s", {n: m.version for n, m in book.models.items()})
            try:
                batch = await fetch.getmany(timeout_ms=poll_ms)
            except FetchFailed as exc:
                log.warning("following models failed: %r; again in a second", exc)
                await asyncio.sleep(1.0)
                continue
            for records in batch.values():
                for record in records:
                    await _offer(book, record, refused)
    finally:
        book.close()
        await consumer.stop()


async def _offer(book: ModelBook, record: Any, refused: Refused | None) -> None:
    message = RawMessage(
        record.value or b"", record.topic, record.partition, record.offset, record.key
    )
    try:
        await book.offer_aside(message, record.value, _signature(record.headers))
    except BadMessage as bad:
        log.error(
            "refused a record of %s[%s]@%s: %s", record.topic, record.partition, record.offset, bad
        )
        if refused is not None:
            await refused(message, bad)
