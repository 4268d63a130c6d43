"""The labels of a history applied again: :func:`rederive` over typed records, and
:func:`run_job` over the bytes a table holds (what runs in the learner's derivation process,
:mod:`~.runner`).

A correction makes every member of the group what it would be had the corrected label been
the one given: from a checkpoint before the corrected step, every later step is applied
again in the order it was first applied, with the label in force of each
(:class:`~service.records.Step`). The same derivation with the labels a model held (the
corrections up to an offset: ``held``) re-derives what the model is from an older
checkpoint: how a history read back without a key is checked (:mod:`~.trust`).

This module is pure (no Kafka, no clock): the learner runs it in a process of its own,
``abstain rebuild`` and the replay in theirs, with the same result bit for bit.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from service.config import Settings
from service.records import Label, ModelEnvelope, PendingEntry, parse_model_envelope
from service.records.history import Step, parse_step
from service.records.moments import moments_trust
from service.records.signing import signer_of
from service.records.state import Limits
from service.stream.labels.protocol import Outcome, apply_shadow_label, teach

__all__ = ["Derived", "Job", "Rederived", "rederive", "run_job"]


@dataclass(frozen=True, slots=True)
class Rederived:
    """The members' states after the steps (``states``), and their states before each
    step whose seq was asked for (``checkpoints``: seq -> member -> state)."""

    states: dict[str, ModelEnvelope]
    checkpoints: dict[int, dict[str, ModelEnvelope]]


def rederive(
    settings: Settings,
    group: str,
    base: Mapping[str, ModelEnvelope],
    steps: Sequence[Step],
    *,
    keep: Iterable[int] = (),
) -> Rederived:
    """Apply ``steps`` (in order) to the members' ``base`` states exactly as the learner
    applied them: the label in force of each (a withdrawn one is left out) teaches the member
    that decided its request as the champion (:func:`~service.stream.labels.protocol.teach`)
    and every other member as a shadow; an update the champion would refuse (not finite)
    leaves the step out for all, one a shadow would refuse leaves that shadow as it is.
    ``keep``: the seqs before which the states are returned too (the checkpoints a
    correction rewrites)."""
    states = dict(base)
    wanted = set(keep)
    checkpoints: dict[int, dict[str, ModelEnvelope]] = {}
    cap = settings.models[group].weight_cap(settings.max_importance_weight)
    key, previous = settings.snapshot_key, settings.snapshot_key_previous
    signer = signer_of(  # the workers' key: the moments' verdict is the label path's
        None if key is None else key.get_secret_value(),
        None if previous is None else previous.get_secret_value(),
    )
    for step in steps:
        if step.seq in wanted:
            checkpoints[step.seq] = dict(states)
        server = step.request.server
        if step.label is None or server not in states:
            continue
        where = (step.partition, step.offset)
        trust = moments_trust(signer, step.request)
        outcome = teach(
            settings.models[server],
            states[server],
            step.request,
            step.label,
            where=where,
            now=step.applied_at,
            max_weight=cap,
            trust=trust,
            limits=Limits.of(settings),
        )
        if outcome.outcome is not Outcome.APPLIED or outcome.model is None:
            continue
        states[server] = outcome.model
        pending = PendingEntry(step.request, step.partition)
        label = Label(step.request_id, group, step.label, step.labelled_by, step.ts)
        for name in states:
            if name == server:
                continue
            shadow = apply_shadow_label(
                settings.models[name],
                states[name],
                pending,
                label,
                step.offset,
                now=step.applied_at,
                partition=step.partition,
                max_weight=cap,
                trust=trust,
                limits=Limits.of(settings),
            )
            if shadow.outcome is Outcome.APPLIED and shadow.model is not None:
                states[name] = shadow.model
    return Rederived(states, checkpoints)


@dataclass(frozen=True, slots=True)
class Job:
    """A derivation over encoded records: the members' states at its start (``base``,
    member -> a :class:`~service.records.ModelEnvelope`'s JSON), the steps in order (each a
    :class:`~service.records.Step`'s JSON), the seqs before which the states are returned
    (``keep``) and, for a check, ``held``: the labels offset up to which the corrections are
    taken (None: every step's label in force)."""

    group: str
    base: dict[str, bytes]
    steps: list[bytes]
    keep: tuple[int, ...] = ()
    held: int | None = None


@dataclass(frozen=True, slots=True)
class Derived:
    """What a :class:`Job` gave, encoded: the members' states after its steps, their states
    before each kept seq, the seq of its last step (-1: none) and the CPU seconds it took."""

    states: dict[str, bytes]
    checkpoints: dict[int, dict[str, bytes]]
    last_seq: int
    seconds: float


def run_job(settings: Settings, job: Job) -> Derived:
    """Carry out ``job`` (:func:`rederive` over its records, parsed and checked as any
    record read from a table). Raises :class:`~service.records.BadMessage` for a record
    that does not parse."""
    started = time.thread_time()
    base = {m: parse_model_envelope(raw, model=m) for m, raw in job.base.items()}
    steps = [parse_step(raw) for raw in job.steps]
    if job.held is not None:
        held = job.held
        steps = [dataclasses.replace(s, label=s.label_at(held)) for s in steps]
    out = rederive(settings, job.group, base, steps, keep=job.keep)
    return Derived(
        states={m: state.to_json() for m, state in out.states.items()},
        checkpoints={
            seq: {m: st.to_json() for m, st in states.items()}
            for seq, states in out.checkpoints.items()
        },
        last_seq=steps[-1].seq if steps else -1,
        seconds=time.thread_time() - started,
    )
