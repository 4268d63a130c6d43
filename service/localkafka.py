"""A local single-node Apache Kafka broker (KRaft mode) for development and tests.

The broker's jars come from Maven Central through ``deploy/kafka/pom.xml`` (``mvn``
caches them in the local Maven repository), storage is formatted once per data directory,
and ``kafka.Kafka`` runs as a child process in its own process group, listening on
127.0.0.1 only. Its PID is kept in a state file inside the data directory, so any process
can ask for its status or stop it; the data survive a stop and a later start.

>>> kafka = LocalKafka(port=19092, data_dir=Path("/tmp/abstain-kafka-doc"))
>>> kafka.bootstrap, kafka.controller_port
('127.0.0.1:19092', 19093)

Command line (``python -m service kafka ...``)::

    start [--port 9092] [--data-dir var/kafka] [--partitions 1] [--foreground]
    stop | status [--data-dir var/kafka]
    fetch                      fetch the jars only

Exceptions::

    LocalKafkaError (RuntimeError)
     ├── FetchError       the jars could not be fetched (no mvn, or mvn failed)
     ├── StartError       the broker did not start, or did not answer in time
     └── StateFileError   the state file exists but cannot be read
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

__all__ = [
    "DEFAULT_DATA_DIR",
    "BrokerConfig",
    "BrokerState",
    "BrokerStatus",
    "FetchError",
    "LocalKafka",
    "LocalKafkaError",
    "StartError",
    "StateFileError",
    "find_free_ports",
    "main",
    "new_cluster_id",
    "pinned_kafka_version",
    "probe_metadata",
    "read_state",
    "render_server_properties",
    "write_state",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
POM_PATH = REPO_ROOT / "deploy" / "kafka" / "pom.xml"
LOG4J_PATH = REPO_ROOT / "deploy" / "kafka" / "log4j.properties"
DEFAULT_DATA_DIR = REPO_ROOT / "var" / "kafka"
DEFAULT_JARS_ROOT = REPO_ROOT / "var" / "kafka-jars"
HOST = "127.0.0.1"
STATE_FILE = "localkafka.json"
STORAGE_TOOL = "kafka.tools.StorageTool"
FETCH_TIMEOUT = 900.0  # seconds; a cold fetch of ~46 MB of jars
_HEAP_RE = re.compile(r"[1-9][0-9]*[kmgKMG]?")


class LocalKafkaError(RuntimeError):
    """Base of every error raised by this module."""


class FetchError(LocalKafkaError):
    """The broker's jars could not be fetched."""


class StartError(LocalKafkaError):
    """The broker did not start or did not answer in time."""


class StateFileError(LocalKafkaError):
    """A state file exists but cannot be read."""


def pinned_kafka_version(pom: Path = POM_PATH) -> str:
    """The Kafka version pinned in ``deploy/kafka/pom.xml`` (``<kafka.version>``)."""
    match = re.search(r"<kafka\.version>\s*([^<\s]+)\s*</kafka\.version>", pom.read_text())
    if match is None:
        raise FetchError(f"{pom} names no <kafka.version>")
    return match.group(1)


def new_cluster_id() -> str:
    """A random KRaft cluster id: 16 bytes, URL-safe base64 without padding.

    >>> cid = new_cluster_id()
    >>> len(cid), cid[0] != "-"
    (22, True)
    """
    while True:
        cid = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")
        if not cid.startswith("-"):  # a leading dash reads as an option on a command line
            return cid


def find_free_ports(count: int = 1, host: str = HOST) -> list[int]:
    """``count`` distinct TCP ports that were free on ``host`` a moment ago (bind port 0)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def port_is_free(port: int, host: str = HOST) -> bool:
    """Whether a server could listen on ``host:port`` now (as the broker does, connections
    of a previous run left in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """What ``server.properties`` is rendered from."""

    port: int = 9092
    controller_port: int = 9093
    num_partitions: int = 1
    host: str = HOST

    def __post_init__(self) -> None:
        for name in ("port", "controller_port"):
            value = getattr(self, name)
            if not 0 < value < 65536:
                raise ValueError(f"{name} must be in 1..65535, got {value}")
        if self.port == self.controller_port:
            raise ValueError(f"port and controller_port must differ, both are {self.port}")
        if self.num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {self.num_partitions}")


def render_server_properties(config: BrokerConfig, log_dir: Path) -> str:
    """A KRaft ``server.properties`` for one combined broker+controller node.

    >>> text = render_server_properties(BrokerConfig(port=9092), Path("/d/kraft"))
    >>> [line for line in text.splitlines() if line.startswith("listeners=")]
    ['listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093']
    """
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{config.host}:{config.controller_port}",
        "listeners": (
            f"PLAINTEXT://{config.host}:{config.port},"
            f"CONTROLLER://{config.host}:{config.controller_port}"
        ),
        "advertised.listeners": f"PLAINTEXT://{config.host}:{config.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": str(config.num_partitions),
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.threads": "1",
    }
    lines = ["# Written by service/localkafka.py; rewritten at every start."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class BrokerState:
    """What the state file records about a running broker."""

    pid: int
    port: int
    controller_port: int
    kafka_version: str
    started_at: float  # wall-clock seconds since the epoch, for people

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"


def write_state(path: Path, state: BrokerState) -> None:
    """Write ``state`` atomically (temp file + rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    os.replace(tmp, path)


def read_state(path: Path) -> BrokerState | None:
    """The state in ``path``; None when there is no state file."""
    try:
        raw = json.loads(path.read_text())
        return BrokerState(
            pid=int(raw["pid"]),
            port=int(raw["port"]),
            controller_port=int(raw["controller_port"]),
            kafka_version=str(raw["kafka_version"]),
            started_at=float(raw["started_at"]),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StateFileError(f"cannot read {path} ({exc}); delete it if no broker runs") from exc


def process_alive(pid: int, marker: str | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, if given, has ``marker`` in its command line."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return not proc.parent.joinpath("self").exists()  # no procfs: trust kill(0)
    except OSError:
        return True
    if stat[stat.rfind(")") + 2 :].startswith("Z"):
        return False
    return marker is None or marker in cmdline


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(remaining)
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def probe_metadata(host: str, port: int, timeout: float = 2.0) -> list[tuple[int, str, int]]:
    """Brokers (node id, host, port) named by a Metadata v4 request to ``host:port``.

    Raises OSError when nobody answers, ValueError on a malformed answer.
    """
    client_id = b"abstain-localkafka"
    correlation_id = 7
    request = struct.pack(">hhih", 3, 4, correlation_id, len(client_id)) + client_id
    request += struct.pack(">i?", 0, False)  # no topics, no auto-creation
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        if not 12 <= size <= 1 << 24:
            raise ValueError(f"implausible metadata response size {size}")
        payload = _recv_exact(sock, size)
    try:
        got_id, _throttle, n_brokers = struct.unpack_from(">iii", payload, 0)
        if got_id != correlation_id:
            raise ValueError(f"correlation id {got_id} != {correlation_id}")
        offset, brokers = 12, []
        for _ in range(n_brokers):
            node_id, host_len = struct.unpack_from(">ih", payload, offset)
            offset += 6
            node_host = payload[offset : offset + host_len].decode()
            offset += host_len
            node_port, rack_len = struct.unpack_from(">ih", payload, offset)
            offset += 6 + max(rack_len, 0)
            brokers.append((node_id, node_host, node_port))
    except struct.error as exc:
        raise ValueError(f"malformed metadata response: {exc}") from exc
    return brokers


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux SIGKILL the child when this process dies."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """What ``LocalKafka.status()`` reports."""

    running: bool
    answering: bool
    pid: int | None
    bootstrap: str | None
    kafka_version: str | None
    data_dir: Path

    def describe(self) -> str:
        if not self.running:
            return f"kafka: not running (data dir {self.data_dir})"
        health = "answering" if self.answering else "NOT answering"
        return (
            f"kafka {self.kafka_version}: running, {health}, pid {self.pid}, "
            f"bootstrap {self.bootstrap} (data dir {self.data_dir})"
        )


class LocalKafka:
    """One local Kafka broker in ``data_dir``; see the module docstring.

    ``die_with_parent=True`` makes the kernel kill the broker when the process that
    started it dies (Linux; only when ``start()`` runs on the main thread), for test
    sessions; the command line's ``start`` leaves the broker running on its own.
    """

    def __init__(
        self,
        *,
        port: int = 9092,
        controller_port: int | None = None,
        data_dir: Path = DEFAULT_DATA_DIR,
        jars_dir: Path | None = None,
        num_partitions: int = 1,
        heap: str = "512m",
        ready_timeout: float = 60.0,
        die_with_parent: bool = False,
        java: str = "java",
        mvn: str = "mvn",
    ) -> None:
        if not _HEAP_RE.fullmatch(heap):
            raise ValueError(f"heap must look like 512m or 1g, got {heap!r}")
        if ready_timeout <= 0:
            raise ValueError(f"ready_timeout must be > 0, got {ready_timeout}")
        self.config = BrokerConfig(
            port=port,
            controller_port=port + 1 if controller_port is None else controller_port,
            num_partitions=num_partitions,
        )
        self.data_dir = Path(data_dir).resolve()
        self.kafka_version = pinned_kafka_version()
        self.jars_dir = Path(jars_dir or DEFAULT_JARS_ROOT / self.kafka_version).resolve()
        self.heap = heap
        self.ready_timeout = ready_timeout
        self.die_with_parent = die_with_parent
        self.java = java
        self.mvn = mvn
        self._proc: subprocess.Popen[bytes] | None = None

    # paths -----------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self.config.port

    @property
    def controller_port(self) -> int:
        return self.config.controller_port

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.config.port}"

    @property
    def properties_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def state_path(self) -> Path:
        return self.data_dir / STATE_FILE

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def kraft_dir(self) -> Path:
        return self.data_dir / "kraft"

    # jars ------------------------------------------------------------------------------
    def jars_present(self) -> bool:
        return (self.jars_dir / f"kafka_2.13-{self.kafka_version}.jar").is_file()

    def fetch(self) -> Path:
        """Copy the broker's jars into ``jars_dir`` with mvn, unless they are there."""
        if self.jars_present():
            return self.jars_dir
        mvn = shutil.which(self.mvn)
        if mvn is None:
            raise FetchError(f"{self.mvn!r} not found on PATH; install Maven 3 (and Java 17)")
        tmp = self.jars_dir.with_name(f".{self.jars_dir.name}.{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _say(f"fetching Kafka {self.kafka_version} jars with mvn into {self.jars_dir} ...")
        began = time.monotonic()
        cmd = [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(POM_PATH)]
        cmd += ["dependency:copy-dependencies", f"-DoutputDirectory={tmp}"]
        try:
            done = subprocess.run(  # noqa: S603 - fixed argv, no shell
                cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FetchError(f"mvn did not finish in {FETCH_TIMEOUT:.0f} s: {exc.cmd}") from exc
        if done.returncode != 0 or not (tmp / f"kafka_2.13-{self.kafka_version}.jar").is_file():
            shutil.rmtree(tmp, ignore_errors=True)
            raise FetchError(
                f"mvn failed (exit {done.returncode}): {' '.join(cmd)}\n"
                f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        self.jars_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.rename(self.jars_dir)
        except OSError as exc:  # another process fetched them meanwhile, or a stray dir
            shutil.rmtree(tmp, ignore_errors=True)
            if not self.jars_present():
                raise FetchError(f"cannot fill {self.jars_dir} ({exc}); remove it") from exc
        _say(
            f"fetched {len(list(self.jars_dir.glob('*.jar')))} jars in "
            f"{time.monotonic() - began:.1f} s"
        )
        return self.jars_dir

    # lifecycle -------------------------------------------------------------------------
    def running_state(self) -> BrokerState | None:
        """The state of the broker running for ``data_dir``; drops a stale state file."""
        state = read_state(self.state_path)
        if state is None:
            return None
        if process_alive(state.pid, str(self.properties_path)):
            return state
        self.state_path.unlink(missing_ok=True)
        return None

    def start(self) -> bool:
        """Start the broker and wait until it answers; False if it already ran."""
        if self.running_state() is not None:
            return False
        self._reap()
        self.fetch()
        for name, port in (("port", self.port), ("controller port", self.controller_port)):
            if not port_is_free(port):
                raise StartError(f"{name} {HOST}:{port} is already in use")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.properties_path.write_text(render_server_properties(self.config, self.kraft_dir))
        if not (self.kraft_dir / "meta.properties").is_file():
            self._format_storage()
        cmd = [*self._java_prefix(self.heap), "kafka.Kafka", str(self.properties_path)]
        with open(self.log_dir / "stdout.log", "ab") as out:
            self._proc = subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=self._preexec(),
            )
        state = BrokerState(
            pid=self._proc.pid,
            port=self.port,
            controller_port=self.controller_port,
            kafka_version=self.kafka_version,
            started_at=time.time(),
        )
        write_state(self.state_path, state)
        self._wait_ready(self._proc)
        return True

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM the broker, SIGKILL it after ``timeout`` s; False if none ran."""
        state = self.running_state()
        if state is None:
            self._reap()
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.pid, signal.SIGCONT)  # a paused broker cannot act on SIGTERM
            os.kill(state.pid, signal.SIGTERM)
        if not self._wait_gone(state.pid, timeout):
            _say(f"kafka pid {state.pid} ignored SIGTERM for {timeout:.0f} s; SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(state.pid) == state.pid:
                    os.killpg(state.pid, signal.SIGKILL)
                else:
                    os.kill(state.pid, signal.SIGKILL)
            self._wait_gone(state.pid, 10.0)
        self._reap()
        self.state_path.unlink(missing_ok=True)
        return True

    def pause(self) -> None:
        """SIGSTOP the broker: connections stay open, nothing answers."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused broker."""
        self._signal(signal.SIGCONT)

    def status(self) -> BrokerStatus:
        state = self.running_state()
        if state is None:
            return BrokerStatus(False, False, None, None, None, self.data_dir)
        try:
            answering = bool(probe_metadata(HOST, state.port, timeout=1.0))
        except (OSError, ValueError):
            answering = False
        return BrokerStatus(
            True, answering, state.pid, state.bootstrap, state.kafka_version, self.data_dir
        )

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the broker's server log and console output."""
        parts = []
        for name in ("server.log", "stdout.log"):
            path = self.log_dir / name
            if path.is_file():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path} ---\n" + "\n".join(tail))
        return "\n".join(parts) or f"(no logs in {self.log_dir})"

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # internals -------------------------------------------------------------------------
    def _java_prefix(self, heap: str) -> list[str]:
        return [
            self.java,
            f"-Xmx{heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dkafka.logs.dir={self.log_dir}",
            f"-Dlog4j.configuration={LOG4J_PATH.as_uri()}",
            "-cp",
            str(self.jars_dir / "*"),
        ]

    def _preexec(self) -> Callable[[], None] | None:
        # Linux delivers the parent-death signal when the *thread* that forked exits, so a
        # broker started from a worker thread (asyncio.to_thread) relies on stop() alone.
        if self.die_with_parent and threading.current_thread() is threading.main_thread():
            return _parent_death_signal()
        return None

    def _format_storage(self) -> None:
        cmd = [*self._java_prefix("256m"), STORAGE_TOOL, "format", "--ignore-formatted"]
        cmd += ["-t", new_cluster_id(), "-c", str(self.properties_path)]
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            cmd, capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise StartError(f"formatting {self.kraft_dir} failed:\n{done.stdout}{done.stderr}")

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            code = proc.poll()
            if code is not None:
                self.state_path.unlink(missing_ok=True)
                raise StartError(f"broker exited with code {code}\n{self.log_tail()}")
            try:
                if any(port == self.port for _, _, port in probe_metadata(HOST, self.port)):
                    return
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.stop(timeout=5.0)
                raise StartError(
                    f"broker did not answer on {self.bootstrap} within "
                    f"{self.ready_timeout:.0f} s\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=0.1)
            if not process_alive(pid):
                return True
            time.sleep(0.05)
        return not process_alive(pid)

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None

    def _signal(self, signum: signal.Signals) -> None:
        state = self.running_state()
        if state is None:
            raise LocalKafkaError(f"no broker runs for {self.data_dir}")
        os.kill(state.pid, signum)


def _say(message: str, stream: IO[str] | None = None) -> None:
    print(f"abstain kafka: {message}", file=stream or sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="abstain kafka", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("start", help="start the broker (no-op if it runs)")
    start.add_argument("--port", type=int, default=9092)
    start.add_argument("--controller-port", type=int, default=None, help="default: port + 1")
    start.add_argument("--partitions", type=int, default=1, help="num.partitions (default 1)")
    start.add_argument("--heap", default="512m", help="JVM -Xmx (default 512m)")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it")
    start.add_argument("--foreground", action="store_true", help="run until Ctrl-C")
    stop = sub.add_parser("stop", help="stop the broker (SIGTERM, then SIGKILL)")
    stop.add_argument("--timeout", type=float, default=30.0)
    sub.add_parser("status", help="is it running and answering? (exit 0 yes, 3 no)")
    sub.add_parser("fetch", help="fetch the jars only")
    for action in sub.choices.values():
        action.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m service kafka start|stop|status|fetch``; returns the exit code."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.action == "start":
            kafka = LocalKafka(
                port=args.port,
                controller_port=args.controller_port,
                data_dir=args.data_dir,
                num_partitions=args.partitions,
                heap=args.heap,
                ready_timeout=args.timeout,
                die_with_parent=args.foreground,
            )
            return _start(kafka, foreground=args.foreground)
        kafka = LocalKafka(data_dir=args.data_dir)
        if args.action == "stop":
            began = time.monotonic()
            if kafka.stop(timeout=args.timeout):
                _say(f"stopped in {time.monotonic() - began:.1f} s")
            else:
                _say(f"not running (data dir {kafka.data_dir})")
            return 0
        if args.action == "status":
            status = kafka.status()
            print(status.describe())
            return 0 if status.running and status.answering else 3
        print(kafka.fetch())
        return 0
    except (LocalKafkaError, ValueError) as exc:
        _say(f"error: {exc}")
        return 1


def _start(kafka: LocalKafka, *, foreground: bool) -> int:
    began = time.monotonic()
    if not kafka.start():
        state = kafka.running_state()
        where = f"pid {state.pid}, bootstrap {state.bootstrap}" if state else "?"
        _say(f"already running ({where}, data dir {kafka.data_dir})")
        return 1 if foreground else 0
    _say(
        f"Kafka {kafka.kafka_version} ready on {kafka.bootstrap} after "
        f"{time.monotonic() - began:.1f} s (logs in {kafka.log_dir})"
    )
    print(kafka.bootstrap, flush=True)
    if not foreground:
        return 0

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        while kafka.running_state() is not None:
            time.sleep(0.5)
        _say("broker exited")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        kafka.stop()
