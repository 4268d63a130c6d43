"""Where the broker's files live and what its ``server.properties`` says."""

from __future__ import annotations

import base64
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from service.localkafka.errors import FetchError
from service.localkafka.wire import HOST

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_JARS_ROOT",
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
LOG4J_PATH = REPO_ROOT / "deploy" / "kafka" / "log4j.properties"
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
    lines = ["# Written by service.localkafka; rewritten at every start."]
    lines += [f"{key}={value}" for key, value in props.items()]
    return "\n".join(lines) + "\n"
