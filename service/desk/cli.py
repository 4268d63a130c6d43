"""``abstain desk``: the label desk server, and ``abstain desk hash-password``.

::

    abstain desk [--config FILE] [--broker HOST:PORT] [--app-id ID] [--host H] [--port N]
                 [--users FILE]
    abstain desk hash-password            (reads the password from the terminal or stdin)

The desk follows the topics of the app id in the settings (docs/operate/desk.md); its own settings
are the ``desk`` section (``ABSTAIN_DESK__*``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import logging
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from service.config import ConfigError, Settings, load_settings
from service.desk.auth.accounts import Accounts
from service.desk.auth.logins import LoginGate
from service.desk.auth.passwords import hash_password
from service.desk.auth.sessions import Sessions
from service.desk.backlog import DeskQueue
from service.desk.core import Desk
from service.desk.errors import AccountsError
from service.desk.feeds import (
    Feeds,
    KafkaLabelSink,
    KafkaLabelsLog,
    KafkaLeaseLog,
    KafkaRevocationLog,
    ensure_desk_topics,
    make_producer,
)
from service.desk.leases import LeaseBook
from service.desk.metrics import DeskMetrics
from service.desk.review import Review, ReviewBook
from service.desk.web import DeskWeb
from service.stream.errors import KafkaLoginError
from service.stream.kafka.login import check_login

__all__ = ["main", "serve"]

log = logging.getLogger("service.desk")


def main(argv: list[str]) -> int:
    """Entry point (``argv`` after ``desk``)."""
    if argv[:1] == ["hash-password"]:
        return _hash_password(argv[1:])
    parser = argparse.ArgumentParser(prog="abstain desk", description="the label desk")
    parser.add_argument("--config", type=Path, help="settings file (.json or .toml)")
    parser.add_argument("--broker", help="bootstrap server(s), comma separated host:port")
    parser.add_argument("--app-id", help="application id of the workers to serve")
    parser.add_argument("--host", help="bind address (desk.host)")
    parser.add_argument("--port", type=int, help="HTTP port (desk.port)")
    parser.add_argument("--users", type=Path, help="users file (desk.users_file)")
    args = parser.parse_args(argv)
    try:
        settings = _settings(args)
        accounts = _accounts(settings)
        asyncio.run(check_login(settings))
    except (ConfigError, AccountsError, KafkaLoginError) as exc:
        print(f"abstain desk: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(serve(settings, accounts))
    return 0


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if args.broker:
        overrides["broker"] = args.broker
    if args.app_id:
        overrides["app_id"] = args.app_id
    settings = load_settings(args.config, **overrides)
    desk = {
        k: v
        for k, v in {"host": args.host, "port": args.port, "users_file": args.users}.items()
        if v is not None
    }
    if desk:
        settings = settings.model_copy(update={"desk": settings.desk.model_copy(update=desk)})
    return settings


def _accounts(settings: Settings) -> Accounts:
    path = settings.desk.users_file
    if path is None:
        if settings.desk.auth == "users":
            raise AccountsError(
                "desk.users_file is not set (auth = users): create one with "
                "`abstain desk hash-password`, see docs/operate/desk.md"
            )
        return Accounts({})
    accounts = Accounts.load(path, passwords=settings.desk.auth == "users")
    if settings.desk.auth == "users" and not accounts:
        raise AccountsError(f"users file {str(path)!r} lists nobody")
    return accounts


def _hash_password(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="abstain desk hash-password",
        description="print a salted scrypt hash for a users file",
    )
    parser.parse_args(argv)
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            print("abstain desk: the passwords differ", file=sys.stderr)
            return 2
    else:
        password = sys.stdin.readline().rstrip("\n")
    if len(password) < 8:
        print("abstain desk: give at least 8 characters", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0


async def _tick(desk: Desk) -> None:
    """Once a second: expire, forget, compute the team view and set the gauges."""
    while True:
        await asyncio.sleep(1.0)
        if desk.ready:
            desk.tick()


async def _models(settings: Settings) -> Any:
    """The models topic, followed for the top features (the worker's own follower)."""
    from service.stream.kafka.clients import consumer_options  # noqa: PLC0415
    from service.stream.models.book import ModelBook, follow_models, signer_for  # noqa: PLC0415

    book = ModelBook(settings, signer=signer_for(settings))

    async def follow() -> None:
        while True:
            try:
                kwargs = consumer_options(settings)
                await follow_models(settings, book, consumer_kwargs=kwargs)
            except Exception:  # the desk works without snapshots; say why and try again
                log.exception("following the models topic failed; retrying in 5 s")
                await asyncio.sleep(5.0)

    return book, follow


async def serve(settings: Settings, accounts: Accounts) -> None:
    """Run the desk until SIGTERM / SIGINT."""
    key = settings.desk.session_key
    if key is None:
        log.warning("desk.session_key is not set: sessions end when this desk restarts")
    sessions = Sessions(
        key.get_secret_value().encode() if key else secrets.token_bytes(32),
        lifetime=settings.desk.session_seconds,
        clock=time.time,
    )
    await ensure_desk_topics(settings)
    producer = make_producer(settings)
    await producer.start()
    queue, folded = DeskQueue(clock=time.time), asyncio.Condition()
    leases = LeaseBook(
        lease_seconds=settings.desk.lease_seconds,
        answer_seconds=2 * (settings.desk.ack_timeout_seconds + 1.0),
    )
    metrics = DeskMetrics(CollectorRegistry(), models=settings.models)
    book, follow = await _models(settings)
    replica = settings.desk.replica or socket.gethostname()
    lease_log = KafkaLeaseLog(settings, producer, leases, folded)
    answers = ReviewBook(settings, clock=time.time)
    review = Review(
        settings,
        book=answers,
        leases=leases,
        lease_log=lease_log,
        labels=KafkaLabelsLog(settings, producer, answers, folded),
        metrics=metrics,
        clock=time.time,
        replica=replica,
        models=lambda: book.models,
        folded=folded,
    )
    desk = Desk(
        settings,
        queue=queue,
        leases=leases,
        metrics=metrics,
        clock=time.time,
        log=lease_log,
        sink=KafkaLabelSink(settings, producer),
        replica=replica,
        review=review,
    )
    logins = LoginGate(accounts, clock=time.time)
    app = DeskWeb(
        settings,
        desk,
        accounts,
        sessions,
        models=lambda: book.models,
        logins=logins,
        revocations=KafkaRevocationLog(settings, producer),
    ).app()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, settings.desk.host, settings.desk.port).start()
    log.info("desk on http://%s:%s", settings.desk.host, settings.desk.port)
    tasks = [
        asyncio.create_task(c)
        for c in (Feeds(settings, desk, folded, sessions).run(), _tick(desk), follow())
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    done = asyncio.create_task(stop.wait())
    await asyncio.wait([done, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    await runner.cleanup()
    logins.close()
    await producer.stop()
