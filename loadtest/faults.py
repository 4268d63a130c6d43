"""Run the fault-injection tests and print their summary table.

    python loadtest/faults.py                  # CI sizes (what `make test` runs), ~4 min
    python loadtest/faults.py --full           # the full sizes (marker `slow`), tens of min
    python loadtest/faults.py --full -k kill   # one scenario
    python loadtest/faults.py --out table.md   # also write the table as Markdown

The tests themselves live in ``tests/integration/test_faults_*.py`` (assertions included:
a run that breaks a promise fails here too). Each writes its summary as JSON into a
results directory; this script collects them into one Markdown table (the one in
``docs/operate/reliability.md``). A broker is started by the test session on free ports unless
``--bootstrap HOST:PORT`` (or ``ABSTAIN_TEST_BOOTSTRAP``) names one; the outage test always
starts its own.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TESTS = sorted(
    str(p.relative_to(REPO)) for p in (REPO / "tests" / "integration").glob("test_faults_*.py")
)
ORDER = [
    "fuzz",
    "kill -9",
    "numeric guard",
    "rebalance",
    "stall",
    "skipped records",
    "broker outage",
]


def _table(rows: list[dict[str, Any]]) -> str:
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from faults.report import format_table  # noqa: PLC0415 - the tests' own formatter

    return format_table(rows)


def collect(results: Path) -> tuple[str, list[dict[str, Any]]]:
    """The combined table and the summaries found in ``results``."""
    found = [json.loads(p.read_text()) for p in sorted(results.glob("summary-*.json"))]
    found.sort(
        key=lambda f: (
            ORDER.index(f["row"]["scenario"]) if f["row"]["scenario"] in ORDER else len(ORDER),
            f["row"]["size"],
        )
    )
    return _table([f["row"] for f in found]), [f["summary"] for f in found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="full sizes (marker slow)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (e.g. kill)")
    parser.add_argument("--bootstrap", help="use this broker (host:port) instead of starting one")
    parser.add_argument("--results", type=Path, help="directory for the JSON summaries")
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)

    results = args.results or Path(tempfile.mkdtemp(prefix="abstain-faults-"))
    results.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ABSTAIN_FAULTS_RESULTS=str(results))
    if args.bootstrap:
        env["ABSTAIN_TEST_BOOTSTRAP"] = args.bootstrap
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *TESTS,
        "-q",
        "-p",
        "no:cacheprovider",
        "-m",
        "slow" if args.full else "not slow",
    ]
    if args.keyword:
        cmd += ["-k", args.keyword]
    print("$", " ".join(cmd), flush=True)
    began = time.monotonic()
    code = subprocess.run(cmd, cwd=REPO, env=env, check=False).returncode
    took = time.monotonic() - began

    table, summaries = collect(results)
    size = "full" if args.full else "CI"
    text = [
        f"\n## Fault-injection summary ({size} size, {took:.0f} s, pytest exit {code})\n",
        table,
        "",
    ]
    for s in summaries:
        notes = "; ".join(f"{k} {v}" for k, v in s["notes"].items() if v != "")
        text.append(f"- **{s['scenario']} ({s['size']})**: {notes}")
    out = "\n".join(text)
    print(out)
    if args.out:
        args.out.write_text(out + "\n")
    print(f"\nJSON summaries in {results}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
