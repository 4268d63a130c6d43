"""What the load tests share: the demo data as feature vectors, a worker's command line, a
desk users file, and stopping a process.

Run the load tests as scripts (``python loadtest/NAME.py``): this directory is then first
on ``sys.path`` and they import this module by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from service.processes import stop_process

__all__ = [
    "features",
    "local_broker",
    "running_worker",
    "stop",
    "users_file",
    "wait_ready",
    "worker_argv",
]


def features(n_features: int) -> np.ndarray:
    """The Phishing rows (packaged with the service) if they have ``n_features`` columns,
    else a fixed normal sample of that width."""
    try:
        from service.datasets import load_dataset, resolve_dataset_path  # noqa: PLC0415

        X, _ = load_dataset(resolve_dataset_path("phishing"))
        if X.shape[1] == n_features:
            return X
    except (ImportError, ValueError):
        pass
    return np.random.default_rng(0).normal(size=(5000, n_features))


def stop(proc: subprocess.Popen[bytes] | None, grace: float = 30.0) -> None:
    """SIGTERM ``proc`` (if it runs), wait ``grace`` seconds, then SIGKILL."""
    stop_process(proc, grace)


def worker_argv(config: Path, broker: str, port: int) -> list[str]:
    """``python -m service worker`` with settings file ``config``, ``broker`` and the web
    port ``port``."""
    return [
        sys.executable,
        "-m",
        "service",
        "worker",
        "--config",
        str(config),
        "--broker",
        broker,
        "--web-port",
        str(port),
    ]


def users_file(work: Path, passwords: Mapping[str, str]) -> Path:
    """A desk users file in ``work`` for ``passwords`` (user -> password, hashed here)."""
    from service.desk.auth.passwords import hash_password  # noqa: PLC0415

    lines = [f'[users.{u}]\npassword = "{hash_password(pw)}"' for u, pw in passwords.items()]
    path = work / "users.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def local_broker(given: str | None, work: Path) -> tuple[Any, str]:
    """``(None, given)``, or, without a broker given, a single-node Kafka started with its
    data under ``work`` (it dies with this process; the caller stops it) and its address."""
    if given is not None:
        return None, given
    from service.localkafka import LocalKafka, find_free_ports  # noqa: PLC0415

    port, ctl = find_free_ports(2)
    kafka = LocalKafka(
        port=port, controller_port=ctl, data_dir=work / "kafka", die_with_parent=True
    )
    kafka.start()
    return kafka, kafka.bootstrap


def wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 120.0) -> None:
    """Return once the worker ``proc`` (web port ``port``) says it is ready; exit naming its
    ``log`` if it stops or is not ready within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"worker exited; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if json.loads(r.read()).get("ready"):
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"worker not ready; see {log}")


@contextlib.contextmanager
def running_worker(
    work: Path, config: Mapping[str, Any], broker: str, port: int
) -> Iterator[tuple[Any, subprocess.Popen[bytes]]]:
    """A worker subprocess for settings ``config`` (written under ``work`` by its app id,
    its output in ``<app id>.log`` there), ready; yields (its settings, the process) and
    stops it by PID on the way out."""
    from service.config import load_settings  # noqa: PLC0415

    path = work / f"{config['app_id']}.json"
    path.write_text(json.dumps(config))
    settings = load_settings(path, broker=broker)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    log = work / f"{config['app_id']}.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                worker_argv(path, broker, port),
                cwd=Path(__file__).resolve().parents[1],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_ready(port, proc, log)
        yield settings, proc
    finally:
        stop(proc)
