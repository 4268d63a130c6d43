"""Fault-injection harness for the stream worker on a real broker.

The ``test_faults_*`` modules build on these pieces:

- :mod:`.sizes`    CI and full sizes of each scenario (``ABSTAIN_FAULTS_SIZE``).
- :mod:`.kafkaio`  topics: create, produce in bulk, read to the end, follow in a thread.
- :mod:`.workers`  ``abstain worker`` subprocesses: start, SIGKILL, restart, scrape, by PID.
- :mod:`.data`     synthetic events with a known truth, and malformed inputs by reason.
- :mod:`.oracle`   a labeller that answers label requests from the known truth.
- :mod:`.checks`   the promises: decisions, the model chain and its offline replay
                   through :mod:`service.learning`, offline expectations, finiteness.
- :mod:`.scenario` a deployment with its topics, a paced event feeder, waiting for the
                   stream to settle, the label accounting and the promise as assertions.
- :mod:`.report`   the summary table (stdout, JSON under the test's tmp dir and, when
                   ``ABSTAIN_FAULTS_RESULTS`` names a directory, there too).
- :mod:`.faultworker` a worker with switches that pause its consumer (stall test) or make
  it drop fetched records (skip test).

Errors::

    AssertionError        a promise does not hold (the harness asserts, tests read it)
    RuntimeError
     └── HarnessError     the harness itself could not do its job (timeout, dead worker)
"""

from __future__ import annotations


class HarnessError(RuntimeError):
    """The harness could not do its job (a bounded wait ran out, a process died)."""


__all__ = ["HarnessError"]
