"""What a local broker leaves on the machine and on the wire: free ports, the state file,
process liveness and a Metadata v4 probe of a listening broker."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

from service.localkafka.errors import StateFileError

__all__ = [
    "HOST",
    "STATE_FILE",
    "BrokerState",
    "find_free_ports",
    "port_is_free",
    "probe_metadata",
    "process_alive",
    "read_state",
    "write_state",
]

HOST = "127.0.0.1"
STATE_FILE = "localkafka.json"


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
