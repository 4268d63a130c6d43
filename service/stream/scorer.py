"""The scoring path of a worker: a batch of feature events in, records out, metrics counted.

:class:`Scorer` takes the models once per batch (a swap while the batch is written out
never mixes versions within it), scores with :func:`~service.stream.scoring.score_batch`,
and hands decisions, label requests and dead letters to :class:`~service.stream.outputs.Outputs`.
Should an unexpected data-caused error escape the pure code, the batch is scored again one
event at a time and the culprit is dead-lettered (reason ``schema``; the detail says why).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from service.config import Settings
from service.metrics import Metrics
from service.records import Action, DeadLetter, RawMessage, Reason, Source
from service.stream.joiner import DATA_ERRORS
from service.stream.model import ServedModel
from service.stream.outputs import Outputs
from service.stream.scoring import Limits, ScoreResult, score_batch

__all__ = ["Scorer"]

log = logging.getLogger(__name__)

#: decisions per model over which the recent query rate is measured
RECENT = 1000


class Scorer:
    """Parse -> decide -> emit, batch by batch (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        models: Callable[[], Mapping[str, ServedModel]],
        outputs: Outputs,
        metrics: Metrics,
        *,
        clock: Callable[[], float],
    ) -> None:
        self.limits = Limits(
            default_model=settings.default_model,
            request_ttl=settings.request_ttl_seconds,
            max_bytes=settings.max_message_bytes,
            max_features=settings.max_features,
        )
        self.models = models
        self.outputs = outputs
        self.clock = clock
        self.recent: dict[str, deque[bool]] = {m: deque(maxlen=RECENT) for m in settings.models}
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

    async def score(self, messages: Sequence[RawMessage]) -> ScoreResult:
        """Score ``messages`` and write every output; returns what was written."""
        models = self.models()  # one mapping for the whole batch
        started = time.perf_counter()
        result = self._score_guarded(models, messages, self.clock())
        per_event = (time.perf_counter() - started) / max(1, len(messages))
        for decision in result.decisions:
            await self.outputs.decision(decision)
        for request in result.label_requests:
            await self.outputs.label_request(request)
        for letter in result.dead_letters:
            await self.outputs.dead_letter(letter)
        self._count(result, per_event)
        return result

    def query_rates(self) -> dict[str, float]:
        """Fraction of each model's recent decisions that asked for a label (models that
        have decided nothing yet are left out)."""
        return {m: sum(r) / len(r) for m, r in self.recent.items() if r}

    def _score_guarded(
        self, models: Mapping[str, ServedModel], messages: Sequence[RawMessage], now: float
    ) -> ScoreResult:
        try:
            return score_batch(models, messages, limits=self.limits, now=now)
        except DATA_ERRORS:
            log.exception("batch scoring failed; retrying one event at a time")
        result = ScoreResult()
        for message in messages:
            try:
                result.extend(score_batch(models, [message], limits=self.limits, now=now))
            except DATA_ERRORS as exc:
                result.dead_letters.append(
                    DeadLetter.of(Source.FEATURES, message, Reason.SCHEMA,
                                  f"internal error: {exc!r}")
                )  # fmt: skip
        return result

    def _count(self, result: ScoreResult, per_event: float) -> None:
        counts: dict[str, list[int]] = {}
        for d in result.decisions:
            counts.setdefault(d.model, [0, 0, 0])[0 if d.action is Action.PREDICT else 1] += 1
            self.recent[d.model].append(d.queried)
        for r in result.label_requests:
            counts.setdefault(r.model, [0, 0, 0])[2] += 1
        for model, (predicted, rejected, requested) in counts.items():
            predict, reject, events, latency, label_requests = self._bound[model]
            events.inc(predicted + rejected)
            predict.inc(predicted)
            reject.inc(rejected)
            label_requests.inc(requested)
            for _ in range(predicted + rejected):
                latency.observe(per_event)
