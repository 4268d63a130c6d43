"""A worker with fault switches: ``abstain worker`` plus three test-only pages.

``POST /__faults/pause`` pauses every partition the consumers are assigned (the scoring
path's and the learner's, which stop fetching, and faust's, while the HTTP server and the
timers go on): the consumer that silently stops making progress, which liveness must catch.
``POST /__faults/resume`` undoes it. ``POST /__faults/skip`` with ``{"topic": T, "count":
N}``: faust's consumer drops the next N records it fetches of topic T before they reach a
faust stream (the position moves past them; nothing is acknowledged) -- what faust does to
records fetched while an assignment is being recovered. The worker's topics are read by
its own consumers, so a drop there must find nothing to drop.

With ``FAULTS_KILL_IN_CORRECTION=replaying`` the worker SIGKILLs itself when the derivation
of the first correction it takes lands (the labels applied again in its derivation process,
the correction's note durable, nothing of the result written); with ``=writing``, once the
checkpoints the derivation rewrote are durable and before the first model version it makes
is written.

With ``FAULTS_OLD_GROUP_DOWN=1`` in its environment, the worker cannot read where its faust
group (``<app_id>``) left off: every attempt fails as a broker that does not answer would,
until ``POST /__faults/old-group`` with ``{"down": false}``. Run as a script with the
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
    from service.stream.kafka.internals import Worker

    parser = argparse.ArgumentParser(prog="faultworker")
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--broker", required=True)
    parser.add_argument("--web-port", type=int, required=True)
    args = parser.parse_args(argv)
    settings = load_settings(args.config, broker=args.broker, web={"port": args.web_port})
    skip = _install_skipper()
    old_group = _install_old_group_switch()
    _install_correction_killer()
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
            return self.bytes(
                json.dumps({"skipping": skip}).encode(), content_type="application/json"
            )

    @app.page("/__faults/old-group")
    class OldGroup(faust.web.View):  # type: ignore[misc]
        async def post(self, request: Any) -> Any:
            old_group["down"] = bool(json.loads(await request.read())["down"])
            return self.bytes(json.dumps(old_group).encode(), content_type="application/json")

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


def _install_old_group_switch() -> dict[str, bool]:
    """Wrap aiokafka's admin ``list_consumer_group_offsets`` (how the worker reads where its
    faust group left off) so that it fails while ``switch["down"]``, as a coordinator that
    does not answer does."""
    import os

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaConnectionError

    switch = {"down": os.environ.get("FAULTS_OLD_GROUP_DOWN") == "1"}
    original = AIOKafkaAdminClient.list_consumer_group_offsets

    async def listed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if switch["down"]:
            raise KafkaConnectionError("fault: the group coordinator does not answer")
        return await original(self, *args, **kwargs)

    AIOKafkaAdminClient.list_consumer_group_offsets = listed  # type: ignore[method-assign]
    return switch


def _install_correction_killer() -> None:
    """``FAULTS_KILL_IN_CORRECTION`` (module docstring): die when the derivation of the first
    correction lands, before anything of it is written (``replaying``: its note is durable,
    the labels were applied again in the derivation process), or once the checkpoints it
    rewrote are durable, before the first model version (``writing``)."""
    import os
    import signal

    where = os.environ.get("FAULTS_KILL_IN_CORRECTION")
    if where is None:
        return
    from service.stream.labels.corrector import Corrector

    def die() -> None:
        print(f"fault: SIGKILL while {where} a correction", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "replaying":
        landed = Corrector._landed

        async def landed_then_die(self: Any, group: str) -> None:
            die()
            await landed(self, group)

        Corrector._landed = landed_then_die  # type: ignore[method-assign]
        return
    write = Corrector.write_versions

    async def write_then_die(self: Any, *args: Any, **kw: Any) -> None:
        die()
        await write(self, *args, **kw)

    Corrector.write_versions = write_then_die  # type: ignore[method-assign]


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
