"""Stopping a child process by its PID: what the demo, the local Prometheus and the load
tests share."""

from __future__ import annotations

import subprocess
from typing import Any

__all__ = ["stop_process"]


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
