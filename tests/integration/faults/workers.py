"""``abstain worker`` subprocesses for fault tests, tracked and stopped by PID.

A :class:`Deployment` is one configuration (fresh app id and topic names) and every worker
process started for it, including the ones killed on purpose; :meth:`Deployment.close`
stops whatever still runs. Workers die with the test process (``PR_SET_PDEATHSIG``), so an
interrupted session leaves none behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from service.config import Topics
from service.localkafka import find_free_ports

from . import HarnessError

__all__ = [
    "WORKER_ENV",
    "Deployment",
    "Served",
    "ServedSampler",
    "WorkerProcess",
    "http",
    "service_config",
    "wait_until",
    "worker_command",
]

REPO = Path(__file__).resolve().parents[3]
WORKER_ENV = "ABSTAIN_FAULTS_WORKER"


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass(frozen=True, slots=True)
class _Limited:
    """A child's set-up: it dies with its parent and may map at most ``memory_bytes`` of
    address space (RLIMIT_AS: an allocation past it fails, as one past a container's memory
    limit gets the process killed)."""

    memory_bytes: int

    def __call__(self) -> None:
        _die_with_parent()
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))


def http(
    url: str,
    *,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> tuple[int, bytes]:
    """GET (or POST ``data``); ``(status, body)``, HTTP errors included."""
    req = urllib.request.Request(url, data=data, headers=dict(headers or {}))  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def worker_command() -> list[str]:
    """How a worker is started: ``python -m service worker``, or the command in
    ``ABSTAIN_FAULTS_WORKER`` (e.g. an installed ``abstain worker``)."""
    custom = os.environ.get(WORKER_ENV)
    return shlex.split(custom) if custom else [sys.executable, "-m", "service", "worker"]


def service_config(tmp: Path, **overrides: Any) -> dict[str, Any]:
    """A worker configuration with a fresh app id and fresh topic names under ``tmp``."""
    suffix = uuid.uuid4().hex[:8]
    config: dict[str, Any] = {
        "app_id": f"faults-{suffix}",
        "datadir": str(tmp / "data"),
        "topics": Topics.prefixed(f"f{suffix}"),
        "partitions": {"features": 2, "decisions": 1, "labels": 1, "models": 1},
        "label_token": f"token-{uuid.uuid4().hex}",
        "request_ttl_seconds": 3600,
        "stall_seconds": 60,
        "session_timeout_seconds": 6,
        "commit_interval_seconds": 1.0,
        "models": {"m": {"algorithm": "dsal", "cost": 0.25, "n_features": 3, "audit_rate": 0.05}},
        "default_model": "m",
        "log_level": "warning",
    }
    config.update(overrides)
    return config


@dataclass
class WorkerProcess:
    """One worker process: its PID, HTTP port and log files."""

    proc: subprocess.Popen[bytes]
    port: int
    stdout: Path
    stderr: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        return http(self.url + path, headers=headers)

    def post(
        self, path: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        return http(self.url + path, data=data, headers=headers)

    def status(self, path: str) -> int:
        """HTTP status of ``path``; 0 when the server does not answer."""
        try:
            return self.get(path)[0]
        except OSError:
            return 0

    def wait_ready(self, timeout: float = 90.0) -> dict[str, Any]:
        """Poll ``/readyz`` until 200; fail with the log tail if the process dies or hangs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise HarnessError(
                    f"worker {self.pid} exited {self.proc.returncode}:\n{self.tail()}"
                )
            try:
                status, body = self.get("/readyz")
            except OSError:
                status, body = 0, b""
            if status == 200:
                return dict(json.loads(body))
            time.sleep(0.25)
        raise HarnessError(f"worker {self.pid} not ready after {timeout:.0f}s:\n{self.tail()}")

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        """Every sample of ``/metrics`` as ``(name, labels, value)``."""
        _, body = self.get("/metrics")
        return [
            (s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
        ]

    def metric(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """Sum of the samples of ``name`` whose labels include ``labels`` (0.0 if none)."""
        want = dict(labels or {})
        return sum(
            v
            for n, lab, v in self.samples()
            if n == name and all(lab.get(k) == x for k, x in want.items())
        )

    def kill9(self) -> float:
        """SIGKILL by PID; returns the monotonic time of the kill."""
        at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(30)
        return at

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """``sig`` (SIGTERM), then SIGKILL after ``timeout`` s; the exit code."""
        if self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)

    def memory(self) -> dict[str, int]:
        """The process's memory from ``/proc``, in bytes: ``VmHWM`` (peak resident), ``VmRSS``,
        ``VmPeak`` (peak address space), ``VmSize``."""
        out = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmHWM", "VmRSS", "VmPeak", "VmSize"):
                out[name] = int(value.split()[0]) * 1024
        return out

    def tail(self, lines: int = 40) -> str:
        parts = []
        for path in (self.stdout, self.stderr):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.name} ---\n" + "\n".join(text))
        return "\n".join(parts)


@dataclass
class Deployment:
    """A configuration and every worker process started for it."""

    bootstrap: str
    tmp: Path
    config: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    processes: list[WorkerProcess] = field(default_factory=list)

    @property
    def topics(self) -> dict[str, str]:
        return dict(self.config["topics"])

    @property
    def app_id(self) -> str:
        return str(self.config["app_id"])

    def changelog(self, table: str) -> str:
        """Name of a table's changelog topic (faust: ``<app id>-<table>-changelog``)."""
        return f"{self.app_id}-{table}-changelog"

    @property
    def token(self) -> str:
        return str(self.config["label_token"])

    def write_config(self) -> Path:
        path = self.tmp / "config.json"
        path.write_text(json.dumps(self.config))
        return path

    def start(
        self, *, argv: list[str] | None = None, memory_bytes: int | None = None
    ) -> WorkerProcess:
        """Start one more worker (own HTTP port, own log files); ``memory_bytes``: the most
        address space it may map."""
        n = len(self.processes)
        port = find_free_ports(1)[0]
        path = self.write_config()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
        env.update(self.env)
        cmd = argv or worker_command()
        cmd = [*cmd, "--config", str(path), "--broker", self.bootstrap, "--web-port", str(port)]
        out, err = self.tmp / f"worker-{n}.out", self.tmp / f"worker-{n}.err"
        with out.open("wb") as o, err.open("wb") as e:
            proc = subprocess.Popen(  # noqa: S603 - fixed argv
                cmd,
                cwd=REPO,
                env=env,
                stdout=o,
                stderr=e,
                preexec_fn=_die_with_parent if memory_bytes is None else _Limited(memory_bytes),
            )
        worker = WorkerProcess(proc, port, out, err)
        self.processes.append(worker)
        return worker

    def close(self) -> None:
        """Stop every process this deployment started that still runs (by PID)."""
        for worker in self.processes:
            worker.stop(timeout=15)

    def logs(self) -> str:
        """stderr of every process, concatenated (for secret checks)."""
        return "\n".join(w.stderr.read_text(errors="replace") for w in self.processes)


def wait_until(
    check: Callable[[], bool], timeout: float, what: str, *, every: float = 0.2
) -> float:
    """Poll ``check`` until true; returns the seconds it took, raises HarnessError after
    ``timeout``."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise HarnessError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)
    return time.monotonic() - began


@dataclass(frozen=True, slots=True)
class Served:
    """What a worker served for one model at one moment: the version ``/readyz`` names and
    the model gauges of ``/metrics`` (version, rho, ||w||), and whether ``/healthz`` was 200.
    Scorers wait until the models topic is read (``loaded``): before that, what ``/readyz``
    names is the follower reading the topic from the beginning, not yet served."""

    at: float  # time.time() before the first request
    until: float  # time.time() after the last one
    pid: int
    loaded: bool  # /readyz "models_loaded"
    ready_version: int | None  # /readyz "models" (None: no answer)
    version: float | None  # abstain_model_version
    rho: float | None  # abstain_model_rho
    weight_norm: float | None  # abstain_model_weight_norm
    live: bool | None  # /healthz 200 (None: no answer)


class ServedSampler(threading.Thread):
    """Polls a worker (``worker()``: the current one, so a restart is followed) every
    ``every`` s and keeps what it served for ``model``; ``samples`` under ``lock``."""

    def __init__(
        self, worker: Callable[[], WorkerProcess], model: str, *, every: float = 0.2
    ) -> None:
        super().__init__(name="faults-served", daemon=True)
        self.worker, self.model, self.every = worker, model, every
        self.samples: list[Served] = []
        self.lock = threading.Lock()
        self._stop_flag = threading.Event()

    def run(self) -> None:
        while not self._stop_flag.wait(self.every):
            sample = self.sample(self.worker())
            if sample is not None:
                with self.lock:
                    self.samples.append(sample)

    def sample(self, worker: WorkerProcess) -> Served | None:
        """One sample of ``worker`` (None when it does not answer at all)."""
        at = time.time()
        try:
            _, body = worker.get("/readyz")
            detail = json.loads(body) if body else {}
            ready = detail.get("models", {}).get(self.model)
            gauges = {
                name: value
                for name, labels, value in worker.samples()
                if labels.get("model") == self.model
            }
            live = worker.status("/healthz") == 200
        except (OSError, ValueError):
            return None
        return Served(
            at,
            time.time(),
            worker.pid,
            bool(detail.get("models_loaded")),
            None if ready is None else int(ready),
            gauges.get("abstain_model_version"),
            gauges.get("abstain_model_rho"),
            gauges.get("abstain_model_weight_norm"),
            live,
        )

    def halt(self) -> list[Served]:
        """Stop sampling; every sample taken."""
        self._stop_flag.set()
        self.join(10)
        with self.lock:
            return list(self.samples)
