"""App wiring without a broker: agents, co-partitioned tables, credentials."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import faust

from service.config import KafkaSecurity, Settings
from service.stream.app import create_app
from service.stream.kafka.clients import broker_credentials

WILDCARD = "0.0.0.0"  # noqa: S104 - the bind address under test


def test_app_wires_a_scoring_loop_a_learning_loop_and_co_partitioned_tables(
    tmp_path: Path,
) -> None:
    settings = Settings(app_id="wiring", datadir=tmp_path, partitions={"labels": 3})
    app = create_app(settings)
    assert not app.agents  # neither path goes through faust's per-record stream
    assert not app.tables  # the learner's tables are its own (service.stream.labels.tables)
    scoring, learning = app.parts.scoring, app.parts.learning

    async def made(factory: Any, listener: Any) -> tuple[Any, ...]:
        consumer = factory(listener)  # aiokafka clients are made inside a running loop
        try:  # no public accessors for the group and the commit mode
            return (consumer.subscription(), consumer._group_id, consumer._enable_auto_commit)  # noqa: SLF001
        finally:
            await consumer.stop()

    # committed only once the outputs are acknowledged, each in a group of its own
    assert asyncio.run(made(scoring.consumer_factory, scoring.listener())) == (
        {"abstain.features"},
        "wiring-score",
        False,
    )
    assert asyncio.run(made(learning.consumer_factory, None)) == (
        {"abstain.label-requests", "abstain.labels"},
        "wiring-learn",
        False,
    )
    assert app.parts.housekeeping.liveness.watched == {
        "abstain.features",
        "abstain.label-requests",
        "abstain.labels",
    }
    assert [t.topic for t in learning.tables] == [
        "wiring-pending-changelog",
        "wiring-orphans-changelog",
        "wiring-models-changelog",
        "wiring-history-changelog",
    ]
    assert app.parts.book.models["default"].version == 0
    assert not app.parts.housekeeping.status.ready
    assert not learning.view.recovery().completed  # not assigned yet


def test_security_settings_become_faust_credentials() -> None:
    assert broker_credentials(KafkaSecurity()) is None
    sasl = broker_credentials(
        KafkaSecurity(
            protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            username="u",
            password="p",  # noqa: S106
        )
    )
    assert isinstance(sasl, faust.SASLCredentials)
    assert (sasl.username, sasl.mechanism.value, sasl.ssl_context is not None) == (
        "u",
        "SCRAM-SHA-512",
        True,
    )
    assert "p" not in repr(sasl).replace("username", "")
    assert isinstance(broker_credentials(KafkaSecurity(protocol="SSL")), faust.SSLCredentials)


def test_web_binds_to_the_wildcard_but_advertises_a_reachable_name(tmp_path: Path) -> None:
    settings = Settings(app_id="web", datadir=tmp_path, web={"host": WILDCARD, "port": 7001})
    app = create_app(settings)
    assert app.conf.web_bind == WILDCARD
    assert app.conf.web_host == socket.gethostname()
    assert str(app.conf.canonical_url) == f"http://{socket.gethostname()}:7001"
