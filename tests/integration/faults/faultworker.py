"""A worker with fault switches: ``abstain worker`` plus three test-only pages.

``POST /__faults/pause`` pauses every partition the consumers are assigned (the scoring
path's and the learner's, which stop fetching, and faust's, while the HTTP server and the
timers go on): the consumer that silently stops making progress, which liveness must catch.
``POST /__faults/resume`` undoes it. ``POST /__faults/skip`` with ``{"topic": T, "count":
N}``: faust's consumer drops the next N records it fetches of topic T before they reach a
faust stream (the position moves past them; nothing is acknowledged) -- what faust does to
records fetched while an assignment is being recovered. The worker's topics are read by
its own consumers, so a drop there must find nothing to drop. Run as a script with the
worker's own flags::

    python tests/integration/faults/faultworker.py --config C --broker B --web-port P
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


def main(argv: list[str]) -> int:
    import faust

    from service.config import load_settings
    from service.stream.app import create_app
    from service.stream.internals import Worker

    parser = argparse.ArgumentParser(prog="faultworker")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--broker", required=True)
    parser.add_argument("--web-port", type=int, required=True)
    args = parser.parse_args(argv)
    settings = load_settings(args.config, broker=args.broker, web={"port": args.web_port})
    skip = _install_skipper()
    app = create_app(settings)

    def tps() -> list[Any]:
        return sorted(app.consumer.assignment())

    scoring, learning = app.parts.scoring, app.parts.learning

    def answer(view: Any, action: str, done: list[Any]) -> Any:
        body = json.dumps({action: [f"{tp.topic}[{tp.partition}]" for tp in done]})
        return view.bytes(body.encode(), content_type="application/json")

    @app.page("/__faults/pause")
    class Pause(faust.web.View):  # type: ignore[misc]
        async def post(self, request: Any) -> Any:
            done = tps()
            app.consumer.pause_partitions(done)
            return answer(self, "paused", done + scoring.pause() + learning.pause())

    @app.page("/__faults/resume")
    class Resume(faust.web.View):  # type: ignore[misc]
        async def post(self, request: Any) -> Any:
            done = tps()
            app.consumer.resume_partitions(done)
            return answer(self, "resumed", done + scoring.resume() + learning.resume())

    @app.page("/__faults/skip")
    class Skip(faust.web.View):  # type: ignore[misc]
        async def post(self, request: Any) -> Any:
            order = json.loads(await request.read())
            skip[str(order["topic"])] = skip.get(str(order["topic"]), 0) + int(order["count"])
            return self.bytes(json.dumps({"skipping": skip}).encode(),
                              content_type="application/json")  # fmt: skip

    worker = Worker(app, loglevel=settings.log_level, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def _install_skipper() -> dict[str, int]:
    """Wrap faust's ``Consumer.getmany`` (before the fetcher starts) so records of a topic
    with a skip budget are fetched and dropped. Returns the budget, by topic."""
    from faust.transport.consumer import Consumer

    budget: dict[str, int] = {}
    original = Consumer.getmany

    async def getmany(self: Any, timeout: float) -> Any:
        async for tp, message in original(self, timeout):
            if budget.get(tp.topic, 0) > 0:
                budget[tp.topic] -= 1
                continue
            yield tp, message

    Consumer.getmany = getmany  # type: ignore[method-assign]
    return budget


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
