"""What the load tests share: the demo data as feature vectors, a worker's command line, a
desk users file, and stopping a process.

Run the load tests as scripts (``python loadtest/NAME.py``): this directory is then first
on ``sys.path`` and they import this module by name.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from service.processes import stop_process

__all__ = ["features", "stop", "users_file", "worker_argv"]


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
