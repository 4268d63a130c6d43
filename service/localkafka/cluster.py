"""A local Kafka cluster: ``brokers`` KRaft nodes on 127.0.0.1, each a combined broker and
controller with its own data directory (``<data dir>/node-<id>``), one controller quorum of
all of them, one cluster id. Node ``i`` (1-based) listens on ``port + 2(i-1)`` and its
controller on the port after; each node is a :class:`LocalKafka` (stopped, killed, started
by PID), so one can be lost while the others go on.

>>> from pathlib import Path
>>> cluster = LocalCluster(brokers=3, port=19092, data_dir=Path("/tmp/abstain-cluster-doc"))
>>> cluster.bootstrap
'127.0.0.1:19092,127.0.0.1:19094,127.0.0.1:19096'
>>> cluster.node(2).config.quorum_voters
'1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097'
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Self

from service.localkafka.broker import LocalKafka
from service.localkafka.config import DEFAULT_DATA_DIR, new_cluster_id
from service.localkafka.errors import LocalKafkaError, StartError

__all__ = ["CLUSTER_ID_FILE", "LocalCluster", "stop_all"]

CLUSTER_ID_FILE = "cluster.id"


class LocalCluster:
    """``brokers`` local Kafka nodes forming one cluster; see the module docstring.

    ``ports``, when given, are ``(broker port, controller port)`` of each node (free ports
    for tests); otherwise they count up from ``port``. ``replication_factor`` and
    ``min_insync_replicas`` are the brokers' defaults (internal topics too); unset, every
    node holds a copy and a write needs all but one. Other keywords go to each node.
    """

    def __init__(
        self,
        *,
        brokers: int = 3,
        port: int = 9092,
        ports: Sequence[tuple[int, int]] | None = None,
        data_dir: Path = DEFAULT_DATA_DIR,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
        heap: str = "384m",
        kafka: str = "3",
        **node_options: object,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"brokers must be >= 1, got {brokers}")
        if ports is None:
            ports = [(port + 2 * i, port + 2 * i + 1) for i in range(brokers)]
        if len(ports) != brokers:
            raise ValueError(f"{brokers} brokers need {brokers} port pairs, got {len(ports)}")
        self.data_dir = Path(data_dir).resolve()
        rf = brokers if replication_factor is None else replication_factor
        isr = max(1, rf - 1) if min_insync_replicas is None else min_insync_replicas
        voters = tuple((i + 1, controller) for i, (_, controller) in enumerate(ports))
        self.nodes = [
            LocalKafka(
                port=broker_port,
                controller_port=controller,
                data_dir=self.data_dir / f"node-{i + 1}",
                heap=heap,
                kafka=kafka,
                node_id=i + 1,
                voters=voters,
                replication_factor=rf,
                min_insync_replicas=isr,
                cluster_id=None,  # set from the cluster's id file at start
                **node_options,  # type: ignore[arg-type]
            )
            for i, (broker_port, controller) in enumerate(ports)
        ]

    @property
    def bootstrap(self) -> str:
        """Every node's ``host:port``, comma-separated."""
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def kafka_version(self) -> str:
        return self.nodes[0].kafka_version

    def node(self, node_id: int) -> LocalKafka:
        """The node with ``node_id`` (1-based)."""
        if not 1 <= node_id <= len(self.nodes):
            raise LocalKafkaError(f"no node {node_id}: the cluster has {len(self.nodes)}")
        return self.nodes[node_id - 1]

    def cluster_id(self) -> str:
        """The cluster's id, made once and kept in the data directory."""
        path = self.data_dir / CLUSTER_ID_FILE
        if not path.is_file():
            self.data_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(new_cluster_id() + "\n")
        return path.read_text().strip()

    def fetch(self) -> Path:
        return self.nodes[0].fetch()

    def start(self) -> bool:
        """Start every node that does not run and wait until all answer; False if all ran.
        A node that fails to start stops the ones started here."""
        self.fetch()
        cid = self.cluster_id()
        launched = []
        try:
            for node in self.nodes:
                node.cluster_id = cid
                if node.launch():
                    launched.append(node)
            for node in launched:
                node.wait_ready()
        except LocalKafkaError:
            for node in launched:
                node.stop(timeout=10.0)
            raise
        return bool(launched)

    def start_node(self, node_id: int) -> float:
        """Start one node (after a kill or a stop) and wait until it answers; seconds taken."""
        node = self.node(node_id)
        node.cluster_id = self.cluster_id()
        began = time.monotonic()
        if not node.start():
            raise StartError(f"node {node_id} already runs")
        return time.monotonic() - began

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop every node at once (SIGTERM, then SIGKILL after ``timeout`` s): one by one,
        the last nodes would wait for a controller quorum that is gone. False if none ran."""
        return stop_all(self.nodes, timeout)

    def running(self) -> list[int]:
        """Ids of the nodes that run."""
        return [i + 1 for i, node in enumerate(self.nodes) if node.running_state() is not None]

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


def stop_all(nodes: Sequence[LocalKafka], timeout: float = 30.0) -> bool:
    """Stop ``nodes`` at once (each by its PID); False if none ran."""
    if not nodes:
        return False
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        return any(list(pool.map(lambda node: node.stop(timeout=timeout), nodes)))
