"""Command line of the local broker: ``python -m service kafka start|stop|status|fetch``."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from service.localkafka.broker import LocalKafka, _say
from service.localkafka.config import DEFAULT_DATA_DIR
from service.localkafka.errors import LocalKafkaError

__all__ = ["main"]

DESCRIPTION = "A local single-node Apache Kafka broker (KRaft mode) for development and tests."


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="abstain kafka", description=DESCRIPTION)
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
