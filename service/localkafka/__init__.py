"""A local Apache Kafka broker, or a cluster of them (KRaft mode), for development and tests.

The broker's jars come from Maven Central through ``deploy/kafka/pom.xml`` (``mvn``
caches them in the local Maven repository), storage is formatted once per data directory,
and ``kafka.Kafka`` runs as a child process in its own process group, listening on
127.0.0.1 only. Its PID is kept in a state file inside the data directory, so any process
can ask for its status or stop it; the data survive a stop and a later start.

>>> from pathlib import Path
>>> kafka = LocalKafka(port=19092, data_dir=Path("/tmp/abstain-kafka-doc"))
>>> kafka.bootstrap, kafka.controller_port
('127.0.0.1:19092', 19093)

Modules: ``errors`` (the tree below), ``wire`` (free ports, state file, process
liveness, Metadata probe), ``config`` (paths, pinned versions, ``server.properties``),
``broker`` (``LocalKafka``: jars, start, stop, kill, status, pause, resume), ``cluster``
(``LocalCluster``: several nodes, one quorum), ``cli`` (``main``).

Two Kafka lines are supported, each pinned in its own pom (``KAFKA_LINES``): ``3``
(``deploy/kafka/pom.xml``, the default) and ``4`` (``deploy/kafka/kafka4/pom.xml``).

Command line (``python -m service kafka ...``)::

    start [--port 9092] [--data-dir var/kafka] [--partitions 1] [--foreground]
          [--brokers 1] [--kafka 3|4] [--heap 512m]
    stop | status [--data-dir var/kafka]     (every node of a cluster in that directory)
    fetch [--kafka 3|4]        fetch the jars only

Exceptions::

    LocalKafkaError (AbstainError, RuntimeError)
     ├── FetchError       the jars could not be fetched (no mvn, or mvn failed)
     ├── StartError       the broker did not start, or did not answer in time
     └── StateFileError   the state file exists but cannot be read
"""

from __future__ import annotations

from service.localkafka.broker import FETCH_TIMEOUT as FETCH_TIMEOUT
from service.localkafka.broker import STORAGE_TOOL as STORAGE_TOOL
from service.localkafka.broker import BrokerStatus, LocalKafka
from service.localkafka.cli import main
from service.localkafka.cluster import LocalCluster
from service.localkafka.config import (
    DEFAULT_DATA_DIR,
    BrokerConfig,
    new_cluster_id,
    pinned_kafka_version,
    render_server_properties,
)
from service.localkafka.config import DEFAULT_JARS_ROOT as DEFAULT_JARS_ROOT
from service.localkafka.config import KAFKA_LINES as KAFKA_LINES
from service.localkafka.config import LOG4J_PATH as LOG4J_PATH
from service.localkafka.config import POM_PATH as POM_PATH
from service.localkafka.config import REPO_ROOT as REPO_ROOT
from service.localkafka.errors import FetchError, LocalKafkaError, StartError, StateFileError
from service.localkafka.wire import HOST as HOST
from service.localkafka.wire import STATE_FILE as STATE_FILE
from service.localkafka.wire import (
    BrokerState,
    find_free_ports,
    probe_metadata,
    read_state,
    write_state,
)
from service.localkafka.wire import port_is_free as port_is_free
from service.localkafka.wire import process_alive as process_alive

__all__ = [
    "DEFAULT_DATA_DIR",
    "BrokerConfig",
    "BrokerState",
    "BrokerStatus",
    "FetchError",
    "LocalCluster",
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
