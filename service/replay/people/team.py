r"""The people of a replay: labellers who err at a given rate, a reviewer, and their draws.

:class:`People` says who answers the label requests of one arm of a replay: a team of
labellers, each of whom gives the wrong answer with their own probability (``noise``: one
rate for everyone, or one per person), whether the label desk's second-opinion rule
(:class:`~service.config.SecondOpinions`) shows answers to a second labeller, and a
reviewer (its own error rate) who decides disagreements ``review_delay`` labels later;
``undo``: the share of their own wrong answers authors notice and change within the grace
period, ``undo_delay`` labels later.

:class:`Draws` holds every random number the people of one run use, one per trial and
purpose, drawn before the run from ``SeedSequence(seed, spawn_key=(run, PEOPLE))``: the
same trial gets the same person and the same coins in every arm (common random numbers),
so an answer wrong at 5 % is wrong at 20 % too, and two arms differ only by what the
people do, never by luck. An answer is wrong iff its coin falls below the person's rate.

>>> p = People(noise=0.2)
>>> p.rates, p.reviewer_rate, p.reviewed
((0.2, 0.2, 0.2, 0.2), 0.05, False)
>>> d = Draws.draw(5, seed=0, run=0)
>>> d.first.shape, bool((d.second != d.first).all())
((5,), True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from service.config import SecondOpinions
from service.replay.errors import ReplayConfigError

__all__ = ["PEOPLE", "REVIEWER", "Draws", "People", "labeller"]

#: the spawn-key tag of the people's draws (the trials and query coins use ``(run,)``)
PEOPLE = 7
#: the reviewer's user name (never one of the labellers)
REVIEWER = "reviewer"

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def labeller(i: int) -> str:
    """The user name of labeller ``i``.

    >>> labeller(0), labeller(11)
    ('labeller-0', 'labeller-11')
    """
    return f"labeller-{i}"


def _rate(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ReplayConfigError(f"{name} must be a probability in [0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class People:
    """Who answers one arm's label requests (module docstring).

    ``noise``: every labeller's error rate, or one per labeller (a tuple sets the team);
    ``team``: labellers when ``noise`` is one rate (at least 2 with second opinions);
    ``second_opinions``: the desk's rule (None: no second opinions and no reviewer);
    ``reviewer_noise``: the reviewer's error rate (None: a quarter of the labellers' mean);
    ``review_delay``: labels the model learns between a disagreement and the reviewer's
    decision; ``undo``: the share of their own wrong answers authors change, ``undo_delay``
    labels later."""

    noise: float | tuple[float, ...] = 0.0
    team: int = 4
    second_opinions: SecondOpinions | None = None
    reviewer_noise: float | None = None
    review_delay: int = 20
    undo: float = 0.0
    undo_delay: int = 5
    rates: tuple[float, ...] = field(init=False)

    def __post_init__(self) -> None:
        rates = self.noise if isinstance(self.noise, tuple) else (self.noise,) * self.team
        object.__setattr__(self, "rates", tuple(_rate("noise", r) for r in rates))
        if not rates:
            raise ReplayConfigError("a team needs at least one labeller")
        if self.second_opinions is not None and len(self.rates) < 2:
            raise ReplayConfigError("second opinions need a team of at least 2 labellers")
        if self.reviewer_noise is not None:
            _rate("reviewer_noise", self.reviewer_noise)
        _rate("undo", self.undo)
        for name in ("review_delay", "undo_delay"):
            if getattr(self, name) < 0:
                raise ReplayConfigError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def reviewed(self) -> bool:
        """True when answers get second opinions and disagreements a reviewer."""
        return self.second_opinions is not None and self.second_opinions.enabled

    @property
    def reviewer_rate(self) -> float:
        """The reviewer's error rate."""
        if self.reviewer_noise is not None:
            return self.reviewer_noise
        return sum(self.rates) / len(self.rates) / 4.0

    def settings(self) -> dict[str, object]:
        """JSON-safe record of the arm's people."""
        rule = self.second_opinions
        return {
            "rates": list(self.rates),
            "second_opinions": None if rule is None else rule.model_dump(),
            "reviewer_noise": self.reviewer_rate if self.reviewed else None,
            "review_delay": self.review_delay if self.reviewed else None,
            "undo": self.undo,
            "undo_delay": self.undo_delay if self.undo else None,
        }


@dataclass(frozen=True)
class Draws:
    """The people's random numbers for one run, one per trial: who answers first
    (``first``), who gives a second opinion (``second``, never ``first``), and the coins of
    the first answer, the second one, the reviewer's and the author's undo."""

    first: IntArray
    second: IntArray
    answer: FloatArray
    opinion: FloatArray
    review: FloatArray
    undo: FloatArray

    @classmethod
    def draw(cls, trials: int, *, seed: int, run: int, team: int = 4) -> Draws:
        """The draws of run ``run`` for a team of ``team`` labellers (``team >= 2`` for a
        second labeller; with one, ``second`` repeats ``first`` and is never used)."""
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(run, PEOPLE)))
        first = rng.integers(0, team, size=trials)
        step = rng.integers(1, max(team, 2), size=trials)  # 1 .. team-1: another person
        second = (first + step) % team if team > 1 else first
        coins = rng.random((4, trials))
        return cls(first, second, coins[0], coins[1], coins[2], coins[3])
