"""kcat (librdkafka's command-line client, Debian package ``kcat``): a real non-Python
producer and consumer for the tests."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

__all__ = ["kcat", "kcat_read", "write_unreadable"]

#: a record header key of the bytes 0xff 0xfe (argv is encoded with surrogateescape): not
#: UTF-8, which Kafka's broker takes and aiokafka cannot parse
UNREADABLE_HEADER = "\udcff\udcfe=x"


def kcat(bootstrap: str, *args: str, data: bytes = b"") -> str:
    """Run kcat against ``bootstrap``; its stdout (an assertion error with its stderr if it
    fails)."""
    exe = shutil.which("kcat")
    assert exe, "install Debian's kcat package (.ci/run does)"
    done = subprocess.run(
        [exe, "-b", bootstrap, *args], input=data, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


def kcat_read(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every record of ``topic`` as kcat's JSON envelope (``key``, ``payload``, ...)."""
    out = kcat(bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q", "-J")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def write_unreadable(bootstrap: str, topic: str, partition: int, values: list[Any]) -> None:
    """``values`` (JSON) as one batch on ``topic[partition]`` that the workers cannot read."""
    data = b"".join(json.dumps(v).encode() + b"\n" for v in values)
    # a linger long enough that every line goes into the one batch
    kcat(
        bootstrap,
        "-P",
        "-t",
        topic,
        "-p",
        str(partition),
        "-H",
        UNREADABLE_HEADER,
        "-X",
        "linger.ms=500",
        data=data,
    )
