"""A model's next version, written: its whole state to the learner's models table, what a
scorer reads of it (:meth:`~service.records.ModelEnvelope.served`) to the models topic, under
one lock, and counted.

Every write of a model version goes through :meth:`Publisher.put` while its caller holds
:attr:`Publisher.lock` (a label's writes, a correction's, an order's, a republish): a
republish never slips between a model write and its snapshot, and the durable steps a write
waits for (the applied mark, the history) happen under the same lock.
"""

from __future__ import annotations

import asyncio
import logging

from service.metrics import Metrics
from service.stream.labels.protocol import LabelOutcome
from service.stream.labels.state import ModelStore
from service.stream.outputs import Outputs

__all__ = ["Publisher"]

log = logging.getLogger(__name__)


class Publisher:
    """Writes model versions (module docstring); ``written`` is told each version written."""

    def __init__(self, models: ModelStore, outputs: Outputs, metrics: Metrics) -> None:
        self.models = models
        self.outputs = outputs
        self.metrics = metrics
        self.lock = asyncio.Lock()
        self.versions: dict[str, int] | None = None  # the owner's cache, kept up to date

    async def put(
        self,
        outcome: LabelOutcome,
        *,
        learned: bool = True,
        publish: bool = True,
        write: bool = True,
    ) -> None:
        """Write one model's new version to the table and (unless not ``publish``) what a
        scorer reads of it to the models topic (the caller holds :attr:`lock`), and count
        it when it ``learned`` a label. Not ``write``: a later version of the same group
        follows it and is written instead (a version holds every label before it), so this
        one is only counted."""
        model = outcome.model
        assert model is not None  # noqa: S101 - an applied outcome carries it
        name = model.model
        if write:
            encoded = outcome.encode()
            self.models.put(model, encoded)
            if self.versions is not None:
                self.versions[name] = model.version
            if publish:  # what a scorer reads of it (ModelEnvelope.served)
                await self.outputs.model(name, outcome.serve())
        if not learned:
            return
        self.metrics.labels_applied.labels(model=name).inc()
        self.metrics.iw_loss.labels(model=name).inc(outcome.iw_loss)
        if outcome.clipped:
            self.metrics.weights_clipped.labels(model=name).inc()
        if outcome.changes:
            self.metrics.drift_detected.labels(model=name).inc(outcome.changes)
            log.info("model %s: a change detected at version %s", name, model.version)
        if outcome.takeovers:
            self.metrics.takeovers.labels(model=name).inc(outcome.takeovers)
            log.info("model %s: a challenger took over at version %s", name, model.version)
        log.debug("model %s -> version %s", name, model.version)
