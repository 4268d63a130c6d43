"""The start-up check of the connection to Kafka: TLS and login, before anything else.

aiokafka's clients retry a bootstrap that fails and log why at each attempt; a worker with a
wrong password or an untrusted certificate would then wait forever, not ready, with the
reason deep in its log. :func:`check_login` connects to the bootstrap servers once, as every
client of the settings will (same TLS context, same SASL login), and turns a definite
refusal into a :class:`~service.stream.errors.KafkaLoginError` whose message names the
setting to fix and never a secret:

- the broker's certificate does not chain to a trusted CA: ``security.ca_file``;
- it does not name the host connected to: ``security.check_hostname`` (or the broker
  address);
- a TLS handshake with a listener that speaks no TLS: ``security.protocol``;
- the broker refuses the login or the mechanism: ``security.username`` /
  ``security.password`` / ``security.sasl_mechanism``.

A broker that does not answer at all is not a login problem: the check gives up quietly
after ``timeout`` seconds and the worker waits for Kafka as it always did.

Uses ``aiokafka.conn.create_conn`` (aiokafka 0.14.0; public module function): the bootstrap
of aiokafka's clients catches the error it raises and keeps only a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time

from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from service.config import Settings
from service.stream.errors import KafkaLoginError

__all__ = ["check_login", "describe_refusal"]

log = logging.getLogger(__name__)


def _address(server: str) -> tuple[str, int]:
    host, _, port = server.rpartition(":")
    return host.strip("[]"), int(port)


def describe_refusal(settings: Settings, server: str, exc: BaseException) -> str | None:
    """What to tell the operator about ``exc`` met connecting to ``server``; None when it is
    not a refusal of the certificate or the login (a broker down, a network error).

    >>> s = Settings(security={"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
    ...                        "username": "svc", "password": "hunter2-hunter2"})
    >>> print(describe_refusal(s, "k:9093", SaslAuthenticationFailed("bad creds")))
    Kafka at k:9093 refused the login of user 'svc' (SCRAM-SHA-512): check security.username and security.password (bad creds)
    >>> describe_refusal(s, "k:9093", ConnectionRefusedError()) is None
    True
    """  # noqa: E501
    sec = settings.security
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or str(exc)
        if "mismatch" in reason.lower():
            return (
                f"the TLS certificate of Kafka at {server} does not name that host "
                f"({reason}): connect by a name the certificate carries (broker), or turn "
                "security.check_hostname off explicitly"
            )
        trusted = f"security.ca_file {str(sec.ca_file)!r}" if sec.ca_file else "the system CAs"
        return (
            f"the TLS certificate of Kafka at {server} is not trusted ({reason}): set "
            f"security.ca_file to the CA that signed it (now: {trusted})"
        )
    if isinstance(exc, ssl.SSLError):
        return (
            f"the TLS handshake with Kafka at {server} failed ({exc.reason or exc}): is "
            f"security.protocol {sec.protocol} what that listener speaks?"
        )
    if isinstance(exc, UnsupportedSaslMechanismError):
        return (
            f"Kafka at {server} does not accept security.sasl_mechanism {sec.sasl_mechanism}"
            f" ({_kafka_message(exc)})"
        )
    if isinstance(exc, SaslAuthenticationFailed):
        user = sec.username.get_secret_value() if sec.username is not None else "?"
        return (
            f"Kafka at {server} refused the login of user {user!r} ({sec.sasl_mechanism}): "
            f"check security.username and security.password ({_kafka_message(exc)})"
        )
    return None


def _kafka_message(exc: KafkaError) -> str:
    return str(exc.args[0]) if exc.args else type(exc).__name__


async def check_login(settings: Settings, *, timeout: float = 10.0) -> None:
    """Connect to the bootstrap servers (one after the other, until one accepts) as the
    settings' clients will; :class:`KafkaLoginError` at the first definite refusal. Plain
    ``PLAINTEXT`` settings have nothing to check."""
    sec = settings.security
    if not (sec.uses_ssl or sec.uses_sasl):
        return
    kwargs = sec.aiokafka_kwargs()
    deadline = time.monotonic() + timeout
    for server in settings.bootstrap_servers:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        host, port = _address(server)
        try:
            conn = await asyncio.wait_for(
                create_conn(
                    host,
                    port,
                    request_timeout_ms=int(left * 1000),
                    max_idle_ms=int(left * 1000) + 1000,
                    **kwargs,
                ),
                left,
            )
        except (OSError, KafkaError, TimeoutError) as exc:
            problem = describe_refusal(settings, server, exc)
            if problem is not None:
                raise KafkaLoginError(problem) from None  # the cause may quote settings
            log.debug("login check: %s did not answer (%r)", server, exc)
            continue
        with contextlib.suppress(Exception):
            conn.close()
        return
