"""Scoring as a pure function: consumed messages in, decisions, label requests and dead
letters out (no Kafka, no clock, no metrics).

:func:`score_batch` parses the batch in one pass (:func:`~.batch.parse_batch`: one matrix
of raw features per model, a dead letter for each event that cannot be scored), draws each
model's coins together (:func:`~service.records.ids.coins`), decides each model's events
through the learner's ``decide_many`` and keeps what it decided as columns: one
:class:`Decided` per model, in the order of its first event. :class:`ScoreResult` gives the
:class:`~service.records.Decision` and :class:`~service.records.LabelRequest` records in
input order when asked; the scorer encodes them from the columns
(:mod:`~service.stream.scoring.encode`). Every event keeps its own coin
(:func:`~service.records.coin`), so batching never changes a decision. A finite event that
overflows once scaled is refused alone (``non_finite``), not with its batch. The result
also holds the :class:`~service.learning.Moments` of the raw features each route scored
(``ScoreResult.moments``: one ``add_many`` of the route's matrix per batch; of the inputs
the version's first standardiser learns, ``Pipeline.moments_width``: a declared model's
numbers alone, not its hashed buckets), which the
scorer gathers for the route's next label request (:mod:`service.stream.scoring.scorer`;
``Decided.moments``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from service.learning import QueryBudget
from service.learning.errors import NonFiniteError
from service.learning.moments import Moments
from service.learning.sparse import SparseRows
from service.records import (
    Action,
    Champions,
    DeadLetter,
    Decision,
    FeatureEvent,
    LabelRequest,
    RawMessage,
)
from service.records.ids import coins, request_ids
from service.records.reasons import Source
from service.records.wire import FeatureMoments
from service.stream.models.served import ServedModel
from service.stream.scoring.batch import (
    Limits,
    Messages,
    ParsedEvent,
    Rows,
    parse_batch,
    parse_event,
    whole,
)
from service.stream.scoring.encode import priorities

__all__ = [
    "Decided",
    "Limits",
    "ParsedEvent",
    "ScoreResult",
    "gathered",
    "parse_event",
    "score_batch",
]


@dataclass(slots=True)
class Decided:
    """The events one model decided in a batch, as columns (a row per event, in input
    order; ``positions``: where each sits among the result's events)."""

    route: str  # the model the events are addressed to (the group's name)
    model: ServedModel  # the member that decided them
    positions: np.ndarray
    ids: list[str]
    partitions: list[int]  # of each event's features partition
    x: np.ndarray | SparseRows  # raw features
    labels: np.ndarray  # +1, -1, 0 = reject
    scores: np.ndarray
    queried: np.ndarray
    probabilities: np.ndarray  # the query probability, audit included
    rho: float
    # per row, the decision of each shadow of the group (None: the route has no shadows)
    shadow_labels: list[dict[str, int]] | None = None
    # the moments the first row that asks carries (the scorer attaches them)
    moments: FeatureMoments | None = None
    # per row, the fields a person is shown (a model that declares ``fields``; else None)
    fields: Sequence[dict[str, Any] | None] | None = None

    def decisions(self, now: float) -> list[Decision]:
        """The :class:`Decision` of each row."""
        name, version, rho = self.model.name, self.model.version, self.rho
        return [
            Decision(
                event_id,
                name,
                Action.REJECT if label == 0 else Action.PREDICT,
                None if label == 0 else label,
                score,
                rho,
                version,
                asked,
                p,
                now,
            )
            for event_id, label, score, asked, p in zip(
                self.ids,
                self.labels.tolist(),
                self.scores.tolist(),
                self.queried.tolist(),
                self.probabilities.tolist(),
                strict=True,
            )
        ]

    def asked(self) -> np.ndarray:
        """The rows that ask for their label."""
        return np.flatnonzero(self.queried)

    def label_requests(self, now: float, ttl: float) -> list[LabelRequest]:
        """The :class:`LabelRequest` of each row that asks."""
        rows = self.asked().tolist()
        route, name, version, rho = self.route, self.model.name, self.model.version, self.rho
        ids = [self.ids[j] for j in rows]
        priority = priorities(self.scores[rows], rho).tolist()
        shadows = self.shadow_labels
        features = _request_features(self.x, rows, declared=self.fields is not None)
        return [
            LabelRequest(
                request_id=rid,
                event_id=ids[k],
                model=route,
                features=features[k],
                score=float(self.scores[j]),
                rho=rho,
                decided_label=int(self.labels[j]),
                query_probability=float(self.probabilities[j]),
                model_version=version,
                requested_at=now,
                expires_at=now + ttl,
                priority=priority[k],
                shadow_labels={} if shadows is None else dict(shadows[j]),
                served_by=None if name == route else name,
                moments=self.moments if k == 0 else None,
                fields=None if self.fields is None else self.fields[j],
            )
            for k, (j, rid) in enumerate(zip(rows, request_ids(route, ids), strict=True))
        ]


def _request_features(
    x: np.ndarray | SparseRows, rows: list[int], *, declared: bool
) -> list[Sequence[float] | None]:
    """The features of the label requests of ``rows``: a list of numbers each, or none for
    a model that declares ``fields`` (its requests carry the event's fields, which the
    learner encodes as the scorer did: :mod:`service.stream.labels.admission`)."""
    if declared:
        return [None] * len(rows)
    return [row.tolist() for row in whole(x, rows)]


@dataclass(slots=True)
class ScoreResult:
    """Outputs of scoring one batch of ``size`` messages."""

    blocks: list[Decided] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    suppressed: Counter[str] = field(default_factory=Counter)  # by model
    # shadow decisions, counted and never written: (shadow model, +1 / -1 / 0) -> count
    shadow: Counter[tuple[str, int]] = field(default_factory=Counter)
    # by the model that decided them: the events it scored, and those refused because the
    # scaled features or the score overflowed (``non_finite``)
    scored: Counter[str] = field(default_factory=Counter)
    overflowed: Counter[str] = field(default_factory=Counter)
    # by route: the moments of the raw features of the events scored
    moments: dict[str, Moments] = field(default_factory=dict)
    size: int = 0
    now: float = 0.0
    ttl: float = 0.0

    def order(self) -> list[tuple[int, int]]:
        """(block, row) of every decided event, in input order."""
        if len(self.blocks) == 1:
            return [(0, j) for j in range(len(self.blocks[0].ids))]
        places = [
            (int(p), b, j)
            for b, block in enumerate(self.blocks)
            for j, p in enumerate(block.positions.tolist())
        ]
        return [(b, j) for _, b, j in sorted(places)]

    @property
    def decisions(self) -> list[Decision]:
        """Every decision, in input order."""
        each = [block.decisions(self.now) for block in self.blocks]
        return [each[b][j] for b, j in self.order()]

    @property
    def partitions(self) -> list[int]:
        """The features partition of each decision's event, in the order of :attr:`decisions`."""
        return [self.blocks[b].partitions[j] for b, j in self.order()]

    @property
    def label_requests(self) -> list[LabelRequest]:
        """Every label request, in input order."""
        each = [
            dict(zip(block.asked().tolist(), block.label_requests(self.now, self.ttl), strict=True))
            for block in self.blocks
        ]
        return [each[b][j] for b, j in self.order() if j in each[b]]

    def extend(self, other: ScoreResult) -> None:
        """Append ``other``'s outputs (a later batch) to this result's."""
        self.blocks += [replace(b, positions=b.positions + self.size) for b in other.blocks]
        self.size += other.size
        self.now, self.ttl = other.now, other.ttl
        self.scored += other.scored
        self.overflowed += other.overflowed
        for route, seen in other.moments.items():
            gathered(self.moments, route, seen)
        self.dead_letters += other.dead_letters
        self.suppressed += other.suppressed
        self.shadow += other.shadow


def gathered(moments: dict[str, Moments], route: str, seen: Moments) -> None:
    """Merge ``seen`` into ``route``'s ``moments``; moments of other inputs than those
    gathered so far (the version served now learns others: a model rebuilt under another
    layout) replace them."""
    mine = moments.get(route)
    if mine is None or mine.n_features != seen.n_features:
        moments[route] = seen
    else:
        mine.merge(seen)


def score_batch(
    models: Mapping[str, ServedModel],
    messages: Sequence[RawMessage],
    *,
    limits: Limits,
    now: float,
    budgets: Mapping[str, QueryBudget] | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    champions: Champions | None = None,
) -> ScoreResult:
    """Score a batch with ``models`` and ``champions`` (one mapping for the whole batch).
    A model with a budget in ``budgets`` asks through it (the budget's state moves on: it
    is the one stateful input). The events addressed to a model of ``groups`` (route ->
    members) are decided by the member ``champions`` names (the route itself by default)
    and by every other member as a shadow: those decisions are counted in
    ``ScoreResult.shadow`` and travel with the label requests, never as decisions."""
    batch = Messages.of(messages)
    out = ScoreResult(size=len(batch), now=now, ttl=limits.request_ttl)
    found, out.dead_letters = parse_batch(batch, models, limits, champions)
    for rows in found:
        served = rows.model
        budget = None if budgets is None else budgets.get(rows.route)
        width = served.pipeline.moments_width
        if width:  # the moments of the inputs the version's first standardiser learns
            seen = out.moments.setdefault(rows.route, Moments(width))
            if isinstance(rows.x, SparseRows):
                seen.add_many(rows.x.head(width))
            else:
                seen.add_many(rows.x if rows.x.shape[1] == width else rows.x[:, :width])
        block, refused, suppressed = _decide(served, rows, batch, budget, now)
        out.dead_letters += refused
        out.scored[served.name] += len(rows)
        if refused:
            out.overflowed[served.name] += len(refused)
        if suppressed:
            out.suppressed[served.name] += suppressed
        group = () if groups is None else groups.get(rows.route, ())
        shadows = [models[m] for m in group if m != served.name]
        if shadows:
            _shadows(block, rows, shadows, out.shadow)
        if block is not None:
            out.blocks.append(block)
    return out


def _shadows(
    block: Decided | None,
    rows: Rows,
    shadows: list[ServedModel],
    counts: Counter[tuple[str, int]],
) -> None:
    """Each shadow's decision on its champion's ``rows``, kept per row of ``block`` for the
    events the champion decided and counted in ``counts`` (rows that overflow for a shadow
    are left out for it)."""
    positions = [] if block is None else block.positions.tolist()
    decided = {p: j for j, p in enumerate(positions)}
    per_row: list[dict[str, int]] = [{} for _ in positions]
    for shadow in shadows:
        kept, labels = _shadow_decide(shadow, rows)
        for k, label in zip(kept, labels, strict=True):
            j = decided.get(rows.positions[k])
            if j is not None:
                per_row[j][shadow.name] = label
                counts[(shadow.name, label)] += 1
    if block is not None:
        block.shadow_labels = per_row


def _shadow_decide(shadow: ServedModel, rows: Rows) -> tuple[list[int], list[int]]:
    """A shadow's decision (+1, -1, 0) on each of its champion's ``rows``: (rows, labels);
    rows that overflow for the shadow are left out (the shadow decides nothing there)."""
    drawn = coins(shadow.name, rows.ids, shadow.version)
    scored = _sparse_scores(shadow, rows)
    if scored is not None:
        kept = np.flatnonzero(np.isfinite(scored))
        labels = shadow.learner.decide_scores(scored[kept], coins=drawn[kept])[0]
        return kept.tolist(), [int(label) for label in labels]
    with np.errstate(over="ignore", invalid="ignore"):
        z = shadow.pipeline.transform_many(rows.dense())
    try:
        labels = shadow.learner.decide_many(z, coins=drawn)[0]
        return list(range(len(rows))), [int(label) for label in labels]
    except NonFiniteError:
        kept_rows, labels = _decide_rows(shadow, z, drawn)[:2]
        return kept_rows, [int(label) for label in labels]


def _sparse_scores(served: ServedModel, rows: Rows) -> np.ndarray | None:
    """The scores of sparse ``rows`` (:class:`~service.learning.sparse_scoring.SparseScorer`:
    NaN or infinite where a row overflows once scaled); None when the rows are a matrix or
    the model scores them whole."""
    scorer = served.sparse
    if scorer is None or not isinstance(rows.x, SparseRows):
        return None
    return scorer.scores(rows.x)


def _decide(
    served: ServedModel, rows: Rows, batch: Messages, budget: QueryBudget | None, now: float
) -> tuple[Decided | None, list[DeadLetter], int]:
    """The rows' decisions (None when every row overflows once scaled), the dead letters of
    the rows that overflow, and how many the learner alone would have asked about that its
    budget did not."""
    name, version = served.name, served.version
    drawn = coins(name, rows.ids, version)
    scored = _sparse_scores(served, rows)
    if scored is None:
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused below
            z = served.pipeline.transform_many(rows.dense())
        try:
            labels, scores, probs, queries = served.learner.decide_many(z, coins=drawn)
            kept = list(range(len(rows)))
        except NonFiniteError:  # a finite event overflows once scaled: refuse those rows
            kept, labels, scores, probs, queries = _decide_rows(served, z, drawn)
    else:  # a row's score stands alone: those that overflow are left out, the rest decided
        kept = np.flatnonzero(np.isfinite(scored)).tolist()
        scored, drawn = scored[kept], drawn[kept]
        labels, scores, probs, queries = served.learner.decide_scores(scored, coins=drawn)
    dead = [
        DeadLetter.of(
            Source.FEATURES,
            batch[rows.positions[j]],
            "non_finite",
            f"model {name!r}: the scaled features or the score overflow",
        )
        for j in sorted(set(range(len(rows))) - set(kept))
    ]
    if not kept:
        return None, dead, 0
    if dead:
        rows = _take(rows, kept)
        if scored is None:
            drawn = drawn[kept]
    scores = np.asarray(scores, dtype=np.float64)
    queries = np.asarray(queries, dtype=bool)
    suppressed = 0
    if budget is None:
        queried, probabilities = _audited(served, rows.ids, probs, queries)
    else:
        stamps = batch.timestamps()
        times = _event_times(budget, [stamps[p] for p in rows.positions], now)
        queried, probabilities = _budgeted(served, budget, scores, drawn, times)
        suppressed = int(np.count_nonzero(queries & ~queried))
    block = Decided(
        rows.route,
        served,
        np.asarray(rows.positions, dtype=np.int64),
        rows.ids,
        [batch.partitions[p] for p in rows.positions],
        rows.x,
        np.asarray(labels, dtype=np.int64),
        scores,
        queried,
        probabilities,
        float(served.learner.rho),
        fields=rows.fields,
    )
    return block, dead, suppressed


def _take(rows: Rows, kept: list[int]) -> Rows:
    """The ``kept`` rows of ``rows``."""
    return Rows(
        rows.route,
        rows.model,
        [rows.positions[j] for j in kept],
        [rows.ids[j] for j in kept],
        [rows.ts[j] for j in kept],
        rows.x.take(kept) if isinstance(rows.x, SparseRows) else rows.x[kept],
        rows.fields_of(kept),
    )


def _audited(
    served: ServedModel, ids: Sequence[str], probs: Any, queries: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(queried, probability) with the model's uniform audit on top of the learner's own
    rule: asked if either coin says so (the audit coin is drawn only where the learner's
    did not ask: it cannot change a request that is made anyway)."""
    audit = served.config.audit_rate
    p = np.asarray(probs, dtype=np.float64)
    queried = queries.copy()
    rest = np.flatnonzero(~queries)
    if audit > 0.0 and len(rest):
        drawn = coins(served.name, [ids[j] for j in rest.tolist()], served.version, "audit")
        queried[rest] = drawn < audit
    return queried, p + audit - p * audit


def _event_times(budget: QueryBudget, stamps: Sequence[float | None], now: float) -> np.ndarray:
    """The times a per-second budget counts for a batch: each event's Kafka timestamp,
    held between the budget's last time and ``now`` and never going back (a record stamped
    in the future or the past cannot buy labels beyond the wall clock). A batch's events
    keep the spacing they arrived with, so its size does not change what the budget allows;
    a pause stays one long gap (which the budget clips).

    >>> b = QueryBudget(1.0, per="second")
    >>> _event_times(b, [5.0, None, 9.5, 7.0, 99.0], now=10.0).tolist()
    [5.0, 10.0, 10.0, 10.0, 10.0]
    """
    ts = np.array([now if t is None else t for t in stamps], dtype=np.float64)
    low = budget.last_ts
    np.clip(ts, -np.inf if low is None else low, now, out=ts)
    return np.maximum.accumulate(ts) if len(ts) else ts


def _budgeted(
    served: ServedModel,
    budget: QueryBudget,
    scores: np.ndarray,
    drawn: np.ndarray,
    times: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(queried, probability) through the model's budget: the learner's utility of each
    score, scaled to the budget's rate (its explore share replaces the audit)."""
    utilities = np.clip(served.learner.query_utility(scores), 0.0, 1.0)
    probs, asked = budget.ask_many(utilities, coins=drawn, ts=times)
    return np.asarray(asked, dtype=bool), np.asarray(probs, dtype=np.float64)


def _decide_rows(
    served: ServedModel, z: np.ndarray, drawn: np.ndarray
) -> tuple[list[int], list[int], list[float], list[float], list[bool]]:
    """Row-by-row decisions of the rows that stay finite: (kept rows, labels, scores,
    probabilities, queries)."""
    kept: list[int] = []
    labels: list[int] = []
    scores: list[float] = []
    probs: list[float] = []
    queries: list[bool] = []
    for j in range(z.shape[0]):
        try:
            d = served.learner.decide(z[j], coin=float(drawn[j]))
        except NonFiniteError:
            continue
        kept.append(j)
        labels.append(d.label)
        scores.append(d.score)
        probs.append(d.query_probability)
        queries.append(d.query)
    return kept, labels, scores, probs, queries


def _parse_all(
    messages: Sequence[RawMessage],
    models: Mapping[str, ServedModel],
    limits: Limits,
    dead: list[DeadLetter],
    champions: Champions | None = None,
) -> list[ParsedEvent]:
    """:func:`~.batch.parse_batch` event by event, in input order (each event the record
    :func:`parse_event` makes of it alone); refusals go to ``dead``."""
    batch = Messages.of(messages)
    found, refused = parse_batch(batch, models, limits, champions)
    dead += refused
    events = [
        (p, ParsedEvent(batch[p], FeatureEvent(i, rows.route, x[j].tolist(), ts), rows.model, x[j]))
        for rows, x in ((rows, rows.dense()) for rows in found)
        for j, (p, i, ts) in enumerate(zip(rows.positions, rows.ids, rows.ts, strict=True))
    ]
    return [event for _, event in sorted(events, key=lambda pe: pe[0])]
