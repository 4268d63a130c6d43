"""``abstain models``: compare a group's models, promote a challenger, roll back.

::

    abstain models compare [--url URL] [--broker ...] [--config FILE]
    abstain models show NAME [--broker ...] [--config FILE]
    abstain models promote NAME [--if-serial N] [--broker ...] [--config FILE]
    abstain models rollback NAME --to-version V [--broker ...] [--config FILE]
    abstain models seed --model NAME FILE [--broker ...] [--config FILE]

``compare`` prints one JSON line per model (:func:`~service.stream.models.champions.comparison`):
from the models topic (what every worker serves: versions, labels, risk and interval), or
with ``--url`` from a worker's ``GET /models`` page, which adds the decisions that worker
made with each model and the share it rejected. ``show`` prints the version of NAME every
worker serves, read and checked as a worker reads it (its signature too), as one JSON
record (versions travel in a packed binary form, :mod:`service.records.packed`, that a
console tool does not print). ``promote`` writes the models topic's
champions record (signed with ``snapshot_key`` when one is set) that makes NAME serve its
group from the first batch each worker scores after reading it; ``promote`` of a group's
own name gives the route back to it. It is a compare-and-set: it writes the serial after
the one served (refusing, before writing, one no worker would take), reads the topic back
and prints the record that won (``"won": false`` and exit 1 when a promotion that raced it
won; ``--if-serial N`` writes only if the record served has serial N). ``rollback`` writes an
order on the labels topic (key: NAME's group, like its labels; signed like the champions
record; naming the version of NAME served when it was written, so that a copy of it written
later is refused): the learner that owns the group serves version V of NAME
again as its next version, at the order's place among the labels, and learns on from it;
it keeps the last ``HISTORY`` versions it wrote of each model (one a group of labels:
:mod:`service.stream.labels.state`; ``abstain models versions NAME`` lists them), another
one is refused (dead letter ``unknown_version``). ``seed`` trains NAME from a labelled
file and publishes it; it is :mod:`service.stream.cli`'s (it needs the label protocol, above
this folder), and ``abstain models seed`` is sent there.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import urllib.request
from dataclasses import dataclass, field, replace
from typing import Any

from aiokafka.errors import KafkaError

from service.config import ConfigError, Settings, common_arguments, settings_from_arguments
from service.records import SIGNATURE_HEADER, BadMessage, Champions
from service.records.champions import CHAMPIONS_KEY, CHAMPIONS_MAX_SERIAL, parse_champions
from service.records.codec import decode_json, dumps
from service.records.labels import Rollback
from service.stream.errors import StreamError
from service.stream.kafka.clients import produce_one, read_topic
from service.stream.models.book import ModelBook, champions_rank, signer_for
from service.stream.models.champions import comparison, promoted

__all__ = ["SETTLE", "main", "read_book"]

#: seconds ``promote`` waits after its write before it reads back which record won
SETTLE = 1.0


def main(argv: list[str]) -> int:
    """Entry point: ``argv`` after ``models``."""
    parser = argparse.ArgumentParser(
        prog="abstain models",
        description="champion and challengers",
        epilog="abstain models seed --model NAME FILE: train NAME from labelled history and "
        "publish it (abstain models seed --help); abstain models versions NAME: the versions "
        "of NAME kept for a rollback",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    compare = sub.add_parser("compare", help="the live comparison, one JSON line per model")
    common_arguments(compare)
    compare.add_argument("--url", help="a worker's web address (adds its decision counts)")
    show = sub.add_parser("show", help="the version of a model served, as JSON")
    common_arguments(show)
    show.add_argument("name", help="the model")
    promote = sub.add_parser("promote", help="make a challenger serve its group")
    common_arguments(promote)
    promote.add_argument("name", help="the model to serve")
    promote.add_argument(
        "--if-serial",
        type=int,
        dest="if_serial",
        help="only if the champions record served has this serial",
    )
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
        if args.action == "show":
            return asyncio.run(_show(settings, args.name))
        if args.action == "rollback":
            return asyncio.run(_rollback(settings, args.name, args.to_version, args.by))
        return asyncio.run(_promote(settings, args.name, args.if_serial))
    except (ConfigError, ValueError, OSError, StreamError) as exc:
        print(f"abstain: {exc}", file=sys.stderr)
        return 2
    except KafkaError as exc:  # a broker that cannot be reached, or stops mid-read
        print(f"abstain: Kafka: {exc}", file=sys.stderr)
        return 2


async def _show(settings: Settings, name: str) -> int:
    if name not in settings.models:
        print(f"abstain: no model {name!r} is configured", file=sys.stderr)
        return 2
    book = await read_book(settings)
    print(book.models[name].envelope.to_json().decode())
    return 0


async def read_book(settings: Settings) -> ModelBook:
    """A model book fed with the models topic up to its end (what a starting worker reads;
    refused records are skipped)."""
    return (await _read(settings))[0]


async def _read(settings: Settings) -> tuple[ModelBook, Read]:
    """:func:`read_book`, and what ``promote`` checks: the champions records read."""
    book = ModelBook(settings, signer=signer_for(settings))
    read = Read()
    for record in await read_topic(settings, settings.topics.models):
        signature = next((v for k, v in record.headers or () if k == SIGNATURE_HEADER), None)
        champions = record.key == CHAMPIONS_KEY.encode()
        if champions:
            read.last = record.value
        try:
            book.offer(record.key, record.value, signature=signature)
        except BadMessage:
            continue
        if champions:
            read.take(parse_champions(record.value), record.value, ranked=book.signer is not None)
    return book, read


@dataclass
class Read:
    """The champions records on the models topic: the last one (what compaction keeps) and,
    per serial, the one that wins it (with a key the highest rank, else the newest)."""

    last: bytes | None = None
    best: dict[int, tuple[tuple[int, str], bytes]] = field(default_factory=dict)

    def take(self, record: Champions, raw: bytes, *, ranked: bool) -> None:
        rank = champions_rank(record, raw)
        known = self.best.get(record.serial)
        if known is None or not ranked or rank > known[0]:
            self.best[record.serial] = (rank, raw)

    def won(self, serial: int, raw: bytes) -> bool:
        """True if ``raw`` is the record that wins ``serial``."""
        best = self.best.get(serial)
        return best is not None and best[1] == raw


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


async def _promote(settings: Settings, name: str, if_serial: int | None) -> int:
    """Compare and set: write the record that follows the one served (``if_serial``: only
    if that one has this serial), read the topic back after :data:`SETTLE` seconds and say
    which record won; 1 if another did (two promotions that raced: the same serial, the
    higher rank wins, see :mod:`~service.stream.models.book`)."""
    if name not in settings.models:
        raise ValueError(f"no model named {name!r} (one of {sorted(settings.models)})")
    book, _ = await _read(settings)
    current = book.champions
    if if_serial is not None and current.serial != if_serial:
        print(
            f"abstain: not promoted: the champions record is at serial {current.serial}, "
            f"not {if_serial}",
            file=sys.stderr,
        )
        return 1
    signer = signer_for(settings)
    if signer is None and current.serial + 1 >= CHAMPIONS_MAX_SERIAL:
        print(
            f"abstain: the champions record's serial {current.serial} has no successor "
            "(a forged record?); without snapshot_key the newest record is served, so it "
            "is replaced by serial 1",
            file=sys.stderr,
        )
        current = replace(current, serial=0)
    record = promoted(settings, current, name, now=time.time())
    key, value = CHAMPIONS_KEY.encode(), record.to_json()
    headers = None if signer is None else [(SIGNATURE_HEADER, signer.sign(key, value))]
    await produce_one(settings, settings.topics.models, key, value, headers)
    await asyncio.sleep(SETTLE)
    after, read = await _read(settings)
    served = after.champions_record
    if signer is not None and served is not None and read.last != served[0]:
        # a losing record is the last one: compaction would keep it, so write the winner
        raw, signature = served
        again = None if signature is None else [(SIGNATURE_HEADER, signature)]
        await produce_one(settings, settings.topics.models, key, raw, again)
    winner = after.champions
    won = read.won(record.serial, value)
    row = {
        "serial": record.serial,
        "servers": dict(record.servers),
        "won": won,
        "served": {"serial": winner.serial, "servers": dict(winner.servers)},
    }
    print(dumps(row).decode())
    if not won:
        print(
            f"abstain: not promoted: another promotion of serial {record.serial} won (the "
            f"record served has serial {winner.serial}, servers {dict(winner.servers)}); "
            "run promote again to follow it",
            file=sys.stderr,
        )
        return 1
    if winner != record:
        print(
            f"abstain: promoted, then replaced by a later promotion (serial {winner.serial}, "
            f"servers {dict(winner.servers)})",
            file=sys.stderr,
        )
    return 0


async def _rollback(settings: Settings, name: str, version: int, by: str) -> int:
    if name not in settings.models:
        raise ValueError(f"no model named {name!r} (one of {sorted(settings.models)})")
    if version < 0:
        raise ValueError(f"--to-version must be 0 or more, got {version}")
    route = settings.learner_key(name)
    # the version it is written against: a copy written after the model's line changed
    # (this order served, or another) is refused by the learner
    base = (await read_book(settings)).models[name].version
    order = Rollback(route, name, version, by, time.time(), base_version=base)
    key, value = route.encode(), order.to_json()
    signer = signer_for(settings)
    headers = None if signer is None else [(SIGNATURE_HEADER, signer.sign(key, value))]
    await produce_one(settings, settings.topics.labels, key, value, headers)
    print(dumps({"model": name, "to_version": version, "ordered": True}).decode())
    return 0
