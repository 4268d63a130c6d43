"""The session broker speaks every request the clients may send, on each supported Kafka
line. Kafka 4 removed the oldest versions of many requests (KIP-896); aiokafka picks, per
request, the newest version both sides know (from the broker's ApiVersions answer), so a
request is usable as long as one of its versions in aiokafka is one the broker serves.

Run on the Kafka 4 line with ``ABSTAIN_TEST_KAFKA=4`` (``make test`` does, for the smoke
subset: this module, tests/integration/test_broker.py and test_service.py)."""

from __future__ import annotations

import asyncio
import importlib
import os
import pkgutil
from collections.abc import Iterator

import aiokafka.protocol
import pytest
from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.admin import ApiVersionRequest
from aiokafka.protocol.api import Request

from service.localkafka import KAFKA_LINES, LocalKafka, pinned_kafka_version

KAFKA_LINE_ENV = "ABSTAIN_TEST_KAFKA"


def _request_types() -> Iterator[type[Request]]:
    for module in pkgutil.iter_modules(aiokafka.protocol.__path__):
        importlib.import_module(f"aiokafka.protocol.{module.name}")
    todo, seen = list(Request.__subclasses__()), set()
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls not in seen and hasattr(cls, "_CLASSES"):
            seen.add(cls)
            yield cls


async def _served(bootstrap: str) -> dict[int, tuple[int, int]]:
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        node = next(iter(client.cluster.brokers())).nodeId
        answer = await client.send(node, ApiVersionRequest())
        return {key: (low, high) for key, low, high in answer.api_versions}
    finally:
        await client.close()


def test_every_request_aiokafka_can_send_has_a_version_the_broker_serves(
    kafka_bootstrap: str,
) -> None:
    served = asyncio.run(_served(kafka_bootstrap))
    unusable = {}
    for cls in _request_types():
        versions = sorted(struct.API_VERSION for struct in cls._CLASSES)
        low, high = served.get(cls.API_KEY, (1, 0))
        if not any(low <= v <= high for v in versions):
            unusable[cls.__name__] = (versions, served.get(cls.API_KEY))
    assert len(list(_request_types())) > 30  # the catalogue was found
    assert unusable == {}
    # the requests the worker relies on are served in a version newer than Kafka 4's floor
    for key in (0, 1, 3, 8, 9, 11, 19, 32):  # produce, fetch, metadata, commit, ... configs
        assert key in served, key


def test_the_session_broker_runs_the_kafka_line_asked_for(
    kafka_bootstrap: str, request: pytest.FixtureRequest
) -> None:
    if os.environ.get("ABSTAIN_TEST_BOOTSTRAP"):
        pytest.skip("an external broker: its version is not ours to say")
    line = os.environ.get(KAFKA_LINE_ENV, "3")
    kafka: LocalKafka = request.getfixturevalue("_local_kafka")
    assert kafka.kafka_version == pinned_kafka_version(KAFKA_LINES[line])
    assert kafka.kafka_version.startswith(f"{line}.")
    assert kafka.status().answering
