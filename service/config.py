"""Settings for the stream worker: one frozen, validated object read at start-up.

Sources, highest precedence first: keyword overrides (command line), environment variables
(prefix ``ABSTAIN_``, nested fields joined by ``__``, e.g. ``ABSTAIN_WEB__PORT=7000``), an
optional JSON or TOML file named by ``ABSTAIN_CONFIG`` (or ``load_settings(config=...)``),
then the defaults below. The default configuration serves one model, ``default``, shaped
for the demo data set (Phishing, 68 features).

Secrets (the label API token, the Kafka password) are ``SecretStr``: they never appear in
``repr``, logs or metrics.

Errors::

    AbstainError, ValueError
     └── ConfigError          invalid settings; the message names the offending field

>>> s = Settings()
>>> s.topics.features, s.web.port, sorted(s.models)
('abstain.features', 6066, ['default'])
>>> "secret" in repr(Settings(label_token="a-secret-of-16-chars"))
False
>>> try:
...     load_settings(label_token="")
... except ConfigError as exc:
...     print(exc)
invalid settings:
  label_token: label_token is empty: unset it to turn HTTP labelling off, or give at least 16 characters
"""  # noqa: E501

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
import ssl
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from service.errors import AbstainError
from service.features import FieldsConfig
from service.features.declaration import BUCKET_BYTES, VERSION_BASE
from service.learning.adaptive import Parts
from service.learning.errors import LearningError
from service.learning.registry import ALGORITHM_NAMES, LINEAR_ALGORITHMS, make_learner

__all__ = [
    "ALGORITHMS",
    "ConfigError",
    "Desk",
    "KafkaSecurity",
    "LabelBudget",
    "ModelConfig",
    "Partitions",
    "SecondOpinions",
    "Settings",
    "TopicPolicy",
    "Topics",
    "Web",
    "common_arguments",
    "load_settings",
    "settings_from_arguments",
]

ALGORITHMS = ALGORITHM_NAMES  # the names live in service.learning

_FROZEN = ConfigDict(frozen=True, extra="forbid")

#: shortest accepted label token and snapshot key (characters)
MIN_TOKEN: Final = 16
MIN_KEY: Final = 32


def check_secret(value: SecretStr | None, name: str, minimum: int) -> SecretStr | None:
    """``value`` if it is a usable secret: not empty, no surrounding white space (a newline
    read from a file would otherwise silently change it), at least ``minimum`` characters.

    >>> check_secret(SecretStr("x" * 16), "t", 16) is not None
    True
    >>> check_secret(SecretStr("x" * 16 + chr(10)), "t", 16)
    Traceback (most recent call last):
    ...
    ValueError: t has white space at its start or end (a newline read from a file?): remove it
    """
    if value is None:
        return None
    text = value.get_secret_value()
    if not text.strip():
        off = "turn HTTP labelling off" if name == "label_token" else "turn signing off"
        raise ValueError(
            f"{name} is empty: unset it to {off}, or give at least {minimum} characters"
        )
    if text != text.strip():
        raise ValueError(
            f"{name} has white space at its start or end (a newline read from a file?): remove it"
        )
    if len(text) < minimum:
        raise ValueError(f"{name} is {len(text)} characters; give at least {minimum}")
    return value


#: room a model version's record leaves, within a client's request size, for its key (a
#: model name), its headers (a signature) and the record's framing
VERSION_HEADROOM: Final = 4096
#: the largest ``max_state_bytes`` (Kafka takes larger records badly: every copy of a
#: changelog's record is a request of its own)
MAX_STATE_BYTES: Final = 67_108_864
#: the record a broker takes by default (``max.message.bytes``: 1 MiB and 12 bytes), rounded
#: down as ``max_message_bytes``'s default is
KAFKA_RECORD: Final = 1_000_000


class ConfigError(AbstainError, ValueError):
    """The settings are invalid; the message names each offending field."""


class LabelBudget(BaseModel):
    """How many labels a model may ask for: ``per_hour`` (labels per hour, for the whole
    model, shared by the workers in proportion to the feature partitions each scores) or
    ``fraction`` (of the events), not both. The most informative events are the most likely
    to be asked (:class:`service.learning.QueryBudget`); every decision's
    ``query_probability`` stays the probability it was really asked with.

    >>> LabelBudget(per_hour=600).per_hour
    600.0
    >>> try:
    ...     LabelBudget(per_hour=600, fraction=0.1)
    ... except ValueError as exc:
    ...     print("give per_hour or fraction (one of them)" in str(exc))
    True
    """

    model_config = _FROZEN

    per_hour: float | None = Field(default=None, gt=0.0, le=1e9, description="labels per hour")
    fraction: float | None = Field(default=None, gt=0.0, le=1.0, description="of the events")
    explore: float = Field(
        default=0.1, ge=0.0, le=1.0, description="share of the budget asked uniformly at random"
    )
    sharpness: float = Field(
        default=4.0, ge=0.0, le=64.0, description="how strongly informative events are favoured"
    )

    @model_validator(mode="after")
    def _one_kind(self) -> LabelBudget:
        if (self.per_hour is None) == (self.fraction is None):
            raise ValueError("give per_hour or fraction (one of them)")
        return self


class AdaptiveConfig(BaseModel):
    """Adaptive learning of one model (``service.learning.Adaptive``), on by default; each
    part can be turned off, or the whole wrapper (``enabled = false``: the bare learner).

    >>> AdaptiveConfig().parts()
    Parts(detector=True, challengers=True, explore=True, steps=True, intercept=True, take_back=True)
    >>> AdaptiveConfig(challengers=False).parts().challengers, AdaptiveConfig(enabled=False).parts()
    (False, None)
    >>> AdaptiveConfig().parts(intercept=False).intercept
    False
    """

    model_config = _FROZEN

    enabled: bool = Field(default=True, description="serve the learner inside the wrapper")
    detector: bool = Field(
        default=True, description="detect changes (ADWIN on the margin errors; a collapse)"
    )
    challengers: bool = Field(
        default=True, description="start challengers at a change; the better one takes over"
    )
    explore: bool = Field(
        default=True,
        description="ask uniformly more at the first labels and for a while after a change",
    )
    steps: bool = Field(
        default=True,
        description="tracking steps (DSAL, DSOL): rho's step capped at 0.2/gamma^2, the "
        "intercept's kept at its first size",
    )
    take_back: bool = Field(
        default=True,
        description="after a takeover, the replaced champion runs as the sole challenger for "
        "up to 200 labels and takes the model back when they prove the takeover wrong",
    )

    def parts(self, *, intercept: bool = True) -> Parts | None:
        """The wrapper's parts (``None``: no wrapper) for inputs that end with an intercept
        or not (the model's ``intercept``)."""
        if not self.enabled:
            return None
        return Parts(
            detector=self.detector,
            challengers=self.challengers,
            explore=self.explore,
            steps=self.steps,
            intercept=intercept,
            take_back=self.take_back,
        )


class CorrectionsConfig(BaseModel):
    """How far back a correction of a label can reach (docs/learn/corrections.md): the learner
    keeps the last ``reach`` labels it applied to the model (and its shadows) and a
    checkpoint of their states every ``every`` labels, so a correction restores the
    checkpoint before the corrected label and applies the later labels again. ``reach = 0``
    turns corrections off (nothing is kept; every correction is refused).

    >>> c = CorrectionsConfig(); c.reach, c.every
    (200, 50)
    >>> CorrectionsConfig(reach=5).every, CorrectionsConfig(reach=0).every
    (2, 0)
    """

    model_config = _FROZEN

    reach: int = Field(
        default=200, ge=0, le=10_000, description="labels a correction can reach back (0: off)"
    )

    @property
    def every(self) -> int:
        """Labels between two checkpoints: a quarter of the reach (a correction applies at
        most ``reach + every`` labels again; a checkpoint is a whole state, which a wide
        model pays for at every checkpoint); 0 when corrections are off."""
        return -(-self.reach // 4) if self.reach else 0


class ModelConfig(BaseModel):
    """One served model: the learner, its reject cost and how features arrive.

    >>> ModelConfig(algorithm="dsal", cost=0.2, feature_names=["a", "b"]).n_inputs
    2
    """

    model_config = _FROZEN

    algorithm: str = Field(default="dsal", description="one of service.learning.ALGORITHM_NAMES")
    cost: float = Field(default=0.25, gt=0.0, lt=0.5, description="reject cost d in (0, 0.5)")
    n_features: int | None = Field(
        None, ge=1, description="features an event carries (or feature_names)"
    )
    feature_names: tuple[str, ...] | None = Field(
        default=None,
        description="the features' names: events may send {name: value}; the desk shows them",
    )
    fields: FieldsConfig | None = Field(
        default=None,
        description="the events' fields as producers write them (numbers, booleans, "
        "categories, tokens, nulls; hashed): instead of n_features or feature_names "
        "(docs/operate/events.md)",
    )
    hyperparameters: dict[str, Any] = Field(
        default_factory=dict,
        description="keywords of the learner (eta, gamma, kernel, budget, ...)",
    )
    update_rule: Literal["sgd", "normalized"] = Field(
        default="normalized",
        description="how a linear learner (dral, dsal, dsol) steps on a label: 'normalized' "
        "(importance-weight aware, per-coordinate adaptive; docs/results/learning.md) or "
        "'sgd' (the paper's step); kernel learners take the paper's",
    )
    standardize: bool = Field(
        default=True,
        description="standardise features online: by every event (the moments the scorers "
        "send with their label requests), then by the labelled rows",
    )
    intercept: bool = Field(default=True, description="add an intercept feature")
    audit_rate: float = Field(
        default=0.01, ge=0.0, lt=1.0, description="extra uniform query probability (unbiased risk)"
    )
    label_budget: LabelBudget | None = Field(
        default=None, description="labels the model may ask for (none: as many as it wants)"
    )
    max_open_requests: int = Field(
        default=50_000,
        ge=1,
        description="open label requests kept per model; beyond, the least urgent is dropped",
    )
    seed: int = Field(default=0, description="seed of the learner's own randomness")
    champion: str | None = Field(
        default=None,
        description="run as a shadow of this model: score its events, learn from its labels, "
        "decide nothing that is served",
    )
    adaptive: AdaptiveConfig = Field(
        default_factory=AdaptiveConfig,
        description="change detection, challengers and exploration (each can be turned off)",
    )
    corrections: CorrectionsConfig = Field(
        default_factory=CorrectionsConfig,
        description="how far back a correction of a label reaches (the group's champion's)",
    )

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        if value not in ALGORITHM_NAMES:
            raise ValueError(f"unknown algorithm {value!r}; one of {', '.join(ALGORITHM_NAMES)}")
        return value

    @model_validator(mode="after")
    def _features_given(self) -> ModelConfig:
        if self.fields is not None:
            if self.feature_names is not None or self.n_features is not None:
                raise ValueError("give fields, or n_features / feature_names, not both")
            return self
        if self.feature_names is None and self.n_features is None:
            raise ValueError("give n_features, feature_names or fields")
        if self.feature_names is not None:
            if len(set(self.feature_names)) != len(self.feature_names):
                raise ValueError("feature_names must be unique")
            if not self.feature_names:
                raise ValueError("feature_names must not be empty")
            if self.n_features is not None and self.n_features != len(self.feature_names):
                raise ValueError(
                    f"n_features={self.n_features} but {len(self.feature_names)} feature_names"
                )
        return self

    @model_validator(mode="after")
    def _learner_builds(self) -> ModelConfig:
        """The learner is built once here, so a bad hyperparameter (an unknown name, a
        value out of range) is refused when the settings are read, not when a worker first
        serves the model."""
        if self.feature_names is None and self.n_features is None and self.fields is None:
            return self  # refused above
        try:
            make_learner(
                self.algorithm,
                n_features=self.n_learner_features,
                cost=self.cost,
                seed=self.seed,
                **self.learner_hyperparameters,
            )
        except (LearningError, TypeError, ValueError) as exc:
            raise ValueError(f"hyperparameters: {exc}") from None
        return self

    @property
    def n_inputs(self) -> int:
        """Number of raw features an event carries for this model (with ``fields``: the
        inputs its declaration encodes an event to)."""
        if self.fields is not None:
            return self.fields.width
        if self.feature_names is not None:
            return len(self.feature_names)
        assert self.n_features is not None  # noqa: S101 - guaranteed by the validator
        return self.n_features

    @property
    def moments_inputs(self) -> int:
        """How many of the inputs (the first ones) a scorer gathers the moments of for the
        learner's first standardiser (:func:`service.learning.serving_pipeline`): every one,
        or a declared model's numbers, not its hashed buckets (0 when it has no numbers).

        >>> ModelConfig(n_features=3).moments_inputs
        3
        >>> declared = {"hash_bits": 4, "fields": {"a": "number", "t": "tokens"}}
        >>> ModelConfig(fields=declared).moments_inputs
        1
        """
        if self.fields is not None and self.fields.hashed_from is not None:
            return self.fields.hashed_from
        return self.n_inputs

    def weight_cap(self, max_importance_weight: float) -> float:
        """The cap of a label's importance weight 1/p for this model: the global
        ``max_importance_weight``, raised for a fraction budget to what its exploration floor
        (p >= explore x fraction) legitimately reaches, so honest weights are never clipped.

        >>> m = ModelConfig(n_features=2, label_budget={"fraction": 0.05, "explore": 0.1})
        >>> round(m.weight_cap(100.0))
        200
        """
        budget = self.label_budget
        if budget is None or budget.fraction is None or budget.explore == 0.0:
            return max_importance_weight
        return max(max_importance_weight, 1.0 / (budget.explore * budget.fraction))

    @property
    def learner_hyperparameters(self) -> dict[str, Any]:
        """The learner's keyword hyperparameters: ``hyperparameters``, with ``update_rule``
        for a linear learner unless they name one.

        >>> ModelConfig(n_features=2).learner_hyperparameters
        {'update_rule': 'normalized'}
        >>> ModelConfig(n_features=2, algorithm="kernel-dsal").learner_hyperparameters
        {}
        """
        if self.algorithm not in LINEAR_ALGORITHMS:
            return dict(self.hyperparameters)
        return {"update_rule": self.update_rule, **self.hyperparameters}

    @property
    def n_learner_features(self) -> int:
        """Dimension the learner sees: raw features plus the intercept column."""
        return self.n_inputs + (1 if self.intercept else 0)


class Topics(BaseModel):
    """Topic names (docs/reference/architecture.md, "Topics")."""

    model_config = _FROZEN

    features: str = Field(default="abstain.features", description="feature events (input)")
    decisions: str = Field(default="abstain.decisions", description="one decision per event")
    label_requests: str = Field(
        default="abstain.label-requests", description="the events the learner asks labels for"
    )
    labels: str = Field(
        default="abstain.labels", description="labels, corrections, second opinions and orders"
    )
    models: str = Field(
        default="abstain.models", description="model snapshots (compacted), read by every worker"
    )
    dead_letters: str = Field(
        default="abstain.dead-letters", description="refused input, with the reason"
    )

    @classmethod
    def prefixed(cls, prefix: str) -> dict[str, str]:
        """Every topic named under ``prefix`` (a run of its own: tests, the demo, load tests).

        >>> Topics.prefixed("run-1")["label_requests"]
        'run-1.label-requests'
        """
        return {name: f"{prefix}.{name.replace('_', '-')}" for name in cls.model_fields}

    @model_validator(mode="after")
    def _distinct(self) -> Topics:
        names = list(self.model_dump().values())
        if len(set(names)) != len(names):
            raise ValueError("topic names must be distinct")
        return self


class Partitions(BaseModel):
    """Partition counts. ``labels`` is used for both label-requests and labels, which must be
    co-partitioned (one learner owns a model's requests and labels)."""

    model_config = _FROZEN

    features: int = Field(
        default=8, ge=1, description="of the features topic: the workers' parallelism"
    )
    decisions: int = Field(default=8, ge=1, description="of the decisions topic")
    labels: int = Field(
        default=2,
        ge=1,
        description="of the label topics and the learner's changelogs (fixed once used)",
    )
    models: int = Field(default=1, ge=1, description="of the models topic")
    dead_letters: int = Field(default=1, ge=1, description="of the dead-letters topic")


class TopicPolicy(BaseModel):
    """How the worker's topics come to exist, and how many copies of them the cluster keeps.

    ``creation``: ``create`` (the worker creates any topic and changelog that is missing) or
    ``check`` (it creates none: at start-up it checks that each exists with the partitions,
    compaction and replicas it needs, and refuses to start otherwise, one line per problem).
    ``replication_factor`` and ``min_insync_replicas`` apply to every topic the worker
    creates and are what ``check`` asks for at least; unset, the broker's
    ``default.replication.factor`` and ``min.insync.replicas`` apply. Producers always wait
    for every in-sync replica (acks=all).

    >>> TopicPolicy().creation, TopicPolicy().replication_factor
    ('create', None)
    >>> try:
    ...     load_settings(topic_policy={"replication_factor": 2, "min_insync_replicas": 3})
    ... except ConfigError as exc:
    ...     print(exc)
    invalid settings:
      topic_policy: min_insync_replicas 3 exceeds replication_factor 2: no write could ever succeed
    """

    model_config = _FROZEN

    creation: Literal["create", "check"] = Field(
        default="create", description="create missing topics, or only check that they fit"
    )
    replication_factor: int | None = Field(
        default=None, ge=1, le=32767, description="copies of each topic (None: broker default)"
    )
    min_insync_replicas: int | None = Field(
        default=None, ge=1, le=32767, description="copies a write needs (None: broker default)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> TopicPolicy:
        factor, isr = self.replication_factor, self.min_insync_replicas
        if factor is not None and isr is not None and isr > factor:
            raise ValueError(
                f"min_insync_replicas {isr} exceeds replication_factor {factor}: "
                "no write could ever succeed"
            )
        return self

    @property
    def topic_configs(self) -> dict[str, str]:
        """Configs every created topic gets (besides its own cleanup policy).

        >>> TopicPolicy(min_insync_replicas=2).topic_configs
        {'min.insync.replicas': '2'}
        """
        if self.min_insync_replicas is None:
            return {}
        return {"min.insync.replicas": str(self.min_insync_replicas)}


_WILDCARD_HOSTS: Final = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 - names, not binds


class Web(BaseModel):
    """HTTP server for /metrics, /healthz, /readyz and /labels.

    ``host`` is the address the server binds to (``0.0.0.0`` in a container);
    ``advertised_host`` is the name other workers and faust links use to reach it, by
    default ``host`` itself, or this machine's host name when ``host`` is a wildcard.

    >>> Web(host="10.0.0.5").advertised
    '10.0.0.5'
    >>> Web(host="0.0.0.0", advertised_host="pod-1.svc").advertised
    'pod-1.svc'
    """

    model_config = _FROZEN

    host: str = Field(default="127.0.0.1", description="bind address")
    port: int = Field(
        default=6066, ge=0, le=65535, description="HTTP port: /metrics, /healthz, /readyz, /labels"
    )
    advertised_host: str | None = Field(
        default=None, description="host name to advertise (default: see class docstring)"
    )

    @property
    def advertised(self) -> str:
        """The host name to advertise for this worker's web server."""
        if self.advertised_host:
            return self.advertised_host
        if self.host in _WILDCARD_HOSTS:
            return socket.gethostname()
        return self.host


class KafkaSecurity(BaseModel):
    """How the worker authenticates to Kafka (docs/operate/secure-kafka.md).

    With TLS (``SSL``, ``SASL_SSL``) the broker's certificate must chain to ``ca_file`` (the
    system CAs when unset) and name the host the client connects to: host-name verification
    is on unless ``check_hostname`` is set to false explicitly.

    >>> KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
    ...               username="svc", password="pw").uses_sasl
    True
    >>> KafkaSecurity(protocol="SSL").ssl_context().check_hostname
    True
    """

    model_config = _FROZEN

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="Kafka's security.protocol"
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        default=None, description="with SASL_*: the login mechanism"
    )
    username: SecretStr | None = Field(default=None, description="with SASL_*: the login")
    password: SecretStr | None = Field(default=None, description="with SASL_*: its password")
    ca_file: Path | None = Field(
        default=None,
        description="with *SSL: CA bundle the brokers' certificates chain to (none: the system's)",
    )
    cert_file: Path | None = Field(
        default=None, description="with *SSL: client certificate (mutual TLS), with key_file"
    )
    key_file: Path | None = Field(
        default=None, description="with *SSL: the client certificate's key"
    )
    check_hostname: bool = Field(
        default=True,
        description="TLS: the broker's certificate must name the host connected to (turn off "
        "only for a broker whose certificate cannot name it)",
    )

    @property
    def uses_sasl(self) -> bool:
        return self.protocol.startswith("SASL")

    @property
    def uses_ssl(self) -> bool:
        return self.protocol.endswith("SSL")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecurity:
        if self.uses_sasl:
            if self.sasl_mechanism is None:
                raise ValueError(f"security protocol {self.protocol} needs sasl_mechanism")
            if self.username is None or self.password is None or not _given(self.password):
                raise ValueError(f"security protocol {self.protocol} needs username and password")
        elif self.sasl_mechanism is not None:
            raise ValueError(f"sasl_mechanism given but protocol is {self.protocol}")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if not self.uses_ssl and any((self.ca_file, self.cert_file, self.key_file)):
            raise ValueError(f"CA/cert/key files given but protocol is {self.protocol}")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {str(path)!r} is not a readable file")
        return self

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client SSL context for SSL / SASL_SSL (system CAs unless ``ca_file``)."""
        if not self.uses_ssl:
            return None
        ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        ctx.check_hostname = self.check_hostname  # the chain is verified either way
        if self.cert_file is not None and self.key_file is not None:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file))
        return ctx

    def aiokafka_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka clients (consumer / producer / admin)."""
        kwargs: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_ssl:
            kwargs["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            assert self.username is not None  # noqa: S101
            assert self.password is not None  # noqa: S101
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.username.get_secret_value()
            kwargs["sasl_plain_password"] = self.password.get_secret_value()
        return kwargs


#: a Kafka topic name
_TOPIC: Final = r"^[A-Za-z0-9._-]{1,249}$"
_MAX_PROXIES: Final = 64
#: a user name of the desk (it ends up in ``labelled_by``): service.desk.auth.accounts
USER_NAME: Final = r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,63}$"
_MAX_REVIEWERS: Final = 1000
#: how long the desk keeps an answer (its reviews, second opinions and corrections) in view:
#: the retention of its leases topic at the least, where "ask for review" is written
REVIEW_HORIZON_SECONDS: Final = 2 * 86400.0


class SecondOpinions(BaseModel):
    """Which answered requests the label desk also shows to a second person (never the
    first, never with the first answer): a ``share`` of them, chosen by a hash coin of the
    request id (every replica and the offline replay choose the same), and every one whose
    answer trains with a large weight (1/p, capped at ``max_importance_weight``, at least
    ``min_weight``) or contradicts a confident model (it decided, not rejected, with
    |f(x)| - rho at least ``confident_margin``, and the answer differs). The rule is
    :func:`service.stream.labels.review.second_opinion`; a second answer is asked for within
    ``within_seconds`` of the first, while the label can still be corrected.

    >>> SecondOpinions().share, SecondOpinions().min_weight, SecondOpinions().within_seconds
    (0.05, 20.0, 86400.0)
    >>> try:
    ...     SecondOpinions(share=2)
    ... except ValueError as exc:
    ...     print("share" in str(exc))
    True
    """

    model_config = _FROZEN

    enabled: bool = Field(default=True, description="ask for second opinions at all")
    after_answers: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="a person is offered second opinions first only once they have given "
        "this many first answers; before, a free request comes first (0: always opinions first)",
    )
    share: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description="share of answered requests checked at random",
    )
    min_weight: float = Field(
        default=20.0,
        ge=1.0,
        le=1e6,
        allow_inf_nan=False,
        description="an answer whose importance weight 1/p (capped) is at least this is checked",
    )
    confident_margin: float = Field(
        default=1.0,
        ge=0.0,
        le=1e6,
        allow_inf_nan=False,
        description="an answer against a model that decided with |score| - rho >= this is checked",
    )
    within_seconds: float = Field(
        default=86400.0,
        gt=0.0,
        le=REVIEW_HORIZON_SECONDS,
        allow_inf_nan=False,
        description="how long after the first answer a second one is asked for",
    )


class Desk(BaseModel):
    """The label desk (``abstain desk``, docs/operate/desk.md): a web work queue for the people who
    answer label requests. It binds ``host:port`` and identifies people by ``auth``:

    - ``users``: built-in accounts from ``users_file`` (JSON or TOML, user -> scrypt hash made
      by ``abstain desk hash-password``), a login page and a session cookie;
    - ``proxy``: the name in ``proxy_header``, set by an authenticating reverse proxy (the
      desk must then be reachable through that proxy only).

    Headers a proxy sets (``proxy_header``, ``X-Forwarded-For``, ``-Proto``, ``-Host``) are
    believed only from ``trusted_proxies`` (addresses or networks; none by default).

    >>> Desk().port, Desk().lease_seconds, Desk().leases_topic, Desk().trusted_proxies
    (6070, 120.0, 'abstain.desk-leases', ())
    >>> try:
    ...     Desk(auth="proxy", proxy_header="")
    ... except ValueError as exc:
    ...     print("proxy_header" in str(exc))
    True
    >>> Desk(trusted_proxies="10.0.0.0/8, 192.0.2.7").trusted_proxies
    ('10.0.0.0/8', '192.0.2.7/32')
    """

    model_config = _FROZEN

    host: str = Field(default="127.0.0.1", description="bind address")
    port: int = Field(default=6070, ge=0, le=65535, description="the desk's HTTP port")
    auth: Literal["users", "proxy"] = Field(
        default="users", description="sign-in: the users file, or a trusted proxy's header"
    )
    users_file: Path | None = Field(default=None, description="accounts (auth = users)")
    proxy_header: str = Field(
        default="X-Forwarded-User", description="who the proxy says it is (auth = proxy)"
    )
    session_key: SecretStr | None = Field(
        default=None,
        description=f"HMAC key of session cookies (>= {MIN_KEY} characters), the same on every "
        "replica; unset: a random key per process (sessions end with a restart)",
    )
    session_seconds: float = Field(
        default=8 * 3600.0, gt=0.0, le=7 * 86400.0, description="how long a sign-in lasts"
    )
    secure_cookie: bool = Field(
        default=False, description="mark the cookie Secure (always when served over TLS)"
    )
    lease_seconds: float = Field(
        default=120.0, ge=5.0, le=3600.0, description="how long a claim lasts unless renewed"
    )
    leases_topic: str = Field(
        default="abstain.desk-leases", pattern=_TOPIC, description="the desk's claims and answers"
    )
    revocations_topic: str = Field(
        default="abstain.desk-revocations",
        pattern=_TOPIC,
        description="compacted topic of logged-out sessions, read by every replica",
    )
    trusted_proxies: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="addresses or networks (CIDR) of the reverse proxies whose headers the "
        "desk believes (the person with auth = proxy, X-Forwarded-For/-Proto/-Host); empty: "
        "none (a list, or one comma-separated string)",
    )
    ack_timeout_seconds: float = Field(
        default=5.0, gt=0.0, le=60.0, description="longest wait for Kafka to acknowledge"
    )
    min_time_left_seconds: float = Field(
        default=15.0, ge=0.0, description="a request closer to expiry is not handed out"
    )
    answer_names: dict[str, tuple[str, str]] = Field(
        default_factory=dict, description="model -> display names of its +1 and -1 answers"
    )
    replica: str | None = Field(default=None, description="name of this replica (host name)")
    undo_seconds: float = Field(
        default=600.0,
        ge=0.0,
        le=86400.0,
        allow_inf_nan=False,
        description="how long after answering a person may undo or change their answer "
        "(then: ask for review)",
    )
    reviewers: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="user names with the reviewer role (also `reviewer = true` in the users "
        "file): they decide disagreements and may correct anyone's recent answer (a list, or "
        "one comma-separated string)",
    )
    second_opinions: SecondOpinions = SecondOpinions()

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _networks(cls, value: Any) -> tuple[str, ...]:
        return proxy_networks(value)

    @field_validator("reviewers", mode="before")
    @classmethod
    def _reviewers(cls, value: Any) -> tuple[str, ...]:
        return user_names(value, "reviewers")

    @model_validator(mode="after")
    def _consistent(self) -> Desk:
        if self.auth == "proxy" and not self.proxy_header.strip():
            raise ValueError("auth = proxy needs a proxy_header")
        if self.auth == "proxy" and not self.trusted_proxies:
            raise ValueError(
                "auth = proxy needs trusted_proxies: the addresses of the proxy that sets "
                f"{self.proxy_header} (from anyone else the header is not believed)"
            )
        if self.leases_topic == self.revocations_topic:
            raise ValueError("leases_topic and revocations_topic must differ")
        check_secret(self.session_key, "session_key", MIN_KEY)
        return self


def user_names(value: Any, field: str) -> tuple[str, ...]:
    """User names (:data:`USER_NAME`): a list, or one comma-separated string (an environment
    variable); an empty string or list is none. A blank, malformed or repeated name, or more
    than a thousand, is refused with ``field`` named.

    >>> user_names("ann, bob", "reviewers")
    ('ann', 'bob')
    >>> user_names(["ann", " "], "reviewers")
    Traceback (most recent call last):
    ...
    ValueError: reviewers: ' ' is not a user name (letters, digits, . _ @ + -; at most 64)
    """
    if value is None:
        return ()
    items = value
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")] if value.strip() else []
    if not isinstance(items, list | tuple) or len(items) > _MAX_REVIEWERS:
        raise ValueError(f"{field}: give a list of at most {_MAX_REVIEWERS} user names")
    out: list[str] = []
    for item in items:
        if not isinstance(item, str) or re.match(USER_NAME, item) is None:
            raise ValueError(
                f"{field}: {item!r:.80} is not a user name (letters, digits, . _ @ + -; at most 64)"
            )
        if item in out:
            raise ValueError(f"{field}: {item!r} is named twice")
        out.append(item)
    return tuple(out)


def proxy_networks(value: Any) -> tuple[str, ...]:
    """Trusted proxy addresses or networks, normalised (``192.0.2.7`` -> ``192.0.2.7/32``):
    a list, or one string (a JSON list, or comma-separated); an empty string or list is none.
    A blank entry, an address that does not parse, a network with host bits set or one that
    takes in every address (``0.0.0.0/0``) is refused.

    >>> proxy_networks(["10.1.0.0/16", " ::1 "])
    ('10.1.0.0/16', '::1/128')
    >>> proxy_networks("0.0.0.0/0")
    Traceback (most recent call last):
    ...
    ValueError: trusted_proxies: 0.0.0.0/0 trusts every address; name the proxies' own
    """
    if value is None:
        return ()
    items = value
    if isinstance(value, str):  # an environment variable: a JSON list, or comma-separated
        try:
            items = orjson.loads(value) if value.lstrip().startswith("[") else value.split(",")
        except orjson.JSONDecodeError:
            raise ValueError("trusted_proxies: not a JSON list of addresses") from None
        items = items if value.strip() else []
    if not isinstance(items, list | tuple) or len(items) > _MAX_PROXIES:
        raise ValueError(f"trusted_proxies: give a list of at most {_MAX_PROXIES} addresses")
    out = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"trusted_proxies: {item!r} is not an address or network")
        try:
            network = ipaddress.ip_network(item.strip())
        except ValueError as exc:
            raise ValueError(f"trusted_proxies: {item.strip()!r}: {exc}") from None
        if network.prefixlen == 0:
            raise ValueError(
                f"trusted_proxies: {network} trusts every address; name the proxies' own"
            )
        out.append(str(network))
    return tuple(out)


def _room(model: ModelConfig) -> int:
    """The bytes the learner's state of a model may take however many of its hashed buckets
    a stream touches (:func:`~service.features.declaration.version_room`; 0: not declared,
    or nothing hashed)."""
    return 0 if model.fields is None else model.fields.room


def _check_room(name: str, model: ModelConfig, state_bytes: int) -> None:
    """A declared model's states must fit ``state_bytes`` (``max_state_bytes`` when it is
    set) however many of its buckets a stream touches."""
    room = _room(model)
    if room > state_bytes:
        assert model.fields is not None  # noqa: S101 - a room is a declaration's
        raise ValueError(
            f"models.{name}: 2^{model.fields.hash_bits} hashed buckets may make the learner's "
            f"state of a version {room:,} bytes ({BUCKET_BYTES} bytes a bucket, and "
            f"{VERSION_BASE // 1024} KiB), more than max_state_bytes ({state_bytes:,}): raise "
            f"max_state_bytes to at least {room:,} or unset it (the learner's changelogs the "
            "worker creates get room for it; raise an existing one's max.message.bytes with "
            "it), or lower hash_bits"
        )


def _check_shadow(name: str, model: ModelConfig, models: Mapping[str, ModelConfig]) -> None:
    """A shadow's champion exists, is no shadow itself and takes the same features."""
    champion = model.champion
    if champion is None:
        return
    where = f"models.{name}.champion"
    if champion == name:
        raise ValueError(f"{where}: a model cannot be its own champion")
    if champion not in models:
        raise ValueError(f"{where}: no model named {champion!r} (one of {sorted(models)})")
    if models[champion].champion is not None:
        raise ValueError(
            f"{where}: {champion!r} is itself a shadow of {models[champion].champion!r}; "
            "name a model that decides"
        )
    theirs = models[champion]
    mine = (model.n_inputs, model.feature_names, model.fields)
    if mine != (theirs.n_inputs, theirs.feature_names, theirs.fields):
        raise ValueError(
            f"{where}: a shadow takes its champion's features (the same n_features, "
            f"feature_names or fields); {name!r} takes "
            f"{model.fields or model.feature_names or model.n_inputs}, {champion!r} takes "
            f"{theirs.fields or theirs.feature_names or theirs.n_inputs}"
        )
    if model.label_budget is not None:
        raise ValueError(
            f"models.{name}.label_budget: a shadow asks for no labels of its own (it learns "
            f"from {champion!r}'s); remove the budget"
        )


def _given(secret: SecretStr) -> bool:
    return bool(secret.get_secret_value().strip())


def _default_models() -> dict[str, ModelConfig]:
    return {"default": ModelConfig(algorithm="dsal", cost=0.25, n_features=68)}


class Settings(BaseSettings):
    """Everything a worker needs, validated once at start-up."""

    model_config = SettingsConfigDict(
        env_prefix="ABSTAIN_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    broker: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("kafka://127.0.0.1:9092",),
        description="bootstrap servers, comma separated host:port (kafka:// optional)",
    )
    app_id: str = Field(
        default="abstain",
        min_length=1,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="names the consumer groups and the changelogs: one per deployment",
    )
    datadir: Path = Field(
        default=Path("/tmp/abstain"),  # noqa: S108 - per-worker scratch, overridable
        description="scratch directory of the worker (nothing in it must survive)",
    )
    topics: Topics = Topics()
    partitions: Partitions = Partitions()
    topic_policy: TopicPolicy = TopicPolicy()
    web: Web = Web()
    desk: Desk = Desk()
    security: KafkaSecurity = KafkaSecurity()
    label_token: SecretStr | None = Field(
        default=None, description=f"bearer token for the label API (>= {MIN_TOKEN} characters)"
    )
    snapshot_key: SecretStr | None = Field(
        default=None,
        description=f"HMAC key that signs model snapshots (>= {MIN_KEY} characters); when set, "
        "unsigned or mis-signed snapshots are refused",
    )
    snapshot_key_previous: SecretStr | None = Field(
        default=None, description="the key being rotated out: still accepted, never used to sign"
    )
    max_importance_weight: float = Field(
        default=100.0,
        ge=1.0,
        description="cap of 1/p for a label's importance weight (p is floored at its inverse)",
    )
    republish_seconds: float = Field(
        default=300.0,
        gt=0.0,
        description="how often the learner publishes its models' newest snapshots again (a new "
        "key re-signs them); a model whose served version differs from the learner's is "
        "republished within seconds",
    )
    label_ack_timeout_seconds: float = Field(
        default=5.0, gt=0.0, le=60.0, description="longest wait for Kafka to acknowledge a label"
    )
    request_ttl_seconds: float = Field(
        default=3600.0, gt=0.0, description="how long a label request waits for its label"
    )
    max_message_bytes: int = Field(
        default=1_000_000, ge=64, description="largest record read or written; larger: dead letter"
    )
    max_state_bytes: int | None = Field(
        default=None,
        ge=KAFKA_RECORD,
        le=MAX_STATE_BYTES,
        description="largest record of the learner's own tables: a model's whole state (its "
        "challengers, what it remembers, its normaliser), which only the learner reads; the "
        "models topic carries what a scorer reads of it, under max_message_bytes. Unset: "
        "room for the largest state the configured models may reach (a declared model's "
        "hashed buckets: 72 bytes each and 512 KiB), and no less than a version may take",
    )
    max_inflated_bytes: int = Field(
        default=134_217_728,
        ge=1_048_576,
        description="largest a compressed record batch may inflate to (fetch sizes bound "
        "compressed bytes only); larger: the batch is refused before it is inflated whole and "
        "read as unreadable (the partition stops there until `abstain skip`). At least "
        "fetch_bytes; keep it well inside the worker's memory limit",
    )
    max_features: int = Field(
        default=100_000,
        ge=1,
        description="most features a model may have (a declared model's hashed buckets are "
        "bounded by its hash_bits instead)",
    )
    stall_seconds: float = Field(
        default=60.0, gt=0.0, description="lag without progress this long fails /healthz"
    )
    pinned_transaction_seconds: float = Field(
        default=30.0,
        gt=0.0,
        description="a consumed partition whose last stable offset stands this long behind its "
        "high watermark (a transaction neither committed nor aborted, under read_committed) is "
        "named in /healthz (pinned) and abstain_pinned_transaction_seconds passes it",
    )
    batch_size: int = Field(
        default=256, ge=1, description="most events scored together (one decide_many)"
    )
    orphan_label_seconds: float = Field(
        default=30.0,
        gt=0.0,
        description="how long a label may wait for its request before it is dead-lettered",
    )
    expired_grace_seconds: float = Field(
        default=300.0,
        ge=0.0,
        description="how long an expired request is kept so a late label reads 'expired'",
    )
    label_group_ms: float = Field(
        default=250.0,
        gt=0.0,
        le=60_000.0,
        description="longest the learner applies labels before one flush makes them durable "
        "and each model's newest version, which holds them all, is written (a group commit); "
        "a fetched batch that takes longer is written in several groups, so a label's version "
        "is served this soon after it is applied",
    )
    commit_interval_seconds: float = Field(
        default=2.8,
        gt=0.0,
        description="how often the learner commits the offsets it handled (the scoring path "
        "commits each batch once its outputs are acknowledged)",
    )
    session_timeout_seconds: float = Field(
        default=60.0,
        ge=6.0,
        description="consumer group session timeout: how soon a dead worker's partitions move",
    )
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        default="zstd",
        description="codec of every record batch abstain's producers write (decisions, label "
        "requests, changelogs, snapshots, dead letters; zstd: a seventh of the bytes for no "
        "more CPU, loadtest/compression.py); every codec is read whatever this is",
    )
    isolation_level: Literal["read_committed", "read_uncommitted"] = Field(
        default="read_committed",
        description="what every consumer reads of transactional producers: read_committed "
        "never sees records of an aborted (or still open) transaction",
    )
    sweep_every: int = Field(
        default=100, ge=1, description="labels between sweeps of expired requests"
    )
    models: dict[str, ModelConfig] = Field(
        default_factory=_default_models, description="the served models, by name"
    )
    default_model: str = Field(default="default", description="the model of events that name none")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="log level of the worker and the desk"
    )

    @field_validator("label_token", "snapshot_key", "snapshot_key_previous")
    @classmethod
    def _secret(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        minimum = MIN_TOKEN if info.field_name == "label_token" else MIN_KEY
        return check_secret(value, str(info.field_name), minimum)

    @field_validator("broker", mode="before")
    @classmethod
    def _split_brokers(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            return (
                tuple(v if "://" in v else f"kafka://{v}" for v in value if isinstance(v, str))
                or value
            )
        return value

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if not self.broker:
            raise ValueError("broker: give at least one host:port")
        if not self.models:
            raise ValueError("models: configure at least one model")
        if self.max_inflated_bytes < self.fetch_bytes:
            raise ValueError(
                f"max_inflated_bytes {self.max_inflated_bytes} is below fetch_bytes "
                f"{self.fetch_bytes} (max(1 MiB, 2 x max_message_bytes), and room for the "
                "learner's state of a model: state_bytes): a batch that is read whole "
                "uncompressed would be refused once compressed"
            )
        for name, model in self.models.items():
            if not name or not all(c.isalnum() or c in "._-" for c in name):
                raise ValueError(f"models: bad model name {name!r} (letters, digits, . _ -)")
            if name.startswith("__"):
                raise ValueError(
                    f"models: bad model name {name!r} (names starting with __ "
                    "are the service's own keys)"
                )
            hashed = 0 if model.fields is None else model.fields.buckets  # hash_bits bounds
            if model.n_inputs - hashed > self.max_features:
                raise ValueError(
                    f"models.{name}: {model.n_inputs - hashed} features exceeds max_features "
                    f"{self.max_features}"
                )
            if self.max_state_bytes is not None:
                _check_room(name, model, self.max_state_bytes)
        if self.default_model not in self.models:
            raise ValueError(
                f"default_model {self.default_model!r} is not one of the models "
                f"{sorted(self.models)}"
            )
        for name, model in self.models.items():
            _check_shadow(name, model, self.models)
        if self.models[self.default_model].champion is not None:
            raise ValueError(f"default_model {self.default_model!r} is a shadow; name a champion")
        return self

    def shadows_of(self, champion: str) -> tuple[str, ...]:
        """The models that run as shadows of ``champion`` (sorted by name)."""
        return tuple(sorted(n for n, m in self.models.items() if m.champion == champion))

    def group(self, route: str) -> tuple[str, ...]:
        """The models that can serve the events addressed to ``route``: itself, then its
        shadows (any of them may be promoted to serve)."""
        return (route, *self.shadows_of(route))

    def learner_key(self, model: str) -> str:
        """The model whose label topics' key carries ``model``'s labels: its champion for a
        shadow, itself otherwise (a shadow's state lives with its champion's)."""
        return self.models[model].champion or model

    @property
    def fetch_bytes(self) -> int:
        """Fetch and request size of every Kafka client: room for the largest message (an
        input, a model version, or a learner's state with its key and headers)."""
        return max(self._message_fetch, self.state_bytes + VERSION_HEADROOM)

    @property
    def _message_fetch(self) -> int:
        """Room for twice the largest input."""
        return max(1_048_576, self.max_message_bytes * 2)

    @property
    def state_bytes(self) -> int:
        """The most bytes the learner's state of a model version may take (its tables'
        records: the models and history changelogs): ``max_state_bytes``, or else the most
        any configured model may need, and never less than :attr:`version_bytes`."""
        if self.max_state_bytes is not None:
            return max(self.max_state_bytes, self.version_bytes)
        return max(self.version_bytes, *(_room(m) for m in self.models.values()))

    @property
    def version_bytes(self) -> int:
        """The most bytes a model version's record may take (a learner refuses a label whose
        version would take more): ``max_message_bytes``, what the topics are to take, or
        Kafka's default record (1,000,000) when it is set below that (events may be held
        smaller than versions), within what every client writes and reads
        (:attr:`fetch_bytes`) less room for its key, headers and framing."""
        room = self._message_fetch - VERSION_HEADROOM
        return min(max(self.max_message_bytes, KAFKA_RECORD), room)

    @property
    def bootstrap_servers(self) -> list[str]:
        """``host:port`` strings for plain aiokafka clients."""
        return [b.split("://", 1)[1] for b in self.broker]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))


class _FileSource(PydanticBaseSettingsSource):
    """Reads the JSON / TOML file named by ``ABSTAIN_CONFIG`` (lowest precedence)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # pragma: no cover - __call__ is used instead

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("ABSTAIN_CONFIG")
        return read_config_file(Path(path)) if path else {}


def read_document(path: Path, *, what: str, error: type[AbstainError]) -> Any:
    """Parse a ``.json`` or ``.toml`` file (``what`` names it in messages); every problem
    (unreadable, another suffix, not valid) is an ``error`` that says which."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"{what} {str(path)!r}: {exc.strerror}") from exc
    if path.suffix not in (".toml", ".json"):
        raise error(f"{what} {str(path)!r}: use a .json or .toml file")
    try:
        if path.suffix == ".toml":
            return tomllib.loads(raw.decode("utf-8"))
        return orjson.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(f"{what} {str(path)!r} is not valid: {exc}") from exc


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a ``.json`` or ``.toml`` settings file into a plain dict."""
    data = read_document(path, what="config file", error=ConfigError)
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a table / object")
    return data


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Build the settings, raising :class:`ConfigError` with one line per bad field.

    ``config`` takes the place of ``ABSTAIN_CONFIG``; ``overrides`` win over everything.

    >>> load_settings(web={"port": 7000}).web.port
    7000
    >>> load_settings(models={"m": {"cost": 0.7, "n_features": 2}}, default_model="m")
    Traceback (most recent call last):
    ...
    service.config.ConfigError: invalid settings:
      models.m.cost: Input should be less than 0.5
    """
    previous = os.environ.get("ABSTAIN_CONFIG")
    try:
        if config is not None:
            os.environ["ABSTAIN_CONFIG"] = str(config)
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None
    finally:
        if config is not None:
            if previous is None:
                os.environ.pop("ABSTAIN_CONFIG", None)
            else:
                os.environ["ABSTAIN_CONFIG"] = previous


def _describe(exc: ValidationError) -> str:
    lines = ["invalid settings:"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {msg}" if where else f"  {msg}")
    return "\n".join(lines)


def common_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of every command that reads the worker's settings: ``--broker``, ``--config``
    and ``--app-id`` (:func:`settings_from_arguments` applies them)."""
    parser.add_argument("--broker", help="bootstrap server(s), comma separated host:port")
    parser.add_argument("--config", type=Path, help="settings file (.json or .toml)")
    parser.add_argument("--app-id", help="application id (consumer group, table names)")


def settings_from_arguments(args: argparse.Namespace, **extra: Any) -> Settings:
    """The settings of the environment and ``--config``, with ``--broker``, ``--app-id`` and
    the ``extra`` values that are not None over them (:class:`ConfigError` if invalid)."""
    overrides: dict[str, Any] = {k: v for k, v in extra.items() if v is not None}
    if args.broker:
        overrides["broker"] = args.broker
    if args.app_id:
        overrides["app_id"] = args.app_id
    return load_settings(args.config, **overrides)
