"""``abstain desk`` subprocesses for the desk's real-broker and browser tests, and a person
at the desk without a browser (cookies, the login form, the CSRF token, the JSON API).

A :class:`DeskProcess` is stopped by PID and dies with the test process.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.cookiejar as cookies
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from service.localkafka import find_free_ports

from .workers import REPO, Deployment, http

__all__ = ["FORM", "DeskProcess", "Person"]

FORM = "application/x-www-form-urlencoded"


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


class DeskProcess:
    """``python -m service desk`` for a deployment, stopped by PID. ``desk`` overrides
    settings of the ``desk`` section (written to a config file of its own)."""

    def __init__(self, service: Deployment, users: Path, **desk: Any) -> None:
        self.port = find_free_ports(1)[0]
        path = service.write_config()
        if desk:
            config = {**service.config, "desk": {**service.config.get("desk", {}), **desk}}
            path = service.tmp / f"config-desk-{self.port}.json"
            path.write_text(json.dumps(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
        self.log = service.tmp / f"desk-{self.port}.err"
        cmd = [
            sys.executable,
            "-m",
            "service",
            "desk",
            "--config",
            str(path),
            "--broker",
            service.bootstrap,
            "--port",
            str(self.port),
            "--users",
            str(users),
        ]
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(  # noqa: S603 - fixed argv
                cmd, cwd=REPO, env=env, stdout=err, stderr=err, preexec_fn=_die_with_parent
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        return http(self.url + path, headers=headers)

    def post(
        self, path: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes]:
        return http(self.url + path, data=data, headers=headers)

    def metric(self, name: str, model: str = "m") -> float:
        return self.sample(f'{name}{{model="{model}"}}')

    def sample(self, series: str) -> float:
        """The value of one exact series (``name{labels}``) of ``/metrics``; 0.0 if absent."""
        _, body = self.get("/metrics")
        for line in body.decode().splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def open_requests(self) -> int:
        return int(json.loads(self.get("/readyz")[1])["open"])

    def wait(self, check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            with contextlib.suppress(OSError):
                if check():
                    return
            time.sleep(0.25)
        raise AssertionError(f"desk: timed out waiting for {what}\n{self.log.read_text()[-3000:]}")

    def wait_ready(self) -> DeskProcess:
        self.wait(lambda: self.get("/readyz")[0] == 200, "ready")
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Person:
    """Someone at a desk without a browser: a cookie jar, the login form, the page's CSRF
    token and the JSON API. ``headers`` go with every request (e.g. a proxy's)."""

    def __init__(self, desk: DeskProcess, headers: Mapping[str, str] | None = None) -> None:
        self.desk, self.headers = desk, dict(headers or {})
        self.jar = cookies.CookieJar()
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()
        )
        self.csrf = ""

    def request(
        self, path: str, data: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes, Mapping[str, str]]:
        """``(status, body, headers)`` of one request, redirects not followed."""
        req = urllib.request.Request(  # noqa: S310
            self.desk.url + path,
            data=data,
            headers={**self.headers, **(headers or {})},
        )
        try:
            with self.opener.open(req, timeout=15) as resp:
                return int(resp.status), bytes(resp.read()), dict(resp.headers)
        except urllib.error.HTTPError as exc:
            return int(exc.code), bytes(exc.read()), dict(exc.headers)

    def login(
        self, user: str, password: str, headers: Mapping[str, str] | None = None
    ) -> tuple[int, bytes, Mapping[str, str]]:
        """Fill in the login form; on success, read the labelling page's CSRF token."""
        _, page, _ = self.request("/login")
        token = re.search(rb'name="token" value="([^"]+)"', page)
        assert token is not None, page[:500]
        form = urllib.parse.urlencode(
            {"user": user, "password": password, "token": token.group(1).decode()}
        ).encode()
        got = self.request("/login", form, {"Content-Type": FORM, **(headers or {})})
        if got[0] == 303:
            self.page()
        return got

    def page(self) -> int:
        """Open the labelling view (and keep its CSRF token); its status."""
        status, page, _ = self.request("/")
        csrf = re.search(rb'name="csrf-token" content="([^"]+)"', page)
        self.csrf = csrf.group(1).decode() if csrf else ""
        return status

    def api(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        """A JSON API call with the session's CSRF token."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, out, _ = self.request(
            path, raw, {"Content-Type": "application/json", "X-CSRF-Token": self.csrf}
        )
        try:
            return status, dict(json.loads(out))
        except ValueError:
            return status, {"raw": out[:200].decode(errors="replace")}

    def next(self, model: str | None = None) -> str | None:
        """The request the desk hands this person (its id), None when there is none."""
        status, body = self.api("/api/next", {"model": model})
        assert status == 200, (status, body)
        request = body.get("request")
        return None if request is None else str(request["request_id"])

    def logout(self) -> int:
        form = urllib.parse.urlencode({"csrf": self.csrf}).encode()
        status, _, _ = self.request("/logout", form, {"Content-Type": FORM})
        return status
