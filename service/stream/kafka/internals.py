"""Every use of faust-streaming internals, in one place.

faust runs the worker (its lifecycle, the web server, the timer and the app tasks); the
worker's inputs are read by its own aiokafka consumers (:mod:`service.stream.scoring.loop`,
:mod:`service.stream.labels.loop`), so no faust consumer, stream or table internals are used
any more. When faust is upgraded, this module is what to read again: each access below
names the version it was written against and why it is needed.

- ``Worker._setup_spinner_handler``'s side effect on the root logger: :class:`Worker`.

No aiokafka internals are used (aiokafka 0.14.0).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

import faust

__all__ = ["App", "Worker"]


class App(faust.App):
    """The faust app of a worker: carries its parts (set by
    :func:`service.stream.app.create_app`)."""

    parts: Any = None  # service.stream.app.Parts


class Worker(faust.Worker):
    """faust's worker, with the log level it was given once it has started.

    faust-streaming 0.15.3: at ``warning`` or above, ``Worker._setup_spinner_handler`` sets
    the root logger to DEBUG (so its start-up spinner turns on every record) and never sets
    it back: every aiokafka send then builds a debug record that no handler prints (5 % of
    a busy worker's time). Once started, the root logger gets the configured level back and
    the spinner's handler goes."""

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        root = logging.getLogger()
        for handler in list(root.handlers):
            if type(handler).__name__ == "SpinnerHandler":
                root.removeHandler(handler)
        level = self.loglevel
        root.setLevel(level.upper() if isinstance(level, str) else level or logging.WARNING)
        # what start-up made (modules, faust's services, aiokafka's clients: ~90,000 objects)
        # lives as long as the process: out of the collector's sight, a full collection no
        # longer walks it (measured ~50 ms each, a stall of every event in flight)
        gc.collect()
        gc.freeze()
