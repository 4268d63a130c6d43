"""The broker itself: fetch its jars, format storage, start, stop, pause, resume and
report on one ``kafka.Kafka`` child process per data directory."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from service.localkafka.config import (
    DEFAULT_DATA_DIR,
    DEFAULT_JARS_ROOT,
    KAFKA_LINES,
    LOG4J2_PATH,
    LOG4J_PATH,
    BrokerConfig,
    new_cluster_id,
    pinned_kafka_version,
    render_server_properties,
)
from service.localkafka.errors import FetchError, LocalKafkaError, StartError
from service.localkafka.secure import (
    ROLE_USERS,
    SecureFiles,
    admin_ready,
    scram_arguments,
    secure_properties,
)
from service.localkafka.wire import (
    HOST,
    STATE_FILE,
    BrokerState,
    port_is_free,
    probe_metadata,
    process_alive,
    read_state,
    write_state,
)
from service.processes import parent_death_signal

__all__ = ["FETCH_TIMEOUT", "STORAGE_TOOL", "BrokerStatus", "LocalKafka"]

STORAGE_TOOL = "kafka.tools.StorageTool"
FETCH_TIMEOUT = 900.0  # seconds; a cold fetch of ~46 MB of jars
_HEAP_RE = re.compile(r"[1-9][0-9]*[kmgKMG]?")


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
    """One local Kafka broker in ``data_dir``; see the package docstring.

    ``die_with_parent=True`` makes the kernel kill the broker when the process that
    started it dies (Linux; only when ``start()`` runs on the main thread), for test
    sessions; the command line's ``start`` leaves the broker running on its own.

    ``kafka`` picks the Kafka line (``"3"`` or ``"4"``, :data:`KAFKA_LINES`: each pins one
    version in its pom). ``node_id``, ``voters``, ``cluster_id`` and the replication
    settings make the broker one node of a cluster (:class:`~service.localkafka.LocalCluster`).

    ``secure=True`` (one node only) serves TLS, SCRAM-SHA-512 logins and ACLs
    (:mod:`~service.localkafka.secure`; ``users``: the SCRAM users besides ``admin``,
    created when storage is formatted). A data directory keeps the mode it was formatted in.
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
        kafka: str = "3",
        node_id: int = 1,
        voters: tuple[tuple[int, int], ...] = (),
        replication_factor: int = 1,
        min_insync_replicas: int = 1,
        cluster_id: str | None = None,
        secure: bool = False,
        users: tuple[str, ...] = tuple(ROLE_USERS.values()),
    ) -> None:
        if not _HEAP_RE.fullmatch(heap):
            raise ValueError(f"heap must look like 512m or 1g, got {heap!r}")
        if ready_timeout <= 0:
            raise ValueError(f"ready_timeout must be > 0, got {ready_timeout}")
        if kafka not in KAFKA_LINES:
            raise ValueError(f"kafka must be one of {sorted(KAFKA_LINES)}, got {kafka!r}")
        if secure and voters:
            raise ValueError("secure mode runs one node, not a cluster")
        self.config = BrokerConfig(
            port=port,
            controller_port=port + 1 if controller_port is None else controller_port,
            num_partitions=num_partitions,
            node_id=node_id,
            voters=voters,
            replication_factor=replication_factor,
            min_insync_replicas=min_insync_replicas,
        )
        self.cluster_id = cluster_id
        self.data_dir = Path(data_dir).resolve()
        self.pom = KAFKA_LINES[kafka]
        self.kafka_version = pinned_kafka_version(self.pom)
        self.jars_dir = Path(jars_dir or DEFAULT_JARS_ROOT / self.kafka_version).resolve()
        self.heap = heap
        self.ready_timeout = ready_timeout
        self.die_with_parent = die_with_parent
        self.java = java
        self.mvn = mvn
        self.secure = secure
        self.users = users
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

    @property
    def secure_files(self) -> SecureFiles:
        """The secure mode's CA, broker key, passwords and client settings files."""
        return SecureFiles(self.data_dir / "secure")

    def settings_file(self, user: str) -> Path:
        """The settings file (``--config``) of ``user`` of a secure broker."""
        return self.secure_files.settings_file(user)

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
        cmd = [mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(self.pom)]
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
        if not self.launch():
            return False
        self.wait_ready()
        return True

    def launch(self) -> bool:
        """Start the broker's process without waiting for it to answer (the nodes of a
        cluster answer only once a quorum of them runs); False if it already ran."""
        if self.running_state() is not None:
            return False
        self._reap()
        self.fetch()
        for name, port in (("port", self.port), ("controller port", self.controller_port)):
            if not port_is_free(port):
                raise StartError(f"{name} {HOST}:{port} is already in use")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        formatted = (self.kraft_dir / "meta.properties").is_file()
        passwords: dict[str, str] = {}
        if formatted and self.secure != self.secure_files.exists():
            raise StartError(
                f"{self.data_dir} was formatted {'with' if not self.secure else 'without'} "
                "--secure; start it as it was, or use another --data-dir"
            )
        if self.secure:
            passwords = self.secure_files.create(self.users)
            props = render_server_properties(
                self.config,
                self.kraft_dir,
                listener="SASL_SSL",
                overrides=secure_properties(self.secure_files, passwords),
            )
        else:
            props = render_server_properties(self.config, self.kraft_dir)
        fd = os.open(self.properties_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:  # the secure mode's holds the admin password
            out.write(props)
        if not formatted:
            self._format_storage(scram_arguments(passwords) if self.secure else [])
        if self.secure:
            self.secure_files.write_settings(self.bootstrap, passwords)
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
        return True

    def wait_ready(self) -> None:
        """Wait until the launched broker answers and names itself (``ready_timeout``)."""
        if self._proc is None:
            raise StartError(f"no broker was launched for {self.data_dir}")
        self._wait_ready(self._proc)

    def kill(self) -> bool:
        """SIGKILL the broker by PID (a crash: no controlled shutdown); False if none ran."""
        state = self.running_state()
        if state is None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.pid, signal.SIGKILL)
        self._wait_gone(state.pid, 10.0)
        self._reap()
        self.state_path.unlink(missing_ok=True)
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
        if self.secure_files.exists():
            answering = admin_ready(self.secure_files, state.bootstrap, timeout=1.0)
        else:
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
            f"-Dlog4j.configuration={LOG4J_PATH.as_uri()}",  # Kafka 3 (reload4j)
            f"-Dlog4j2.configurationFile={LOG4J2_PATH.as_uri()}",  # Kafka 4 (log4j 2)
            "-cp",
            str(self.jars_dir / "*"),
        ]

    def _preexec(self) -> Callable[[], None] | None:
        # Linux delivers the parent-death signal when the *thread* that forked exits, so a
        # broker started from a worker thread (asyncio.to_thread) relies on stop() alone.
        if self.die_with_parent and threading.current_thread() is threading.main_thread():
            return parent_death_signal()
        return None

    def _format_storage(self, extra: list[str]) -> None:
        cmd = [*self._java_prefix("256m"), STORAGE_TOOL, "format", "--ignore-formatted"]
        cmd += ["-t", self.cluster_id or new_cluster_id(), "-c", str(self.properties_path)]
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [*cmd, *extra], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:  # extra (SCRAM passwords) is not repeated in the message
            raise StartError(f"formatting {self.kraft_dir} failed:\n{done.stdout}{done.stderr}")

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            code = proc.poll()
            if code is not None:
                self.state_path.unlink(missing_ok=True)
                raise StartError(f"broker exited with code {code}\n{self.log_tail()}")
            if self._answers():
                return
            if time.monotonic() > deadline:
                self.stop(timeout=5.0)
                raise StartError(
                    f"broker did not answer on {self.bootstrap} within "
                    f"{self.ready_timeout:.0f} s\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def _answers(self) -> bool:
        """The broker answers and names itself (in secure mode: to a logged-in admin)."""
        if self.secure:
            return admin_ready(self.secure_files, self.bootstrap)
        try:
            return any(port == self.port for _, _, port in probe_metadata(HOST, self.port))
        except (OSError, ValueError):
            return False

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
