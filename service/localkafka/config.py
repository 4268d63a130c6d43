"""Where the broker's files live and what its ``server.properties`` says."""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from service.localkafka.errors import FetchError
from service.localkafka.wire import HOST

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_JARS_ROOT",
    "KAFKA_LINES",
    "LOG4J2_PATH",
    "LOG4J_PATH",
    "POM_PATH",
    "REPO_ROOT",
    "BrokerConfig",
    "new_cluster_id",
    "pinned_kafka_version",
    "render_server_properties",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
POM_PATH = REPO_ROOT / "deploy" / "kafka" / "pom.xml"
LOG4J_PATH = REPO_ROOT / "deploy" / "kafka" / "log4j.properties"  # Kafka 3 (reload4j)
LOG4J2_PATH = REPO_ROOT / "deploy" / "kafka" / "log4j2.properties"  # Kafka 4 (log4j 2)
#: the supported Kafka lines and the pom that pins each one's version
KAFKA_LINES = {"3": POM_PATH, "4": REPO_ROOT / "deploy" / "kafka" / "kafka4" / "pom.xml"}
DEFAULT_DATA_DIR = REPO_ROOT / "var" / "kafka"
DEFAULT_JARS_ROOT = REPO_ROOT / "var" / "kafka-jars"


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


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """What ``server.properties`` is rendered from."""

    port: int = 9092
    controller_port: int = 9093
    num_partitions: int = 1
    host: str = HOST
    node_id: int = 1
    #: (node id, controller port) of every controller of the quorum; () = this node alone
    voters: tuple[tuple[int, int], ...] = ()
    replication_factor: int = 1  # default.replication.factor, internal topics too
    min_insync_replicas: int = 1

    def __post_init__(self) -> None:
        for name in ("port", "controller_port"):
            value = getattr(self, name)
            if not 0 < value < 65536:
                raise ValueError(f"{name} must be in 1..65535, got {value}")
        if self.port == self.controller_port:
            raise ValueError(f"port and controller_port must differ, both are {self.port}")
        if self.num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {self.num_partitions}")
        if self.voters and (self.node_id, self.controller_port) not in self.voters:
            raise ValueError(f"node {self.node_id} is not one of the voters {self.voters}")
        if not 1 <= self.min_insync_replicas <= self.replication_factor:
            raise ValueError(
                f"need 1 <= min_insync_replicas <= replication_factor, got "
                f"{self.min_insync_replicas} and {self.replication_factor}"
            )

    @property
    def quorum_voters(self) -> str:
        """``controller.quorum.voters``: ``id@host:port`` of every controller."""
        voters = self.voters or ((self.node_id, self.controller_port),)
        return ",".join(f"{node}@{self.host}:{port}" for node, port in voters)


def render_server_properties(
    config: BrokerConfig,
    log_dir: Path,
    *,
    listener: str = "PLAINTEXT",
    overrides: Mapping[str, str] | None = None,
) -> str:
    """A KRaft ``server.properties`` for one combined broker+controller node (of a quorum
    of one, or of ``config.voters``). ``listener`` names the client listener (its security
    protocol too); ``overrides`` replace or add lines (the secure mode's:
    :func:`~service.localkafka.secure.secure_properties`).

    >>> text = render_server_properties(BrokerConfig(port=9092), Path("/d/kraft"))
    >>> [line for line in text.splitlines() if line.startswith("listeners=")]
    ['listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093']
    """
    rf, isr = str(config.replication_factor), str(config.min_insync_replicas)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(config.node_id),
        "controller.quorum.voters": config.quorum_voters,
        "listeners": (
            f"{listener}://{config.host}:{config.port},"
            f"CONTROLLER://{config.host}:{config.controller_port}"
        ),
        "advertised.listeners": f"{listener}://{config.host}:{config.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": str(config.num_partitions),
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "4",
        "auto.create.topics.enable": "true",
        "delete.topic.enable": "true",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.threads": "1",
        **(overrides or {}),
    }
    lines = ["# Written by service.localkafka; rewritten at every start."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"
