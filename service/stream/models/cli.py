"""``abstain models``: compare a group's models, promote a challenger, roll back.

::

    abstain models compare [--url URL] [--broker ...] [--config FILE]
    abstain models promote NAME [--broker ...] [--config FILE]
    abstain models rollback NAME --to-version V [--broker ...] [--config FILE]
    abstain models seed --model NAME FILE [--broker ...] [--config FILE]

``compare`` prints one JSON line per model (:func:`~service.stream.models.champions.comparison`):
from the models topic (what every worker serves: versions, labels, risk and interval), or
with ``--url`` from a worker's ``GET /models`` page, which adds the decisions that worker
made with each model and the share it rejected. ``promote`` writes the models topic's
champions record (signed with ``snapshot_key`` when one is set) that makes NAME serve its
group from the first batch each worker scores after reading it; ``promote`` of a group's
own name gives the route back to it. ``rollback`` writes an order on the labels topic (key:
NAME's group, like its labels): the learner that owns the group serves version V of NAME
again as its next version, at the order's place among the labels, and learns on from it;
it keeps the last ``HISTORY`` versions of each model (:mod:`service.stream.labels.state`), an
older one is refused (dead letter ``unknown_version``). ``seed`` trains NAME from a labelled
file and publishes it; it is :mod:`service.stream.cli`'s (it needs the label protocol, above
this folder), and ``abstain models seed`` is sent there.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.request
from typing import Any

from service.config import ConfigError, Settings, common_arguments, settings_from_arguments
from service.records import (
    CHAMPIONS_KEY,
    SIGNATURE_HEADER,
    BadMessage,
    Rollback,
    decode_json,
    dumps,
)
from service.stream.kafka.clients import produce_one, read_topic
from service.stream.models.book import ModelBook, signer_for
from service.stream.models.champions import comparison, promoted

__all__ = ["main", "read_book"]


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` after ``models``."""
    parser = argparse.ArgumentParser(
        prog="abstain models", description="champion and challengers",
        epilog="abstain models seed --model NAME FILE: train NAME from labelled history and "
        "publish it (abstain models seed --help)",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="action", required=True)
    compare = sub.add_parser("compare", help="the live comparison, one JSON line per model")
    common_arguments(compare)
    compare.add_argument("--url", help="a worker's web address (adds its decision counts)")
    promote = sub.add_parser("promote", help="make a challenger serve its group")
    common_arguments(promote)
    promote.add_argument("name", help="the model to serve")
    rollback = sub.add_parser("rollback", help="serve an earlier version again")
    common_arguments(rollback)
    rollback.add_argument("name", help="the model to roll back")
    rollback.add_argument("--to-version", type=int, required=True, dest="to_version")
    rollback.add_argument("--by", default="cli", help="who asks (kept on the record)")
    args = parser.parse_args(argv)
    try:
        settings = settings_from_arguments(args)
        if args.action == "compare":
            rows = _from_page(args.url) if args.url else asyncio.run(_compare(settings))
            for row in rows:
                print(dumps(row).decode())
            return 0
        if args.action == "rollback":
            return asyncio.run(_rollback(settings, args.name, args.to_version, args.by))
        return asyncio.run(_promote(settings, args.name))
    except (ConfigError, ValueError, OSError) as exc:
        print(f"abstain: {exc}", file=sys.stderr)
        return 2


async def read_book(settings: Settings) -> ModelBook:
    """A model book fed with the models topic up to its end (what a starting worker reads;
    refused records are skipped)."""
    book = ModelBook(settings, signer=signer_for(settings))
    for record in await read_topic(settings, settings.topics.models):
        signature = next((v for k, v in record.headers or () if k == SIGNATURE_HEADER), None)
        try:
            book.offer(record.key, record.value, signature=signature)
        except BadMessage:
            continue
    return book


async def _compare(settings: Settings) -> list[dict[str, Any]]:
    book = await read_book(settings)
    models, champions = book.serving()
    return comparison(settings, models, champions)


def _from_page(url: str) -> list[dict[str, Any]]:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--url must start with http:// or https://, got {url!r}")
    with urllib.request.urlopen(f"{url.rstrip('/')}/models", timeout=10) as reply:  # noqa: S310
        body = decode_json(reply.read())
    rows = body.get("models") if isinstance(body, dict) else None
    if not isinstance(rows, list):
        raise ValueError(f"{url}/models did not answer a comparison")
    return rows


async def _promote(settings: Settings, name: str) -> int:
    if name not in settings.models:
        raise ValueError(f"no model named {name!r} (one of {sorted(settings.models)})")
    book = await read_book(settings)
    record = promoted(settings, book.champions, name, now=time.time())
    key, value = CHAMPIONS_KEY.encode(), record.to_json()
    signer = signer_for(settings)
    headers = None if signer is None else [(SIGNATURE_HEADER, signer.sign(key, value))]
    await produce_one(settings, settings.topics.models, key, value, headers)
    print(dumps({"serial": record.serial, "servers": dict(record.servers)}).decode())
    return 0


async def _rollback(settings: Settings, name: str, version: int, by: str) -> int:
    if name not in settings.models:
        raise ValueError(f"no model named {name!r} (one of {sorted(settings.models)})")
    if version < 0:
        raise ValueError(f"--to-version must be 0 or more, got {version}")
    route = settings.learner_key(name)
    order = Rollback(route, name, version, by, time.time())
    await produce_one(settings, settings.topics.labels, route.encode(), order.to_json())
    print(dumps({"model": name, "to_version": version, "ordered": True}).decode())
    return 0
