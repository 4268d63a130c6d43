"""service.localkafka without Java: configuration, ports, state file, stop, wire probe."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree

import pytest

from service.localkafka import (
    KAFKA_LINES,
    BrokerConfig,
    BrokerState,
    FetchError,
    LocalCluster,
    LocalKafka,
    LocalKafkaError,
    StartError,
    StateFileError,
    find_free_ports,
    main,
    new_cluster_id,
    pinned_kafka_version,
    port_is_free,
    probe_metadata,
    read_state,
    render_server_properties,
    write_state,
)

REPO = Path(__file__).resolve().parent.parent


def parse_properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and line[0] != "#")
    return {key: value for key, value in pairs}


@pytest.fixture
def kafka(tmp_path: Path) -> LocalKafka:
    """A LocalKafka whose jars look present (an empty marker jar), so nothing is fetched."""
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / f"kafka_2.13-{pinned_kafka_version()}.jar").touch()
    port, controller_port = find_free_ports(2)
    return LocalKafka(
        port=port, controller_port=controller_port, data_dir=tmp_path / "data", jars_dir=jars
    )


@pytest.fixture
def impostor(kafka: LocalKafka) -> Iterator[subprocess.Popen[bytes]]:
    """A sleeping process whose command line names the broker's properties file, standing
    in for a broker; it ignores SIGTERM when asked to (first line of stdin)."""
    code = (
        "import signal, sys, time\n"
        "if sys.stdin.readline().strip() == 'stubborn':\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(kafka.properties_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def arm(proc: subprocess.Popen[bytes], kafka: LocalKafka, *, stubborn: bool = False) -> None:
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(b"stubborn\n" if stubborn else b"plain\n")
    proc.stdin.flush()
    assert proc.stdout.readline() == b"ready\n"
    kafka.data_dir.mkdir(parents=True, exist_ok=True)
    state = BrokerState(proc.pid, kafka.port, kafka.controller_port, "x", 0.0)
    write_state(kafka.state_path, state)


# configuration ---------------------------------------------------------------------------
def test_server_properties_bind_loopback_and_single_replica_settings() -> None:
    config = BrokerConfig(port=19092, controller_port=19099, num_partitions=4)
    props = parse_properties(render_server_properties(config, Path("/data/kraft")))
    assert props["process.roles"] == "broker,controller"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19099"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.quorum.voters"] == f"{props['node.id']}@127.0.0.1:19099"
    assert props["log.dirs"] == "/data/kraft"
    assert props["num.partitions"] == "4"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "default.replication.factor",
    ):
        assert props[key] == "1", key
    assert props["auto.create.topics.enable"] == "true"
    assert props["group.initial.rebalance.delay.ms"] == "0"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"port": 9092, "controller_port": 9092}, "differ"),
        ({"num_partitions": 0}, "num_partitions"),
    ],
)
def test_broker_config_rejects_bad_values(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BrokerConfig(**kwargs)


def test_controller_port_defaults_to_the_next_port(tmp_path: Path) -> None:
    kafka = LocalKafka(port=29100, data_dir=tmp_path)
    assert (kafka.port, kafka.controller_port, kafka.bootstrap) == (29100, 29101, "127.0.0.1:29100")


@pytest.mark.parametrize("heap", ["512m", "1g", "256M", "65536k"])
def test_heap_sizes_in_jvm_syntax_are_accepted(tmp_path: Path, heap: str) -> None:
    assert LocalKafka(data_dir=tmp_path, heap=heap).heap == heap


@pytest.mark.parametrize("heap", ["", "0m", "big", "512mb", "-Xmx512m"])
def test_bad_heap_is_refused(tmp_path: Path, heap: str) -> None:
    with pytest.raises(ValueError, match="heap"):
        LocalKafka(data_dir=tmp_path, heap=heap)


def test_pinned_version_matches_the_compose_image() -> None:
    version = pinned_kafka_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    compose = (REPO / "deploy" / "docker-compose.yml").read_text()
    assert re.findall(r"image:\s*apache/kafka:(\S+)", compose) == [version]


def test_cluster_ids_are_16_random_bytes_in_url_safe_base64() -> None:
    ids = {new_cluster_id() for _ in range(50)}
    assert len(ids) == 50
    for cid in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cid)
        assert not cid.startswith("-")
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16


# ports -----------------------------------------------------------------------------------
def test_free_ports_are_distinct_and_bindable() -> None:
    ports = find_free_ports(3)
    assert len(set(ports)) == 3
    assert all(port_is_free(port) for port in ports)


def test_a_listening_port_is_not_free() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not port_is_free(sock.getsockname()[1])


def test_start_refuses_a_port_in_use_before_running_java(kafka: LocalKafka) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", kafka.port))
        sock.listen()
        with pytest.raises(StartError, match="already in use"):
            kafka.start()
    assert not kafka.state_path.exists()


# state file ------------------------------------------------------------------------------
def test_state_round_trips_through_the_file(tmp_path: Path) -> None:
    state = BrokerState(
        pid=4242, port=9092, controller_port=9093, kafka_version="3.9.2", started_at=1.5
    )
    path = tmp_path / "state.json"
    write_state(path, state)
    assert read_state(path) == state
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp file left


def test_missing_state_file_means_no_state(tmp_path: Path) -> None:
    assert read_state(tmp_path / "nope.json") is None


@pytest.mark.parametrize("text", ["{not json", '{"pid": 1}', '{"pid": "x", "port": 1}'])
def test_unreadable_state_file_raises_state_file_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "state.json"
    path.write_text(text)
    with pytest.raises(StateFileError, match="delete it"):
        read_state(path)
    assert issubclass(StateFileError, LocalKafkaError)


def test_state_of_a_dead_process_is_dropped(kafka: LocalKafka) -> None:
    kafka.data_dir.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_state(kafka.state_path, BrokerState(dead.pid, kafka.port, 1, "x", 0.0))
    assert kafka.running_state() is None
    assert not kafka.state_path.exists()
    assert kafka.status().running is False


def test_a_live_pid_running_something_else_is_not_the_broker(kafka: LocalKafka) -> None:
    kafka.data_dir.mkdir(parents=True)
    write_state(kafka.state_path, BrokerState(os.getpid(), kafka.port, 1, "x", 0.0))
    assert kafka.running_state() is None  # this pytest process, not a broker: PID reused


# stop ------------------------------------------------------------------------------------
def test_stop_terminates_the_recorded_process(
    kafka: LocalKafka, impostor: subprocess.Popen[bytes]
) -> None:
    arm(impostor, kafka)
    assert kafka.running_state() is not None
    assert kafka.start() is False  # already running: start is a no-op
    assert kafka.stop(timeout=10.0) is True
    assert impostor.wait(timeout=10) == -signal.SIGTERM
    assert not kafka.state_path.exists()
    assert kafka.stop() is False


def test_stop_kills_a_process_that_ignores_sigterm(
    kafka: LocalKafka, impostor: subprocess.Popen[bytes]
) -> None:
    arm(impostor, kafka, stubborn=True)
    assert kafka.stop(timeout=0.5) is True
    assert impostor.wait(timeout=10) == -signal.SIGKILL


def test_pause_and_resume_stop_and_continue_the_process(
    kafka: LocalKafka, impostor: subprocess.Popen[bytes]
) -> None:
    arm(impostor, kafka)
    kafka.pause()
    stat = Path(f"/proc/{impostor.pid}/stat")
    assert _wait_for_state(stat, "T")
    kafka.resume()
    assert _wait_for_state(stat, "S")


def _wait_for_state(stat: Path, letter: str) -> bool:
    for _ in range(100):
        text = stat.read_text()
        if text[text.rfind(")") + 2] == letter:
            return True
        threading.Event().wait(0.02)
    return False


def test_pause_without_a_broker_raises(kafka: LocalKafka) -> None:
    with pytest.raises(LocalKafkaError, match="no broker"):
        kafka.pause()


# jars ------------------------------------------------------------------------------------
def test_fetch_without_maven_says_so(tmp_path: Path) -> None:
    kafka = LocalKafka(data_dir=tmp_path, jars_dir=tmp_path / "jars", mvn="no-such-mvn-here")
    with pytest.raises(FetchError, match="no-such-mvn-here"):
        kafka.fetch()


def test_fetch_is_skipped_when_the_jars_are_there(kafka: LocalKafka) -> None:
    kafka.mvn = "no-such-mvn-here"  # would fail if it were run
    assert kafka.fetch() == kafka.jars_dir


# metadata probe --------------------------------------------------------------------------
def metadata_v4_response(correlation_id: int, brokers: list[tuple[int, str, int]]) -> bytes:
    """A Metadata v4 response, written from the protocol spec: correlation id, throttle,
    brokers [node_id int32, host string, port int32, rack nullable string], cluster id,
    controller id, topics []."""
    body = struct.pack(">iii", correlation_id, 0, len(brokers))
    for node_id, host, port in brokers:
        body += struct.pack(">ih", node_id, len(host)) + host.encode()
        body += struct.pack(">ih", port, -1)
    body += struct.pack(">h", 4) + b"abcd" + struct.pack(">ii", 1, 0)
    return struct.pack(">i", len(body)) + body


@pytest.fixture
def fake_broker() -> Iterator[tuple[int, list[bytes], list[bytes]]]:
    """A one-shot TCP server: records each request, answers with the queued reply."""
    requests: list[bytes] = []
    replies: list[bytes] = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(5)

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                size = struct.unpack(">i", conn.recv(4))[0]
                requests.append(conn.recv(size))
                conn.sendall(replies.pop(0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], requests, replies
    thread.join(timeout=5)
    server.close()


def test_probe_sends_metadata_v4_and_parses_the_brokers(
    fake_broker: tuple[int, list[bytes], list[bytes]],
) -> None:
    port, requests, replies = fake_broker
    replies.append(metadata_v4_response(7, [(1, "127.0.0.1", 9092), (2, "h2", 9093)]))
    assert probe_metadata("127.0.0.1", port) == [(1, "127.0.0.1", 9092), (2, "h2", 9093)]
    api_key, api_version, correlation_id = struct.unpack_from(">hhi", requests[0])
    assert (api_key, api_version, correlation_id) == (3, 4, 7)


def test_probe_rejects_a_reply_to_another_request(
    fake_broker: tuple[int, list[bytes], list[bytes]],
) -> None:
    port, _, replies = fake_broker
    replies.append(metadata_v4_response(99, []))
    with pytest.raises(ValueError, match="correlation"):
        probe_metadata("127.0.0.1", port)


def test_probe_of_a_closed_port_raises_oserror() -> None:
    (port,) = find_free_ports(1)
    with pytest.raises(OSError):  # noqa: PT011 - any refusal will do
        probe_metadata("127.0.0.1", port, timeout=1.0)


# command line ----------------------------------------------------------------------------
def test_status_of_a_stopped_broker_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--data-dir", str(tmp_path)]) == 3
    assert "not running" in capsys.readouterr().out


def test_stop_without_a_broker_is_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stop", "--data-dir", str(tmp_path)]) == 0
    assert "not running" in capsys.readouterr().err


def test_start_with_a_bad_port_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["start", "--port", "0", "--data-dir", str(tmp_path)]) == 1
    assert "port" in capsys.readouterr().err


def test_a_port_left_in_time_wait_by_a_stopped_server_is_free() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first, as a stopping broker does: TIME_WAIT
        client.recv(1)
        client.close()
    assert port_is_free(port)


# clusters and Kafka lines ----------------------------------------------------------------
def test_a_cluster_node_names_the_whole_quorum_and_the_cluster_replication() -> None:
    voters = ((1, 19093), (2, 19095), (3, 19097))
    config = BrokerConfig(
        port=19094,
        controller_port=19095,
        node_id=2,
        voters=voters,
        replication_factor=3,
        min_insync_replicas=2,
    )
    props = parse_properties(render_server_properties(config, Path("/data/node-2/kraft")))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:19093,2@127.0.0.1:19095,3@127.0.0.1:19097"
    )
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19094,CONTROLLER://127.0.0.1:19095"
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
    ):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_id": 4, "voters": ((1, 9093), (2, 9095))}, "not one of the voters"),
        ({"node_id": 1, "controller_port": 9093, "voters": ((1, 9099),)}, "not one of"),
        ({"replication_factor": 2, "min_insync_replicas": 3}, "min_insync_replicas"),
        ({"min_insync_replicas": 0}, "min_insync_replicas"),
    ],
)
def test_cluster_settings_that_cannot_work_are_refused(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        BrokerConfig(**kwargs)  # type: ignore[arg-type]


def test_cluster_nodes_get_their_own_ports_data_dirs_and_one_quorum(tmp_path: Path) -> None:
    cluster = LocalCluster(brokers=3, port=29200, data_dir=tmp_path)
    assert cluster.bootstrap == "127.0.0.1:29200,127.0.0.1:29202,127.0.0.1:29204"
    assert [n.data_dir for n in cluster.nodes] == [tmp_path / f"node-{i}" for i in (1, 2, 3)]
    assert [(n.port, n.controller_port) for n in cluster.nodes] == [
        (29200, 29201),
        (29202, 29203),
        (29204, 29205),
    ]
    assert {n.config.quorum_voters for n in cluster.nodes} == {
        "1@127.0.0.1:29201,2@127.0.0.1:29203,3@127.0.0.1:29205"
    }
    # unset: every node keeps a copy, a write needs all but one
    assert {(n.config.replication_factor, n.config.min_insync_replicas) for n in cluster.nodes} == {
        (3, 2)
    }
    assert cluster.node(3) is cluster.nodes[2]
    with pytest.raises(LocalKafkaError, match="no node 4"):
        cluster.node(4)


def test_a_cluster_keeps_one_id_across_starts(tmp_path: Path) -> None:
    first = LocalCluster(brokers=3, port=29300, data_dir=tmp_path).cluster_id()
    assert LocalCluster(brokers=3, port=29300, data_dir=tmp_path).cluster_id() == first
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", first)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"brokers": 0}, "brokers"), ({"brokers": 3, "ports": [(1, 2)]}, "3 port pairs")],
)
def test_bad_cluster_shapes_are_refused(
    tmp_path: Path, kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        LocalCluster(data_dir=tmp_path, **kwargs)  # type: ignore[arg-type]


def test_each_kafka_line_pins_a_version_of_that_line(tmp_path: Path) -> None:
    assert sorted(KAFKA_LINES) == ["3", "4"]
    for line, pom in KAFKA_LINES.items():
        ElementTree.parse(pom)  # noqa: S314 - our own file; mvn refuses one that is not XML
        version = pinned_kafka_version(pom)
        assert re.fullmatch(rf"{line}\.\d+\.\d+", version), (line, version)
        kafka = LocalKafka(data_dir=tmp_path, kafka=line)
        assert kafka.kafka_version == version
        assert kafka.jars_dir.name == version  # each version's jars in their own directory
    with pytest.raises(ValueError, match="kafka must be one of"):
        LocalKafka(data_dir=tmp_path, kafka="2")


def test_both_logging_configs_send_the_broker_log_to_files() -> None:
    log4j2 = (REPO / "deploy" / "kafka" / "log4j2.properties").read_text()
    assert "${sys:kafka.logs.dir}/server.log" in log4j2
    assert "Console" not in log4j2


def test_kill_sigkills_the_recorded_process(
    kafka: LocalKafka, impostor: subprocess.Popen[bytes]
) -> None:
    arm(impostor, kafka, stubborn=True)
    assert kafka.kill() is True
    assert impostor.wait(timeout=10) == -signal.SIGKILL
    assert not kafka.state_path.exists()
    assert kafka.kill() is False


def test_a_cluster_in_the_foreground_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["start", "--brokers", "3", "--foreground", "--data-dir", str(tmp_path)]
    assert main(argv) == 1
    assert "--foreground runs one broker" in capsys.readouterr().err


def test_status_and_stop_cover_every_node_of_a_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in (1, 2, 3):
        (tmp_path / f"node-{i}").mkdir()
    assert main(["status", "--data-dir", str(tmp_path)]) == 3
    assert main(["stop", "--data-dir", str(tmp_path)]) == 0
    assert "not running" in capsys.readouterr().err
