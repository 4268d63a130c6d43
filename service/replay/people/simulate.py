r"""One run of the replay with people: events in order, the worker's stack, a team at the desk.

:func:`simulate` presents the run's events one at a time to a
:class:`~service.replay.people.learner.MemoryService` (the scorer's decision and the
learner's label path of a stream worker, in memory) and charges each decision its 0-d-1
loss against the true label, as :mod:`service.replay.sequential` does
(:func:`~service.learning.zero_d_one_loss` of the margin $y f(x)$ and $\rho$). When the
model asks, the label request and the first answer (:class:`~service.replay.people.desk.Desk`)
go to the learner at once, then the second opinion the desk asks for, if any; the
corrections due after that many labels (the reviewer's, the authors') follow. At the end
of the run the corrections still filed are sent (they change the final model, not the
losses already charged).

With perfect people and no review it is the plain replay of the same stack on the same
trials and coins (``replay --adaptive --scaler-fit labels --label-budget B``, the budgeted
variant): ``tests/replay/people/test_simulate.py`` checks every decision.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from service.config import ModelConfig
from service.learning.losses import zero_d_one_loss
from service.records import LabelRequest, ModelEnvelope
from service.replay.errors import ReplayConfigError
from service.replay.people.desk import Desk, Work
from service.replay.people.learner import MODEL, MemoryService
from service.replay.people.team import Draws, People

__all__ = ["PeopleRun", "simulate"]

FloatArray = npt.NDArray[np.float64]


@dataclass
class PeopleRun:
    """What one run measured: per event the loss charged, the decision (+1, -1, 0) and
    whether the model asked; the people's work; the learner's corrections by outcome
    (``abstain_corrections_total``); the labels in force that are wrong at the end; the
    final model; the requests asked, in order (with ``keep_requests``)."""

    loss: FloatArray
    decided: npt.NDArray[np.int8]
    asked: npt.NDArray[np.bool_]
    work: Work
    corrections: dict[str, int]
    wrong_in_force: int
    model: ModelEnvelope
    seconds: float
    requests: list[LabelRequest] = field(default_factory=list)

    def risk(self, start: int = 0) -> float:
        """Mean loss over the events from ``start`` on."""
        return float(self.loss[start:].mean())


class _Run:
    def __init__(self, config: ModelConfig, people: People, draws: Draws, *, keep: bool) -> None:
        self.service = MemoryService(config, keep=keep)
        self.desk = Desk(
            people, draws, model=MODEL, max_weight=self.service.settings.max_importance_weight
        )
        self.requests: list[LabelRequest] = []

    async def ask(self, t: int, x: FloatArray, truth: int, request: LabelRequest) -> None:
        """The request of event ``t``, its answer, a second opinion, the corrections due."""
        service, desk, now = self.service, self.desk, self.service.now
        self.requests.append(request)
        await service.send(request)
        first = desk.answer(t, request, truth, now=now)
        await service.send(first)
        for opinion in desk.check(t, request, first, now=now):
            await service.send(opinion)
        await self.land(desk.work.labels)

    async def land(self, labels: int | None) -> None:
        for correction in self.desk.due(labels, now=self.service.now):
            self.desk.landed(correction, taken=await self.service.send(correction))


async def _simulate(
    X: FloatArray,
    y: npt.NDArray[np.int64],
    coins: FloatArray,
    config: ModelConfig,
    people: People,
    draws: Draws,
    keep: bool,
) -> tuple[_Run, FloatArray, npt.NDArray[np.int8], npt.NDArray[np.bool_]]:
    run = _Run(config, people, draws, keep=keep)
    service, cost = run.service, config.cost
    n = y.shape[0]
    loss, decided, asked = np.empty(n), np.empty(n, dtype=np.int8), np.zeros(n, dtype=bool)
    ys, cs = y.tolist(), coins.tolist()
    for t in range(n):
        service.now = float(t)
        x = X[t]
        d = service.decide(x, cs[t])
        loss[t] = zero_d_one_loss(ys[t] * d.score, d.rho, cost)
        decided[t] = d.label
        if d.query:
            asked[t] = True
            await run.ask(t, x, int(ys[t]), service.request(f"e{t}", x, d))
    await run.land(None)
    return run, loss, decided, asked


def simulate(
    X: FloatArray,
    y: npt.NDArray[np.int64],
    coins: FloatArray,
    config: ModelConfig,
    people: People,
    draws: Draws,
    *,
    keep_requests: bool = False,
    keep_models: bool = True,
) -> PeopleRun:
    """Run events ``X[t]``, ``y[t]`` in order with query coins ``coins[t]`` through a
    worker serving ``config`` (a label budget required), labelled by ``people`` with the
    run's ``draws`` (module docstring). ``keep_models``: the learner's model store keeps
    the envelopes it writes (:class:`~service.replay.people.learner.MemoryService`)."""
    if not X.shape[0] == y.shape[0] == coins.shape[0] <= draws.first.shape[0]:
        raise ReplayConfigError("X, y, coins and the draws must cover the same trials")
    tic = time.perf_counter()
    run, loss, decided, asked = asyncio.run(
        _simulate(X, y, coins, config, people, draws, keep_models)
    )
    return PeopleRun(
        loss,
        decided,
        asked,
        run.desk.work,
        run.service.corrections(),
        run.desk.wrong_in_force(),
        run.service.model(),
        time.perf_counter() - tic,
        run.requests if keep_requests else [],
    )
