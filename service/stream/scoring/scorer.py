"""The scoring path of a worker: a batch of feature events in, records out, metrics counted.

:class:`Scorer` takes the models once per batch (a swap while the batch is written out
never mixes versions within it), scores with :func:`~service.stream.scoring.decide.score_batch`,
and hands decisions, label requests and dead letters to :class:`~service.stream.outputs.Outputs`.
Should an unexpected data-caused error escape the pure code, the batch is scored again one
event at a time and the culprit is dead-lettered (reason ``schema``; the detail says why).

Every event a model scores counts in its :class:`~service.learning.Moments` (the raw
features' count, mean and squared deviations, merged batch by batch from
``ScoreResult.moments``); the model's next label request from this worker carries them
(``LabelRequest.moments``) and they start afresh, so the learner merges the moments of every
event into the model's standardiser (:func:`~service.learning.serving_pipeline`). Only
models that standardise get them, and only when they keep a request within
``max_message_bytes`` (:func:`gathers_moments`).

A snapshot that cannot score (given ``fallback``: a worker without ``snapshot_key``, where
anyone who may write the models topic can publish one): when at least :data:`BLAME_SHARE`
of a model's events in a batch overflow (``non_finite``) and the last version that scored
a batch here scores them, the batch is decided by that version, the new one is refused
(``fallback`` serves the good one again and gives the snapshot's dead letter, ``source:
models``) and the events are not dead-lettered. Fewer overflowing events are the events'
own fault, as before.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from service.config import LabelBudget, ModelConfig, Settings
from service.learning import QueryBudget
from service.learning.moments import Moments
from service.learning.risk import CollapseWatch
from service.metrics import Metrics
from service.records import Action, Champions, DeadLetter, LabelRequest, RawMessage, Reason
from service.records.ids import request_id
from service.records.reasons import Source
from service.records.signing import Signer, moments_message
from service.records.wire import FeatureMoments
from service.stream.errors import DATA_ERRORS
from service.stream.kafka.produce import Column, Outgoing
from service.stream.models.served import ServedModel
from service.stream.outputs import Outputs
from service.stream.scoring import encode
from service.stream.scoring.batch import whole
from service.stream.scoring.decide import Decided, Limits, ScoreResult, gathered, score_batch

__all__ = ["DecisionTally", "Scorer", "attach_moments", "gathers_moments"]

log = logging.getLogger(__name__)

#: decisions per model over which the recent query rate is measured
RECENT = 1000
#: a new version is blamed for a batch's overflows when at least this share of its events
#: overflow there and the last good version scores them
BLAME_SHARE = 0.5

#: serve ``good`` again instead of ``bad`` (with a reason); the snapshot's dead letter
Fallback = Callable[[ServedModel, ServedModel, str], DeadLetter | None]


#: bytes a request's moments take per feature, at most (two floats as orjson writes them)
MOMENT_BYTES = 50


def gathers_moments(config: ModelConfig, max_message_bytes: int) -> bool:
    """Whether a model's label requests carry moments: it standardises, and its moments take
    at most half of a message (two numbers per feature).

    >>> gathers_moments(ModelConfig(n_features=68), 1_000_000)
    True
    >>> gathers_moments(ModelConfig(n_features=68, standardize=False), 1_000_000)
    False
    """
    width = config.moments_inputs
    return config.standardize and width > 0 and width * MOMENT_BYTES <= max_message_bytes // 2


def attach_moments(
    requests: list[LabelRequest],
    gathered: Mapping[str, Moments],
    *,
    signer: Signer | None = None,
) -> list[LabelRequest]:
    """``requests`` with the first one of each route carrying that route's ``gathered``
    moments (which start afresh), signed by ``signer`` when given; routes without moments
    gathered are left as they are."""
    out = []
    for request in requests:
        seen = gathered.get(request.model)
        if seen:
            carried = feature_moments(
                seen.take(), signer=signer, model=request.model, request_id=request.request_id
            )
            request = dataclasses.replace(request, moments=carried)
        out.append(request)
    return out


def feature_moments(
    taken: Moments, *, signer: Signer | None = None, model: str = "", request_id: str = ""
) -> FeatureMoments:
    """``taken`` as the label request ``request_id`` of ``model`` carries it: signed by
    ``signer`` when given (:func:`~service.records.signing.moments_message`)."""
    mean, m2 = tuple(taken.mean.tolist()), tuple(taken.m2.tolist())
    if signer is None:
        return FeatureMoments(taken.count, mean, m2)
    signed = signer.sign(*moments_message(model, request_id, taken.count, mean, m2))
    return FeatureMoments(taken.count, mean, m2, signed.decode("ascii"))


def make_budget(config: LabelBudget, *, share: float) -> QueryBudget:
    """The learner-side budget for a model's ``config`` on a worker that scores ``share``
    of its events (per-hour budgets are paced by this worker's clock)."""
    k, v = config.sharpness, config.explore
    if config.per_hour is not None:
        return QueryBudget(config.per_hour / 3600.0 * share, per="second", sharpness=k, explore=v)
    assert config.fraction is not None  # noqa: S101 - LabelBudget holds one of them
    return QueryBudget(config.fraction, per="event", sharpness=k, explore=v)


@dataclass(slots=True)
class DecisionTally:
    """Decisions one model made on this worker (served, or counted for a shadow)."""

    events: int = 0
    rejected: int = 0

    def add(self, events: int, *, rejected: int) -> None:
        self.events += events
        self.rejected += rejected


class Scorer:
    """Parse -> decide -> emit, batch by batch (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        models: Callable[[], tuple[Mapping[str, ServedModel], Champions]],
        outputs: Outputs,
        metrics: Metrics,
        *,
        clock: Callable[[], float],
        fallback: Fallback | None = None,
        signer: Signer | None = None,
    ) -> None:
        self.fallback = fallback
        self.signer = signer  # signs the moments label requests carry (``snapshot_key``)
        self.good: dict[str, ServedModel] = {}  # per model: the last version that scored
        self.limits = Limits(
            default_model=settings.default_model,
            request_ttl=settings.request_ttl_seconds,
            max_bytes=settings.max_message_bytes,
            max_features=settings.max_features,
        )
        self.models = models
        self.outputs = outputs
        self.metrics = metrics
        self.clock = clock
        self.recent: dict[str, deque[bool]] = {m: deque(maxlen=RECENT) for m in settings.models}
        self.budgets = {
            m: make_budget(c.label_budget, share=1.0)
            for m, c in settings.models.items()
            if c.label_budget is not None
        }
        self.configs = settings.models
        # route -> its members (the model and its shadows), for models that have shadows
        self.groups = {m: settings.group(m) for m in settings.models if settings.shadows_of(m)}
        # this worker's decisions per model since it started, served or shadow (/models)
        self.tally = {m: DecisionTally() for m in settings.models}
        self.collapse = {m: CollapseWatch() for m in settings.models}
        # the moments of every event each model scored since its last label request here
        self.moments = {
            m: Moments(c.moments_inputs)
            for m, c in settings.models.items()
            if gathers_moments(c, settings.max_message_bytes)
        }
        self.started = clock()
        self.share = 1.0  # of the feature partitions this worker scores (housekeeping sets it)
        # per-model metric children, bound once (a labels() lookup per event costs more
        # than the decision itself)
        self._bound = {
            m: (
                metrics.decisions.labels(model=m, action=Action.PREDICT),
                metrics.decisions.labels(model=m, action=Action.REJECT),
                metrics.events.labels(model=m),
                metrics.decide_latency.labels(model=m),
                metrics.label_requests.labels(model=m),
            )
            for m in settings.models
        }
        # the collapse gauges of each model, bound when its first window completes
        self._collapse_gauges: dict[str, tuple[Any, Any]] = {}

    def decide(self, messages: Sequence[RawMessage]) -> tuple[ScoreResult, Outgoing]:
        """Score ``messages``: what was decided, and the records to write for it (each
        decision and dead letter to the partition of its event's features partition, label
        requests by model). Counted in the metrics; nothing is written."""
        models, champions = self.models()  # one mapping for the whole batch
        started = time.perf_counter()
        now = self.clock()
        result = self._score_guarded(models, champions, messages, now)
        if self.fallback is not None and result.overflowed:
            models, result = self._fall_back(models, champions, messages, result, now)
        self._remember(models, result)
        self._watch(models, result)
        self._attach_moments(result)
        records = self._records(result)
        self._count(result, (time.perf_counter() - started) / max(1, len(messages)))
        return result, records

    def _attach_moments(self, result: ScoreResult) -> None:
        """The moments ``result`` gathered merged into each route's, and those of each route
        handed to its first label request of the batch (in input order), as
        :func:`attach_moments` does: on the first block of the route that asks."""
        for route, seen in result.moments.items():
            if route in self.moments:  # a route that gathers (gathers_moments)
                gathered(self.moments, route, seen)
        for b in result.blocks:
            mine = self.moments.get(b.route)
            if mine and b.queried.any():
                first = b.ids[int(b.asked()[0])]
                b.moments = feature_moments(
                    mine.take(),
                    signer=self.signer,
                    model=b.route,
                    request_id=request_id(b.route, first),
                )

    def _records(self, result: ScoreResult) -> Outgoing:
        """The records of ``result``, encoded from its columns: the decisions and the label
        requests in input order, then the dead letters."""
        topics, blocks = self.outputs.topics, result.blocks
        encoded = [self._encode(b, result.now, result.ttl) for b in blocks]
        dead = [self.outputs.dead_letter_record(x, x.partition) for x in result.dead_letters]
        if len(blocks) == 1:  # one model: its columns as they are
            (decided, asked, _), b = encoded[0], blocks[0]
            return Outgoing(
                [
                    Column(
                        topics.decisions,
                        decided,
                        keys=[i.encode() for i in b.ids],
                        partitions=b.partitions,
                    ),
                    Column(topics.label_requests, asked, key=b.route.encode()),
                ],
                dead,
            )
        order = result.order()
        asking = [dict(zip(rows.tolist(), range(len(rows)), strict=True)) for _, _, rows in encoded]
        asks = [(b, asking[b][j]) for b, j in order if j in asking[b]]
        return Outgoing(
            [
                Column(
                    topics.decisions,
                    [encoded[b][0][j] for b, j in order],
                    keys=[blocks[b].ids[j].encode() for b, j in order],
                    partitions=[blocks[b].partitions[j] for b, j in order],
                ),
                Column(
                    topics.label_requests,
                    [encoded[b][1][k] for b, k in asks],
                    keys=[blocks[b].route.encode() for b, _ in asks],
                ),
            ],
            dead,
        )

    @staticmethod
    def _encode(b: Decided, now: float, ttl: float) -> tuple[list[bytes], list[bytes], np.ndarray]:
        """A block's decisions and label requests, encoded, and the rows that ask."""
        name, version = b.model.name, b.model.version
        decided = encode.decisions(
            name, b.ids, b.labels, b.scores, b.rho, version, b.queried, b.probabilities, now=now
        )
        rows = b.asked()
        chosen = rows.tolist()
        shadows = None if b.shadow_labels is None else [b.shadow_labels[j] for j in chosen]
        asked = encode.label_requests(
            b.route,
            name,
            [b.ids[j] for j in chosen],
            None if b.fields is not None else whole(b.x, rows),  # declared: fields alone
            b.labels[rows],
            b.scores[rows],
            b.rho,
            version,
            b.probabilities[rows],
            now=now,
            ttl=ttl,
            shadow_labels=shadows,
            moments=b.moments,
            fields=None if b.fields is None else [b.fields[j] for j in chosen],
        )
        return decided, asked, rows

    def _fall_back(
        self,
        models: Mapping[str, ServedModel],
        champions: Champions,
        messages: Sequence[RawMessage],
        result: ScoreResult,
        now: float,
    ) -> tuple[Mapping[str, ServedModel], ScoreResult]:
        """The batch decided by the last good version of each model whose new version
        overflowed on most of its events there (module docstring), and those versions
        refused; unchanged when no new version is to blame."""
        suspects = {}
        for name, n in result.overflowed.items():
            good, served = self.good.get(name), models.get(name)
            if good is None or served is None or good.version == served.version:
                continue
            if n >= BLAME_SHARE * result.scored[name]:
                suspects[name] = good
        if not suspects:
            return models, result
        trial = {**models, **suspects}
        again = self._score_guarded(trial, champions, messages, now)
        blamed = {n: g for n, g in suspects.items() if again.overflowed[n] < result.overflowed[n]}
        if not blamed:
            return models, result
        if blamed != suspects:
            trial = {**models, **blamed}
            again = self._score_guarded(trial, champions, messages, now)
        assert self.fallback is not None  # noqa: S101 - only called with one
        for name, good in blamed.items():
            bad = models[name]
            detail = (
                f"version {bad.version} of model {name!r} overflows on "
                f"{result.overflowed[name]} of {result.scored[name]} events that version "
                f"{good.version} scores: refused, version {good.version} served"
            )
            letter = self.fallback(bad, good, detail)
            if letter is not None:
                again.dead_letters.append(letter)
        return trial, again

    def _remember(self, models: Mapping[str, ServedModel], result: ScoreResult) -> None:
        """The versions that scored most of their events in this batch are good."""
        for name, n in result.scored.items():
            if n and result.overflowed[name] < BLAME_SHARE * n:
                self.good[name] = models[name]

    def set_share(self, share: float) -> None:
        """This worker scores ``share`` of the model's events (its feature partitions over
        all of them): each per-hour budget allows that share of its labels here (a worker
        with no feature partitions keeps its budgets' pace and shows 0 allowed)."""
        self.share = share
        for model, budget in self.budgets.items():
            config = self.configs[model].label_budget
            if config is not None and config.per_hour is not None and share > 0:
                budget.rate = config.per_hour / 3600.0 * share

    def budget_gauges(self) -> None:
        """Budget gauges: this worker's labels per hour and what it spent of its allowance."""
        for model, budget in self.budgets.items():
            report = budget.report()
            config = self.configs[model].label_budget
            per_hour = (
                budget.rate * 3600.0 * (self.share > 0) if report.per == "second" else math.nan
            )
            if config is not None and config.fraction is not None and report.allowance > 0:
                seconds = max(1e-9, self.clock() - self.started)
                per_hour = report.allowance / seconds * 3600.0
            self.metrics.label_budget_target.labels(model=model).set(per_hour)
            self.metrics.label_budget_spent.labels(model=model).set(report.spent_ratio)

    def _watch(self, models: Mapping[str, ServedModel], result: ScoreResult) -> None:
        """Collapse watch over the decisions, and the suppressed-request counter."""
        for b in result.blocks:
            model = b.model.name
            watch = self.collapse[model]
            watch.observe_many(b.labels, float(models[model].learner.rho))
            status = watch.status()
            if status.windows:
                gauges = self._collapse_gauges.get(model)
                if gauges is None:
                    m = self.metrics
                    gauges = self._collapse_gauges[model] = (
                        m.model_collapsed.labels(model=model),
                        m.model_reject_fraction.labels(model=model),
                    )
                collapsed, reject_fraction = gauges
                collapsed.set(int(status.collapsed))
                reject_fraction.set(status.reject_fraction)
        for model, n in result.suppressed.items():
            self.metrics.label_requests_suppressed.labels(model=model).inc(n)

    def query_rates(self) -> dict[str, float]:
        """Fraction of each model's recent decisions that asked for a label (models that
        have decided nothing yet are left out)."""
        return {m: sum(r) / len(r) for m, r in self.recent.items() if r}

    def _score_guarded(
        self,
        models: Mapping[str, ServedModel],
        champions: Champions,
        messages: Sequence[RawMessage],
        now: float,
    ) -> ScoreResult:
        score = partial(
            score_batch,
            limits=self.limits,
            now=now,
            budgets=self.budgets,
            groups=self.groups,
            champions=champions,
        )
        try:
            return score(models, messages)
        except DATA_ERRORS:
            log.exception("batch scoring failed; retrying one event at a time")
        result = ScoreResult()
        for message in messages:
            try:
                result.extend(score(models, [message]))
            except DATA_ERRORS as exc:
                result.dead_letters.append(
                    DeadLetter.of(
                        Source.FEATURES, message, Reason.SCHEMA, f"internal error: {exc!r}"
                    )
                )
        return result

    def _count(self, result: ScoreResult, per_event: float) -> None:
        for b in result.blocks:  # decisions by the model that decided, requests by route
            model, n = b.model.name, len(b.ids)
            rejected = int(np.count_nonzero(b.labels == 0))
            self.recent[model].extend(b.queried[-RECENT:].tolist())
            self.tally[model].add(n, rejected=rejected)
            predict, reject, events, latency, _ = self._bound[model]
            events.inc(n)
            predict.inc(n - rejected)
            reject.inc(rejected)
            _observe_many(latency, per_event, n)
            self._bound[b.route][4].inc(int(np.count_nonzero(b.queried)))
        for (shadow, label), n in result.shadow.items():
            action = Action.REJECT if label == 0 else Action.PREDICT
            self.metrics.shadow_decisions.labels(model=shadow, action=action).inc(n)
            self.tally[shadow].add(n, rejected=n if label == 0 else 0)


def _observe_many(histogram: Any, value: float, n: int) -> None:
    """``histogram.observe(value)`` ``n`` times in one step: prometheus_client (0.2x) keeps a
    histogram child as a sum and a count per bucket (``_sum``, ``_buckets`` for
    ``_upper_bounds``); one call per observation where it does not."""
    buckets, bounds, total = (
        getattr(histogram, name, None) for name in ("_buckets", "_upper_bounds", "_sum")
    )
    if buckets is None or bounds is None or total is None or len(buckets) != len(bounds):
        for _ in range(n):
            histogram.observe(value)
        return
    if n <= 0:
        return
    total.inc(value * n)
    for bucket, bound in zip(buckets, bounds, strict=True):
        if value <= bound:
            bucket.inc(n)
            return
