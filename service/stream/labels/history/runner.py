"""Where a derivation runs: in this process at once (:class:`InlineRunner`: ``abstain
rebuild``, the replay, tests) or in a process of its own (:class:`ProcessRunner`: the
worker).

A correction applies up to ``reach + every`` labels again (hundreds of milliseconds of
CPU). In the worker's process it would compete for the interpreter with scoring, which
shares it: a storm of corrections slowed every decision. The worker's learner therefore
hands its derivations (:class:`~.derive.Job`) to one process of its own, started with
``spawn`` (a fork would copy the event loop and aiokafka's sockets), at a lower CPU
priority (``nice`` +19: decisions come first when the CPU is short), that ignores the
terminal's SIGINT (the worker stops it) and dies with the worker (``PR_SET_PDEATHSIG``, and a
thread that watches the parent). A job in flight when the worker dies is lost with it; the
learner's history says what is left to do after a restart
(:class:`~service.stream.labels.corrector.Corrector`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Final, Protocol

from service.config import Settings
from service.stream.labels.history.derive import Derived, Job, run_job

__all__ = ["NICE", "InlineRunner", "ProcessRunner", "Runner", "broken"]

log = logging.getLogger(__name__)

#: how much lower the derivation process's CPU priority is than the worker's (the lowest:
#: when the CPU is short, corrections wait, decisions do not)
NICE: Final = 19


class Runner(Protocol):
    """Runs :class:`~.derive.Job`\\ s; :meth:`submit` returns a future of the result."""

    def submit(self, job: Job) -> Future[Derived]: ...

    def close(self) -> None: ...


class InlineRunner:
    """Runs each job at once, in the caller's thread (the future is done when returned)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def submit(self, job: Job) -> Future[Derived]:
        done: Future[Derived] = Future()
        try:
            done.set_result(run_job(self.settings, job))
        except Exception as exc:  # noqa: BLE001 - the caller reads it from the future
            done.set_exception(exc)
        return done

    def close(self) -> None:
        return None


# -- the derivation process

_SETTINGS: Settings | None = None


def _init(settings: Settings, parent: int) -> None:
    """In the derivation process, once: keep the settings, lower the priority, ignore the
    terminal's SIGINT, die with the worker."""
    global _SETTINGS  # the process's one configuration
    _SETTINGS = settings
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(NICE)
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            import ctypes  # noqa: PLC0415 - Linux only

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    threading.Thread(target=_watch, args=(parent,), name="parent-watch", daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGKILL)  # the worker is gone: nobody waits for a result


def _run(job: Job) -> Derived:
    assert _SETTINGS is not None  # noqa: S101 - _init ran first
    return run_job(_SETTINGS, job)


class ProcessRunner:
    """Runs jobs in one process of its own (module docstring), started on the first job
    (:meth:`start` starts it ahead) and again after it died."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init,
                initargs=(self.settings, os.getpid()),
            )
        return self._pool

    def start(self) -> None:
        """Start the process now (its imports take a second) rather than at the first job."""
        self._executor().submit(time.sleep, 0)

    def submit(self, job: Job) -> Future[Derived]:
        try:
            return self._executor().submit(_run, job)
        except (BrokenProcessPool, RuntimeError):  # it died (or was shut down): again
            log.warning("the derivation process is gone; starting another")
            self.close()
            return self._executor().submit(_run, job)

    def submit_pid(self) -> Future[int]:
        """The derivation process's PID (for tests and the log)."""
        return self._executor().submit(os.getpid)

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def broken(exc: BaseException) -> bool:
    """True if ``exc`` says the derivation process died (the job can be given again)."""
    return isinstance(exc, BrokenProcessPool | concurrent.futures.CancelledError)
