"""Session-wide test fixtures: a real single-node Kafka broker, started on demand.

- ``kafka_bootstrap`` (session): ``"127.0.0.1:PORT"`` of a broker for the whole session.
  With ``ABSTAIN_TEST_BOOTSTRAP=host:port`` set, that broker is used and none is started;
  otherwise a :class:`~service.localkafka.LocalKafka` starts on free ports in a temporary
  directory the first time a test asks for it, so unit-test-only runs never start Java.
  ``ABSTAIN_TEST_KAFKA=4`` runs that broker on the Kafka 4 line (default 3: the pinned 3.9).
- ``kafka_broker`` (function): the :class:`LocalKafka` object itself, for tests that stop,
  start, pause or resume it (broker outages). After each such test the broker is running
  and answering again. With ``ABSTAIN_TEST_BOOTSTRAP`` set these tests fail: they need a
  broker that this session controls.

The broker is stopped by PID at the end of the session, again at interpreter exit if the
session was interrupted, and the kernel kills it should this process die abruptly
(``die_with_parent``).

Everything under ``tests/integration/`` is marked ``integration`` automatically.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.localkafka import LocalKafka, StartError, find_free_ports

BOOTSTRAP_ENV = "ABSTAIN_TEST_BOOTSTRAP"
KAFKA_LINE_ENV = "ABSTAIN_TEST_KAFKA"
INTEGRATION_DIR = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(item.path).resolve().is_relative_to(INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def _local_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    if os.environ.get(BOOTSTRAP_ENV):
        pytest.fail(
            f"this test stops or starts the broker itself, which it cannot do with "
            f"{BOOTSTRAP_ENV}={os.environ[BOOTSTRAP_ENV]}; unset it to run this test"
        )
    data_dir = tmp_path_factory.mktemp("kafka")
    for attempt in range(3):  # a free port can be taken by someone else before Kafka binds
        port, controller_port = find_free_ports(2)
        kafka = LocalKafka(
            port=port,
            controller_port=controller_port,
            data_dir=data_dir,
            die_with_parent=True,
            kafka=os.environ.get(KAFKA_LINE_ENV, "3"),
        )
        atexit.register(kafka.stop)  # an interrupted session skips fixture teardown
        try:
            kafka.start()
            break
        except StartError as exc:
            atexit.unregister(kafka.stop)
            if attempt == 2 or "in use" not in str(exc):
                raise
    try:
        yield kafka
    finally:
        kafka.stop()
        atexit.unregister(kafka.stop)


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    external = os.environ.get(BOOTSTRAP_ENV)
    if external:
        return external
    kafka: LocalKafka = request.getfixturevalue("_local_kafka")
    return kafka.bootstrap


@pytest.fixture
def kafka_broker(_local_kafka: LocalKafka) -> Iterator[LocalKafka]:
    yield _local_kafka
    if _local_kafka.running_state() is None:
        _local_kafka.start()
    else:
        _local_kafka.resume()
