"""Is the worker well: the one-second check, liveness and readiness.

- :mod:`.housekeeping`: :class:`~.housekeeping.Housekeeping`, the one-second check behind
  ``/healthz`` and ``/readyz`` (it reads the learner's state, never writes it);
- :mod:`.liveness`: :class:`~.liveness.LivenessMonitor`, lag without progress, a recovery
  that stops reading, a broker that does not answer;
- :mod:`.stalls`: the rules of liveness as pure functions and values.
"""
