"""Where derivations run: the learner's process of its own gives what this process gives."""

from __future__ import annotations

import os

from service.records.history import Step
from service.stream.labels.history import Job
from service.stream.labels.history.runner import InlineRunner, ProcessRunner
from service.stream.models.served import initial_envelope

from ..memory import CFG, request, settings


def _job() -> Job:
    steps = [
        Step(
            "m",
            i,
            0,
            i,
            request([float(i), 1.0, -1.0], f"e{i}"),
            1 if i % 2 else -1,
            1 if i % 2 else -1,
            "alice",
            None,
            1.0,
        ).to_json()
        for i in range(12)
    ]
    return Job("m", {"m": initial_envelope("m", CFG).to_json()}, steps, keep=(4, 8))


def test_a_derivation_in_its_own_process_gives_what_this_process_gives() -> None:
    s = settings()
    here = InlineRunner(s).submit(_job()).result()
    runner = ProcessRunner(s)
    try:
        there = runner.submit(_job()).result(timeout=60)
        pid = runner.submit_pid().result(timeout=60)
    finally:
        runner.close()
    assert (there.states, there.checkpoints, there.last_seq) == (
        here.states,
        here.checkpoints,
        here.last_seq,
    )
    assert sorted(there.checkpoints) == [4, 8]
    assert pid != os.getpid()
