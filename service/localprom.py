"""A local Prometheus server for the demo and the observability tests.

Runs Debian's ``prometheus`` binary (package ``prometheus``, the one that also ships
``promtool``) on 127.0.0.1 with a scrape config of its own: one job per name given to
:meth:`LocalPrometheus.set_targets`, each read from a file (``file_sd_configs``) that the
server watches, so a restarted worker on a new port keeps its ``instance`` label; the alert
rules in ``rule_files``; data in ``workdir``. Stopped by PID (SIGTERM, then SIGKILL).

>>> prom = LocalPrometheus(Path("/tmp/p"), scrape_interval=1.0, port=9999)
>>> prom.url
'http://127.0.0.1:9999'
>>> duration(0.5), duration(30.0)
('500ms', '30s')
"""

from __future__ import annotations

import ctypes
import json
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from service.errors import AbstainError
from service.localkafka import find_free_ports
from service.processes import stop_process

__all__ = ["LocalPrometheus", "PrometheusError", "duration"]

HOST = "127.0.0.1"


class PrometheusError(AbstainError):
    """The local Prometheus could not be started or did not answer a query."""


def duration(seconds: float) -> str:
    """A Prometheus duration: whole seconds as ``30s``, anything finer in milliseconds."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class LocalPrometheus:
    """One ``prometheus`` process: :meth:`start`, :meth:`query`, :meth:`alerts`, :meth:`stop`.

    ``evaluation_interval`` defaults to the scrape interval; ``port`` to a free one;
    ``die_with_parent`` asks the kernel to kill the server if this process dies first."""

    def __init__(
        self,
        workdir: Path,
        *,
        scrape_interval: float = 1.0,
        evaluation_interval: float | None = None,
        rule_files: Sequence[Path] = (),
        port: int | None = None,
        die_with_parent: bool = False,
    ) -> None:
        self.workdir = workdir
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval or scrape_interval
        self.rule_files = list(rule_files)
        self.port = port if port is not None else find_free_ports(1)[0]
        self.die_with_parent = die_with_parent
        self.jobs: dict[str, dict[str, str]] = {}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "prometheus.log"

    def set_targets(self, job: str, targets: Mapping[str, str]) -> None:
        """Scrape ``instance -> host:port`` as ``job`` (replaces the job's targets; the
        server picks the change up from the file within a second or two)."""
        self.jobs[job] = dict(targets)
        groups = [{"targets": [a], "labels": {"instance": i}} for i, a in targets.items()]
        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / f"targets-{job}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(path)  # atomic: the server never reads half a file

    def config(self) -> dict[str, Any]:
        interval = duration(self.scrape_interval)
        return {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": duration(min(self.scrape_interval, 10.0)),
                "evaluation_interval": duration(self.evaluation_interval),
            },
            "rule_files": [str(p.absolute()) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": job,
                    "file_sd_configs": [
                        {
                            "files": [str(self.workdir / f"targets-{job}.json")],
                            "refresh_interval": "1s",
                        }
                    ],
                }
                for job in self.jobs
            ],
        }

    def start(self, timeout: float = 30.0) -> str:
        """Write the config, start the server, wait until it is ready; its URL."""
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusError(
                "no prometheus binary: install Debian's package (apt-get install prometheus)"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "prometheus.yml"
        config.write_text(json.dumps(self.config(), indent=2))  # JSON is YAML
        cmd = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={HOST}:{self.port}",
            "--log.level=warn",
        ]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:  # noqa: S310
                    if r.status == 200:
                        return self.url
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise PrometheusError(f"prometheus not ready after {timeout:.0f}s: {self.tail()}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM by PID, SIGKILL after ``grace`` seconds."""
        stop_process(self.proc, grace)

    def tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``: its ``data``; PrometheusError on an error answer."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - local URL
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        except OSError as exc:
            raise PrometheusError(f"{url}: {exc}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query now: the vector's samples (``metric``, ``value``); a scalar
        answer comes back as one sample without labels."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing), each with ``labels`` and ``state``."""
        return list(self.api("alerts")["alerts"])

    def page(self, name: str) -> str:
        """The URL of the web UI's page ``name`` (``graph``, ``alerts``): Prometheus's own UI
        serves it at ``/name``; a build without it (Debian's package) at ``/classic/name``."""
        for path in (f"/{name}", f"/classic/{name}"):
            try:
                with urllib.request.urlopen(self.url + path, timeout=2):  # noqa: S310 - local
                    return self.url + path
            except OSError:
                continue
        return f"{self.url}/{name}"
