"""The scoring path as it was before batches went through it as columns: each event parsed
into its own records, decided, emitted as a :class:`Decision` and a :class:`LabelRequest`
and encoded one at a time, each route's moments gathered as ``main`` gathered them (one
``add_many`` of the route's events per batch, merged into the scorer's, the first request
of the route taking them: :func:`gather`). Kept, unchanged but for its name and the moments
of ``main``'s path, as the reference the batch path is compared with byte for byte
(``test_records.py``); nothing in the service uses it. (Since: a declared model's request
carries the fields it shows; a declared model's events are scored and counted as the inputs
they set, :mod:`service.learning.sparse`, as the worker does.)
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from service.learning import QueryBudget
from service.learning.errors import NonFiniteError
from service.learning.moments import Moments
from service.learning.sparse import SparseRows
from service.records import (
    Action,
    BadMessage,
    Champions,
    DeadLetter,
    Decision,
    FeatureEvent,
    LabelRequest,
    RawMessage,
    coin,
    parse_feature_event,
    request_id,
)
from service.records.reasons import Source
from service.records.wire import FeatureMoments, plain_feature_row
from service.stream.kafka.produce import OutRecord
from service.stream.models.served import ServedModel
from service.stream.outputs import Outputs
from service.stream.scoring.batch import Limits


@dataclass(frozen=True, slots=True)
class ParsedEvent:
    """A valid event with the model that scores it and its raw feature vector."""

    message: RawMessage
    event: FeatureEvent
    model: ServedModel  # the model that decides it (its route's server)
    x: np.ndarray

    @property
    def route(self) -> str:
        """The model the event is addressed to (its group's name)."""
        return self.event.model


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the learner decided for one event; ``query_probability`` includes the audit."""

    label: int  # +1, -1, 0 = reject
    score: float
    queried: bool
    query_probability: float
    suppressed: bool = False  # the learner would have asked; its budget did not


@dataclass(slots=True)
class ScoreResult:
    """Outputs of scoring one batch (decisions in input order)."""

    decisions: list[Decision] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)  # of each decision's event
    label_requests: list[LabelRequest] = field(default_factory=list)
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

    def extend(self, other: ScoreResult) -> None:
        """Append ``other``'s outputs to this result's."""
        self.scored += other.scored
        self.overflowed += other.overflowed
        for route, seen in other.moments.items():
            if route in self.moments:
                self.moments[route].merge(seen)
            else:
                self.moments[route] = seen
        self.decisions += other.decisions
        self.partitions += other.partitions
        self.label_requests += other.label_requests
        self.dead_letters += other.dead_letters
        self.suppressed += other.suppressed
        self.shadow += other.shadow


def parse_event(
    message: RawMessage,
    models: Mapping[str, ServedModel],
    limits: Limits,
    champions: Champions | None = None,
) -> ParsedEvent:
    """Parse and resolve one message (decided by the server ``champions`` names for its
    model); :class:`BadMessage` says why it cannot be scored."""
    event = parse_feature_event(
        message.value,
        default_model=limits.default_model,
        max_bytes=limits.max_bytes,
        max_features=limits.max_features,
    )
    served = models.get(event.model)
    if served is None:
        raise BadMessage("unknown_model", f"no model named {event.model!r}")
    champion = served.config.champion
    if champion is not None:
        detail = f"model {event.model!r} is a shadow of {champion!r}: it scores {champion!r}'s"
        raise BadMessage("unknown_model", f"{detail} events and decides none of its own")
    if champions is not None:
        served = models.get(champions.server(event.model), served)
    return ParsedEvent(message, event, served, served.raw_vector(event))


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
    out = ScoreResult()
    parsed = _parse_all(messages, models, limits, out.dead_letters, champions)
    verdicts: dict[int, Verdict] = {}
    shadow_labels: dict[int, dict[str, int]] = {}
    for served, members in _by_model(parsed):
        route = parsed[members[0]].route
        budget = None if budgets is None else budgets.get(route)
        items = [parsed[i] for i in members]
        width = served.pipeline.moments_width
        if width:  # of the first inputs alone (a declared model's numbers)
            seen = out.moments.setdefault(route, Moments(width))
            seen.add_many(np.stack([it.x[:width] for it in items]))
        decided, refused = _decide(served, items, budget, now)
        verdicts.update((members[j], v) for j, v in decided.items())
        out.dead_letters += refused
        out.scored[served.name] += len(items)
        if refused:
            out.overflowed[served.name] += len(refused)
        group = () if groups is None else groups.get(route, ())
        for shadow in [m for m in group if m != served.name]:
            for j, label in _shadow_decide(models[shadow], items).items():
                if members[j] in verdicts:
                    shadow_labels.setdefault(members[j], {})[shadow] = label
                    out.shadow[(shadow, label)] += 1
    for i, item in enumerate(parsed):
        verdict = verdicts.get(i)
        if verdict is not None:
            _emit(
                out,
                item,
                verdict,
                now=now,
                ttl=limits.request_ttl,
                shadow_labels=shadow_labels.get(i, {}),
            )
    return out


def _shadow_decide(shadow: ServedModel, items: Sequence[ParsedEvent]) -> dict[int, int]:
    """A shadow's decision (+1, -1, 0) on each of its champion's ``items``, by position;
    rows that overflow for the shadow are left out (the shadow decides nothing there)."""
    coins = np.array([coin(shadow.name, it.event.id, shadow.version) for it in items])
    alone = _sparse_scores(shadow, items)
    if alone is not None:
        kept = np.flatnonzero(np.isfinite(alone)).tolist()
        labels = shadow.learner.decide_scores(alone[kept], coins=coins[kept])[0]
        return {j: int(label) for j, label in zip(kept, labels, strict=True)}
    with np.errstate(over="ignore", invalid="ignore"):
        z = shadow.pipeline.transform_many(np.stack([it.x for it in items]))
    try:
        labels = shadow.learner.decide_many(z, coins=coins)[0]
        return {j: int(label) for j, label in enumerate(labels)}
    except NonFiniteError:
        rows, labels = _decide_rows(shadow, z, coins)[:2]
        return {j: int(label) for j, label in zip(rows, labels, strict=True)}


def _parse_all(
    messages: Sequence[RawMessage],
    models: Mapping[str, ServedModel],
    limits: Limits,
    dead: list[DeadLetter],
    champions: Champions | None = None,
) -> list[ParsedEvent]:
    """:func:`parse_event` for a batch, in input order; refusals go to ``dead``.

    The common shape (``{"id": "...", "features": [numbers], "model"?, "ts"?}`` for a model
    that takes a list: :func:`~service.records.plain_feature_row`) is checked for the whole
    batch at once: the types of each row in one pass, then one array per model and one
    finiteness check. Anything else, and any row the
    batch check doubts (a non-finite value, an integer beyond a float), goes through
    :func:`parse_event` alone, which names the exact problem."""
    slots: list[ParsedEvent | None] = [None] * len(messages)
    rows: dict[str, list[tuple[int, str, list[Any], float | None]]] = {}
    slow: list[int] = []
    # the models that decide events (a shadow decides none of its own), by their width
    inputs = {n: m.config.n_inputs for n, m in models.items() if m.config.champion is None}
    for i, message in enumerate(messages):
        fast = plain_feature_row(
            message.value,
            inputs,
            default_model=limits.default_model,
            max_bytes=limits.max_bytes,
            max_features=limits.max_features,
        )
        if fast is None:
            slow.append(i)
        else:
            rows.setdefault(fast[0], []).append((i, *fast[1:]))
    for name, members in rows.items():
        served = models[name]
        if champions is not None:  # the member that serves the group decides
            served = models.get(champions.server(name), served)
        try:
            matrix = np.array([row[2] for row in members], dtype=np.float64)
        except OverflowError:  # an integer beyond any float: row by row
            slow += [row[0] for row in members]
            continue
        finite = cast("list[bool]", np.isfinite(matrix).all(axis=1).tolist())
        for (i, event_id, feats, ts), x, ok in zip(members, matrix, finite, strict=True):
            if ok:
                event = FeatureEvent(id=event_id, model=name, features=feats, ts=ts)
                slots[i] = ParsedEvent(messages[i], event, served, x)
            else:
                slow.append(i)
    for i in sorted(slow):  # refusals in input order
        try:
            slots[i] = parse_event(messages[i], models, limits, champions)
        except BadMessage as bad:
            dead.append(DeadLetter.of(Source.FEATURES, messages[i], bad.reason, bad.detail))
    return [p for p in slots if p is not None]


def _by_model(parsed: Sequence[ParsedEvent]) -> list[tuple[ServedModel, list[int]]]:
    """Positions of ``parsed`` grouped by the model that scores them."""
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(parsed):
        groups.setdefault(item.model.name, []).append(i)
    return [(parsed[idx[0]].model, idx) for idx in groups.values()]


def _decide(
    served: ServedModel, items: Sequence[ParsedEvent], budget: QueryBudget | None, now: float
) -> tuple[dict[int, Verdict], list[DeadLetter]]:
    """Verdicts by position in ``items``; dead letters for rows that overflow once scaled."""
    name, version = served.name, served.version
    coins = np.array([coin(name, it.event.id, version) for it in items])
    alone = _sparse_scores(served, items)
    if alone is not None:  # a declared model's: each event scored alone, overflows refused
        rows = np.flatnonzero(np.isfinite(alone)).tolist()
        decided = served.learner.decide_scores(alone[rows], coins=coins[rows])
        labels, scores, probs, queries = decided
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is refused below
            z = served.pipeline.transform_many(np.stack([it.x for it in items]))
        try:
            labels, scores, probs, queries = served.learner.decide_many(z, coins=coins)
            rows = list(range(len(items)))
        except NonFiniteError:  # a finite event overflows once scaled: refuse those rows
            rows, labels, scores, probs, queries = _decide_rows(served, z, coins)
    refused = sorted(set(range(len(items))) - set(rows))
    dead = [
        DeadLetter.of(
            Source.FEATURES,
            items[j].message,
            "non_finite",
            f"model {name!r}: the scaled features or the score overflow",
        )
        for j in refused
    ]
    ids = [items[j].event.id for j in rows]
    if budget is None:
        asks = _audited(served, ids, probs, queries)
    else:
        stamps = [items[j].message.timestamp for j in rows]
        asks = _budgeted(
            served, budget, scores, coins[rows], queries, _event_times(budget, stamps, now)
        )
    verdicts = {j: Verdict(int(labels[k]), float(scores[k]), *asks[k]) for k, j in enumerate(rows)}
    return verdicts, dead


def _audited(
    served: ServedModel, ids: Sequence[str], probs: Sequence[float], queries: Sequence[bool]
) -> list[tuple[bool, float, bool]]:
    """(queried, probability, suppressed) with the model's uniform audit on top of the
    learner's own rule: asked if either coin says so."""
    audit, name, version = served.config.audit_rate, served.name, served.version
    out = []
    for event_id, p, q in zip(ids, probs, queries, strict=True):
        audited = coin(name, event_id, version, "audit") < audit
        out.append((bool(q) or audited, float(p) + audit - float(p) * audit, False))
    return out


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
    scores: Any,
    coins: np.ndarray,
    queries: Sequence[bool],
    times: np.ndarray,
) -> list[tuple[bool, float, bool]]:
    """(queried, probability, suppressed) through the model's budget: the learner's utility
    of each score, scaled to the budget's rate (its explore share replaces the audit);
    suppressed: the learner alone would have asked, the budget did not."""
    scores = np.asarray(scores, dtype=np.float64)
    utilities = np.clip(served.learner.query_utility(scores), 0.0, 1.0)
    probs, asked = budget.ask_many(utilities, coins=coins, ts=times)
    return [
        (bool(a), float(p), bool(q) and not bool(a))
        for a, p, q in zip(asked, probs, queries, strict=True)
    ]


def _decide_rows(
    served: ServedModel, z: np.ndarray, coins: np.ndarray
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
            d = served.learner.decide(z[j], coin=float(coins[j]))
        except NonFiniteError:
            continue
        kept.append(j)
        labels.append(d.label)
        scores.append(d.score)
        probs.append(d.query_probability)
        queries.append(d.query)
    return kept, labels, scores, probs, queries


def _priority(score: float, rho: float) -> float:
    """Closer to either threshold (+-rho) -> higher priority, in (0, 1]."""
    return 1.0 / (1.0 + min(abs(score - rho), abs(score + rho)))


def _emit(
    out: ScoreResult,
    item: ParsedEvent,
    v: Verdict,
    *,
    now: float,
    ttl: float,
    shadow_labels: Mapping[str, int],
) -> None:
    served, event = item.model, item.event
    if v.suppressed:
        out.suppressed[served.name] += 1
    rho = float(served.learner.rho)
    out.partitions.append(item.message.partition)
    out.decisions.append(
        Decision(
            id=event.id,
            model=served.name,
            action=Action.REJECT if v.label == 0 else Action.PREDICT,
            label=None if v.label == 0 else v.label,
            score=v.score,
            rho=rho,
            model_version=served.version,
            queried=v.queried,
            query_probability=v.query_probability,
            ts=now,
        )
    )
    if v.queried:
        route = item.route
        out.label_requests.append(
            LabelRequest(
                request_id=request_id(route, event.id),
                event_id=event.id,
                model=route,
                # a declared model's request carries its fields alone (added with requests
                # that the learner encodes)
                features=None if served.config.fields is not None else item.x.tolist(),
                score=v.score,
                rho=rho,
                decided_label=v.label,
                query_probability=v.query_probability,
                model_version=served.version,
                requested_at=now,
                expires_at=now + ttl,
                priority=_priority(v.score, rho),
                shadow_labels=dict(shadow_labels),
                served_by=None if served.name == route else served.name,
                fields=served.shown(event),  # a declared model's (added with fields)
            )
        )


def gather(moments: Mapping[str, Moments], result: ScoreResult) -> None:
    """What the scorer did with a result's moments: merged into ``moments`` (the routes that
    gather them), and each route's handed to its first label request of ``result``."""
    for route, seen in result.moments.items():
        if route in moments:
            moments[route].merge(seen)
    requests = []
    for request in result.label_requests:
        seen = moments.get(request.model)
        if seen:
            taken = seen.take()
            carried = FeatureMoments(
                taken.count, tuple(taken.mean.tolist()), tuple(taken.m2.tolist())
            )
            request = dataclasses.replace(request, moments=carried)
        requests.append(request)
    result.label_requests = requests


def records(outputs: Outputs, result: ScoreResult) -> list[OutRecord]:
    """The records the scorer wrote for ``result``: each decision to its event's features
    partition, the label requests by model, then the dead letters."""
    out = [
        outputs.decision_record(d, p)
        for d, p in zip(result.decisions, result.partitions, strict=True)
    ]
    out += [outputs.label_request_record(r) for r in result.label_requests]
    out += [outputs.dead_letter_record(x, x.partition) for x in result.dead_letters]
    return out


def _sparse_scores(served: ServedModel, items: Sequence[ParsedEvent]) -> np.ndarray | None:
    """A declared model's score of each of ``items``, each scored alone (None: scored
    whole)."""
    if served.sparse is None:
        return None
    width = served.config.n_inputs
    one = [SparseRows.of([served.entries(it.event)], width) for it in items]  # type: ignore[list-item]
    return np.array([served.sparse.scores(row)[0] for row in one])
