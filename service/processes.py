"""Child processes the tools start: stopped by their PID, and stopped with their parent
(what the demo, the local Kafka, the local Prometheus and the load tests share)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any

__all__ = ["parent_death_signal", "stop_process"]


def parent_death_signal(signum: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send the child ``signum`` when this process dies
    (however it dies: killed, crashed), so nothing it started outlives it; None where the
    system has no ``prctl``."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(1, int(signum))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signum)

    return arm


def stop_process(proc: subprocess.Popen[Any] | None, grace: float = 30.0) -> None:
    """SIGTERM ``proc`` (if it runs), wait ``grace`` seconds, then SIGKILL.

    >>> import sys
    >>> p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    >>> stop_process(p, grace=5.0)
    >>> p.returncode is not None
    True
    >>> stop_process(p)  # already stopped: nothing to do
    >>> stop_process(None)
    """
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
