"""The learn protocol: label requests and labels in, model versions out, safe to redo.

One :class:`LabelJoiner` per worker handles the records of the label-requests AND labels
topics its learn loop consumes (keyed by model, co-partitioned: one learner owns a model's
pending requests and its (w, rho)):

- a request is stored as a :class:`~service.records.PendingEntry` (a re-sent request never
  resets an answered one);
- a label joins its pending entry and updates the model
  (:func:`~service.stream.labels.protocol.apply_label`);
- a label that overtook its request is *parked* and applied when the request arrives; one
  whose request never comes is dead-lettered after ``orphan_label_seconds``;
- every ``sweep_every`` records, expired entries and stale parked labels of the record's
  partition are swept.

Write order (what makes a redo after a crash safe): the pending entry's *applied* mark is
written and flushed (durable) first, then the model table and the snapshot. The two tables
are two changelog partitions: a crash between unordered writes could keep the model's
update and lose the mark (the request is offered again, a second answer applied twice).
With the mark first, a crash before the model write leaves a mark whose
``applied_version`` is ahead of the model: the redelivered label is applied once more
(see ``apply_label``), and then never again. A parked label is deleted only after its
effect is stored: its own offset was committed long ago, so the parked copy is all there is.

Group commit: the learn loop hands the joiner a fetched batch between :meth:`LabelJoiner.stage`
and :meth:`LabelJoiner.commit` (and :meth:`LabelJoiner.commit_group` after each
``label_group_ms`` of it). Inside it a label's mark and history step are written as
always, but its model versions are *staged* (the next label of the batch learns from them);
``commit`` makes every mark of the group durable with one flush, then writes each model's
newest version of the group alone, to the table, its changelog and the models topic (a
version holds every label before it; the others are checked when made, counted, and never
encoded). The order per label is the one above (its mark durable before the model write
that holds it), so a crash anywhere leaves marks ahead of the model, redone once each in
offset order; what changes is one wait for the broker and one version a model per group
instead of one per label. Version numbers still count labels, so the versions written
have gaps; a rollback serves one of the last ones written. A record that is not a label to
apply (an order, a sweep) commits what is staged first.

Inside a group the versions between are not even made: a label is applied with ``defer``
(:mod:`~service.stream.labels.protocol`), and ``commit`` makes, checks and encodes each
model's newest version before the flush of the marks. A newest version that fails its check,
or a label refused after it took the objects of a version never made, raises
:class:`~service.stream.labels.protocol.StrictRedo` before anything of the group is durable:
the learn loop reads its tables again and consumes again from its committed offsets (as after
a failed produce), and the joiner applies that model's labels one at a time, each version
checked, for the next :data:`STRICT_SECONDS` (:meth:`LabelJoiner.strictly`), which refuses
the label at fault alone. A group's dead letters and counts go out with it at ``commit``
(none if it is applied again: they are sent and counted once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

from service.config import Settings
from service.learning.moments import Implausible
from service.metrics import Metrics
from service.records import (
    BadMessage,
    Correction,
    DeadLetter,
    Label,
    LabelRequest,
    ModelEnvelope,
    Opinion,
    PendingEntry,
    RawMessage,
    Reason,
    RecordError,
    Signer,
    parse_label_request,
)
from service.records.history import Step
from service.records.labels import Rollback, Seed, parse_labels_record
from service.records.moments import Untrusted, moments_trust
from service.records.reasons import IGNORED, Source
from service.records.state import Limits, ParkedLabel
from service.stream.errors import DATA_ERRORS
from service.stream.kafka.produce import partition_for
from service.stream.labels.admission import admission
from service.stream.labels.control import Control
from service.stream.labels.corrector import Corrector
from service.stream.labels.history import History, Plan
from service.stream.labels.history.runner import Runner
from service.stream.labels.protocol import (
    LabelOutcome,
    Outcome,
    StrictRedo,
    apply_label,
    apply_shadow_label,
    park_label,
)
from service.stream.labels.publish import Publisher
from service.stream.labels.state import ModelStore, ParkedStore, PendingStore
from service.stream.models.book import signer_for
from service.stream.outputs import Outputs

__all__ = ["STRICT_SECONDS", "LabelJoiner"]

log = logging.getLogger(__name__)

#: how long a model's labels are applied one at a time, each version checked, after a
#: group of them had to be applied again (:meth:`LabelJoiner.strictly`)
STRICT_SECONDS = 60.0


#: the table writes of labels partition ``p`` are made inside ``writing(p)``
Writing = Callable[[int], AbstractContextManager[object]]


@dataclass(slots=True)
class _Staged:
    """The model writes of a batch waiting for their marks to be durable: (the labels
    partition the label was read on, its model outcome) in order, the requests they answer,
    and what waits for them to be written (a parked label's copy deleted, on its partition);
    the group's dead letters and counts, sent and counted with it (a group applied again
    does not send or count them twice)."""

    writing: Writing
    writes: list[tuple[int, LabelOutcome]] = field(default_factory=list)
    requests: set[str] = field(default_factory=set)
    after: list[tuple[int, Callable[[], None]]] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)
    counts: list[Callable[[], None]] = field(default_factory=list)


class LabelJoiner:
    """Joins labels with their requests and updates the models (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        *,
        pending: PendingStore,
        parked: ParkedStore,
        models: ModelStore,
        outputs: Outputs,
        metrics: Metrics,
        clock: Callable[[], float],
        signer: Signer | None = None,
        history: History | None = None,
        runner: Runner | None = None,
    ) -> None:
        self.settings = settings
        # checks the moments label requests carry with the settings' key, as a correction's
        # re-derivation does (service.records.moments)
        self.moments_signer = signer_for(settings)
        self.admission = admission(settings)  # the checks the label desk makes too
        self.pending = pending
        self.parked = parked
        self.models = models
        # the labels a correction can reach (service.stream.labels.history); in memory when
        # none is given (tests)
        self.history = history if history is not None else History({}, settings)
        self.outputs = outputs
        self.metrics = metrics
        self.clock = clock
        self.seen = 0  # records handled: sweeps run every ``settings.sweep_every``
        # a model write and its snapshot are one step: a republish never slips between them
        self.publisher = Publisher(models, outputs, metrics)
        # corrections: noted here, derived by ``runner`` (in this process when None)
        self.corrector = Corrector(
            settings,
            history=self.history,
            models=models,
            pending=pending,
            publisher=self.publisher,
            outputs=outputs,
            metrics=metrics,
            clock=clock,
            keyed=signer is not None,
            runner=runner,
        )
        self.control = Control(
            settings,
            models=models,
            history=self.history,
            corrector=self.corrector,
            publisher=self.publisher,
            outputs=outputs,
            metrics=metrics,
            clock=clock,
            signer=signer,
        )
        self._partitions: frozenset[int] = frozenset()  # labels partitions assigned (own())
        # per label-requests partition: the newest record timestamp read (how far along the
        # learner is: a parked label waits for the requests written up to its own time)
        self._requests_read: dict[int, float] = {}
        self._staged: _Staged | None = None  # between stage() and commit(): group commit
        # model (None: every model) -> until when its labels are applied strictly
        self._strict: dict[str | None, float] = {}

    def stage(self, writing: Writing) -> None:
        """From now until :meth:`commit`, model versions wait for one flush of their marks
        (module docstring: group commit); ``writing(p)`` is where the table writes of
        labels partition ``p`` go."""
        self._staged = _Staged(writing)

    async def commit(self) -> None:
        """Make the staged labels' marks durable, then write their model versions in order
        (each as the label alone would have) and what waited for them; staging ends."""
        staged, self._staged = self._staged, None
        if staged is None:
            return
        try:
            # each model's newest version of the group is written, and holds the others
            newest = {o.model.model: k for k, (_, o) in enumerate(staged.writes) if o.model}
            for k in newest.values():  # made and checked now, before anything is sent
                partition, outcome = staged.writes[k]
                staged.writes[k] = (partition, self._checked(outcome))
            for letter in staged.letters:
                await self.outputs.dead_letter(letter)
            if staged.writes:
                async with self.publisher.lock:
                    await self.outputs.durable()
                    for k, (partition, outcome) in enumerate(staged.writes):
                        assert outcome.model is not None  # noqa: S101 - applied outcomes
                        with staged.writing(partition):
                            last = newest[outcome.model.model] == k
                            await self.publisher.put(outcome, write=last)
            for partition, then in staged.after:
                with staged.writing(partition):
                    then()
            for count in staged.counts:
                count()
        finally:
            self.models.unstage()

    def _checked(self, outcome: LabelOutcome) -> LabelOutcome:
        """``outcome`` with its version encoded: the checks a version made with ``defer``
        was spared (:meth:`~service.records.ModelEnvelope.to_bytes`, and the size a version
        may take); :class:`StrictRedo` if it fails them."""
        model = outcome.model
        assert model is not None  # noqa: S101 - applied outcomes
        if not model.deferred:
            return outcome
        try:
            encoded, served = model.encode(Limits.of(self.settings))
        except RecordError as exc:
            raise StrictRedo(model.model, f"the newest version of a group fails: {exc}") from exc
        return replace(outcome, encoded=encoded, served=served)

    async def _dead_letter(self, letter: DeadLetter) -> None:
        """Send ``letter`` (with the group it was met in, when one is staged)."""
        if self._staged is not None:
            self._staged.letters.append(letter)
        else:
            await self.outputs.dead_letter(letter)

    def _count(self, metric: Any, **labels: str) -> None:
        """Count one of ``metric``'s ``labels`` (with the group, when one is staged)."""
        self._tally(metric.labels(**labels).inc)

    def _observe(self, metric: Any, value: float, **labels: str) -> None:
        """Observe ``value`` on ``metric`` (with the group, when one is staged)."""
        child = metric.labels(**labels)
        self._tally(lambda: child.observe(value))

    def _tally(self, count: Callable[[], None]) -> None:
        if self._staged is not None:
            self._staged.counts.append(count)
        else:
            count()

    def _made(self, model: ModelEnvelope) -> None:
        """Make and check ``model``'s deferred states (a history checkpoint writes them);
        :class:`StrictRedo` if they fail the checks its version was spared."""
        if not model.deferred:
            return
        try:
            model.make_states()
            model.check(limits=Limits.of(self.settings))
        except RecordError as exc:
            raise StrictRedo(model.model, f"a version of a group fails: {exc}") from exc

    def strictly(self, model: str | None) -> None:
        """Apply the labels of ``model`` and of the models that learn with it (its champion,
        their shadows; every model: None) one at a time, each version checked, for the
        next :data:`STRICT_SECONDS`: their group is applied again."""
        until = self.clock() + STRICT_SECONDS
        if model is None or model not in self.settings.models:
            self._strict[None] = until
            return
        for member in self.settings.group(self.settings.learner_key(model)):
            self._strict[member] = until

    def _defers(self, model: str) -> bool:
        """Whether a label of ``model`` is applied with ``defer`` (module docstring)."""
        if self._staged is None:
            return False
        if not self._strict:
            return True
        now = self.clock()
        self._strict = {m: t for m, t in self._strict.items() if t > now}
        return model not in self._strict and None not in self._strict

    def unstage(self) -> None:
        """Drop what is staged (the batch failed: the learner reads its tables again)."""
        self._staged = None
        self.models.unstage()

    async def commit_group(self) -> None:
        """Commit what is staged and go on staging (the loop's group has lasted
        ``label_group_ms``)."""
        await self._settle_staged()

    async def _settle_staged(self) -> None:
        """Commit what is staged, and go on staging (before a record that writes models
        other than by a label: an order)."""
        staged = self._staged
        if staged is not None and (
            staged.writes or staged.after or staged.letters or staged.counts
        ):
            await self.commit()
            self.stage(staged.writing)

    def versions(self) -> dict[str, int]:
        """The version of each model this learner owns: those whose key maps to one of its
        labels partitions (:meth:`own`), version 0 for one that has learned nothing yet.
        Read from the table once, then kept as it writes."""
        if self.publisher.versions is None:
            stored = {name: version for name, version, _ in self.models.stored()}
            self.publisher.versions = {m: stored.get(m, 0) for m in self._owned()}
        return dict(self.publisher.versions)

    def own(self, partitions: frozenset[int]) -> None:
        """The labels partitions whose tables this learner holds now (its learn loop calls it
        after every recovery and revoke): the pending index is rebuilt for them, and the
        models they map to are the ones it owns (:meth:`versions`, :meth:`republish`)."""
        if self.pending.refresh(partitions):
            self._partitions = partitions
            self.publisher.versions = None
            self.history.refresh()
            self.corrector.resume()

    async def settle(self) -> None:
        """Apply every correction noted so far (tests, tools; the learn loop applies them as
        their derivations land: :meth:`Corrector.tick`)."""
        await self.corrector.settle()

    def _owned(self) -> list[str]:
        n = self.settings.partitions.labels
        key = self.settings.learner_key  # a shadow's state lives with its champion's
        return [
            m for m in self.settings.models if partition_for(key(m).encode(), n) in self._partitions
        ]

    async def republish(self, models: Collection[str] | None = None) -> list[str]:
        """Publish the newest snapshot of the owned ``models`` (all it owns when None) again,
        signed with the current key, version 0 for a model that has learned nothing: a
        record on the models topic that was forged or deleted is replaced, and a rotated key
        re-signs what scorers read after a restart. Returns the models published."""
        async with self.publisher.lock:
            chosen = [m for m in self._owned() if models is None or m in models]
            for name in chosen:
                served = self.models.get(name, staged=False).served()
                await self.outputs.model(name, served.to_bytes())
        return chosen

    async def republish_champions(self, raw: bytes) -> bool:
        """Publish the champions record ``raw`` that scorers serve again, signed with the
        current key, if this learner owns labels partition 0 (one worker of the fleet): the
        last champions record on the compacted topic is then the one served (not a forged or
        refused one that came after it), and a rotated key re-signs it. True if published."""
        if 0 not in self._partitions:
            return False
        await self.outputs.champions(raw)
        return True

    async def handle(self, message: RawMessage) -> None:
        """Handle one consumed record of either topic; sweep its partition now and then."""
        requests = message.topic == self.settings.topics.label_requests
        source = Source.LABEL_REQUESTS if requests else Source.LABELS
        if requests and message.timestamp is not None:
            seen = self._requests_read.get(message.partition, message.timestamp)
            self._requests_read[message.partition] = max(seen, message.timestamp)
        try:
            await (self.on_request(message) if requests else self.on_label(message))
        except DATA_ERRORS as exc:  # a bug met by odd data: record it, keep learning
            log.exception(
                "%s message at %s[%s]@%s", source, message.topic, message.partition, message.offset
            )
            await self._dead_letter(
                DeadLetter.of(source, message, Reason.SCHEMA, f"internal error: {exc!r}")
            )
        self.seen += 1
        if self.seen % self.settings.sweep_every == 0:
            await self.sweep(message.partition)

    async def on_request(self, message: RawMessage) -> None:
        """Store a label request; apply the label that overtook it, if one is parked."""
        admit = self.admission
        try:
            request = parse_label_request(message.value, max_bytes=self.settings.max_message_bytes)
            admit.request(request)  # a model that decides, its width, the derived id
            admit.placement(request.model, key=message.key, partition=message.partition)
            self._check_duplicate(request)
            admit.server(request)
        except BadMessage as bad:
            await self._dead_letter(
                DeadLetter.of(Source.LABEL_REQUESTS, message, bad.reason, bad.detail)
            )
            return
        if request.request_id not in self.pending:  # a re-sent request must not reset an answer
            self.pending.put(
                PendingEntry(request, message.partition, request_offset=message.offset)
            )
            self._cap(request.model)
        parked = self.parked.get(request.request_id)
        if parked is not None:  # its label overtook it: apply that label now
            origin = RawMessage(
                parked.raw, self.settings.topics.labels, message.partition, parked.offset
            )
            await self._join(parked.label, origin, parked=True)
            rid = request.request_id
            if self._staged is not None and self._staged.writes:  # once its effect is stored
                self._staged.after.append((message.partition, lambda: self.parked.delete(rid)))
            else:
                self.parked.delete(rid)

    async def on_label(self, message: RawMessage) -> None:
        """Apply a label to its request's model (or park it until the request arrives)."""
        try:
            label = parse_labels_record(message.value, max_bytes=self.settings.max_message_bytes)
            self.admission.deciding(label.model)
            self.admission.placement(label.model, key=message.key, partition=message.partition)
            if isinstance(label, (Rollback, Seed, Correction)):
                await self._settle_staged()
            if isinstance(label, Rollback):
                await self.control.rollback(label, message)
                return
            if isinstance(label, Seed):
                await self.control.seed(label, message)
                return
            if isinstance(label, Opinion):  # a second opinion teaches no model (the desk's)
                return
            if isinstance(label, Correction):
                await self.control.correct(label, message)
                return
        except BadMessage as bad:
            await self._dead_letter(DeadLetter.of(Source.LABELS, message, bad.reason, bad.detail))
            return
        await self._join(label, message, parked=False)

    def _cap(self, model: str) -> None:
        """Keep at most ``max_open_requests`` open requests of ``model``: beyond, the least
        urgent is dropped (and counted), so memory and recovery time stay bounded."""
        cap = self.settings.models[model].max_open_requests
        while self.pending.open_count(model) > cap:
            victim = self.pending.least_urgent(model)
            if victim is None:
                return
            self.pending.delete(victim)
            self._count(self.metrics.label_requests_dropped, model=model)

    def _check_duplicate(self, request: LabelRequest) -> None:
        """A request for an event id already asked about, with other features, is another
        event reusing the id: it cannot share the first one's answer. A declared model's
        event is its fields (a request written before carries its inputs too, one written
        since does not)."""
        known = self.pending.get(request.request_id)
        if known is None:
            return
        if known.request.fields is not None and request.fields is not None:
            same = known.request.fields == request.fields
        else:
            same = known.request.features == request.features
        if not same:
            raise BadMessage(
                "duplicate_id",
                f"event {request.event_id!r} of model "
                f"{request.model!r} was asked about with other features",
            )

    async def _join(self, label: Label, message: RawMessage, *, parked: bool) -> None:
        pending = self.pending.get(label.request_id)
        # the member of the group that decided the event learns as the champion, the
        # others as shadows (after a promotion the route's server is one of its shadows)
        joined = pending is not None and pending.model == label.model
        server = pending.request.server if pending is not None and joined else label.model
        model = self.models.get(server)
        now = self.clock()
        if pending is None and not parked and not model.applied(message.partition, message.offset):
            await self._park(label, message, now)
            return
        config = self.settings.models[server]
        cap = self.settings.models[label.model].weight_cap(self.settings.max_importance_weight)
        members = self.settings.group(label.model)
        plan = self.history.plan(
            label.model, members, offset=message.offset, partition=message.partition
        )
        if plan.checkpoint:  # the members' states before this label are written
            for m in members:
                self._made(self.models.get(m))
        outcome = apply_label(
            config,
            model,
            pending,
            label,
            message.offset,
            now=now,
            partition=message.partition,
            parked=parked,
            max_weight=cap,
            corrections_from=plan.reach_from,
            trust=moments_trust(self.moments_signer, pending.request) if pending else None,
            limits=Limits.of(self.settings),
            defer=self._defers(server),
        )
        # a label already marked at this offset: a crash interrupted its writes; each model
        # (champion, shadows) whose version is below its mark is redone, no other
        redo = pending is not None and pending.applied and pending.applied_offset == message.offset
        applied = outcome.outcome is Outcome.APPLIED
        if not applied and not (redo and outcome.reason is Reason.REDELIVERED):
            await self._not_applied(label.model, message, outcome)
            return
        assert pending is not None  # noqa: S101 - an applied or redone label had its request
        before = {m: self.models.get(m) for m in members}
        shadows = self._shadows(
            pending,
            server,
            label,
            message,
            now=now,
            cap=cap,
            redo=redo,
            reach_from=plan.reach_from,
        )
        if not applied:  # redelivered: only the shadows a crash left behind are redone
            if shadows:
                await self._store_shadows(shadows, message.partition)
            await self._not_applied(label.model, message, outcome)
            return
        mark = outcome.pending
        assert mark is not None  # noqa: S101 - an applied outcome carries it
        versions = (
            pending.shadow_versions
            if redo
            else {o.model.model: o.model.version for o in shadows if o.model is not None}
        )
        step = _step(label, plan, message, pending.request, applied_at=now)
        await self._store(
            outcome,
            replace(mark, shadow_versions=dict(versions)),
            shadows,
            recorded=(plan, step, before),
            partition=message.partition,
        )
        if outcome.moments_refused is not None:
            await self._refuse_moments(server, pending, outcome.moments_refused)

    async def _refuse_moments(
        self, model: str, pending: PendingEntry, why: Implausible | Untrusted
    ) -> None:
        """Count and dead-letter the moments of ``pending``'s request that ``model``'s first
        standardiser refused (the label was applied without them): the dead letter names
        the request where it was read on the label-requests topic (offset -1 for an entry
        stored before the offset was kept)."""
        self._count(self.metrics.moments_refused, model=model, reason=why.kind)
        offset = -1 if pending.request_offset is None else pending.request_offset
        origin = RawMessage(
            pending.request.to_json(),
            self.settings.topics.label_requests,
            pending.partition,
            offset,
        )
        await self._dead_letter(
            DeadLetter.of(Source.LABEL_REQUESTS, origin, Reason.MOMENTS, why.detail)
        )

    def _shadows(
        self,
        pending: PendingEntry,
        server: str,
        label: Label,
        message: RawMessage,
        *,
        now: float,
        cap: float,
        redo: bool,
        reach_from: int,
    ) -> list[LabelOutcome]:
        """The label applied to each member of the group but its ``server`` (``redo``:
        only to those whose version is below the pending entry's mark); a refused update
        is counted and dead-lettered by nobody (the server's label is fine), the shadow
        stays."""
        out = []
        for name in self.settings.group(label.model):
            if name == server:
                continue
            shadow = self.models.get(name)
            mark = pending.shadow_versions.get(name)
            if redo and (mark is None or shadow.version >= mark):
                continue
            outcome = apply_shadow_label(
                self.settings.models[name],
                shadow,
                pending,
                label,
                message.offset,
                now=now,
                partition=message.partition,
                max_weight=cap,
                corrections_from=reach_from,
                trust=moments_trust(self.moments_signer, pending.request),
                limits=Limits.of(self.settings),
                defer=self._defers(name),
            )
            if outcome.outcome is Outcome.APPLIED:
                out.append(outcome)
            elif outcome.reason is not None:
                self._count(self.metrics.updates_refused, model=name, reason=outcome.reason)
        return out

    async def _park(self, label: Label, message: RawMessage, now: float) -> None:
        """Wait (bounded) for the request: it may still be in flight. The first answer that
        waits keeps its place: another label for the same request (parked entries are keyed
        by request id) is a second answer, dead-lettered, as it would be once the first was
        applied, so a later record cannot replace an answer that is waiting."""
        existing = self.parked.get(label.request_id)
        entry = park_label(
            existing,
            label,
            offset=message.offset,
            partition=message.partition,
            now=now,
            raw=message.value,
            label_ts=message.timestamp,
        )
        if entry is None:
            self._count(self.metrics.labels_ignored, model=label.model, reason=Reason.REDELIVERED)
        elif existing is not None:
            again = Reason.ALREADY_APPLIED
            self._count(self.metrics.labels_ignored, model=label.model, reason=again)
            detail = (
                f"request {label.request_id} already has an answer waiting for it "
                f"(labels offset {existing.offset})"
            )
            await self._dead_letter(
                DeadLetter.of(Source.LABELS, message, Reason.ALREADY_APPLIED, detail)
            )
        else:
            self.parked.put(entry)

    async def _store(
        self,
        outcome: LabelOutcome,
        mark: PendingEntry,
        shadows: list[LabelOutcome],
        *,
        recorded: tuple[Plan, Step, dict[str, ModelEnvelope]],
        partition: int,
    ) -> None:
        """The applied ``mark`` and the label's step in the history (with the checkpoint of
        the states ``before`` it when one is due) first, durably; then the model and its
        shadows (module docstring), staged when a batch is (read on labels ``partition``)."""
        model = outcome.model
        assert model is not None  # noqa: S101 - an applied outcome carries it
        async with self.publisher.lock:
            self.pending.put(mark)
            self.history.record(*recorded)
            if self._staged is not None:
                self._stage([outcome, *shadows], partition)
                self._staged.requests.add(mark.request.request_id)
            else:
                await self.outputs.durable()
                await self.publisher.put(outcome)
                for shadow in shadows:
                    await self.publisher.put(shadow)
        self._observe(self.metrics.label_turnaround, outcome.turnaround, model=model.model)

    async def _store_shadows(self, shadows: list[LabelOutcome], partition: int) -> None:
        """Redo the shadows' writes of a label whose mark is already durable."""
        async with self.publisher.lock:
            if self._staged is not None:
                self._stage(shadows, partition)
                return
            for shadow in shadows:
                await self.publisher.put(shadow)

    def _stage(self, outcomes: list[LabelOutcome], partition: int) -> None:
        """Hold ``outcomes``' model versions for :meth:`commit`; the models table answers
        with them meanwhile (the next label learns from them)."""
        assert self._staged is not None  # noqa: S101 - only while staging
        for outcome in outcomes:
            assert outcome.model is not None  # noqa: S101 - applied outcomes
            self.models.stage(outcome.model)
            self._staged.writes.append((partition, outcome))

    async def _not_applied(self, model: str, message: RawMessage, outcome: LabelOutcome) -> None:
        reason = outcome.reason
        assert reason is not None  # noqa: S101 - every outcome but APPLIED has a reason
        if reason in IGNORED:
            self._count(self.metrics.labels_ignored, model=model, reason=reason)
        if outcome.outcome is Outcome.REFUSED:
            self._count(self.metrics.updates_refused, model=model, reason=reason)
        if outcome.outcome in (Outcome.DEAD, Outcome.REFUSED):
            await self._dead_letter(DeadLetter.of(Source.LABELS, message, reason, outcome.detail))

    def caught_up(self, partition: int, now: float) -> None:
        """The learner has read everything written to label-requests ``partition`` (no lag)
        at ``now`` (its learn loop says so): a parked label there waits for nothing more than
        its time."""
        self._requests_read[partition] = max(self._requests_read.get(partition, now), now)

    def _gave_up(self, parked: ParkedLabel, now: float) -> bool:
        """True once a parked label's request cannot come any more: it has waited
        ``orphan_label_seconds`` and the learner has read the label-requests written up to
        that long after the label (record timestamps, or the time it was last caught up: a
        backlog of requests delays nothing but the verdict), or it has waited a whole
        ``request_ttl_seconds`` (its request would be expired)."""
        s = self.settings
        waited = now - parked.parked_at
        if waited > max(s.orphan_label_seconds, s.request_ttl_seconds):
            return True
        read = self._requests_read.get(parked.partition)
        written = parked.label_ts if parked.label_ts is not None else parked.parked_at
        return waited > s.orphan_label_seconds and (
            read is not None and read - written > s.orphan_label_seconds
        )

    async def sweep(self, partition: int) -> None:
        """Drop expired requests of ``partition`` (past expiry plus grace) and dead-letter
        its labels whose request did not come within ``orphan_label_seconds``."""
        now, s = self.clock(), self.settings
        due = self.pending.due(partition, now=now, grace=s.expired_grace_seconds)
        staged = self._staged
        if staged is not None and any(key in staged.requests for key, _ in due):
            await self._settle_staged()  # an answered entry goes once its label is stored
        for key, summary in due:
            self.pending.delete(key)
            if not summary.applied:
                self._count(self.metrics.label_requests_expired, model=summary.model)
        for key, parked in self.parked.entries():
            if parked is None:  # unreadable: nothing could ever apply it
                self.parked.delete(key)
                continue
            if parked.partition != partition or not self._gave_up(parked, now):
                continue
            self.parked.delete(key)
            model = parked.label.model
            self._count(self.metrics.labels_ignored, model=model, reason=Reason.UNKNOWN_REQUEST)
            origin = RawMessage(parked.raw, s.topics.labels, partition, parked.offset)
            detail = f"no request {key} within {s.orphan_label_seconds:g}s of its label"
            await self._dead_letter(
                DeadLetter.of(Source.LABELS, origin, Reason.UNKNOWN_REQUEST, detail)
            )


def _step(
    label: Label, plan: Plan, message: RawMessage, request: LabelRequest, *, applied_at: float
) -> Step:
    """The history step of ``label``, applied to ``request`` where ``message`` was read."""
    return Step(
        label.model,
        plan.seq,
        message.partition,
        message.offset,
        request,
        label.label,
        label.label,
        label.labelled_by,
        label.ts,
        applied_at=applied_at,
    )
