"""The secure mode of the local broker (``abstain kafka start --secure``): what a managed Kafka
asks of its clients, on 127.0.0.1.

- **TLS** on the client listener (``SASL_SSL``): a throwaway CA and a broker certificate for
  ``127.0.0.1`` (an IP address SAN, no DNS name: a client that connects as ``localhost``
  fails host-name verification unless it turns that off), made with Python's
  ``cryptography`` at the first secure start, PEM files in ``<data dir>/secure``.
- **SCRAM-SHA-512** logins: a super user ``admin`` (for set-up: ACLs, topics) and one user per
  part of abstain (:data:`ROLE_USERS`), created with ``kafka-storage format --add-scram``
  before the first start, with random passwords.
- **ACLs** enforced by KRaft's ``StandardAuthorizer``; nothing is allowed without an ACL
  (``abstain kafka acls --apply`` sets what each part needs).
- The controller listener (loopback, broker to controller) logs in with SASL PLAIN as
  ``admin`` (KRaft controllers cannot check SCRAM logins: the credentials live in the
  metadata they serve).

Each user gets a settings file, ``<data dir>/secure/<user>.json`` (mode 0600), that
``--config`` or ``ABSTAIN_CONFIG`` reads: broker, protocol, mechanism, user, password and CA.

>>> SecureFiles(Path("/d/secure")).ca_file
PosixPath('/d/secure/ca.pem')
>>> SecureFiles(Path("/d/secure")).settings_file("abstain-desk")
PosixPath('/d/secure/abstain-desk.json')
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.localkafka.errors import StartError

__all__ = [
    "ADMIN_USER",
    "MECHANISM",
    "ROLE_USERS",
    "SecureFiles",
    "TlsMaterial",
    "admin_ready",
    "make_tls",
    "secure_properties",
]

ADMIN_USER = "admin"
#: the SCRAM user of each part of abstain (``abstain kafka acls --role``)
ROLE_USERS = {"worker": "abstain-worker", "desk": "abstain-desk", "operator": "abstain-operator"}
MECHANISM = "SCRAM-SHA-512"
_VALID_DAYS = 825


@dataclass(frozen=True, slots=True)
class SecureFiles:
    """Where a secure broker keeps its TLS material, passwords and client settings."""

    root: Path

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def keystore(self) -> Path:
        """The broker's private key and certificate chain, one PEM file."""
        return self.root / "broker.pem"

    @property
    def passwords(self) -> Path:
        return self.root / "passwords.json"

    def settings_file(self, user: str) -> Path:
        return self.root / f"{user}.json"

    def exists(self) -> bool:
        return all(p.is_file() for p in (self.ca_file, self.keystore, self.passwords))

    def read_passwords(self) -> dict[str, str]:
        try:
            data = json.loads(self.passwords.read_text())
        except (OSError, ValueError) as exc:
            raise StartError(f"cannot read {self.passwords}: {exc}") from exc
        if not isinstance(data, dict) or ADMIN_USER not in data:
            raise StartError(f"{self.passwords} names no {ADMIN_USER!r} user")
        return {str(k): str(v) for k, v in data.items()}

    def create(self, users: tuple[str, ...]) -> dict[str, str]:
        """Make the CA, the broker's certificate and a password per user (kept when there)."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        if not (self.ca_file.is_file() and self.keystore.is_file()):
            material = make_tls(hosts=("127.0.0.1",))
            _write_private(self.ca_key, material.ca_key_pem)
            self.ca_file.write_bytes(material.ca_pem)
            _write_private(self.keystore, material.broker_key_pem + material.broker_pem)
        if self.passwords.is_file():
            return self.read_passwords()
        passwords = {user: secrets.token_urlsafe(24) for user in (ADMIN_USER, *users)}
        _write_private(self.passwords, json.dumps(passwords, indent=2).encode())
        return passwords

    def write_settings(self, bootstrap: str, passwords: dict[str, str]) -> dict[str, Path]:
        """A settings file per user (``--config``); returns them by user."""
        out = {}
        for user, password in passwords.items():
            settings = {
                "broker": [bootstrap],
                "security": {
                    "protocol": "SASL_SSL",
                    "sasl_mechanism": MECHANISM,
                    "username": user,
                    "password": password,
                    "ca_file": str(self.ca_file),
                },
            }
            path = self.settings_file(user)
            _write_private(path, json.dumps(settings, indent=2).encode() + b"\n")
            out[user] = path
        return out


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """PEM bytes of a CA and of a certificate it signed (with its private key)."""

    ca_pem: bytes
    ca_key_pem: bytes
    broker_pem: bytes
    broker_key_pem: bytes


def make_tls(*, hosts: tuple[str, ...], common_name: str = "abstain local Kafka") -> TlsMaterial:
    """A throwaway CA and a server certificate for ``hosts`` (IP addresses or DNS names as
    subject alternative names), EC P-256 keys, unencrypted PKCS#8.

    >>> from cryptography import x509
    >>> m = make_tls(hosts=("127.0.0.1",))
    >>> cert = x509.load_pem_x509_certificate(m.broker_pem)
    >>> [str(a) for a in cert.extensions.get_extension_for_class(
    ...     x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)]
    ['127.0.0.1']
    """
    try:
        from cryptography import x509  # noqa: PLC0415 - a dev tool's dependency
        from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - the dev extras have it
        raise StartError(
            "--secure needs Python's cryptography package (pip install cryptography, or the "
            "dev extras: pip install -e '.[dev]')"
        ) from exc

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=_VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pkcs8 = serialization.PrivateFormat.PKCS8
    none = serialization.NoEncryption()
    pem = serialization.Encoding.PEM
    return TlsMaterial(
        ca_pem=ca.public_bytes(pem),
        ca_key_pem=ca_key.private_bytes(pem, pkcs8, none),
        broker_pem=cert.public_bytes(pem) + ca.public_bytes(pem),
        broker_key_pem=key.private_bytes(pem, pkcs8, none),
    )


def _jaas(module: str, user: str, password: str, *, users: dict[str, str] | None = None) -> str:
    extra = "".join(f' user_{u}="{p}"' for u, p in (users or {}).items())
    return f'{module} required username="{user}" password="{password}"{extra};'


def secure_properties(files: SecureFiles, passwords: dict[str, str]) -> dict[str, str]:
    """What ``server.properties`` says in secure mode (over the plain node's lines): the
    client listener is ``SASL_SSL`` (SCRAM-SHA-512), the controller's ``SASL_PLAINTEXT``
    (PLAIN), ACLs on, ``admin`` the one super user."""
    admin = passwords[ADMIN_USER]
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    return {
        "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        "inter.broker.listener.name": "SASL_SSL",
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": _jaas(
            plain, ADMIN_USER, admin, users={ADMIN_USER: admin}
        ),
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": _jaas(scram, ADMIN_USER, admin),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(files.keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(files.ca_file),
        "ssl.client.auth": "none",
        "ssl.endpoint.identification.algorithm": "https",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN_USER}",
        "allow.everyone.if.no.acl.found": "false",
    }


def scram_arguments(passwords: dict[str, str]) -> list[str]:
    """``kafka-storage format`` arguments that create every user's SCRAM credential."""
    out = []
    for user, password in passwords.items():
        out += ["--add-scram", f"{MECHANISM}=[name={user},password={password}]"]
    return out


def admin_ready(files: SecureFiles, bootstrap: str, *, timeout: float = 3.0) -> bool:
    """Whether the broker answers a logged-in admin (TLS, SCRAM) with its cluster's brokers."""
    return asyncio.run(_admin_ready(files, bootstrap, timeout))


async def _admin_ready(files: SecureFiles, bootstrap: str, timeout: float) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:  # nothing listens yet: not a question for aiokafka (which logs every refusal)
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    from aiokafka.admin import AIOKafkaAdminClient  # noqa: PLC0415 - only in secure mode
    from aiokafka.errors import KafkaError  # noqa: PLC0415

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, **admin_kwargs(files), request_timeout_ms=int(timeout * 1000)
    )
    try:
        await asyncio.wait_for(admin.start(), timeout)
        cluster: dict[str, Any] = await asyncio.wait_for(admin.describe_cluster(), timeout)
        return bool(cluster.get("brokers"))
    except (KafkaError, OSError, TimeoutError):
        return False
    finally:
        await admin.close()


def admin_kwargs(files: SecureFiles) -> dict[str, Any]:
    """aiokafka keyword arguments of the super user."""
    import ssl  # noqa: PLC0415

    return {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": MECHANISM,
        "sasl_plain_username": ADMIN_USER,
        "sasl_plain_password": files.read_passwords()[ADMIN_USER],
        "ssl_context": ssl.create_default_context(cafile=str(files.ca_file)),
    }
