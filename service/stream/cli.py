"""``abstain worker`` and ``abstain labels``.

::

    abstain worker [--broker HOST:PORT] [--web-port N] [--config FILE] [--app-id ID]
    abstain labels list   [--broker ...] [--config FILE] [--limit N]
    abstain labels submit --request-id ID --label {1,-1} [--model NAME] [--by WHO]
    abstain labels correct --request-id ID --label {1,-1,none} --by WHO [--role ROLE]
                           [--model NAME]
    abstain rebuild --model NAME [--publish] [--broker ...] [--config FILE]
    abstain models seed --model NAME FILE [--format csv|libsvm] [--dry-run] [--by WHO]
    abstain models versions NAME [--broker ...] [--config FILE]

Settings come from the environment (``ABSTAIN_*``) and the optional config file; the flags
override both. ``labels list`` reads the label-requests and labels topics from the start
and prints the requests that are neither answered nor expired (JSON, one per line).
``labels correct`` writes a correction of an answered request's label (``none`` withdraws
it), signed with ``snapshot_key`` when one is set (docs/learn/corrections.md).
``rebuild`` replays a model's label log (:mod:`service.stream.labels.rebuild`) and prints the
rebuilt state's summary as JSON; ``--publish`` writes the state to the models topic.
``models seed`` trains a model from a labelled file through the learner's own protocol
(:mod:`service.stream.labels.seed`) and publishes it: a seed order on the labels topic (the
learner adopts it there and learns on from it), then the state on the models topic; both
signed with ``snapshot_key`` when one is set. ``models versions`` prints the versions of a
model its learner keeps for ``abstain models rollback`` (read from the models table's
changelog and checked as the learner checks it, signatures included): one JSON line each,
version 0 first. Both live here, not in :mod:`service.stream.models.cli`, because they need
the label protocol's tables, which sit above ``models/``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError

from service.config import ConfigError, Settings, common_arguments, settings_from_arguments
from service.learning import Parts, learner_for
from service.records import SIGNATURE_HEADER, BadMessage, Correction, Label, ModelEnvelope
from service.records.codec import decode_json, dumps
from service.records.labels import Seed
from service.stream.errors import KafkaLoginError, TopicError
from service.stream.kafka.clients import produce_one, read_topic, topic_partitions
from service.stream.kafka.groups import raw_message
from service.stream.kafka.login import check_login
from service.stream.kafka.topics import changelog_topic
from service.stream.labels.rebuild import LogRecord, Rebuilt, rebuild_model, summary
from service.stream.labels.seed import Seeded, SeedError, read_rows, seed_model
from service.stream.labels.state import ModelStore
from service.stream.labels.tables import ChangelogTable, Writes
from service.stream.models.book import signer_for
from service.stream.models.cli import read_book
from service.stream.models.served import initial_envelope

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Entry point: ``argv[0]`` is ``worker``, ``labels``, ``rebuild``, ``seed`` or
    ``versions``."""
    if not argv or argv[0] not in {"worker", "labels", "rebuild", "seed", "versions"}:
        print("usage: abstain worker|labels|rebuild ...", file=sys.stderr)
        return 2
    try:
        if argv[0] == "worker":
            return _worker(argv[1:])
        if argv[0] == "rebuild":
            return _rebuild(argv[1:])
        if argv[0] == "seed":
            return _seed(argv[1:])
        if argv[0] == "versions":
            return _versions(argv[1:])
        return _labels(argv[1:])
    except (ConfigError, TopicError) as exc:  # TopicError: a topic read only in part
        print(f"abstain: {exc}", file=sys.stderr)
        return 2
    except KafkaError as exc:  # a broker that cannot be reached, or stops mid-read
        print(f"abstain: Kafka: {exc}", file=sys.stderr)
        return 2


def _worker(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="abstain worker", description="run a stream worker")
    common_arguments(parser)
    parser.add_argument("--web-port", type=int, help="HTTP port (metrics, health, labels)")
    parser.add_argument("--datadir", type=Path, help="scratch directory of the worker")
    parser.add_argument("--loglevel", default=None, help="debug, info, warning, error")
    args = parser.parse_args(argv)
    settings = settings_from_arguments(args, datadir=args.datadir)
    if args.web_port is not None:
        web = settings.web.model_copy(update={"port": args.web_port})
        settings = settings.model_copy(update={"web": web})
    return run_worker(settings, loglevel=args.loglevel or settings.log_level)


#: objects made (less those freed) between two collections of the youngest generation
#: (Python's default: 700). A label makes a model state whose lists are as long as the
#: model is wide; at 700 most were walked once or twice before they were freed (at 2^12
#: buckets, 14 % of the learner's CPU went to the collector). Objects in a cycle wait
#: longer for it; there are few.
YOUNG_COLLECTION = 20_000


def tune_collector() -> None:
    """Python's garbage collector as a worker runs it, once its app is made: what exists
    now (the modules, the app) lives as long as the process, frozen out of the collector's
    reach, so a full collection walks only what the worker made since (measured: 80,000
    objects, 50-200 ms a collection; the decisions of that long waited for it); and the
    youngest generation is collected every :data:`YOUNG_COLLECTION` objects."""
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION, *gc.get_threshold()[1:])


def run_worker(settings: Settings, *, loglevel: str = "info") -> int:
    """Start a faust worker for ``settings`` in this process; returns when it stops."""
    from service.stream.app import create_app  # noqa: PLC0415 - keep `abstain labels` light
    from service.stream.kafka.internals import Worker  # noqa: PLC0415

    try:  # a wrong password or certificate stops the start, saying which setting
        asyncio.run(check_login(settings))
    except KafkaLoginError as exc:
        print(f"abstain worker: {exc}", file=sys.stderr)
        return 2
    app = create_app(settings)
    tune_collector()
    worker = Worker(app, loglevel=loglevel, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0  # pragma: no cover - execute_from_commandline always exits


def _labels(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="abstain labels", description="label queue")
    sub = parser.add_subparsers(dest="action", required=True)
    lst = sub.add_parser("list", help="print pending label requests (JSON lines)")
    common_arguments(lst)
    lst.add_argument("--limit", type=int, default=100)
    sb = sub.add_parser("submit", help="submit a true label for a request")
    common_arguments(sb)
    sb.add_argument("--request-id", required=True)
    sb.add_argument("--label", type=int, choices=[1, -1], required=True)
    sb.add_argument("--model", default=None)
    sb.add_argument("--by", default="cli")
    co = sub.add_parser("correct", help="correct (or withdraw: none) a request's label")
    common_arguments(co)
    co.add_argument("--request-id", required=True)
    co.add_argument("--label", choices=["1", "-1", "none"], required=True)
    co.add_argument("--by", required=True, help="the person correcting")
    co.add_argument("--role", choices=["reviewer", "author"], default="reviewer")
    co.add_argument("--model", default=None)
    args = parser.parse_args(argv)
    settings = settings_from_arguments(args)
    if args.action == "correct":
        return _correct(settings, args)
    if args.action == "list":
        pending = asyncio.run(pending_requests(settings, now=time.time()))
        for entry in pending[: args.limit]:
            print(dumps(entry).decode())
        print(f"{len(pending)} pending", file=sys.stderr)
        return 0
    label = Label(
        request_id=args.request_id,
        model=args.model or settings.default_model,
        label=args.label,
        labelled_by=args.by,
        ts=time.time(),
    )
    asyncio.run(submit_label(settings, label))
    print(f"submitted label {label.label} for request {label.request_id}")
    return 0


def _correct(settings: Settings, args: argparse.Namespace) -> int:
    if not args.by.strip():
        print("abstain labels correct: --by must name the person correcting", file=sys.stderr)
        return 2
    correction = Correction(
        args.request_id,
        args.model or settings.default_model,
        None if args.label == "none" else int(args.label),
        args.by,
        args.role,
        time.time(),
    )
    value, key = correction.to_json(), correction.model.encode()
    signer = signer_for(settings)
    headers = None if signer is None else [(SIGNATURE_HEADER, signer.sign(key, value))]
    asyncio.run(produce_one(settings, settings.topics.labels, key, value, headers))
    what = "withdrawn" if correction.withdraws else f"corrected to {correction.label}"
    print(
        f"the label of request {correction.request_id} {what} by {correction.by} "
        f"({correction.role}); the learner dead-letters it if it refuses it"
    )
    return 0


def _rebuild(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="abstain rebuild", description="rebuild a model by replaying its label log"
    )
    common_arguments(parser)
    parser.add_argument("--model", required=True, help="configured model name")
    parser.add_argument(
        "--publish", action="store_true", help="write the rebuilt state to the models topic"
    )
    args = parser.parse_args(argv)
    settings = settings_from_arguments(args)
    if args.model not in settings.models:
        print(f"abstain: no model named {args.model!r} in the settings", file=sys.stderr)
        return 2
    champion = settings.models[args.model].champion
    if champion is not None:
        print(
            f"abstain: {args.model!r} is a shadow of {champion!r}; rebuild replays a "
            "champion's own labels alone",
            file=sys.stderr,
        )
        return 2
    rebuilt = asyncio.run(rebuild_from_topics(settings, args.model))
    if args.publish:
        key, value = args.model.encode(), rebuilt.model.served().to_bytes()
        signer = signer_for(settings)
        headers = None if signer is None else [(SIGNATURE_HEADER, signer.sign(key, value))]
        asyncio.run(produce_one(settings, settings.topics.models, key, value, headers))
    print(dumps({**summary(rebuilt), "published": bool(args.publish)}).decode())
    return 0


def _seed(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="abstain models seed",
        description="train a model from labelled history and publish it as a new version",
    )
    common_arguments(parser)
    parser.add_argument("--model", required=True, help="configured model name")
    parser.add_argument(
        "file",
        type=Path,
        help="labelled rows: CSV (with a header naming the "
        "model's features) or LIBSVM, optionally .gz",
    )
    parser.add_argument(
        "--format",
        choices=["csv", "libsvm"],
        default=None,
        help="the file's format (default: guessed)",
    )
    parser.add_argument("--by", default="cli", help="who seeds (kept on the order)")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        dest="dry_run",
        help="train and print the summary, publish nothing",
    )
    args = parser.parse_args(argv)
    settings = settings_from_arguments(args)
    try:
        if args.model not in settings.models:
            raise SeedError(f"no model named {args.model!r} (one of {sorted(settings.models)})")
        X, y = read_rows(args.file, args.model, settings.models[args.model], args.format)
        seeded = _train(settings, args.model, X, y)
    except SeedError as exc:
        print(f"abstain: {exc}", file=sys.stderr)
        return 2
    version = None
    try:
        if not args.dry_run:
            version = asyncio.run(publish_seed(settings, seeded, by=args.by))
    except SeedError as exc:
        print(f"abstain: {exc}; nothing published", file=sys.stderr)
        return 2
    model = seeded.model
    out = {
        "model": model.model,
        "rows": seeded.rows,
        "risk": seeded.risk,
        "rejected": seeded.rejected,
        "wrong": seeded.wrong,
        "rho": float(learner_for(dict(model.learner), Parts()).rho),
        "version": version,
        "published": version is not None,
    }
    print(dumps(out).decode())
    return 0


def _versions(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="abstain models versions",
        description="the versions of a model kept for a rollback, one JSON line each",
    )
    common_arguments(parser)
    parser.add_argument("name", help="the model")
    args = parser.parse_args(argv)
    settings = settings_from_arguments(args)
    if args.name not in settings.models:
        print(f"abstain: no model {args.name!r} is configured", file=sys.stderr)
        return 2
    for row in asyncio.run(kept_versions(settings, args.name)):
        print(dumps(row).decode())
    return 0


async def kept_versions(settings: Settings, name: str) -> list[dict[str, Any]]:
    """The versions of ``name`` its learner keeps (0, the configured one, then those in
    the models table, ``<name>@<version>``), read from the table's changelog and checked
    as the learner reads it back; the current one says so."""
    topic = changelog_topic(settings.app_id, "models")
    table = ChangelogTable(topic, Writes(), signer=signer_for(settings))
    by_partition: dict[int, list[Any]] = {}
    for r in await read_topic(settings, topic):
        by_partition.setdefault(r.partition, []).append(r)
    for partition, records in by_partition.items():
        table.load(partition, [(r.offset, r.key, r.value, r.headers or ()) for r in records])
    store = ModelStore(table, {name: initial_envelope(name, settings.models[name])})
    try:
        current: int | None = store.get(name).version
    except BadMessage:  # unreadable: the learner refuses it too, and says so when it starts
        current = None
    rows = []
    for version in [0, *store.kept(name)]:
        try:
            envelope = store.version(name, version)
        except BadMessage as bad:
            rows.append({"model": name, "version": version, "unreadable": bad.detail})
            continue
        if envelope is None:
            continue
        rows.append(
            {
                "model": name,
                "version": version,
                "labels_applied": envelope.labels_applied,
                "risk": None if envelope.iw_weight <= 0 else envelope.risk,
                "updated_at": envelope.updated_at,
                "current": version == current,
            }
        )
    return rows


def _train(settings: Settings, name: str, X: Any, y: Any) -> Seeded:
    """:func:`seed_model` with a progress bar on a terminal (tqdm, on stderr)."""
    from tqdm import tqdm  # noqa: PLC0415 - only this command draws one

    quiet = len(y) < 2_000 or not sys.stderr.isatty()
    with tqdm(total=len(y), unit="row", desc=f"seeding {name}", disable=quiet) as bar:
        return seed_model(settings, name, X, y, now=time.time(), progress=bar.update)


async def publish_seed(settings: Settings, seeded: Seeded, *, by: str) -> int:
    """Write ``seeded`` as the next version of its model: a :class:`~service.records.Seed`
    order on the labels topic (key: the model's group, where the learner reads it; signed
    itself with ``snapshot_key``, and naming the version served now, so that a copy of it
    written later is refused), then the same state, with the same signature, on the models
    topic. The version is one above what the models topic serves now; the learner numbers
    it one above its own when it adopts it. Returns the version published."""
    name = seeded.model.model
    await _topics_ready(settings)
    book = await read_book(settings)
    envelope: ModelEnvelope = seeded.model.replace(version=book.models[name].version + 1)
    value = envelope.to_json()
    signer = signer_for(settings)
    signature = None if signer is None else signer.sign(name.encode(), value)
    route = settings.learner_key(name)
    order = Seed(
        route,
        name,
        value,
        None if signature is None else signature.decode(),
        by,
        time.time(),
        rows=seeded.rows,
        base_version=book.models[name].version,
    )
    record = order.to_json()
    if len(record) > settings.max_message_bytes:  # the learner would refuse it as too big
        raise SeedError(
            f"the seed order is {len(record)} bytes, over max_message_bytes "
            f"({settings.max_message_bytes})"
        )
    signed = None if signer is None else [(SIGNATURE_HEADER, signer.sign(route.encode(), record))]
    await produce_one(settings, settings.topics.labels, route.encode(), record, signed)
    headers = None if signature is None else [(SIGNATURE_HEADER, signature)]
    await produce_one(settings, settings.topics.models, name.encode(), value, headers)
    return envelope.version


async def _topics_ready(settings: Settings) -> None:
    """The labels and models topics exist with their configured partitions (a write to a
    missing one would create it with the broker's defaults, which the worker then refuses);
    :class:`SeedError` otherwise."""
    wanted = {
        settings.topics.labels: settings.partitions.labels,
        settings.topics.models: settings.partitions.models,
    }
    kwargs = settings.security.aiokafka_kwargs()
    for topic, partitions in wanted.items():
        try:
            tps = await topic_partitions(
                settings.bootstrap_servers, topic, attempts=1, client_kwargs=kwargs
            )
        except TopicError:
            raise SeedError(
                f"topic {topic!r} does not exist: start a worker once (it creates its "
                "topics) or create them as topic_policy says"
            ) from None
        if len(tps) != partitions:
            raise SeedError(
                f"topic {topic!r} has {len(tps)} partitions, the settings say {partitions}"
            )


async def rebuild_from_topics(settings: Settings, model: str) -> Rebuilt:
    """Read the label-requests and labels topics from the start and rebuild ``model``."""

    def records(raw: list[Any]) -> list[LogRecord]:
        return [
            LogRecord(
                r.partition, r.offset, int(r.timestamp), r.value, r.key, raw_message(r).signature
            )
            for r in raw
            if r.value is not None
        ]

    requests = records(await read_topic(settings, settings.topics.label_requests))
    labels = records(await read_topic(settings, settings.topics.labels))
    return rebuild_model(settings, model, requests, labels)


async def submit_label(settings: Settings, label: Label) -> None:
    """Produce ``label`` to the labels topic (key = model) and wait until it is durable."""
    await produce_one(settings, settings.topics.labels, label.model.encode(), label.to_json())


async def pending_requests(settings: Settings, *, now: float) -> list[dict[str, Any]]:
    """Label requests not yet answered (no label seen) and not expired, by priority."""
    answered: set[str] = set()
    for rec in await read_topic(settings, settings.topics.labels):
        try:
            obj = decode_json(rec.value)
        except BadMessage:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("request_id"), str):
            answered.add(obj["request_id"])
    pending: dict[str, dict[str, Any]] = {}
    for rec in await read_topic(settings, settings.topics.label_requests):
        try:
            obj = decode_json(rec.value)
        except BadMessage:
            continue
        if not isinstance(obj, dict) or obj.get("request_id") in answered:
            continue
        if float(obj.get("expires_at", 0.0)) < now:
            continue
        pending.setdefault(str(obj["request_id"]), obj)
    return sorted(pending.values(), key=lambda p: -float(p.get("priority", 0.0)))
