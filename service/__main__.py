"""Command line: ``python -m service COMMAND ...`` (also installed as ``abstain``).

Each command lives in the module that owns it and exposes ``main(argv) -> int``; this
dispatcher only imports the one that is asked for, so ``abstain replay`` never loads faust.
"""

from __future__ import annotations

import importlib
import os
import sys

from service import __version__

# Scoring is many small vector products: BLAS threads only add contention on small
# machines. Set before any command imports numpy; an explicit setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

COMMANDS: dict[str, tuple[str, str]] = {
    "worker": ("service.stream.cli", "run a stream worker (score events, learn from labels)"),
    "demo": ("service.demo", "local Kafka + worker + demo stream + simulated labeller"),
    "labels": ("service.stream.cli", "list pending label requests / submit labels"),
    "rebuild": ("service.stream.cli", "rebuild a model by replaying its label log"),
    "models": ("service.stream.models.cli", "compare, promote, roll back, versions, seed"),
    "skip": ("service.stream.skip", "dead-letter a batch no worker can read and move past it"),
    "replay": ("service.replay.cli", "prequential replay of a dataset (paper protocol)"),
    "bench": ("service.replay.bench", "micro-benchmarks of the learners"),
    "desk": ("service.desk.cli", "the label desk: a web work queue for the people who label"),
    "kafka": ("service.localkafka", "start / stop / status of a local single-node Kafka"),
    "data": ("service.sources", "fetch the datasets the docs and benchmarks use (sha256 checked)"),
}

_SEED = ("service.stream.cli", "train a model from labelled history and publish it")


def _usage() -> str:
    lines = ["usage: abstain COMMAND [ARGS...]   (abstain --version)", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    if args[0] in {"-V", "--version", "version"}:
        print(f"abstain {__version__}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"abstain: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if name == "models" and rest[:1] in (["seed"], ["versions"]):
        # seeding trains through the label protocol, and the versions kept are the learner's
        # table: service.stream.cli sits above both
        name, rest = rest[0], rest[1:]
    module = importlib.import_module(COMMANDS.get(name, _SEED)[0])
    shared = {"worker", "labels", "rebuild", "seed", "versions"}  # service.stream.cli's
    code: int = module.main([name, *rest]) if name in shared else module.main(rest)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
