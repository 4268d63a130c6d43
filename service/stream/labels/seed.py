"""Seed a model from labelled history (``abstain models seed --model NAME FILE``).

A team that already holds labelled examples starts a model from them instead of from
w = 0. The rows are read in file order (:func:`read_rows`: CSV or LIBSVM through
:mod:`service.datasets`) and applied one by one through the learner's own pure code path,
:func:`service.stream.labels.protocol.apply_label`, starting from the configured version 0
(:func:`service.stream.models.served.initial_envelope`): the seeded state is the one the
learner would hold after the same labels arrived on the stream in that order, each asked
with probability 1 (the standardiser learns each row, the learner takes one step, the risk
estimate is charged the decision the model made on the row just before learning it).

Nothing is half-done: any refused row (an update that would not be finite) stops the seed
with a :class:`SeedError` before anything is published. Publishing is the command's
(:mod:`service.stream.cli`): a :class:`~service.records.Seed` order on the labels topic, so
the learner adopts the state at that place in its log and applies later labels on top of
it, then the same state on the models topic, as ``abstain rebuild --publish`` writes it.

An order is bound to what it seeds: it names the version of its target served when it was
written (``base_version``) and, with ``snapshot_key``, carries its own signature. The
learner (and ``abstain rebuild``) refuse an order written before the target's current line
began (:func:`stale_order`): a copy of an earlier order, or an old snapshot put in one,
cannot roll a model back.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from service.config import ModelConfig, Settings
from service.datasets import (
    DatasetError,
    Format,
    csv_header,
    dataset_format,
    load_csv,
    load_events,
    load_libsvm,
)
from service.errors import AbstainError
from service.features import encoder_of
from service.records import (
    BadMessage,
    Label,
    LabelRequest,
    ModelEnvelope,
    PendingEntry,
    Reason,
    parse_model_envelope,
)
from service.records.labels import Seed
from service.stream.labels.protocol import Outcome, apply_label
from service.stream.models.book import signer_for
from service.stream.models.served import ServedModel, initial_envelope

__all__ = ["SeedError", "Seeded", "adopt_seed", "read_rows", "seed_model", "stale_order"]

#: the request id of row ``i`` of a seed file (never a real event's: those are hashes)
_ROW_ID = "seed-row-{}"


class SeedError(AbstainError, ValueError):
    """A seed file that cannot seed the model (what is wrong, and where)."""


@dataclass(frozen=True, slots=True)
class Seeded:
    """The state after the file's rows, and how the model did on them before learning each
    (its prequential risk on the file, the same estimate the service keeps)."""

    model: ModelEnvelope
    rows: int
    rejected: int
    wrong: int

    @property
    def risk(self) -> float:
        """Mean 0-d-1 loss of the decisions made on the rows (NaN without rows)."""
        return self.model.risk


def _columns(path: str | os.PathLike[str], name: str, config: ModelConfig) -> list[int] | None:
    """The CSV columns (among the features, label removed) in the model's feature order;
    None to keep the file's order. The header names the model's features when the model
    has ``feature_names``."""
    header = csv_header(path)
    names = config.feature_names
    if names is None:
        return None
    if header is None:
        raise SeedError(
            f"{path}: no header; model {name!r} takes named features "
            f"{list(names)[:8]}: the first row must name them"
        )
    lowered = [h.lower() for h in header]
    label_col = lowered.index("label") if "label" in lowered else len(header) - 1
    columns = [h for j, h in enumerate(header) if j != label_col]
    missing = [n for n in names if n not in columns]
    unknown = [c for c in columns if c not in names]
    if missing or unknown or len(set(columns)) != len(columns):
        raise SeedError(
            f"{path}: the header does not name model {name!r}'s features: "
            f"missing {missing[:8]}, unknown {unknown[:8]}"
            + (", repeated names" if len(set(columns)) != len(columns) else "")
        )
    return [columns.index(n) for n in names]


def read_rows(
    path: str | os.PathLike[str], name: str, config: ModelConfig, format: Format | None = None
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """The rows of a seed file as ``(X, y)`` in file order, X's columns in the model's
    feature order. CSV: a header naming the model's features (any order) when it has
    ``feature_names``, the label column named ``label`` or last; LIBSVM: feature ``i`` is
    the model's i-th; a model that declares ``fields``: JSON lines of events, each with its
    label (:func:`~service.datasets.load_events`). Labels are +1/-1 or 1/0
    (:mod:`service.datasets`). :class:`SeedError`
    for an unreadable or empty file, a wrong width, a non-finite value or another label."""
    if config.fields is not None:  # events as producers write them, each with its label
        try:
            return load_events(path, encoder_of(config.fields))
        except DatasetError as exc:
            raise SeedError(str(exc)) from exc
    try:
        fmt = dataset_format(path) if format is None else format
        if fmt == "libsvm":
            X, y = load_libsvm(path, n_features=config.n_inputs)
        else:
            columns = _columns(path, name, config)
            X, y = load_csv(path)
            if columns is not None and X.shape[1] == config.n_inputs:
                X = X[:, columns]
    except DatasetError as exc:
        raise SeedError(str(exc)) from exc
    if X.shape[1] != config.n_inputs:
        raise SeedError(
            f"{path}: rows have {X.shape[1]} features, model {name!r} takes {config.n_inputs}"
        )
    return X, y


def _request(
    name: str, i: int, x: npt.NDArray[np.float64], served: ServedModel, now: float
) -> LabelRequest:
    """Row ``i`` as the request the scorer would have written, asked with probability 1."""
    z = served.pipeline.transform(x)
    decision = served.learner.decide(z, coin=0.0)
    return LabelRequest(
        request_id=_ROW_ID.format(i),
        event_id=str(i),
        model=name,
        features=x.tolist(),
        score=float(decision.score),
        rho=float(decision.rho),
        decided_label=int(decision.label),
        query_probability=1.0,
        model_version=served.version,
        requested_at=now,
        expires_at=now + 1.0,
        priority=0.0,
    )


def seed_model(
    settings: Settings,
    name: str,
    X: npt.NDArray[np.float64],
    y: npt.NDArray[np.int64],
    *,
    now: float,
    progress: Callable[[int], Any] | None = None,
) -> Seeded:
    """Train model ``name`` from version 0 on the rows ``(X, y)`` in order, through
    :func:`~service.stream.labels.protocol.apply_label`; ``progress(1)`` after each row.
    :class:`SeedError` names the first row whose update is refused (nothing to publish)."""
    if name not in settings.models:
        raise SeedError(f"no model named {name!r} (one of {sorted(settings.models)})")
    config = settings.models[name]
    if len(X) == 0:
        raise SeedError("no rows to seed from")
    if X.ndim != 2 or X.shape[1] != config.n_inputs or len(X) != len(y):
        raise SeedError(
            f"rows of shape {X.shape} do not fit model {name!r} "
            f"({config.n_inputs} features, {len(y)} labels)"
        )
    if not np.all(np.isfinite(X)):
        raise SeedError("the rows hold a value that is not finite")
    model = initial_envelope(name, config)
    cap = config.weight_cap(settings.max_importance_weight)
    rejected = wrong = 0
    for i, (x, label) in enumerate(zip(X, y, strict=True)):
        if int(label) not in (1, -1):
            raise SeedError(f"row {i + 1}: label {int(label)} is not +1 or -1")
        request = _request(name, i, x, ServedModel.from_envelope(config, model), now)
        rejected += request.decided_label == 0
        wrong += request.decided_label == -int(label)
        answer = Label(request.request_id, name, int(label), "seed", None)
        outcome = apply_label(
            config,
            model,
            PendingEntry(request, 0),
            answer,
            i,
            now=now,
            partition=-1,
            parked=True,
            max_weight=cap,
        )
        if outcome.outcome is not Outcome.APPLIED or outcome.model is None:
            raise SeedError(f"row {i + 1}: {outcome.reason}: {outcome.detail}")
        model = outcome.model
        if progress is not None:
            progress(1)
    # it learned from no record of the labels topic: the learner places it when it adopts it
    model = model.replace(labels_offset=-1, labels_partition=-1, updated_at=now)
    if not math.isfinite(model.risk):
        raise SeedError("the seeded state's risk is not finite")
    return Seeded(model, len(y), rejected, wrong)


def stale_order(
    what: str, base_version: int | None, current: ModelEnvelope, *, keyed: bool
) -> BadMessage | None:
    """Why an order (a seed or rollback, ``what``) written against version ``base_version``
    of a model now at ``current`` is refused as a copy (None: it is not): it was written
    before the model's current line began (``current.line_from``: the version the last
    order served), or, with a key, it names no version (written before orders did: it
    cannot be told from a copy).

    >>> now = ModelEnvelope("m", 9, {}, {}, line_from=5)
    >>> stale_order("seed order", 5, now, keyed=True) is None
    True
    >>> print(stale_order("seed order", 4, now, keyed=True))
    replayed: seed order of 'm' was written against version 4, before its current line began at version 5: a copy of an earlier order
    """  # noqa: E501
    name = current.model
    if base_version is None:
        if not keyed:
            return None
        return BadMessage(
            Reason.REPLAYED,
            f"{what} of {name!r} names no version it was written "
            "against (written before orders did): it cannot be told from a copy; "
            "write it again",
        )
    if base_version < current.line_from:
        return BadMessage(
            Reason.REPLAYED,
            f"{what} of {name!r} was written against version "
            f"{base_version}, before its current line began at version "
            f"{current.line_from}: a copy of an earlier order",
        )
    return None


def adopt_seed(
    settings: Settings,
    current: ModelEnvelope,
    order: Seed,
    where: tuple[int, int],
    *,
    now: float,
) -> ModelEnvelope:
    """The state of seed ``order``, read at labels ``where`` = (partition, offset), as the
    version after ``current``: what the learner serves next and learns on from (and what
    ``abstain rebuild`` replays), the first of a new line (``line_from``). An order written
    before ``current``'s line began is refused (:func:`stale_order`); the state is checked as
    a snapshot is: the signature when ``snapshot_key`` is set, the format, finite numbers,
    the model's algorithm and width; :class:`~service.records.BadMessage` says why it is
    refused. (The order's own signature is its reader's to check, before.)"""
    name = order.target
    signer = signer_for(settings)
    stale = stale_order("seed order", order.base_version, current, keyed=signer is not None)
    if stale is not None:
        raise stale
    if signer is not None:
        signature = None if order.signature is None else order.signature.encode()
        reason = signer.verify(name.encode(), order.envelope, signature)
        if reason is not None:
            raise BadMessage(reason, f"seeded state of model {name!r} is {reason}")
    seeded = parse_model_envelope(order.envelope, model=name, max_bytes=settings.max_message_bytes)
    if seeded.serving:
        raise BadMessage(
            "schema",
            f"seeded state of model {name!r} is a record read to serve (the models topic's: "
            "no challengers, nothing remembered); seed from a labelled file",
        )
    ServedModel.from_envelope(settings.models[name], seeded)  # refuses what does not fit
    partition, offset = where
    if partition == current.labels_partition:
        offset = max(offset, current.labels_offset)
    return seeded.replace(
        version=current.version + 1,
        labels_offset=offset,
        labels_partition=partition,
        updated_at=now,
        line_from=current.version + 1,
        corrected_to=-1,
    )
