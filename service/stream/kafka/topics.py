"""The one catalogue of the worker's topics and tables.

Each :class:`Entry` says what a topic is for: the setting that names it (or, for a table,
the changelog ``<app_id>-<name>-changelog``), the partition count it takes, whether it is
compacted, what it carries and who writes and reads it. Everything that needs the list takes
it from here:

- the worker declares every entry (and creates the missing ones with
  ``topic_policy.creation = create``): :func:`declared`;
- the start-up check, the check mode and the partition guard compare the cluster with
  :func:`topic_specs` (:mod:`~service.stream.kafka.guard`);
- the learner consumes the :func:`learned` topics and keeps one table per :data:`TABLES`
  entry; liveness watches :func:`watched`;
- the label desk follows the :func:`desk_topics`;
- the docs: this table is printed from the catalogue (a doctest keeps it true).

>>> print(markdown_table())
| topic | key | value | written by | read by |
|---|---|---|---|---|
| `abstain.features` | event id | `FeatureEvent` | producers | the scoring loop (group `<app_id>-score`) |
| `abstain.decisions` | event id | `Decision` | the scorer | consumers |
| `abstain.label-requests` | model | `LabelRequest` | the scorer | the learner (group `<app_id>-learn`), the desk, tools |
| `abstain.labels` | model | `Label`, `Correction`, `Opinion`, `Rollback`, `Seed` | staff (the desk, `POST /labels`), `abstain labels submit`, `abstain labels correct`, `abstain models rollback`, `abstain models seed` | the learner (group `<app_id>-learn`), the desk |
| `abstain.models` (compacted) | model, `__champions__`, `__skip__/...` | `ModelEnvelope`, `Champions`, `SkipOrder` | the learner, `abstain models promote`, `abstain rebuild --publish`, `abstain models seed`, `abstain skip` | every worker and desk (group-less) |
| `abstain.dead-letters` | — | `DeadLetter` | the scorer, the learner, the model follower, `abstain skip` | people |
| `<app_id>-pending-changelog` (compacted) | request id | `PendingEntry` | the learner (pending table) | the learner (recovery), the desk |
| `<app_id>-orphans-changelog` (compacted) | request id | `ParkedLabel` | the learner (parked table) | the learner (recovery) |
| `<app_id>-models-changelog` (compacted) | model, `<model>@<version>` | `ModelEnvelope` | the learner (models table) | the learner (recovery) |
| `<app_id>-history-changelog` (compacted) | `<model>@<labels offset>`, `<member>#<seq>` | `Step`, `ModelEnvelope` | the learner (history table: what corrections reach) | the learner (recovery) |
| `<app_id>-__assignor-__leader` | — | — | faust | faust (leader election) |

The records are defined in :mod:`service.records`. Adding a topic is an entry here and, for
a topic whose name is a setting, its fields in :class:`service.config.Topics` and
:class:`service.config.Partitions`.
"""  # noqa: E501

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from service.config import VERSION_HEADROOM, Settings

__all__ = [
    "CATALOGUE",
    "TABLES",
    "Entry",
    "TopicSpec",
    "changelog_topic",
    "declared",
    "largest_record",
    "desk_topics",
    "learned",
    "markdown_table",
    "table_topic",
    "topic_specs",
    "watched",
]

Kind = Literal["topic", "table", "faust"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One topic or table of the worker.

    ``field``: the :class:`~service.config.Topics` field that names a topic, or the name of a
    table (``changelog``: the stem of its changelog's name, when it is not the table's);
    ``partitions``: the :class:`~service.config.Partitions` field that counts it (``labels``:
    co-partitioned with the label topics, the count the learner needs); ``key``, ``value``,
    ``writers``, ``readers``: what the docs say of it."""

    field: str
    partitions: str | None
    key: str
    value: str
    writers: str
    readers: str
    kind: Kind = "topic"
    compacted: bool = False
    keyed_by_model: bool = False  # must never be compacted (one record per model would stay)
    learned: bool = False  # the learner consumes it
    scored: bool = False  # the scoring loop consumes it
    desk: bool = False  # the label desk follows it
    changelog: str | None = None
    #: what each part of abstain does with it, ``"<role>:<r|w|rw>"`` (read, write): the
    #: ACLs each role needs (:mod:`~service.stream.kafka.acls`)
    access: tuple[str, ...] = ()

    def rights(self, role: str) -> str:
        """What ``role`` (worker, desk, operator) does with it: ``""``, ``"r"``, ``"w"``,
        ``"rw"``."""
        for item in self.access:
            who, _, what = item.partition(":")
            if who == role:
                return what
        return ""

    def name(self, settings: Settings, app_id: str | None = None) -> str:
        """The topic's name under ``settings`` (a table's changelog: of ``app_id``, the
        settings' by default)."""
        app = settings.app_id if app_id is None else app_id
        if self.kind == "table":
            return changelog_topic(app, self.changelog or self.field)
        if self.kind == "faust":
            return f"{app}-{self.field}"
        name: str = getattr(settings.topics, self.field)
        return name

    def count(self, settings: Settings) -> int:
        """The partition count the worker needs (1 for faust's own topic)."""
        if self.partitions is None:
            return 1
        count: int = getattr(settings.partitions, self.partitions)
        return count

    def largest(self, settings: Settings) -> int | None:
        """The most bytes a record the worker writes here may take, with its key, headers
        and framing: what a scorer reads of a model version (``version_bytes``) on the
        models topic, the learner's state of one (``state_bytes``) in its tables, else an
        input as large as ``max_message_bytes``; None where the worker writes nothing (or
        faust's own small records)."""
        if "w" not in self.rights("worker") or self.kind == "faust":
            return None
        body = settings.max_message_bytes
        if "ModelEnvelope" in self.value:
            body = settings.state_bytes if self.kind == "table" else settings.version_bytes
        return body + VERSION_HEADROOM

    @property
    def largest_is(self) -> tuple[str, str]:
        """What the largest record the worker writes here is, and the setting bounding it."""
        if "ModelEnvelope" not in self.value:
            return ("an input", "max_message_bytes")
        if self.kind == "table":
            return ("the learner's state of a model: state_bytes", "max_state_bytes")
        return ("a model version: version_bytes", "max_message_bytes")

    @property
    def copartitioned(self) -> bool:
        """Keyed by model and read by the learner (or one of its changelogs): its partition
        count is fixed by ``partitions.labels``."""
        return self.partitions == "labels"

    @property
    def role(self) -> str:
        """What a problem report calls it: ``topics.labels``, ``table pending``, ..."""
        if self.kind == "table":
            return f"table {self.changelog or self.field}"
        if self.kind == "faust":
            return "faust's leader election"
        return f"topics.{self.field}"


_BY_MODEL = "model"
_W, _D, _O = "worker:", "desk:", "operator:"
_LEARNER = "the learner (group `<app_id>-learn`)"

#: every topic and table of the worker, in the order the docs and the checks list them
CATALOGUE: tuple[Entry, ...] = (
    Entry(
        "features",
        "features",
        "event id",
        "`FeatureEvent`",
        "producers",
        "the scoring loop (group `<app_id>-score`)",
        scored=True,
        access=(_W + "r", _O + "r"),
    ),
    Entry(
        "decisions",
        "decisions",
        "event id",
        "`Decision`",
        "the scorer",
        "consumers",
        access=(_W + "w",),
    ),
    Entry(
        "label_requests",
        "labels",
        _BY_MODEL,
        "`LabelRequest`",
        "the scorer",
        f"{_LEARNER}, the desk, tools",
        keyed_by_model=True,
        learned=True,
        desk=True,
        access=(_W + "rw", _D + "r", _O + "r"),
    ),
    Entry(
        "labels",
        "labels",
        _BY_MODEL,
        "`Label`, `Correction`, `Opinion`, `Rollback`, `Seed`",
        "staff (the desk, `POST /labels`), `abstain labels submit`, `abstain labels correct`, "
        "`abstain models rollback`, `abstain models seed`",
        f"{_LEARNER}, the desk",
        keyed_by_model=True,
        learned=True,
        desk=True,
        access=(_W + "rw", _D + "rw", _O + "rw"),
    ),
    Entry(
        "models",
        "models",
        "model, `__champions__`, `__skip__/...`",
        "`ModelEnvelope`, `Champions`, `SkipOrder`",
        "the learner, `abstain models promote`, `abstain rebuild --publish`, "
        "`abstain models seed`, `abstain skip`",
        "every worker and desk (group-less)",
        compacted=True,
        access=(_W + "rw", _D + "r", _O + "rw"),
    ),
    Entry(
        "dead_letters",
        "dead_letters",
        "—",
        "`DeadLetter`",
        "the scorer, the learner, the model follower, `abstain skip`",
        "people",
        access=(_W + "w", _O + "w"),
    ),
    Entry(
        "pending",
        "labels",
        "request id",
        "`PendingEntry`",
        "the learner (pending table)",
        "the learner (recovery), the desk",
        kind="table",
        compacted=True,
        desk=True,
        access=(_W + "rw", _D + "r"),
    ),
    Entry(
        "parked",
        "labels",
        "request id",
        "`ParkedLabel`",
        "the learner (parked table)",
        "the learner (recovery)",
        kind="table",
        compacted=True,
        changelog="orphans",
        access=(_W + "rw",),
    ),
    Entry(
        "models",
        "labels",
        "model, `<model>@<version>`",
        "`ModelEnvelope`",
        "the learner (models table)",
        "the learner (recovery)",
        kind="table",
        compacted=True,
        access=(_W + "rw",),
    ),
    Entry(
        "history",
        "labels",
        "`<model>@<labels offset>`, `<member>#<seq>`",
        "`Step`, `ModelEnvelope`",
        "the learner (history table: what corrections reach)",
        "the learner (recovery)",
        kind="table",
        compacted=True,
        access=(_W + "rw",),
    ),
    Entry(
        "__assignor-__leader",
        None,
        "—",
        "—",
        "faust",
        "faust (leader election)",
        kind="faust",
        access=(_W + "rw",),
    ),
)

#: the learner's tables, by name, in the order it reads them back
TABLES: tuple[Entry, ...] = tuple(e for e in CATALOGUE if e.kind == "table")


def changelog_topic(app_id: str, table: str) -> str:
    """The changelog topic of ``table`` (the name faust's tables used, so a worker reads
    what earlier versions wrote).

    >>> changelog_topic("abstain", "pending")
    'abstain-pending-changelog'
    """
    return f"{app_id}-{table}-changelog"


def table_topic(settings: Settings, table: str) -> str:
    """The changelog of the learner's table ``table`` (``pending``, ``parked``, ``models``).

    >>> table_topic(Settings(), "parked")
    'abstain-orphans-changelog'
    """
    (entry,) = [e for e in TABLES if e.field == table]
    return entry.name(settings)


def declared(settings: Settings) -> list[tuple[str, int, bool]]:
    """(name, partitions, compacted) of every topic the worker declares (faust's own topic is
    faust's to declare)."""
    return [
        (e.name(settings), e.count(settings), e.compacted) for e in CATALOGUE if e.kind != "faust"
    ]


def learned(settings: Settings) -> tuple[str, ...]:
    """The topics the learner consumes (label requests first: a batch's requests are
    handled before its labels)."""
    return tuple(e.name(settings) for e in CATALOGUE if e.learned)


def watched(settings: Settings) -> tuple[str, ...]:
    """The topics liveness watches: those the loops consume."""
    return tuple(e.name(settings) for e in CATALOGUE if e.scored or e.learned)


def desk_topics(settings: Settings) -> tuple[str, ...]:
    """The worker's topics the label desk follows (besides its own leases topic)."""
    return tuple(e.name(settings) for e in CATALOGUE if e.desk)


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic the worker needs: its name, partitions, cleanup policy and role."""

    name: str
    partitions: int
    role: str  # settings field or table, for messages: "topics.labels", "table pending"
    compacted: bool = False
    copartitioned: bool = False  # keyed by model, read by the learner: the count is fixed
    keyed_by_model: bool = False  # must never be compacted
    largest: int | None = None  # bytes of the largest record the worker writes (None: none)
    # what that record is, and the setting that bounds it (a problem report says both)
    largest_is: tuple[str, str] = ("an input", "max_message_bytes")


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic and changelog a worker of ``settings`` reads or writes.

    >>> [(s.name, s.partitions, s.compacted) for s in topic_specs(Settings())][:2]
    [('abstain.features', 8, False), ('abstain.decisions', 8, False)]
    """
    return [
        TopicSpec(
            e.name(settings),
            e.count(settings),
            e.role,
            compacted=e.compacted,
            copartitioned=e.copartitioned,
            keyed_by_model=e.keyed_by_model,
            largest=e.largest(settings),
            largest_is=e.largest_is,
        )
        for e in CATALOGUE
    ]


#: what a broker takes by default (``message.max.bytes``, the default of every topic's
#: ``max.message.bytes``): 1 MiB and 12 bytes
BROKER_RECORD = 1_048_588


def largest_record(settings: Settings, name: str) -> dict[str, str]:
    """The ``max.message.bytes`` a topic ``name`` the worker creates is given: room for the
    largest record it writes there when that is more than a broker takes by default
    (``max_message_bytes`` raised), else nothing (the broker's default).

    >>> largest_record(Settings(), "abstain.models")
    {}
    >>> largest_record(Settings(max_message_bytes=4_000_000), "abstain.models")
    {'max.message.bytes': '4004096'}
    """
    for spec in topic_specs(settings):
        if spec.name == name and spec.largest is not None and spec.largest > BROKER_RECORD:
            return {"max.message.bytes": str(spec.largest)}
    return {}


def markdown_table(settings: Settings | None = None) -> str:
    """The catalogue as the docs show it (names under ``settings``, the defaults when None;
    changelogs with the placeholder ``<app_id>``)."""
    s = Settings() if settings is None else settings
    rows = ["| topic | key | value | written by | read by |", "|---|---|---|---|---|"]
    for e in CATALOGUE:
        name = f"`{e.name(s, app_id='<app_id>')}`" + (" (compacted)" if e.compacted else "")
        rows.append(f"| {name} | {e.key} | {e.value} | {e.writers} | {e.readers} |")
    return "\n".join(rows)
