"""What a loop processed: progress per partition, and the stall clock it restarts."""

from __future__ import annotations

from service.stream.kafka.loop import Progress


def test_hold_restarts_the_stall_clock() -> None:
    progress = Progress(clock=lambda: 5.0)
    progress.mark("t", 0, 3)
    progress.hold([("t", 0), ("t", 1)], 100.0)
    assert progress.times == {("t", 0): 100.0, ("t", 1): 100.0}
    assert progress.offsets == {("t", 0): 3}
