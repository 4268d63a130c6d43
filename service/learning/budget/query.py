r"""Query budgets: ask for labels at a target rate, the most informative events first.

A learner rates each event's label with a utility $u \in [0, 1]$
(:meth:`query_utility`: DSAL's own $p$; for DRAL a smooth bump over its query band; 1 for
DSOL). A :class:`QueryBudget` turns it into the probability the event is *really* asked with

.. math::

    p_t = v\,\beta_t + (1 - v)\,\min(1,\ \lambda_t u_t^k),
    \qquad
    \lambda_t = \frac{\beta_t}{\bar u_{t-1}}\,
                \exp\!\Bigl(\frac{D_t}{\beta_t H}\Bigr),

and asks iff the event's coin is below $p_t$:

* $\beta_t$ — the target fraction of events: ``rate`` when ``per="event"``;
  $\min(1, r\,\bar g_t)$ when ``per="second"`` ($r$ labels per second, $\bar g_t$ the
  running mean gap between event timestamps).
* $k$ = ``sharpness`` — how strongly the budget favours the most informative events:
  $k = 1$ asks in proportion to the utility, larger $k$ moves towards asking only the top
  events (a quantile filter), $k = 0$ ignores the utility: a uniform random sample of the
  events at the same rate, the baseline a budgeted learner must beat. Default 4: on the
  paper's protocol at 10 % of the labels (Phishing and Guide, 20 runs) it lowers budgeted
  DSAL's risk by 1-6 % and DRAL's by 4-9 % against $k = 1$; $k = 8$ is a little lower
  still but spends only 18.5-19.3 % of a 20 % budget (``docs/results/replay/index.md``).
* $v$ = ``explore`` — the share of labels spent uniformly: every event has $p \ge v\beta$, so
  importance weights $1/p$ stay bounded and a model that stopped asking still gets labels
  (the split of scikit-activeml's ``SplitBudgetManager``).
* $\bar u$ — running mean (window ``horizon`` = $H$ events; 1 before the first event) of
  $\min(u_t^k, 1/\lambda_t)$: at
  its fixed point $\mathbb{E}[\min(1, \lambda u^k)] = \beta$, the spend the target asks for
  (feed-forward, like a quantile filter's threshold but without a hard cut: every event
  keeps a positive probability, ordered by its utility, as in Vowpal Wabbit's ``--active``
  where mellowness scales a query probability).
* $D_t$ — the credit: labels the target has allowed so far ($\beta$ per event, or $r$ per
  second of event time) minus labels asked, capped above at ``burst`` (default
  $\max(1, \beta_t H)$). The exponential feedback pays a deficit back over about $H$
  events, so the number of labels asked stays within a bounded distance of the allowance:
  the long-run rate is the target. A budget is a ceiling, not a quota: the feedback can
  raise $\lambda$ by at most $e$ over the feed-forward, so a learner whose utilities are
  nearly all 0 (sure of every event) asks less, never less than $v\beta$.

At a fixed state $p$ increases with $u$ (for $k > 0$): the most informative events are the
most likely to be asked. The state (counts, credit,
$\bar u$, clock, generator) round-trips through :meth:`QueryBudget.to_state`.

>>> budget = QueryBudget(0.1)                  # 10 % of the events
>>> p, q = budget.ask_many([0.9, 0.05, 0.9, 0.05], coins=[0.5, 0.5, 0.05, 0.05])
>>> [round(v, 3) for v in p.tolist()], q.tolist()  # informative events: higher p
([0.069, 0.01, 0.193, 0.01], [False, False, True, False])
>>> r = budget.report()
>>> r.events, r.asked, round(r.allowance, 2), round(r.spent_ratio, 2)
(4, 1, 0.4, 2.5)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal

import numpy as np
import numpy.typing as npt

from .. import state as st
from ..base import check_coin, check_int, check_seed, draw_query, quiet
from ..errors import DimensionError, HyperparameterError, InputError, StateError
from ..losses import FloatArray

__all__ = ["DEFAULT_SHARPNESS", "PERIODS", "BudgetReport", "BudgetRows", "QueryBudget"]

Period = Literal["event", "second"]
PERIODS: tuple[Period, ...] = ("event", "second")

DEFAULT_SHARPNESS: Final = 4.0
"""Default exponent $k$ of the utility (``docs/results/replay/index.md``, "Label budgets")."""

_TINY: Final = 1e-12
_MAX_EXPONENT: Final = 50.0
_MAX_SCALE: Final = 1e12


def _number(name: str, value: Any, low: float, high: float, *, low_open: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise HyperparameterError(f"{name} must be a number, got {value!r}")
    v = float(value)
    ok = math.isfinite(v) and (v > low if low_open else v >= low) and v <= high
    if not ok:
        left = "(" if low_open else "["
        raise HyperparameterError(f"{name} must be in {left}{low:g}, {high:g}], got {value!r}")
    return v


def scale_factor(beta: float, ubar: float, credit: float, horizon: int) -> float:
    r"""$\lambda = (\beta / \bar u)\,\exp(D / (\beta H))$, clipped to stay finite
    (0 when $\beta = 0$).

    >>> scale_factor(0.1, 0.5, 0.0, 100)
    0.2
    """
    if beta <= 0.0:
        return 0.0
    exponent = min(max(credit / (beta * horizon), -_MAX_EXPONENT), _MAX_EXPONENT)
    return min(beta / max(ubar, _TINY) * math.exp(exponent), _MAX_SCALE)


@dataclass(frozen=True, slots=True)
class BudgetReport:
    r"""What a budget has spent (a snapshot; :meth:`QueryBudget.report` changes nothing).

    ``allowance`` is what the target allowed so far (``rate x events``, or ``rate x``
    seconds of event time); ``expected`` the sum of the probabilities used; ``credit`` the
    allowance not yet spent (negative: overspent), as capped by ``burst``; ``scale`` the
    last $\lambda$.
    """

    target: float
    per: str
    events: int
    asked: int
    allowance: float
    expected: float
    credit: float
    scale: float

    @property
    def spent_ratio(self) -> float:
        """``asked / allowance`` (1 on target, NaN before any allowance)."""
        return self.asked / self.allowance if self.allowance > 0.0 else math.nan

    @property
    def fraction_asked(self) -> float:
        """``asked / events`` (NaN before any event)."""
        return self.asked / self.events if self.events else math.nan


class QueryBudget:
    r"""Scale a learner's query utilities so labels are asked at a target rate.

    Parameters
    ----------
    rate:
        The target: a fraction of events in $(0, 1]$ (``per="event"``) or labels per
        second of event time, $> 0$ (``per="second"``, which needs timestamps).
    per:
        ``"event"`` or ``"second"``.
    horizon:
        $H$, in events (default 200): the window of the running mean $\bar u$ (and of the
        mean gap), and the time over which a deficit or a surplus of labels is paid back.
        Utilities shrink as a learner learns; with $H = 1000$ the running mean lags them
        and budgeted DSAL spends 16 % of a 20 % budget at $d = 0.4$ (Guide and Phishing),
        with $H = 200$ it spends 19.9 % at the same or a lower risk.
    sharpness:
        $k \in [0, 64]$, the exponent of the utility (0: uniform random sampling).
    explore:
        $v \in [0, 1]$, the share of the budget spent on uniformly chosen events.
    burst:
        Most labels the budget may save up (``None``: $\max(1, \beta_t H)$).
    seed:
        Seed of the generator that draws coins when none is supplied.
    """

    kind: ClassVar[str] = "query-budget"
    param_names: ClassVar[tuple[str, ...]] = (
        "rate",
        "per",
        "sharpness",
        "horizon",
        "explore",
        "burst",
        "seed",
    )
    __slots__ = (
        "burst",
        "explore",
        "horizon",
        "per",
        "rate",
        "seed",
        "sharpness",
        "_allowance",
        "_asked",
        "_credit",
        "_events",
        "_expected",
        "_gap",
        "_rng",
        "_scale",
        "_t_first",
        "_t_last",
        "_ubar",
    )

    def __init__(
        self,
        rate: float,
        *,
        per: Period = "event",
        sharpness: float = DEFAULT_SHARPNESS,
        horizon: int = 200,
        explore: float = 0.1,
        burst: float | None = None,
        seed: int | None = 0,
    ) -> None:
        if per not in PERIODS:
            raise HyperparameterError(f"per must be one of {PERIODS}, got {per!r}")
        self.per: Period = per
        self.sharpness = _number("sharpness", sharpness, 0.0, 64.0, low_open=False)
        self.rate = _number("rate", rate, 0.0, 1.0 if per == "event" else 1e12, low_open=True)
        self.horizon = check_int("horizon", horizon, 1)
        self.explore = _number("explore", explore, 0.0, 1.0, low_open=False)
        self.burst = None if burst is None else _number("burst", burst, 0.0, 1e12, low_open=True)
        self.seed = check_seed(seed)
        self._events = 0
        self._asked = 0
        self._expected = 0.0
        self._allowance = 0.0
        self._credit = 0.0
        self._scale = 0.0
        self._ubar: float | None = None
        self._gap: float | None = None
        self._t_first: float | None = None
        self._t_last: float | None = None
        self._rng = np.random.default_rng(self.seed)

    # -- the controller ----------------------------------------------------------------
    def _clock(self, ts: float | None) -> tuple[float, float]:
        """Advance the allowance clock by one event: ``(allowance increment, beta)``."""
        if self.per == "event":
            return self.rate, self.rate
        if ts is None:
            raise InputError("a budget per second needs the event timestamps (ts)")
        if self._t_last is None:  # no gap yet: as if the last event was a second ago
            self._t_first = self._t_last = ts
            return 0.0, min(1.0, self.rate)
        gap = max(ts - self._t_last, 0.0)
        self._t_last = max(ts, self._t_last)
        alpha = 1.0 / min(self._events, self.horizon)  # events - 1 gaps seen, plus this one
        # a pause (no events for a while) is not a slower stream: a gap counts at most as the
        # whole window (H mean gaps) in the mean, so beta, the burst cap and the spend right
        # after the pause stay near what they were before it
        limit = self.horizon * self._gap if self._gap else math.inf
        seen = min(gap, limit)
        self._gap = seen if self._gap is None else self._gap + alpha * (seen - self._gap)
        return self.rate * seen, min(1.0, self.rate * self._gap)

    def _step(
        self, u: float, coin: float | None, increment: float, beta: float
    ) -> tuple[float, bool]:
        """One event, once the clock gave its allowance ``increment`` and target ``beta``."""
        u = u**self.sharpness
        self._events += 1
        self._allowance += increment
        cap = self.burst if self.burst is not None else max(1.0, beta * self.horizon)
        credit = min(self._credit + increment, cap)
        ubar = 1.0 if self._ubar is None else self._ubar  # no history: assume the most
        lam = scale_factor(beta, ubar, credit, self.horizon)
        v = self.explore
        p = min(v * beta + (1.0 - v) * min(1.0, lam * u), 1.0)
        query = draw_query(p, coin, self._rng) if coin is None else coin < p
        alpha = 1.0 / min(self._events, self.horizon)
        seen = min(u, 1.0 / lam) if lam > 0.0 else u
        self._ubar = ubar + alpha * (seen - ubar)
        self._credit = credit - float(query)
        self._asked += int(query)
        self._expected += p
        self._scale = lam
        return p, query

    # -- public API --------------------------------------------------------------------
    @quiet
    def ask(
        self, utility: float, coin: float | None = None, ts: float | None = None
    ) -> tuple[float, bool]:
        """One event: ``(p, query)`` for the learner's ``utility`` in ``[0, 1]``.

        ``coin`` (uniform in ``[0, 1)``) decides: ``query = coin < p``; without it the
        budget's generator draws one when ``0 < p < 1``. ``ts`` is the event time in
        seconds (required with ``per="second"``). The budget's state moves on.
        """
        u = _utility(utility)
        c = None if coin is None else check_coin(coin)
        t = _timestamp(ts) if ts is not None else None
        return self._step(u, c, *self._clock(t))

    @quiet
    def ask_many(
        self, utilities: Any, coins: Any = None, ts: Any = None
    ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        """:meth:`ask` for a batch, in order: the same results as row-by-row calls.

        Bad input (shapes, coins outside ``[0, 1)``, non-finite values) is refused before
        anything changes.
        """
        u = np.asarray(utilities, dtype=np.float64)
        if u.ndim != 1:
            raise DimensionError(f"utilities must be a 1-D array, got shape {u.shape}")
        if not ((u >= 0.0) & (u <= 1.0)).all():
            raise InputError("utilities must all be in [0, 1]")
        m = u.shape[0]
        c = None if coins is None else _coins(coins, m)
        t = None if ts is None else _timestamps(ts, m)
        if t is None and self.per == "second":
            raise InputError("a budget per second needs the event timestamps (ts)")
        probs = np.empty(m)
        queries = np.empty(m, dtype=bool)
        for i, ui in enumerate(u.tolist()):
            clock = self._clock(None if t is None else t[i])
            probs[i], queries[i] = self._step(ui, None if c is None else c[i], *clock)
        return probs, queries

    @property
    def last_ts(self) -> float | None:
        """The latest event timestamp seen (None before the first, and per-event budgets)."""
        return self._t_last

    def report(self) -> BudgetReport:
        """Spent against target so far (pure: the budget is not changed)."""
        return BudgetReport(
            target=self.rate,
            per=self.per,
            events=self._events,
            asked=self._asked,
            allowance=self._allowance,
            expected=self._expected,
            credit=self._credit,
            scale=self._scale,
        )

    # -- state -------------------------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """Hyperparameters as JSON-safe values (the constructor's keywords)."""
        return {name: getattr(self, name) for name in self.param_names}

    def to_state(self) -> dict[str, Any]:
        """A versioned, JSON-safe record (``"format": "abstain.budget"``)."""
        learned = {
            "events": self._events,
            "asked": self._asked,
            "expected": self._expected,
            "allowance": self._allowance,
            "credit": self._credit,
            "scale": self._scale,
            "ubar": self._ubar,
            "gap": self._gap,
            "t_first": self._t_first,
            "t_last": self._t_last,
            "rng": st.rng_state(self._rng),
        }
        return st.budget_record(self.get_params(), learned)

    @classmethod
    def from_state(cls, state: Any) -> QueryBudget:
        """Rebuild a budget from :meth:`to_state` output (same future, coin for coin)."""
        record = st.read_record(state, st.BUDGET_FORMAT)
        params = st.read_mapping(record, "params")
        learned = st.read_mapping(record, "learned")
        unknown = set(params) - set(cls.param_names)
        if unknown:
            raise StateError(f"budget state params hold unknown names {sorted(unknown)}")
        try:
            budget = cls(**params)
        except (TypeError, ValueError) as exc:
            raise StateError(f"budget state params are invalid: {exc}") from exc
        budget._events = st.read_int(learned, "events")
        budget._asked = st.read_int(learned, "asked")
        budget._expected = st.read_float(learned, "expected", minimum=0.0)
        budget._allowance = st.read_float(learned, "allowance", minimum=0.0)
        budget._credit = st.read_float(learned, "credit")
        budget._scale = st.read_float(learned, "scale", minimum=0.0)
        budget._ubar = st.read_optional_float(learned, "ubar", minimum=0.0)
        budget._gap = st.read_optional_float(learned, "gap", minimum=0.0)
        budget._t_first = st.read_optional_float(learned, "t_first")
        budget._t_last = st.read_optional_float(learned, "t_last")
        budget._rng = st.rng_from_state(learned.get("rng"))
        return budget

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"QueryBudget({params}, events={self._events}, asked={self._asked})"


def _utility(value: Any) -> float:
    try:
        u = float(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"utility must be a number in [0, 1], got {value!r}") from exc
    if not 0.0 <= u <= 1.0:
        raise InputError(f"utility must be in [0, 1], got {value!r}")
    return u


def _timestamp(value: Any) -> float:
    try:
        t = float(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"ts must be a number of seconds, got {value!r}") from exc
    if not math.isfinite(t):
        raise InputError(f"ts must be finite, got {value!r}")
    return t


def _coins(coins: Any, m: int) -> list[float]:
    c = np.asarray(coins, dtype=np.float64)
    if c.shape != (m,):
        raise DimensionError(f"coins must have shape {(m,)}, got {c.shape}")
    if not ((c >= 0.0) & (c < 1.0)).all():
        raise InputError("coins must all be in [0, 1)")
    out: list[float] = c.tolist()
    return out


def _timestamps(ts: Any, m: int) -> list[float]:
    try:
        t = np.asarray(ts, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise InputError(f"ts must be numbers of seconds: {exc}") from exc
    if t.shape != (m,):
        raise DimensionError(f"ts must have shape {(m,)}, got {t.shape}")
    if not np.isfinite(t).all():
        raise InputError("ts must all be finite")
    out: list[float] = t.tolist()
    return out


class BudgetRows:
    """Fresh per-event budgets of ``B`` rows advanced in lockstep (the replay's engine).

    Row ``b`` follows exactly the formulas of ``budgets[b]`` (a :class:`QueryBudget` with
    ``per="event"`` that has seen no event) fed the same utilities and coins, evaluated with
    numpy instead of :mod:`math` (so rows agree with the single budgets to rounding).
    :meth:`ask` computes a step and :meth:`commit` keeps it, so a caller that refuses the
    step afterwards leaves the budgets as they were.

    >>> rows = BudgetRows([QueryBudget(0.1), QueryBudget(0.1, sharpness=0.0)])
    >>> p, q = rows.ask(np.array([0.9, 0.9]), np.array([0.5, 0.05]))
    >>> rows.commit(); [round(v, 3) for v in p.tolist()], q.tolist()
    ([0.069, 0.1], [False, True])
    >>> rows.asked.tolist()
    [0, 1]
    """

    __slots__ = (
        "_asked",
        "_burst",
        "_credit",
        "_events",
        "_explore",
        "_horizon",
        "_next",
        "_rate",
        "_sharpness",
        "_ubar",
    )

    def __init__(self, budgets: list[QueryBudget]) -> None:
        for b in budgets:
            if b.per != "event" or b.report().events:
                raise HyperparameterError("batched budgets must be fresh and per event")
        self._rate = np.array([b.rate for b in budgets])
        self._horizon = np.array([b.horizon for b in budgets], dtype=np.int64)
        self._explore = np.array([b.explore for b in budgets])
        self._burst = np.array([math.nan if b.burst is None else b.burst for b in budgets])
        self._sharpness = np.array([b.sharpness for b in budgets])
        self._events = 0
        self._asked = np.zeros(len(budgets), dtype=np.int64)
        self._credit = np.array([b.report().credit for b in budgets])
        self._ubar = np.full(len(budgets), math.nan)
        self._next: tuple[FloatArray, FloatArray, npt.NDArray[np.bool_]] | None = None

    @property
    def asked(self) -> npt.NDArray[np.int64]:
        """Labels asked per row (a copy)."""
        return self._asked.copy()

    def ask(
        self, utilities: FloatArray, coins: FloatArray
    ) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
        """One event per row: ``(p, query)``; call :meth:`commit` to keep the step."""
        u = np.power(utilities, self._sharpness)
        beta, horizon, v = self._rate, self._horizon, self._explore
        cap = np.where(np.isnan(self._burst), np.maximum(1.0, beta * horizon), self._burst)
        credit = np.minimum(self._credit + beta, cap)
        ubar = np.where(np.isnan(self._ubar), 1.0, self._ubar)
        exponent = np.clip(credit / (beta * horizon), -_MAX_EXPONENT, _MAX_EXPONENT)
        lam = np.minimum(beta / np.maximum(ubar, _TINY) * np.exp(exponent), _MAX_SCALE)
        p = np.minimum(v * beta + (1.0 - v) * np.minimum(1.0, lam * u), 1.0)
        query = coins < p
        alpha = 1.0 / np.minimum(self._events + 1, horizon)
        seen = np.minimum(u, 1.0 / lam)
        self._next = (ubar + alpha * (seen - ubar), credit - query, query)
        return p, query

    def commit(self) -> None:
        """Keep the step computed by the last :meth:`ask`."""
        if self._next is None:
            return
        self._ubar, self._credit, query = self._next
        self._asked += query
        self._events += 1
        self._next = None
