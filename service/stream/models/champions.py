"""Champion and challengers: the live comparison of a group's models and promotion.

A *group* is a model that decides (its *route*: the name events and labels are addressed
to) and the models that name it ``champion``. One member serves the route: its decisions go
to the decisions topic and its label requests carry its query probability; the others are
shadows, decided on every event, counted, and taught with that probability as importance
weight (:func:`~service.stream.labels.protocol.apply_shadow_label`). By default the route serves;
:func:`promote` writes the models topic's champions record
(:class:`~service.records.Champions`) that names another member.

When a promotion takes effect: every worker's :class:`~service.stream.models.book.ModelBook`
reads the record like a snapshot, and the scorer takes the models and the champions together
once per batch, so each worker decides from the first batch it scores after it has read the
record, and a batch is decided by one mapping (no event is decided by both members, none
by neither). Label requests keep the route as their model (and key): labels are still
answered for the route, and the learner that owns the route teaches the member that decided
(``served_by``) as the champion and the others as shadows.

:func:`comparison` is the live comparison (``GET /models``, ``abstain models compare``):
per model its role, version, label count and importance-weighted 0-d-1 risk with its 95 %
interval (from the labels, the learner's estimate carried by the snapshot), and the
decisions this worker made with it and the share it rejected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from service.config import Settings
from service.records import Champions
from service.records.champions import CHAMPIONS_MAX_SERIAL
from service.stream.models.served import ServedModel

__all__ = ["Tally", "comparison", "promoted", "routes"]


class Tally(Protocol):
    """Decisions a model made on this worker."""

    events: int
    rejected: int


def routes(settings: Settings) -> list[str]:
    """The models that decide (every group's name), sorted."""
    return sorted(n for n, m in settings.models.items() if m.champion is None)


def comparison(
    settings: Settings,
    models: Mapping[str, ServedModel],
    champions: Champions,
    tally: Mapping[str, Tally] | None = None,
) -> list[dict[str, Any]]:
    """One JSON-safe row per model, groups in name order, the serving member first (NaN
    becomes None; without ``tally`` the decision counts are None)."""
    rows = []
    for route in routes(settings):
        server = champions.server(route)
        members = sorted(settings.group(route), key=lambda m: (m != server, m))
        for name in members:
            served = models[name]
            r = served.interval()
            t = None if tally is None else tally.get(name)
            events = None if t is None else t.events
            row: dict[str, Any] = {
                "model": name,
                "route": route,
                "role": "champion" if name == server else "challenger",
                "algorithm": served.config.algorithm,
                "cost": served.config.cost,
                "version": served.version,
                "labels": served.envelope.labels_applied,
                "risk": r.risk,
                "low": r.low,
                "high": r.high,
                "level": r.level,
                "events": events,
                "rejected": None if t is None else t.rejected,
                "reject_rate": None if t is None or not t.events else t.rejected / t.events,
            }
            rows.append(
                {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
            )
    return rows


def promoted(settings: Settings, current: Champions, name: str, *, now: float) -> Champions:
    """The champions record that makes ``name`` serve its group, after ``current``
    (:class:`ValueError` when ``name`` is not a configured model, or when the next serial
    is one no reader would take: nothing is written then)."""
    if name not in settings.models:
        raise ValueError(f"no model named {name!r} (one of {sorted(settings.models)})")
    if not 0 <= current.serial + 1 < CHAMPIONS_MAX_SERIAL:
        raise ValueError(
            f"the champions record's serial {current.serial} has no successor "
            f"below {CHAMPIONS_MAX_SERIAL} that workers would take"
        )
    route = settings.learner_key(name)
    servers = {r: s for r, s in current.servers.items() if r != route}
    if name != route:
        servers[route] = name
    return Champions(serial=current.serial + 1, servers=servers, updated_at=now)
