"""``abstain demo``: the whole loop on one machine, in one command.

1. starts a local single-node Kafka (:mod:`service.localkafka`) unless ``--broker`` is given;
2. starts a stream worker as a subprocess (``python -m service worker``) on fresh topics;
3. starts the label desk (``python -m service desk``, docs/operate/desk.md) on
   ``--desk-port`` with a users file in the demo's directory: one user, ``demo``, whose
   random password is printed once (``--no-desk``: no desk);
4. streams a dataset (default: Phishing, LIBSVM, labels 0 -> -1, its 68 one-hot columns
   named after the UCI attributes) as feature events at ``--rate`` events/s (20), until
   Ctrl-C (``--events N``: N of them);
5. runs a simulated labeller, the *oracle*: a stand-in for operations staff that answers each
   label request with the dataset's true label after ``--label-delay`` seconds, except the
   requests a person at the desk has claimed and a share it leaves to people
   (``--left-to-you``, a quarter: answered by the oracle only if nobody did within
   ``--leave-seconds``; see ``--help``);
6. prints one line per second: events/s, decisions (predict / reject), labels asked /
   applied, model version, the worker's importance-weighted risk estimate with its 95 %
   interval (or "not enough labels yet" before :data:`MIN_LABELS`) and, because the demo
   knows every true label, the true 0-d-1 risk of the decisions served so far;
7. with ``--prometheus``, starts Debian's ``prometheus`` on 127.0.0.1 (a free port) scraping
   the worker and the desk with the project's alert rules, and prints its URL, so the
   dashboard's queries can be tried on the graph page (:mod:`service.localprom`).

Ctrl-C, or the end of a bounded run, stops every process the demo started, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from service.config import Settings, Topics, load_settings
from service.datasets import feature_names, load_dataset, resolve_dataset_path
from service.desk.leases import LeaseBook, LeaseRecord, parse_lease_record
from service.localprom import LocalPrometheus, PrometheusError
from service.processes import parent_death_signal, stop_process
from service.records import BadMessage
from service.records import coin as coin_of

if TYPE_CHECKING:
    from service.stream.kafka.clients import Client

__all__ = ["main"]

_EPILOG = """\
the label desk and the simulated labeller:
  The desk shows one open label request at a time to whoever logs in (user demo, the password
  printed at start). The simulated labeller takes part in the desk's own protocol: before it
  answers a request it claims it on the desk's leases topic, like a desk replica, and the
  first claim in the topic's order wins. So a request a person has claimed is left to that
  person (the labeller looks again every --label-delay seconds, and answers it only if the
  person gives it back or leaves it), and a request the labeller has claimed is not handed
  to a person. This was chosen over a head start (the labeller waiting longer) because a
  head start still races: the desk hands out the most urgent request, often the very one the
  labeller is about to answer, and the person would then read "already answered".
  The labeller leaves a share of the requests (--left-to-you, a quarter) to people: it
  answers one of those only if nobody did within --leave-seconds (40), so there is always
  something to answer at the desk and nothing expires. Your answers teach the model like
  the labeller's (the demo cannot tell if they are right; the true risk it prints counts
  the decisions, not your labels). The demo runs until Ctrl-C; a bounded run (--events N)
  ends soon after its last event.
"""


@dataclass
class Tally:
    """What the demo has seen so far."""

    sent: int = 0
    predict: int = 0
    reject: int = 0
    asked: int = 0
    answered: int = 0
    people: int = 0  # requests answered by people at the desk
    loss: float = 0.0  # true 0-d-1 loss of served decisions
    started: float = field(default_factory=time.monotonic)


ORACLE = "oracle"  # the simulated labeller's name: labelled_by, and its lease records
ORACLE_LEASE_SECONDS = 30.0
#: labels applied before the live line prints the model's risk estimate
MIN_LABELS = 30


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="abstain demo",
        description=__doc__.splitlines()[0],
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--broker", help="use this Kafka (host:port) instead of starting one")
    p.add_argument(
        "--dataset",
        default="phishing",
        help="name under the data dir (phishing also ships with the package), or a path",
    )
    p.add_argument("--format", choices=["libsvm", "csv"], default=None)
    p.add_argument("--rate", type=float, default=20.0, help="events per second")
    p.add_argument("--events", type=int, default=0, help="how many (0 = until Ctrl-C)")
    p.add_argument("--label-delay", type=float, default=1.0, help="oracle answer delay, s")
    p.add_argument(
        "--left-to-you",
        type=_share,
        default=0.25,
        help="share of the label requests the oracle leaves to people at the desk (0 to 1)",
    )
    p.add_argument(
        "--leave-seconds",
        type=float,
        default=40.0,
        help="after this long the oracle answers a request left to people that nobody answered",
    )
    p.add_argument("--algorithm", default="dsal", help="dral, dsal, dsol, kernel-...")
    p.add_argument("--cost", type=float, default=0.25, help="reject cost d in (0, 0.5)")
    p.add_argument("--web-port", type=int, default=6066)
    p.add_argument("--desk-port", type=int, default=6070, help="the label desk's HTTP port")
    p.add_argument(
        "--no-desk", dest="desk", action="store_false", help="do not start the label desk"
    )
    p.add_argument(
        "--prometheus",
        action="store_true",
        help="also start Debian's prometheus on 127.0.0.1 (a free port, printed) scraping the "
        "worker and the desk every 5 s with the project's alert rules",
    )
    p.add_argument("--seed", type=int, default=0, help="shuffles the dataset")
    p.add_argument("--workdir", type=Path, default=None, help="logs and scratch (default tmp)")
    return p


def _share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share is between 0 and 1, got {text}")
    return value


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM stops the demo as Ctrl-C does: everything it started


def main(argv: list[str]) -> int:
    """Run the demo; returns the exit code."""
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    if isinstance(sys.stdout, io.TextIOWrapper):
        # the URLs and the login reach a pipe (`make run | tee`) or a file when printed
        sys.stdout.reconfigure(line_buffering=True)
    X, y = load_dataset(resolve_dataset_path(args.dataset), format=args.format)
    order = np.random.default_rng(args.seed).permutation(len(y))
    X, y = X[order], y[order]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="abstain-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:6]
    kafka: Any = None
    worker: subprocess.Popen[bytes] | None = None
    desk: subprocess.Popen[bytes] | None = None
    prom: LocalPrometheus | None = None
    try:
        broker = args.broker
        if broker is None:
            kafka = _start_kafka(workdir)
            broker = kafka.bootstrap
        names = feature_names(args.dataset, X.shape[1])
        config = _config(args, run, X.shape[1], workdir, names)
        settings = load_settings(workdir / "demo.json", broker=broker)
        worker = _start_worker(workdir, broker, args.web_port)
        print(
            f"worker pid {worker.pid}, http://127.0.0.1:{args.web_port}/labels  "
            f"(logs: {workdir}/worker.log)"
        )
        print(f"label token for this run: {config['label_token']}")
        password = None
        if args.desk:
            password = secrets.token_urlsafe(12)
            desk = _start_desk(workdir, broker, args.desk_port, password)
        _wait_ready(worker, args.web_port, workdir)
        if desk is not None:
            _wait_ready(desk, args.desk_port, workdir, name="desk")
            print(f"label desk pid {desk.pid}  (logs: {workdir}/desk.log)")
            print(
                f"\n  open the label desk at http://127.0.0.1:{args.desk_port}/ and sign in "
                f"as {DESK_USER}, password {password}\n  (1 / 2 answer, U undoes, S skips; "
                f"a quarter of the requests are left to you)\n"
            )
        if args.prometheus:
            prom = start_prometheus(workdir, args.web_port, args.desk_port if desk else None)
        print(_intro(args, config, X.shape, named=bool(names), desk=desk is not None))
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(DemoStream(settings, args, X, y, run).run())
        return 0
    finally:
        if prom is not None:
            prom.stop()
        for proc, grace in ((desk, 15), (worker, 30)):
            if proc is not None:
                stop_process(proc, grace)
        if kafka is not None:
            kafka.stop()
        print("stopped everything the demo started")


def _start_kafka(workdir: Path) -> Any:
    """A local single-node Kafka under ``workdir``, started (it dies with the demo)."""
    from service.localkafka import LocalKafka, find_free_ports  # noqa: PLC0415

    port, controller = find_free_ports(2)
    kafka = LocalKafka(
        port=port, controller_port=controller, data_dir=workdir / "kafka", die_with_parent=True
    )
    print(f"starting Kafka on 127.0.0.1:{port} (first run downloads the jars) ...")
    kafka.start()
    return kafka


def _intro(
    args: argparse.Namespace,
    config: dict[str, Any],
    shape: tuple[int, ...],
    *,
    named: bool,
    desk: bool,
) -> str:
    """The line that says what the demo streams, and who answers."""
    rows, width = shape
    return (
        f"model {config['models']['default']['algorithm']} d={args.cost} on "
        f"{args.dataset}: {rows} rows x {width} {'named' if named else 'unnamed'} features, "
        f"{args.rate:g} events/s; oracle answers after {args.label_delay:g}s (a stand-in "
        "for operations staff)"
        + ("; it leaves requests claimed at the desk to whoever claimed them" if desk else "")
        + ("; Ctrl-C stops everything" if not args.events else "")
    )


RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "alerts.yml"
PROMETHEUS_INTERVAL = 5.0  # s, scrape and rule evaluation


def start_prometheus(workdir: Path, web_port: int, desk_port: int | None) -> LocalPrometheus:
    """A local Prometheus scraping the worker (job ``abstain``) and the desk (job
    ``abstain-desk``) with the alert rules of a source checkout; its URL printed."""
    rules = [RULES] if RULES.exists() else []
    prom = LocalPrometheus(
        workdir / "prometheus", scrape_interval=PROMETHEUS_INTERVAL, rule_files=rules
    )
    prom.set_targets("abstain", {"worker-0": f"127.0.0.1:{web_port}"})
    if desk_port is not None:
        prom.set_targets("abstain-desk", {"desk-0": f"127.0.0.1:{desk_port}"})
    try:
        prom.start()
    except PrometheusError as exc:
        raise SystemExit(f"--prometheus: {exc}") from exc
    assert prom.proc is not None  # noqa: S101 - started
    print(
        f"prometheus pid {prom.proc.pid}, {prom.page('graph')}  (every "
        f"{PROMETHEUS_INTERVAL:g} s; alerts: {prom.page('alerts')}; logs: {prom.log}); try "
        "sum by (model) (rate(abstain_events_total[1m]))"
    )
    return prom


def _config(
    args: argparse.Namespace,
    run: str,
    n_features: int,
    workdir: Path,
    names: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    width: dict[str, Any] = {"feature_names": list(names)} if names else {"n_features": n_features}
    config: dict[str, Any] = {
        "app_id": f"abstain-demo-{run}",
        "datadir": str(workdir / "worker"),
        "topics": Topics.prefixed(f"demo-{run}"),
        "partitions": {"features": 4, "decisions": 4, "labels": 1},
        "label_token": secrets.token_urlsafe(24),  # a new one each run (printed at start)
        # signed snapshots, champions records and rollback orders, as in production (the
        # chart's default): a key for this run, in the config file only (mode 0600)
        "snapshot_key": secrets.token_urlsafe(32),
        # long enough for a request left to people to be answered by the oracle after all
        "request_ttl_seconds": max(
            120.0, 10 * args.label_delay, getattr(args, "leave_seconds", 0.0) + 60.0
        ),
        "session_timeout_seconds": 10,
        "models": {
            # the demo's labeller costs nothing: a 5 % uniform audit (the production default
            # is 1 %) caps a label's importance weight at 20, not 100, so the risk
            # estimate's interval is tight enough to follow the true risk line by line
            "default": {"algorithm": args.algorithm, "cost": args.cost, "audit_rate": 0.05, **width}
        },
        "desk": {
            # Phishing's +1 is a legitimate site, -1 a phishing one (UCI's Result)
            **({"answer_names": {"default": ["legitimate", "phishing"]}} if names else {}),
            "leases_topic": f"demo-{run}.desk-leases",
            "revocations_topic": f"demo-{run}.desk-revocations",
            "session_key": secrets.token_urlsafe(32),  # this run only, like the label token
            # the newcomer answers requests first: second opinions on the labeller's
            # answers come first only once they have given five answers of their own
            "second_opinions": {"after_answers": NEWCOMER_ANSWERS},
        },
        "log_level": "warning",
    }
    path = workdir / "demo.json"
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return config


DESK_USER = "demo"
#: first answers the demo's person gives before second opinions come first
NEWCOMER_ANSWERS = 5


def write_users(path: Path, password: str) -> None:
    """A desk users file with one account, ``demo``, holding ``password`` (scrypt-hashed)."""
    from service.desk.auth.passwords import hash_password  # noqa: PLC0415

    path.write_text(f'[users.{DESK_USER}]\npassword = "{hash_password(password)}"\n')
    path.chmod(0o600)


def _start_desk(workdir: Path, broker: str, port: int, password: str) -> subprocess.Popen[bytes]:
    users = workdir / "desk-users.toml"
    write_users(users, password)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    cmd = [
        sys.executable,
        "-m",
        "service",
        "desk",
        "--config",
        str(workdir / "demo.json"),
        "--broker",
        broker,
        "--port",
        str(port),
        "--users",
        str(users),
    ]
    with (workdir / "desk.log").open("wb") as log:
        return subprocess.Popen(  # noqa: S603
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=parent_death_signal(signal.SIGTERM),
        )


def _start_worker(workdir: Path, broker: str, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ABSTAIN_")}
    cmd = [
        sys.executable,
        "-m",
        "service",
        "worker",
        "--config",
        str(workdir / "demo.json"),
        "--broker",
        broker,
        "--web-port",
        str(port),
    ]
    with (workdir / "worker.log").open("wb") as log:
        return subprocess.Popen(  # noqa: S603
            cmd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=parent_death_signal(signal.SIGTERM),
        )


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - local URL
        return bytes(resp.read())


def _wait_ready(
    proc: subprocess.Popen[bytes], port: int, workdir: Path, name: str = "worker"
) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited ({proc.returncode}); see {workdir}/{name}.log")
        with contextlib.suppress(OSError, ValueError):
            if json.loads(_get(f"http://127.0.0.1:{port}/readyz")).get("ready"):
                return
        time.sleep(0.3)
    raise SystemExit(f"{name} not ready after 120 s; see {workdir}/{name}.log")


def _metrics(port: int) -> dict[str, float]:
    out: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for line in _get(f"http://127.0.0.1:{port}/metrics").decode().splitlines():
            if line.startswith("abstain_") and 'model="default"' in line:
                name, _, value = line.rpartition(" ")
                out[name.split("{")[0]] = float(value)
    return out


def estimate(metrics: dict[str, float]) -> str:
    """The model's risk estimate as a person reads it: the importance-weighted estimate and
    its 95 % interval, once :data:`MIN_LABELS` labels are applied; before, how many are.

    >>> estimate({"abstain_labels_applied_total": 12.0})
    'risk est: not enough labels yet, 12 of 30'
    >>> estimate({"abstain_labels_applied_total": 40.0, "abstain_risk_estimate": 0.1034,
    ...           "abstain_risk_estimate_low": 0.08, "abstain_risk_estimate_high": 0.131})
    'risk est 0.103 [0.080, 0.131]'
    """
    applied = int(metrics.get("abstain_labels_applied_total", 0.0))
    if applied < MIN_LABELS:
        return f"risk est: not enough labels yet, {applied} of {MIN_LABELS}"
    nan = float("nan")
    est, low, high = (metrics.get(f"abstain_risk_estimate{s}", nan) for s in ("", "_low", "_high"))
    return f"risk est {est:.3f} [{low:.3f}, {high:.3f}]"


def live_line(tally: Tally, now: float, rate: float, metrics: dict[str, float]) -> str:
    """The once-a-second status line, from the tally, the worker's metrics and the send rate
    (the true risk shows ``nan`` until a decision has been seen)."""
    decided = tally.predict + tally.reject
    applied = metrics.get("abstain_labels_applied_total", 0.0)
    true_risk = tally.loss / decided if decided else float("nan")
    return (
        f"[{now - tally.started:6.0f}s] {rate:6.0f} ev/s  sent {tally.sent:6d}  "
        f"decided {tally.predict:6d} predict / {tally.reject:6d} reject  "
        f"labels asked {tally.asked:5d} applied "
        f"{applied:5.0f}  "
        f"model v{metrics.get('abstain_model_version', 0):.0f}  "
        f"{estimate(metrics)} "
        f"(true {true_risk:.3f})"
        + (f"  answered at the desk {tally.people}" if tally.people else "")
    )


def done_line(tally: Tally, metrics: dict[str, float] | None = None) -> str:
    """The summary printed once the stream has ended (with the model's estimate when the
    worker's ``metrics`` are given)."""
    decided = tally.predict + tally.reject
    people = f" (and {tally.people} by people at the desk)" if tally.people else ""
    model = "" if metrics is None else f"; the model's {estimate(metrics)}"
    return (
        f"done: {tally.sent} events, {decided} decisions "
        f"({tally.reject} rejected), {tally.answered} labels given{people}; true 0-d-1 "
        f"risk {tally.loss / max(1, decided):.3f}{model}"
    )


class DemoStream:
    """Streams ``X`` as feature events, scores the decisions against ``y``, answers the label
    requests as the oracle, and reports once a second; :meth:`run` drives it all.

    With the desk (``args.desk``) the oracle follows the desk's leases topic through the
    desk's own fold (:class:`~service.desk.leases.LeaseBook`) and claims each request there
    before it answers: a request a person holds is left to them (looked at again every
    ``label_delay`` seconds), one a person answered is counted as theirs."""

    def __init__(
        self, settings: Settings, args: argparse.Namespace, X: np.ndarray, y: np.ndarray, run: str
    ) -> None:
        self.settings = settings
        self.args = args
        self.X = X
        self.y = y
        self.run_id = run
        self.tally = Tally()
        self.desk = bool(getattr(args, "desk", False))
        # decisions / label requests (/ the desk's leases) followed
        self.ready = [asyncio.Event() for _ in range(3 if self.desk else 2)]
        self.pending: set[asyncio.Task[None]] = set()  # oracle answers being sent
        # the desk's leases topic, folded as the desk folds it
        self.leases = LeaseBook(lease_seconds=settings.desk.lease_seconds)
        self.claims: dict[tuple[str, float], asyncio.Future[bool]] = {}  # the oracle's, unfolded
        self.by_people: set[str] = set()
        self._client: Client | None = None

    @property
    def client(self) -> Client:
        if self._client is None:
            raise RuntimeError("DemoStream.client is only available inside run()")
        return self._client

    def row(self, event_id: str) -> int:
        """The dataset row behind ``event_id`` (``<run>-<i>``)."""
        return int(event_id.rsplit("-", 1)[1]) % len(self.y)

    def record_decision(self, decision: dict[str, Any]) -> None:
        """Count one served decision and its true 0-d-1 loss."""
        truth = int(self.y[self.row(decision["id"])])
        if decision["action"] == "reject":
            self.tally.reject += 1
            self.tally.loss += self.args.cost
        else:
            self.tally.predict += 1
            self.tally.loss += 0.0 if decision["label"] == truth else 1.0

    async def watch_decisions(self) -> None:
        topic = self.settings.topics.decisions
        async for rec in self.client.follow([topic], positioned=self.ready[0]):
            self.record_decision(json.loads(rec.value))

    async def oracle(self) -> None:
        topic = self.settings.topics.label_requests
        async for rec in self.client.follow([topic], positioned=self.ready[1]):
            req = json.loads(rec.value)
            self.tally.asked += 1
            delay = self.args.leave_seconds if self.left_to_people(req) else self.args.label_delay
            asyncio.get_running_loop().call_later(delay, self.schedule, req)

    def left_to_people(self, req: dict[str, Any]) -> bool:
        """True for the share of requests (``--left-to-you``) the oracle leaves to people at
        the desk: chosen by a hash coin of the request id (the same in every run)."""
        share = float(getattr(self.args, "left_to_you", 0.0)) if self.desk else 0.0
        rid = str(req.get("request_id", ""))
        return share > 0 and coin_of("demo", rid, 0, purpose="left-to-people") < share

    def schedule(self, req: dict[str, Any]) -> None:
        if self._client is None:  # stopping (a timer that fired after the end): no answer
            return
        task = asyncio.ensure_future(self.answer(req))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def watch_leases(self) -> None:
        topic = self.settings.desk.leases_topic
        async for rec in self.client.follow([topic], from_beginning=True, positioned=self.ready[2]):
            self.on_lease(rec.offset, rec.value, timestamp_ms=rec.timestamp_ms)

    def on_lease(self, offset: int, raw: bytes | None, *, timestamp_ms: int | None = None) -> None:
        """Fold one record of the leases topic (at its Kafka time, as the desk does); settle
        the oracle's claim it may be."""
        try:
            record = None if raw is None else parse_lease_record(raw)
        except BadMessage:
            record = None
        at = None if timestamp_ms is None or timestamp_ms < 0 else timestamp_ms / 1000.0
        won = self.leases.apply(offset, record, at=at)
        if record is not None and record.holder == ORACLE:
            claim = self.claims.pop((record.request_id, record.at), None)
            if claim is not None and not claim.done():
                claim.set_result(won)

    async def claim(self, rid: str) -> bool:
        """Claim ``rid`` on the leases topic as the oracle; True once folded and won (the
        first claim in the topic's order wins, so the desk will not hand it to a person)."""
        now = time.time()
        record = LeaseRecord(
            rid, "claim", ORACLE, at=now, expires_at=now + ORACLE_LEASE_SECONDS, replica="demo"
        )
        won = asyncio.get_running_loop().create_future()
        self.claims[(rid, now)] = won
        await self.client.send(self.settings.desk.leases_topic, rid, record.to_json())
        await self.client.flush()
        try:
            return bool(await asyncio.wait_for(won, 10.0))
        except TimeoutError:
            self.claims.pop((rid, now), None)
            return True  # the leases topic is not being read: answer as without a desk

    async def leave_to_people(self, req: dict[str, Any]) -> bool:
        """True if a person at the desk has ``req``: answered (counted), or held (looked at
        again in ``label_delay`` seconds, until the request expires)."""
        rid = req["request_id"]
        if rid in self.leases.answers and self.leases.answers[rid].holder != ORACLE:
            if rid not in self.by_people:
                self.by_people.add(rid)
                self.tally.people += 1
            return True
        if await self.claim(rid):
            return False
        if rid in self.leases.answers:  # answered while the claim was on its way
            return await self.leave_to_people(req)
        if float(req.get("expires_at", 0.0)) > time.time():
            delay = max(0.5, self.args.label_delay)
            asyncio.get_running_loop().call_later(delay, self.schedule, req)
        return True

    async def answer(self, req: dict[str, Any]) -> None:
        if self.desk and await self.leave_to_people(req):
            return
        label = int(self.y[self.row(req["event_id"])])
        await self.client.send(
            self.settings.topics.labels,
            req["model"],
            {
                "request_id": req["request_id"],
                "model": req["model"],
                "label": label,
                "labelled_by": ORACLE,
                "ts": time.time(),
            },
        )
        self.tally.answered += 1

    async def feed(self) -> None:
        await asyncio.gather(*(e.wait() for e in self.ready))
        total = self.args.events if self.args.events > 0 else None
        interval = 1.0 / self.args.rate
        next_at = time.monotonic()
        i = 0
        while total is None or i < total:
            event_id = f"{self.run_id}-{i}"
            await self.client.send(
                self.settings.topics.features,
                event_id,
                {
                    "id": event_id,
                    "features": self.X[i % len(self.y)].tolist(),
                    "ts": time.time(),
                },
            )
            self.tally.sent += 1
            i += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await self.client.flush()

    async def report(self) -> None:
        last, last_t = 0, time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            rate = (self.tally.sent - last) / (now - last_t)
            last, last_t = self.tally.sent, now
            print(live_line(self.tally, now, rate, _metrics(self.args.web_port)), flush=True)

    async def drain(self) -> None:
        """Wait for the decisions on everything sent, then for the last labels to land."""
        tally = self.tally
        deadline = time.monotonic() + 30 + 2 * self.args.label_delay
        while tally.predict + tally.reject < tally.sent and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(self.args.label_delay + 1.5)  # let the last labels land

    async def run(self) -> None:
        from service.stream.kafka.clients import Client  # noqa: PLC0415 - keeps --help fast

        async with Client(self.settings) as client:
            self._client = client
            followers = [self.watch_decisions, self.oracle, self.report]
            if self.desk:
                followers.append(self.watch_leases)
            tasks = [asyncio.create_task(c()) for c in followers]
            try:
                await self.feed()
                await self.drain()
            finally:
                # the followers and the answers on their way stop before the client closes
                self._client = None
                stopping = [*tasks, *self.pending]
                for task in stopping:
                    task.cancel()
                await asyncio.gather(*stopping, return_exceptions=True)
                print(done_line(self.tally, _metrics(self.args.web_port)))
