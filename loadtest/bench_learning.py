"""Micro-benchmarks of the learners (a thin wrapper around ``abstain bench``).

Usage: ``python loadtest/bench_learning.py [--repeat 7] [--dataset phishing] ...``
(the same options as ``python -m service bench --help``). River, the reference, comes with
the ``bench`` extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.replay.bench import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
