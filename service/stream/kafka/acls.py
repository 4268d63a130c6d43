"""The Kafka ACLs each part of abstain needs, generated from the topic catalogue and the
consumer groups: ``abstain kafka acls --role worker|desk|operator`` (docs/operate/secure-kafka.md).

Roles and what they do with Kafka:

- ``worker`` (``abstain worker``): reads and writes the topics the catalogue gives it
  (:attr:`~service.stream.kafka.topics.Entry.access`), consumes in three groups (faust's
  ``<app_id>``, the scoring loop's ``<app_id>-score``, the learner's ``<app_id>-learn``),
  reads every topic's configuration (the topic guard); with ``topic_policy.creation =
  create`` it may create each of its topics, and without ``topic_policy.replication_factor``
  it reads the brokers' ``default.replication.factor`` (the cluster's configuration);
- ``desk`` (``abstain desk``): reads the label requests, the labels, the pending changelog
  and the models, writes labels, and reads and writes its own leases and revocations topics
  (which it creates under ``creation = create``); no consumer group;
- ``operator`` (``abstain labels``, ``abstain models``, ``abstain rebuild``, ``abstain
  skip``): reads the label topics, the features and the models, writes labels, models (skip
  orders too) and dead letters; joins no consumer group, but describes the loops' groups
  (``abstain skip`` reads where they committed).

Kafka lets ``Read`` and ``Write`` on a topic imply ``Describe``; every ACL is a literal
name, allowed from any host.

>>> from service.config import Settings
>>> [str(a) for a in role_acls(Settings(), "desk", "User:abstain-desk")][:3]
['ALLOW User:abstain-desk READ TOPIC abstain.label-requests', \
'ALLOW User:abstain-desk READ TOPIC abstain.labels', \
'ALLOW User:abstain-desk WRITE TOPIC abstain.labels']
>>> [str(a) for a in role_acls(Settings(), "worker", "User:w") if a.resource == "GROUP"]
['ALLOW User:w READ GROUP abstain', 'ALLOW User:w READ GROUP abstain-score', \
'ALLOW User:w READ GROUP abstain-learn']
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from service.config import ConfigError, Settings, common_arguments, settings_from_arguments
from service.stream.errors import AclError, KafkaLoginError
from service.stream.kafka.login import check_login
from service.stream.kafka.topics import CATALOGUE

__all__ = [
    "ROLES",
    "Acl",
    "acl_commands",
    "acl_json",
    "acl_markdown",
    "apply_acls",
    "default_principal",
    "main",
    "role_acls",
]

Role = Literal["worker", "desk", "operator"]
ROLES: Final[tuple[Role, ...]] = ("worker", "desk", "operator")
Resource = Literal["TOPIC", "GROUP", "CLUSTER"]
Operation = Literal["READ", "WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"]
CLUSTER_NAME: Final = "kafka-cluster"

#: Kafka's codes (org.apache.kafka.common.acl / resource): the Admin API speaks these
RESOURCE_CODES: Final[dict[str, int]] = {"TOPIC": 2, "GROUP": 3, "CLUSTER": 4}
OPERATION_CODES: Final[dict[str, int]] = {
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DESCRIBE": 8,
    "DESCRIBE_CONFIGS": 10,
}
ALLOW: Final = 3
LITERAL: Final = 3
#: kafka-acls.sh's spelling of an operation
_CLI_OPERATION: Final = {
    "READ": "Read",
    "WRITE": "Write",
    "CREATE": "Create",
    "DESCRIBE": "Describe",
    "DESCRIBE_CONFIGS": "DescribeConfigs",
}


@dataclass(frozen=True, slots=True)
class Acl:
    """One ALLOW rule: ``principal`` may do ``operation`` on the literal ``resource`` named
    ``name``, from any host; ``why`` says which part of abstain needs it."""

    principal: str
    operation: Operation
    resource: Resource
    name: str
    why: str = ""

    def __str__(self) -> str:
        return f"ALLOW {self.principal} {self.operation} {self.resource} {self.name}"

    def to_json(self) -> dict[str, str]:
        return {
            "principal": self.principal,
            "host": "*",
            "permission": "ALLOW",
            "operation": self.operation,
            "resource_type": self.resource,
            "resource_name": self.name,
            "pattern_type": "LITERAL",
            "why": self.why,
        }


def default_principal(role: str) -> str:
    """The principal of ``role`` unless told otherwise (the local secure broker's users).

    >>> default_principal("worker")
    'User:abstain-worker'
    """
    return f"User:abstain-{role}"


def _groups(settings: Settings) -> list[tuple[str, str]]:
    app = settings.app_id
    return [
        (app, "faust's group (leader election)"),
        (f"{app}-score", "the scoring loop's group"),
        (f"{app}-learn", "the learner's group"),
    ]


def _desk_topics(settings: Settings) -> list[str]:
    return [settings.desk.leases_topic, settings.desk.revocations_topic]


def role_acls(settings: Settings, role: str, principal: str) -> list[Acl]:
    """The ACLs ``role`` needs under ``settings``, in the catalogue's order."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    creates = settings.topic_policy.creation == "create"
    out: list[Acl] = []

    def add(operation: Operation, resource: Resource, name: str, why: str) -> None:
        out.append(Acl(principal, operation, resource, name, why))

    for entry in CATALOGUE:
        rights, name = entry.rights(role), entry.name(settings)
        if not rights:
            continue
        what = entry.role
        if "r" in rights:
            add("READ", "TOPIC", name, f"reads {what}")
        if "w" in rights:
            add("WRITE", "TOPIC", name, f"writes {what}")
        if role == "worker":
            add("DESCRIBE_CONFIGS", "TOPIC", name, f"checks {what} at start-up")
            if creates:
                add("CREATE", "TOPIC", name, f"creates {what} (topic_policy.creation=create)")
    if role == "desk":
        for name in _desk_topics(settings):
            add("READ", "TOPIC", name, "reads its own topic")
            add("WRITE", "TOPIC", name, "writes its own topic")
            if creates:
                add("CREATE", "TOPIC", name, "creates its own topic (topic_policy.creation=create)")
    if role == "worker":
        for group, why in _groups(settings):
            add("READ", "GROUP", group, why)
    if role == "operator":
        for group, why in _groups(settings)[1:]:
            add("DESCRIBE", "GROUP", group, f"`abstain skip` reads where {why} committed")
    if role in ("worker", "desk") and creates and settings.topic_policy.replication_factor is None:
        add(
            "DESCRIBE_CONFIGS",
            "CLUSTER",
            CLUSTER_NAME,
            "reads default.replication.factor to create topics (unset "
            "topic_policy.replication_factor)",
        )
    return out


def acl_commands(acls: Sequence[Acl], *, bootstrap: str = "$BOOTSTRAP") -> list[str]:
    """``kafka-acls.sh`` command lines that add ``acls``: one per principal and resource,
    with every operation on it (the admin's login in ``$ADMIN_CONFIG``)."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for acl in acls:
        ops = grouped.setdefault((acl.principal, acl.resource, acl.name), [])
        if _CLI_OPERATION[acl.operation] not in ops:
            ops.append(_CLI_OPERATION[acl.operation])
    lines = []
    for (principal, resource, name), ops in grouped.items():
        where = (
            "--cluster" if resource == "CLUSTER" else f"--{resource.lower()} {shlex.quote(name)}"
        )
        flags = " ".join(f"--operation {op}" for op in ops)
        lines.append(
            f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config $ADMIN_CONFIG "
            f"--add --allow-principal {shlex.quote(principal)} {flags} {where}"
        )
    return lines


def acl_json(acls: Iterable[Acl]) -> str:
    """``acls`` as a JSON array (one object per ACL)."""
    return json.dumps([acl.to_json() for acl in acls], indent=2)


def acl_markdown(
    settings: Settings,
    principals: dict[str, str] | None = None,
    roles: Sequence[str] = ROLES,
) -> str:
    """Every role's ACLs as the docs show them (default topic names and principals).

    >>> print(acl_markdown(Settings()).splitlines()[2])
    | worker | `User:abstain-worker` | topic `abstain.features` | Read, DescribeConfigs, Create | reads topics.features; checks topics.features at start-up; creates topics.features (topic_policy.creation=create) |
    """  # noqa: E501
    rows = ["| role | principal | resource | operations | why |", "|---|---|---|---|---|"]
    for role in roles:
        principal = (principals or {}).get(role, default_principal(role))
        grouped: dict[tuple[str, str], list[Acl]] = {}
        for acl in role_acls(settings, role, principal):
            grouped.setdefault((acl.resource, acl.name), []).append(acl)
        for (resource, name), acls in grouped.items():
            ops = ", ".join(_CLI_OPERATION[a.operation] for a in acls)
            why = "; ".join(a.why for a in acls)
            rows.append(f"| {role} | `{principal}` | {resource.lower()} `{name}` | {ops} | {why} |")
    return "\n".join(rows)


def create_requests(acls: Iterable[Acl]) -> list[Any]:
    """aiokafka ``CreateAclsRequest`` objects (one ACL each) for ``acls``."""
    from aiokafka.protocol.admin import CreateAclsRequest  # noqa: PLC0415

    return [
        CreateAclsRequest(
            RESOURCE_CODES[a.resource],
            a.name,
            LITERAL,
            a.principal,
            "*",
            OPERATION_CODES[a.operation],
            ALLOW,
        )
        for a in acls
    ]


async def apply_acls(settings: Settings, acls: Sequence[Acl]) -> None:
    """Create ``acls`` through Kafka's Admin API (CreateAcls), logged in as ``settings``
    say (a principal allowed to alter ACLs: a super user); creating one that exists is a
    no-op. :class:`~service.stream.errors.AclError` names the first refused.

    aiokafka 0.14.0's admin client has no ACL call: its own client sends aiokafka's
    ``CreateAclsRequest`` (public protocol classes, no private attribute)."""
    from aiokafka.client import AIOKafkaClient  # noqa: PLC0415
    from aiokafka.errors import KafkaError  # noqa: PLC0415

    client = AIOKafkaClient(
        bootstrap_servers=settings.bootstrap_servers, **settings.security.aiokafka_kwargs()
    )
    try:
        await client.bootstrap()
        node = client.get_random_node()
        for acl, request in zip(acls, create_requests(acls), strict=True):
            response = await client.send(node, request)
            for code, message in response.creation_responses:
                if code:
                    raise AclError(f"Kafka refused to add {acl}: error {code} ({message})")
    except KafkaError as exc:
        raise AclError(f"cannot add the ACLs: {exc!r}") from exc
    finally:
        await client.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="abstain kafka acls",
        description="the Kafka ACLs each part of abstain needs (least privilege), from the "
        "topic catalogue and the consumer groups of the settings",
    )
    common_arguments(parser)
    parser.add_argument("--role", choices=[*ROLES, "all"], default="all")
    parser.add_argument(
        "--principal", help="the role's principal (default User:abstain-<role>); one role only"
    )
    parser.add_argument("--format", choices=["commands", "json", "markdown"], default="commands")
    parser.add_argument(
        "--apply",
        action="store_true",
        help="add them through the Admin API, logged in as the settings say (a super user)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    """``abstain kafka acls ...``; returns the exit code."""
    args = _parser().parse_args(list(argv))
    roles = list(ROLES) if args.role == "all" else [args.role]
    if args.principal and len(roles) > 1:
        print(
            "abstain kafka acls: --principal names one role's principal: give --role",
            file=sys.stderr,
        )
        return 2
    try:
        settings = settings_from_arguments(args)
    except ConfigError as exc:
        print(f"abstain kafka acls: {exc}", file=sys.stderr)
        return 2
    principals = {r: args.principal or default_principal(r) for r in roles}
    acls = [acl for r in roles for acl in role_acls(settings, r, principals[r])]
    if args.format == "markdown":
        print(acl_markdown(settings, principals, roles))
    elif args.format == "json":
        print(acl_json(acls))
    else:
        print("\n".join(acl_commands(acls, bootstrap=",".join(settings.bootstrap_servers))))
    if args.apply:
        try:
            asyncio.run(check_login(settings))
            asyncio.run(apply_acls(settings, acls))
        except (AclError, KafkaLoginError) as exc:
            print(f"abstain kafka acls: {exc}", file=sys.stderr)
            return 1
        print(f"abstain kafka acls: {len(acls)} ACLs in place", file=sys.stderr)
    return 0
