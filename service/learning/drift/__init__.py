r"""Change detectors over a stream of numbers (a model's losses or margins on its labels).

Both detectors read one value at a time with :meth:`update`, which returns whether a
change was detected at that value; after a detection the next :meth:`update` starts the
detector afresh (the convention of River's ``drift`` module, whose ``ADWIN`` and
``PageHinkley`` give the same detections on the same sequences, see
``tests/learning/test_drift.py``). Their state is a versioned, JSON-safe record
(``"format": "abstain.drift-detector"``) that rebuilds a detector with the same future.

* :class:`ADWIN` — adaptive windowing (Bifet & Gavaldà, 2007, "ADWIN2"): keeps the
  values since the last change in exponential histograms (at most ``max_buckets`` buckets
  of each size $2^i$) and, every ``clock`` values, cuts the window into an older part $W_0$
  and a recent part $W_1$ at every bucket boundary; a change is detected when

  .. math::

      |\hat\mu_0 - \hat\mu_1| > \sqrt{2\,m\,\hat\sigma^2\,\delta'} + \tfrac23\,\delta'\,m,
      \qquad \delta' = \ln\frac{2 \ln |W|}{\delta},\quad
      m = \frac{1}{n_0 - \ell + 1} + \frac{1}{n_1 - \ell + 1},

  with $\hat\sigma^2$ the variance of the whole window and $\ell$ = ``min_window_length``
  (both parts need at least $\ell$ values). The oldest bucket is dropped while a cut holds.
  Besides the detection it tells where the change is: :attr:`ADWIN.recent` is the number
  of latest values after the best split of the window (largest
  $n_0 n_1 (\hat\mu_0 - \hat\mu_1)^2$ over the bucket boundaries) and
  :attr:`ADWIN.rising` whether the recent values' mean is the higher one.
* :class:`PageHinkley` — the Page-Hinkley test (Page, 1954) on deviations from the running
  mean $\bar x_t$: $U_t = \alpha U_{t-1} + (x_t - \bar x_t - \delta)$ and
  $D_t = \alpha D_{t-1} + (x_t - \bar x_t + \delta)$; an increase is detected when
  $U_t - \min_s U_s > \lambda$, a decrease when $\max_s D_s - D_t > \lambda$ (``mode``
  ``"up"``, ``"down"`` or ``"both"``), once ``min_instances`` values were seen.

>>> adwin = ADWIN(clock=1)
>>> flags = [adwin.update(0.1 if t < 300 else 0.9) for t in range(400)]
>>> flags.index(True), adwin.rising, adwin.detections
(313, True, 1)
"""

from __future__ import annotations

from typing import Any

from .. import state as st
from ..errors import StateError
from .adwin import ADWIN
from .detector import DRIFT_FORMAT
from .pagehinkley import PageHinkley

__all__ = ["ADWIN", "DRIFT_FORMAT", "PageHinkley", "detector_from_state"]


_DETECTORS: dict[str, Any] = {"adwin": ADWIN, "page-hinkley": PageHinkley}


def detector_from_state(state: Any) -> ADWIN | PageHinkley:
    """Rebuild whichever detector a state record holds."""
    record = st.read_record(state, DRIFT_FORMAT)
    kind = record.get("kind")
    if kind not in _DETECTORS:
        raise StateError(
            f"unknown change detector {kind!r} (known: {sorted(_DETECTORS)}); upgrade abstain "
            "to a release that knows it"
        )
    det: ADWIN | PageHinkley = _DETECTORS[str(kind)].from_state(record)
    return det
