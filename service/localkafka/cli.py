"""Command line of the local broker: ``python -m service kafka start|stop|status|fetch``."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from service.localkafka.broker import LocalKafka, _say
from service.localkafka.cluster import LocalCluster, stop_all
from service.localkafka.config import DEFAULT_DATA_DIR, KAFKA_LINES
from service.localkafka.errors import LocalKafkaError
from service.localkafka.secure import ADMIN_USER, MECHANISM

__all__ = ["main"]

DESCRIPTION = (
    "A local Apache Kafka broker, or a cluster of brokers (KRaft mode), for development and tests."
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="abstain kafka", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="action", required=True)
    start = sub.add_parser("start", help="start the broker (no-op if it runs)")
    start.add_argument("--port", type=int, default=9092)
    start.add_argument("--controller-port", type=int, default=None, help="default: port + 1")
    start.add_argument("--partitions", type=int, default=1, help="num.partitions (default 1)")
    start.add_argument("--heap", default="512m", help="JVM -Xmx of each broker (default 512m)")
    start.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="nodes of a local cluster (ports count up from --port by 2; default 1)",
    )
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for it")
    start.add_argument("--foreground", action="store_true", help="run until Ctrl-C")
    start.add_argument(
        "--secure",
        action="store_true",
        help="TLS, SCRAM-SHA-512 logins and ACLs (one node; client settings files printed)",
    )
    stop = sub.add_parser("stop", help="stop the broker (SIGTERM, then SIGKILL)")
    stop.add_argument("--timeout", type=float, default=30.0)
    sub.add_parser("status", help="is it running and answering? (exit 0 yes, 3 no)")
    sub.add_parser("fetch", help="fetch the jars only")
    for action in sub.choices.values():
        action.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
        action.add_argument(
            "--kafka", choices=sorted(KAFKA_LINES), default="3", help="Kafka line (default 3)"
        )
    return parser


def _cluster_nodes(data_dir: Path, kafka: str) -> list[LocalKafka]:
    """The nodes of a cluster started in ``data_dir`` (``node-<id>``), by their state files."""
    return [
        LocalKafka(data_dir=path, kafka=kafka)
        for path in sorted(data_dir.glob("node-*"))
        if path.is_dir()
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m service kafka start|stop|status|fetch``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["acls"]:  # the catalogue's ACLs: a command of the stream's package
        from service.stream.kafka.acls import main as acls_main  # noqa: PLC0415

        return acls_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        if args.action == "start" and args.brokers > 1:
            return _start_cluster(args)
        if args.action == "start":
            kafka = LocalKafka(
                port=args.port,
                controller_port=args.controller_port,
                data_dir=args.data_dir,
                num_partitions=args.partitions,
                heap=args.heap,
                ready_timeout=args.timeout,
                die_with_parent=args.foreground,
                kafka=args.kafka,
                secure=args.secure,
            )
            return _start(kafka, foreground=args.foreground)
        kafka = LocalKafka(data_dir=args.data_dir, kafka=args.kafka)
        nodes = [kafka, *_cluster_nodes(kafka.data_dir, args.kafka)]
        if args.action == "stop":
            began = time.monotonic()
            if stop_all(nodes, args.timeout):
                _say(f"stopped in {time.monotonic() - began:.1f} s")
            else:
                _say(f"not running (data dir {kafka.data_dir})")
            return 0
        if args.action == "status":
            statuses = [node.status() for node in nodes]
            shown = [s for s in statuses if s.running] or statuses[:1]
            for status in shown:
                print(status.describe())
            return 0 if all(s.running and s.answering for s in shown) else 3
        print(kafka.fetch())
        return 0
    except (LocalKafkaError, ValueError) as exc:
        _say(f"error: {exc}")
        return 1


def _start_cluster(args: argparse.Namespace) -> int:
    if args.foreground:
        raise ValueError("--foreground runs one broker; start a cluster without it")
    cluster = LocalCluster(
        brokers=args.brokers,
        port=args.port,
        data_dir=args.data_dir,
        heap=args.heap,
        kafka=args.kafka,
        num_partitions=args.partitions,
        ready_timeout=args.timeout,
    )
    began = time.monotonic()
    if not cluster.start():
        _say(f"already running (data dir {cluster.data_dir})")
        return 0
    _say(
        f"Kafka {cluster.kafka_version} cluster of {args.brokers} ready on {cluster.bootstrap} "
        f"after {time.monotonic() - began:.1f} s (data dir {cluster.data_dir})"
    )
    print(cluster.bootstrap, flush=True)
    return 0


def _say_secure(kafka: LocalKafka) -> None:
    """The secure broker's client settings (the passwords stay in the files)."""
    files = kafka.secure_files
    _say(
        f"secure: SASL_SSL with {MECHANISM}, ACLs on (StandardAuthorizer); super user "
        f"{ADMIN_USER!r} for set-up only; CA {files.ca_file}"
    )
    _say("client settings: --config FILE (or ABSTAIN_CONFIG=FILE), one file per user:")
    for user in (ADMIN_USER, *kafka.users):
        _say(f"  {user:<18} {files.settings_file(user)}")
    _say(
        f"each holds ABSTAIN_BROKER={kafka.bootstrap} ABSTAIN_SECURITY__PROTOCOL=SASL_SSL "
        f"ABSTAIN_SECURITY__SASL_MECHANISM={MECHANISM} ABSTAIN_SECURITY__CA_FILE="
        f"{files.ca_file}, the user and its password"
    )
    _say(
        "least-privilege ACLs: abstain kafka acls --role worker --apply --config "
        f"{files.settings_file(ADMIN_USER)}"
    )


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
    if kafka.secure:
        _say_secure(kafka)
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
