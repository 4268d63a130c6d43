"""The team view's small charts: per model, the queue depth and the answers over the last
hours, kept as records arrive and drawn as inline SVG (no script, no external asset: the
pages' Content-Security-Policy allows neither; colours come from ``desk.css``).

A :class:`Timeline` adds changes at the times the records carry (a request's
``requested_at``, the time of the label or of the expiry that closed it), not when the desk
read them: a desk restarted on the same topics draws the same charts.

>>> t = Timeline(bucket=60.0, n=3)
>>> for at, delta in [(10.0, 1), (70.0, 1), (75.0, 1), (130.0, -1)]:
...     t.add(at, delta)
>>> t.levels(now=150.0), t.counts(now=150.0)
([1.0, 3.0, 2.0], [1.0, 2.0, -1.0])
>>> t.levels(now=200.0)  # a minute later: the first bucket rolled into the base
[3.0, 2.0, 2.0]
>>> print(sparkline([0.0, 2.0, 1.0], label="answers", width=30, height=10))
<svg class="spark" viewBox="0 0 30 10" width="30" height="10" role="img" aria-label="answers"><title>answers</title><rect class="axis" x="0" y="9.5" width="30" height="0.5"/><rect x="10.0" y="0.0" width="9.0" height="10.0"/><rect x="20.0" y="5.0" width="9.0" height="5.0"/></svg>
"""  # noqa: E501

from __future__ import annotations

import html
import math
from typing import Final

__all__ = ["BUCKET_SECONDS", "BUCKETS", "Timeline", "sparkline"]

BUCKET_SECONDS: Final = 600.0  # ten minutes a bar
BUCKETS: Final = 36  # six hours


class Timeline:
    """Changes summed per ``bucket`` seconds, over the ``n`` buckets up to now; what is
    older is folded into one base (the level the oldest bucket starts from)."""

    def __init__(self, *, bucket: float = BUCKET_SECONDS, n: int = BUCKETS) -> None:
        self.bucket, self.n = bucket, n
        self.deltas: dict[int, float] = {}
        self.base = 0.0
        self._first: int | None = None  # the oldest bucket kept

    def add(self, at: float, delta: float) -> None:
        """A change of ``delta`` at time ``at``."""
        i = math.floor(at / self.bucket)
        if self._first is not None and i < self._first:
            self.base += delta
        else:
            self.deltas[i] = self.deltas.get(i, 0.0) + delta

    def _roll(self, now: float) -> int:
        """Fold the buckets before the window ending at ``now`` into the base; its first."""
        first = math.floor(now / self.bucket) - self.n + 1
        if self._first is None or first > self._first:
            for i in [i for i in self.deltas if i < first]:
                self.base += self.deltas.pop(i)
            self._first = first
        return first

    def counts(self, now: float) -> list[float]:
        """The sum of the changes in each bucket, oldest first."""
        first = self._roll(now)
        return [self.deltas.get(i, 0.0) for i in range(first, first + self.n)]

    def levels(self, now: float) -> list[float]:
        """The level at the end of each bucket (the base plus every change up to it)."""
        deltas = self.counts(now)  # (rolls the base first)
        level, out = self.base, []
        for delta in deltas:
            level += delta
            out.append(level)
        return out


def sparkline(values: list[float], *, label: str, width: int = 216, height: int = 36) -> str:
    """Bars of ``values`` (from 0 to their largest), with ``label`` as the chart's title."""
    top = max([*values, 0.0]) or 1.0
    step = width / max(len(values), 1)
    bars = "".join(
        f'<rect x="{i * step:.1f}" y="{height - h:.1f}" width="{max(step - 1, 1):.1f}" '
        f'height="{h:.1f}"/>'
        for i, v in enumerate(values)
        if (h := round(max(v, 0.0) / top * height, 1)) > 0
    )
    name = html.escape(label, quote=True)
    return (
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{name}"><title>{name}</title>'
        f'<rect class="axis" x="0" y="{height - 0.5}" width="{width}" height="0.5"/>'
        f"{bars}</svg>"
    )
