#!/usr/bin/env bash
# Start, stop or query the local single-node Kafka broker (service/localkafka/).
#
#   deploy/local/kafka.sh start [--port 9092] [--data-dir var/kafka] [--partitions 1] [--foreground]
#   deploy/local/kafka.sh stop | status | fetch
#
# Needs Java 17 and Maven 3 (the first start fetches the broker's jars from Maven Central)
# and the repository's virtualenv in .venv (or PYTHON=/path/to/python).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"

if [[ $# -eq 0 ]]; then
    echo "usage: $0 start|stop|status|fetch [options]   (--help for the options)" >&2
    exit 2
fi
if [[ ! -x "$python" ]]; then
    echo "$0: no Python at $python; create the virtualenv first:" >&2
    echo "  python3 -m venv .venv && .venv/bin/pip install -e '.[dev]'" >&2
    exit 1
fi
cd "$repo"
exec "$python" -m service kafka "$@"
