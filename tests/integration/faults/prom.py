"""A real Prometheus over real workers: the project's alert rules and dashboard, live.

- :func:`fast_rules`     ``deploy/prometheus/alerts.yml`` with every ``for:`` cut to a few
                         seconds and the thresholds that stand for a setting or a duration
                         set to this run's values (each replaced text must be there once);
                         the expressions and their range windows are left as written.
- :func:`panel_queries`  every query of every panel of the Grafana dashboard, its template
                         variables substituted as Grafana would.
- :class:`AlertLog`      when each alert (name + labels) was first seen pending, firing and
                         gone, polled from ``/api/v1/alerts``; waits with bounds.
- :class:`PacedFeed`     feature events per model at fixed rates, one producer in a thread,
                         with the count sent per second kept for rate checks.
- :class:`DeskClient`    a person at the label desk (``desk.auth = "proxy"``): next, answer,
                         skip over the desk's JSON API; :class:`DeskShift` one at work.
- :class:`DeskRun`      ``python -m service desk`` as a subprocess, stopped by PID.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from aiokafka import AIOKafkaProducer

from service.localkafka import find_free_ports
from service.localprom import LocalPrometheus, duration

from . import HarnessError
from .data import truth
from .workers import REPO, Deployment, http

__all__ = [
    "DASHBOARD",
    "RULES",
    "AlertLog",
    "DeskClient",
    "DeskRun",
    "DeskShift",
    "PacedFeed",
    "PanelQuery",
    "fast_rules",
    "panel_queries",
    "rule_names",
]

RULES = REPO / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "abstain-dashboard.json"


def rule_names() -> list[str]:
    """Every alert in ``alerts.yml``, in file order."""
    doc = yaml.safe_load(RULES.read_text())
    return [r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r]


def fast_rules(dst: Path, *, hold: float, replace: Mapping[str, Mapping[str, str]]) -> Path:
    """Write ``alerts.yml`` to ``dst`` with each ``for:`` set to ``hold`` seconds and, per
    alert, each text of ``replace[alert]`` (old -> new) replaced in its expression; an old
    text that is not in the expression exactly once is an error (the rules moved on)."""
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = duration(hold)
            for old, new in replace.get(rule.get("alert", ""), {}).items():
                if rule["expr"].count(old) != 1:
                    raise HarnessError(f"{rule['alert']}: {old!r} not once in {rule['expr']!r}")
                rule["expr"] = rule["expr"].replace(old, new)
    dst.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dst


@dataclass(frozen=True, slots=True)
class PanelQuery:
    """One query of one dashboard panel, variables substituted."""

    panel: str
    ref: str
    expr: str
    unit: str


def panel_queries(rate_interval: str, model: str = ".*") -> list[PanelQuery]:
    """Every panel query of the dashboard with ``$model`` (a regex, "All" = ``.*``) and
    ``$__rate_interval`` substituted."""
    board = json.loads(DASHBOARD.read_text())
    out = []
    for panel in board["panels"]:
        for t in panel.get("targets", []):
            expr = t["expr"].replace("$__rate_interval", rate_interval).replace("$model", model)
            unit = panel["fieldConfig"]["defaults"].get("unit", "short")
            out.append(PanelQuery(panel["title"], t["refId"], expr, unit))
    return out


def _key(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


@dataclass
class AlertLog:
    """What ``/api/v1/alerts`` showed over time: per (alert name, its labels), the first
    time each state was seen and the last time it was seen at all."""

    prom: LocalPrometheus
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, float]] = field(
        default_factory=dict
    )

    def poll(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        alerts = self.prom.alerts()
        for a in alerts:
            labels = dict(a["labels"])
            times = self.seen.setdefault((labels.pop("alertname"), _key(labels)), {})
            times.setdefault(a["state"], now)
            times["last"] = now
        return alerts

    def active(self, name: str, match: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        """Active alerts called ``name`` whose labels include ``match``."""
        want = dict(match or {})
        return [
            a
            for a in self.poll()
            if a["labels"]["alertname"] == name
            and all(a["labels"].get(k) == v for k, v in want.items())
        ]

    def wait_firing(
        self, name: str, match: Mapping[str, str] | None = None, *, timeout: float
    ) -> dict[str, Any]:
        """The first firing alert ``name`` (labels include ``match``); HarnessError naming
        what was active after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            firing = [a for a in self.active(name, match) if a["state"] == "firing"]
            if firing:
                return firing[0]
            if time.monotonic() > deadline:
                active = [(a["labels"], a["state"]) for a in self.poll()]
                raise HarnessError(
                    f"{name} {match or ''} not firing after {timeout:.0f}s; active: {active}"
                )
            time.sleep(0.5)

    def wait_fired(
        self, name: str, match: Mapping[str, str] | None = None, *, timeout: float
    ) -> None:
        """Wait until alert ``name`` (labels include ``match``) is firing or has fired since
        Prometheus started (its ``ALERTS`` series): for an alert whose condition comes and
        goes, such as a collapse that ends when rho settles. HarnessError after ``timeout`` s."""
        want = {"alertname": name, "alertstate": "firing", **dict(match or {})}
        selector = ",".join(f'{k}="{v}"' for k, v in sorted(want.items()))
        deadline = time.monotonic() + timeout
        while True:
            if [a for a in self.active(name, match) if a["state"] == "firing"]:
                return
            if self.prom.query(f"max_over_time(ALERTS{{{selector}}}[1h])"):
                return
            if time.monotonic() > deadline:
                active = [(a["labels"], a["state"]) for a in self.poll()]
                raise HarnessError(
                    f"{name} {match or ''} has not fired in {timeout:.0f}s; active: {active}"
                )
            time.sleep(0.5)

    def wait_resolved(
        self, name: str, match: Mapping[str, str] | None = None, *, timeout: float
    ) -> float:
        """Seconds until no alert ``name`` (labels include ``match``) is active."""
        began = time.monotonic()
        while self.active(name, match):
            if time.monotonic() - began > timeout:
                raise HarnessError(f"{name} {match or ''} still active after {timeout:.0f}s")
            time.sleep(0.5)
        return time.monotonic() - began

    def fired(self) -> set[str]:
        """Names of the alerts seen firing so far."""
        return {name for (name, _), times in self.seen.items() if "firing" in times}


class PacedFeed(threading.Thread):
    """Feature events for each model at ``rates[model]`` events/s (ids ``<model>-<i>``),
    sent every ``tick`` s by one producer; ``truth`` maps each id to its label (the fixed
    linear rule, or a coin for the models in ``noise``); a model's features are multiplied
    by ``scale[model]`` (default 1); ``sent_log`` keeps
    ``(time.time(), model, count)`` per tick."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        rates: Mapping[str, float],
        *,
        noise: frozenset[str] = frozenset(),
        scale: Mapping[str, float] | None = None,
        tick: float = 0.1,
        seed: int = 0,
    ) -> None:
        super().__init__(name="prom-feed", daemon=True)
        self.bootstrap, self.topic, self.rates = bootstrap, topic, dict(rates)
        self.noise, self.scale, self.tick = noise, dict(scale or {}), tick
        self.rng = np.random.default_rng(seed)
        self.truth: dict[str, int] = {}
        self.sent = dict.fromkeys(self.rates, 0)
        self.sent_log: list[tuple[float, str, int]] = []
        self.lock = threading.Lock()
        self.error: BaseException | None = None
        self.began = math.inf  # time.time() of the first tick
        self._halt = threading.Event()
        self._held = threading.Event()
        self._started = threading.Event()

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - handed to the test by check()
            self.error = exc
            self._started.set()

    def _event(self, model: str, i: int) -> tuple[bytes, bytes]:
        eid = f"{model}-{i}"
        x = (self.rng.normal(size=3).round(4) * self.scale.get(model, 1.0)).tolist()
        label = int(self.rng.choice((-1, 1))) if model in self.noise else truth(x)
        with self.lock:
            self.truth[eid] = label
        event = {"id": eid, "model": model, "features": x, "ts": time.time()}
        return eid.encode(), json.dumps(event).encode()

    async def _main(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
        await producer.start()
        self.began = time.time()
        self._started.set()
        owed = dict.fromkeys(self.rates, 0.0)
        last = time.monotonic()
        try:
            while not self._halt.is_set():
                await asyncio.sleep(self.tick)
                now = time.monotonic()
                if self._held.is_set():  # held: nothing owed for the time held
                    last = now
                    continue
                futures = []
                for model, rate in self.rates.items():
                    owed[model] += rate * (now - last)
                    due = int(owed[model])
                    owed[model] -= due
                    for i in range(self.sent[model], self.sent[model] + due):
                        key, value = self._event(model, i)
                        futures.append(await producer.send(self.topic, value, key=key))
                    self.sent[model] += due
                    with self.lock:
                        self.sent_log.append((time.time(), model, due))
                last = now
                await asyncio.gather(*futures)
        finally:
            await producer.stop()

    def hold(self) -> None:
        """Send nothing until :meth:`go` (and nothing owed for the time held)."""
        self._held.set()

    def go(self) -> None:
        self._held.clear()

    def begin(self) -> PacedFeed:
        self.start()
        self._started.wait(60)
        self.check()
        return self

    def check(self) -> None:
        if self.error is not None:
            raise HarnessError(f"the feed failed: {self.error!r}") from self.error

    def rate(self, model: str, since: float, until: float) -> float:
        """Events/s sent for ``model`` between two ``time.time()`` stamps."""
        with self.lock:
            n = sum(c for t, m, c in self.sent_log if m == model and since < t <= until)
        return n / (until - since)

    def halt(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(30)


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class DeskRun:
    """``python -m service desk`` for a deployment on a free port, stopped by PID."""

    proc: subprocess.Popen[bytes]
    port: int

    @classmethod
    def start(cls, dep: Deployment, log: Path) -> DeskRun:
        port = find_free_ports(1)[0]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
        cmd = [
            sys.executable,
            "-m",
            "service",
            "desk",
            "--config",
            str(dep.write_config()),
            "--broker",
            dep.bootstrap,
            "--port",
            str(port),
        ]
        with log.open("ab") as out:
            proc = subprocess.Popen(  # noqa: S603 - fixed argv
                cmd, cwd=REPO, env=env, stdout=out, stderr=out, preexec_fn=_die_with_parent
            )
        return cls(proc, port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise HarnessError(f"the desk exited {self.proc.returncode}")
        try:
            return http(self.url + "/readyz")[0] == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class DeskClient:
    """One person at a desk behind an authenticating proxy (``desk.auth = "proxy"``): the
    name travels in ``header``; the first page view starts a session (cookie + CSRF token)."""

    def __init__(self, url: str, name: str, header: str = "X-Forwarded-User") -> None:
        self.url, self.headers = url, {header: name}
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        page = self._call("GET", "/")[1].decode()
        found = re.search(r'<meta name="csrf-token" content="([^"]+)"', page)
        if found is None:
            raise HarnessError(f"no CSRF token on the desk's page: {page[:300]}")
        self.headers["X-CSRF-Token"] = found.group(1)

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.headers, "Content-Type": "application/json"}
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)  # noqa: S310
        try:
            with self.opener.open(req, timeout=15) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), bytes(exc.read())

    def api(self, action: str, **body: Any) -> tuple[int, dict[str, Any]]:
        status, raw = self._call("POST", f"/api/{action}", body)
        return status, dict(json.loads(raw or b"{}"))


class DeskShift(threading.Thread):
    """A person working at the desk on ``model`` until :meth:`halt`: takes the next request
    every ``every`` s and answers it (+1 / -1 in turn), except every 5th (skipped), every 7th
    (can't tell); every 6th answer is sent twice (the second is refused). A second opinion
    the desk offers (an answered request, offered first) gets one. ``done`` counts
    what happened by outcome (HTTP status of each call, by action)."""

    def __init__(self, client: DeskClient, model: str, *, every: float = 1.0) -> None:
        super().__init__(name="prom-desk-shift", daemon=True)
        self.client, self.model, self.every = client, model, every
        self.done: dict[str, int] = {}
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def _count(self, what: str) -> None:
        self.done[what] = self.done.get(what, 0) + 1

    def run(self) -> None:
        n = 0
        try:
            while not self._halt.wait(self.every):
                try:
                    status, body = self.client.api("next", model=self.model)
                    req = body.get("request") if status == 200 else None
                    if req and req.get("second_opinion"):  # an answered request, again
                        label = 1 if n % 2 else -1
                        reply = self.client.api(
                            "opinion", request_id=req["request_id"], label=label
                        )
                        self._count(f"opinion {self._outcome(reply)}")
                    elif req:
                        n += 1
                        self._work(n, req["request_id"])
                except OSError:  # the desk is down (a fault test): the person waits
                    self._count("unreachable")
        except BaseException as exc:  # noqa: BLE001 - handed to the test by halt()
            self.error = exc

    @staticmethod
    def _outcome(reply: tuple[int, dict[str, Any]]) -> str:
        """The status, with the desk's code of a refusal (``409 already_answered``)."""
        status, body = reply
        return f"{status}" if status == 200 else f"{status} {body.get('error', '?')}"

    def _work(self, n: int, rid: str) -> None:
        if n % 5 == 0 or n % 7 == 0:
            why = "skip" if n % 5 == 0 else "cant_tell"
            self._count(f"{why} {self._outcome(self.client.api('skip', request_id=rid, why=why))}")
            return
        label = 1 if n % 2 else -1
        reply = self.client.api("answer", request_id=rid, label=label)
        self._count(f"answer {self._outcome(reply)}")
        if n % 6 == 0:
            again = self.client.api("answer", request_id=rid, label=label)[0]
            self._count(f"answer again {again}")

    def halt(self) -> dict[str, int]:
        self._halt.set()
        if self.is_alive():
            self.join(30)
        if self.error is not None:
            raise HarnessError(f"the desk shift failed: {self.error!r}") from self.error
        return dict(self.done)


class Corrector(threading.Thread):
    """A reviewer who, every ``every`` s until :meth:`halt`, corrects the label of the most
    recent request of ``model`` the observer answered (to the other answer), straight on the
    labels topic: the learner's corrections, as the dashboard's "Corrections" row charts them
    (``corrected`` counts the records written)."""

    def __init__(
        self, bootstrap: str, topic: str, observer: Any, model: str, *, every: float = 2.0
    ) -> None:
        super().__init__(name="prom-corrector", daemon=True)
        self.bootstrap, self.topic, self.observer = bootstrap, topic, observer
        self.model, self.every = model, every
        self.corrected = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._done: set[str] = set()

    def _pick(self) -> tuple[str, int] | None:
        with self.observer.lock:
            answered = list(self.observer.answered.items())
            requests = dict(self.observer.requests)
        mine = [
            (rid, label)
            for rid, label in answered
            if requests.get(rid, {}).get("model") == self.model
        ]
        for rid, label in reversed(mine[:-5]):  # learned by now: not the newest answers
            if rid not in self._done:
                return rid, label
        return None

    def run(self) -> None:
        async def main() -> None:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
            await producer.start()
            try:
                while not self._halt.wait(self.every):
                    target = self._pick()
                    if target is None:
                        continue
                    rid, label = target
                    self._done.add(rid)
                    body = {
                        "kind": "correction",
                        "request_id": rid,
                        "model": self.model,
                        "label": -label,
                        "labelled_by": "rita",
                        "role": "reviewer",
                        "ts": time.time(),
                    }
                    await producer.send_and_wait(
                        self.topic, json.dumps(body).encode(), key=self.model.encode()
                    )
                    self.corrected += 1
            finally:
                await producer.stop()

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - handed to the test by halt()
            self.error = exc

    def halt(self) -> int:
        self._halt.set()
        if self.is_alive():
            self.join(30)
        if self.error is not None:
            raise HarnessError(f"the corrector failed: {self.error!r}") from self.error
        return self.corrected
