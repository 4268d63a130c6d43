"""How a model says what an event's fields are: the ``fields`` block of a model's settings.

A declaration names each field an event may carry and its kind:

* ``number`` — a finite number (an integer or a float; a boolean is refused), at a fixed
  coordinate of its own, in the declared order, standardised as any dense feature;
* ``boolean`` — ``true`` is 1 at the hashed coordinate of the field's name, ``false`` 0;
* ``category`` — a string (or an integer, read as its decimal text): 1 at the hashed
  coordinate of ``name=value``;
* ``tokens`` — a list of strings, or one string split at white space: a bag of words, each
  token adding 1 at the hashed coordinate of ``name^token``;
* ``ignore`` — read and dropped.

A field that is ``null`` or missing is ``absent`` by default: it adds nothing (a number's
coordinate holds 0). ``missing: indicator`` also sets 1 at the hashed coordinate of
``name?``, so the model learns what a missing value means; ``missing: refuse`` dead-letters
such an event. ``cross`` pairs two hashed fields (Vowpal Wabbit's ``-q``): every key of the
first with every key of the second, at the hashed coordinate of ``a*b`` (the product of
their values). A field an event sends that is not declared is refused (``undeclared:
refuse``, the default) or dropped (``undeclared: ignore``).

The model's inputs are the numbers first, then, when a field is hashed, ``2**hash_bits``
buckets: MurmurHash3 (32 bit, seeded with ``seed``) of each key's UTF-8 bytes, modulo the
buckets (:mod:`service.features.encode`).

>>> d = FieldsConfig.model_validate(
...     {"hash_bits": 4, "fields": {"amount": "number", "country": "category"}})
>>> d.numbers, d.hashed, d.width
(('amount',), True, 17)
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "BUCKET_BYTES",
    "DEFAULT_HASH_BITS",
    "KINDS",
    "MAX_HASH_BITS",
    "VERSION_BASE",
    "FieldSpec",
    "FieldsConfig",
    "Kind",
    "version_room",
]

Kind = Literal["number", "boolean", "category", "tokens", "ignore"]
KINDS: tuple[str, ...] = ("number", "boolean", "category", "tokens", "ignore")
MAX_HASH_BITS = 18
"""The most hashed buckets a model holds, as a power of two. A label costs about the same at
any width (the learner learns the entries an event sets), but the learner's state of a model
holds the weights and statistics of every bucket a stream has touched: up to
:data:`BUCKET_BYTES` each, so a declaration must fit the learner's state size
(:func:`version_room`; ``Settings.state_bytes``, which is made large enough unless
``max_state_bytes`` is set). What a scorer reads of a version (the models topic) holds the
champion's weights of the buckets touched, under ``max_message_bytes``."""

DEFAULT_HASH_BITS = 18
"""The hashed buckets of a declaration that hashes a field and does not say ``hash_bits``."""

BUCKET_BYTES = 72
"""The most bytes a bucket adds to a model version: nine numbers of 8 bytes (the second
standardiser's sum of squares; the weight and the normaliser's sum of the champion and of
each of three challengers). A list is written whole (8 bytes a number) or as its entries
(12 bytes each) when at most half are set, so never more than 8 bytes a number."""

VERSION_BASE = 512 * 1024
"""Room a version needs besides its buckets: the rows and weight snapshots it remembers
(for events of a few hundred entries), the numbers' statistics, the detectors, the
structure."""


def version_room(hash_bits: int | None, numbers: int = 0) -> int:
    """The bytes a version of a declaration of ``2^hash_bits`` buckets and ``numbers``
    number fields may need (:data:`BUCKET_BYTES` a bucket or number, and
    :data:`VERSION_BASE`).

    >>> version_room(12), version_room(16)
    (819200, 5242880)
    """
    return VERSION_BASE + BUCKET_BYTES * ((1 << hash_bits if hash_bits else 0) + numbers)


_NAME_LEN = 256
_FROZEN = ConfigDict(frozen=True, extra="forbid")


class FieldSpec(BaseModel):
    """One declared field: its kind and what a missing or ``null`` value means."""

    model_config = _FROZEN

    kind: Kind = Field(description="number, boolean, category, tokens or ignore")
    missing: Literal["absent", "indicator", "refuse"] = Field(
        default="absent",
        description="a null or missing field: adds nothing (absent), also sets its "
        "missing-indicator bucket (indicator), or dead-letters the event (refuse)",
    )
    max_tokens: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="tokens: the most one event may send in this field (more: dead-lettered)",
    )

    @model_validator(mode="after")
    def _tokens_only(self) -> FieldSpec:
        if self.max_tokens != 10_000 and self.kind != "tokens":
            raise ValueError(f"max_tokens is for a tokens field, not a {self.kind}")
        if self.kind == "ignore" and self.missing != "absent":
            raise ValueError("an ignored field has no missing policy")
        return self


def _spec(value: Any) -> Any:
    """``"number"`` is short for ``{"kind": "number"}``."""
    return {"kind": value} if isinstance(value, str) else value


class FieldsConfig(BaseModel):
    """A model's declaration of its events' fields (see the module docstring)."""

    model_config = _FROZEN

    fields: dict[str, Annotated[FieldSpec, Field()]] = Field(
        description="field name -> kind (or {kind, missing, max_tokens}), in order"
    )
    hash_bits: int | None = Field(
        default=None,
        ge=1,
        le=MAX_HASH_BITS,
        description=f"hashed buckets, as a power of two (1-{MAX_HASH_BITS}); "
        f"{DEFAULT_HASH_BITS} when a field is hashed (boolean, category, tokens, a missing "
        "indicator, a cross) and it is not given. The learner's state of a model may take 72 "
        "bytes a bucket and 512 KiB (max_state_bytes); what a scorer reads, the weights of "
        "the buckets a stream touched (max_message_bytes)",
    )
    seed: int = Field(
        default=0, ge=0, lt=2**32, description="seed of the hash (MurmurHash3, 32 bit)"
    )
    cross: tuple[tuple[str, str], ...] = Field(
        default=(), description="pairs of hashed fields crossed (every key of one by the other's)"
    )
    undeclared: Literal["refuse", "ignore"] = Field(
        default="refuse", description="a field an event sends that is not declared"
    )

    @field_validator("fields", mode="before")
    @classmethod
    def _short_forms(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: _spec(v) for k, v in value.items()}
        return value

    @field_validator("fields")
    @classmethod
    def _names(cls, value: dict[str, FieldSpec]) -> dict[str, FieldSpec]:
        if not value:
            raise ValueError("declare at least one field")
        for name in value:
            if not name.strip() or len(name) > _NAME_LEN:
                raise ValueError(f"a field name must be 1-{_NAME_LEN} characters, not {name!r:.80}")
        if all(spec.kind == "ignore" for spec in value.values()):
            raise ValueError("every field is ignored: the model would see nothing")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> FieldsConfig:
        for a, b in self.cross:
            for name in (a, b):
                spec = self.fields.get(name)
                if spec is None:
                    raise ValueError(f"cross: {name!r} is not a declared field")
                if spec.kind in ("number", "ignore"):
                    raise ValueError(f"cross: {name!r} is a {spec.kind}; cross hashed fields")
            if a == b:
                raise ValueError(f"cross: {a!r} with itself")
        if len(set(self.cross)) != len(self.cross):
            raise ValueError("cross: a pair is given twice")
        if self.hashed and self.hash_bits is None:  # frozen: set as a field's default is
            self.__dict__["hash_bits"] = DEFAULT_HASH_BITS
        if not self.hashed and self.hash_bits is not None:
            raise ValueError("hash_bits is set but no field is hashed")
        return self

    @property
    def numbers(self) -> tuple[str, ...]:
        """The number fields, in order: the model's first inputs."""
        return tuple(n for n, s in self.fields.items() if s.kind == "number")

    @property
    def hashed(self) -> bool:
        """Whether any field lands in the hashed buckets."""
        return bool(self.cross) or any(
            s.kind in ("boolean", "category", "tokens") or s.missing == "indicator"
            for s in self.fields.values()
        )

    @property
    def buckets(self) -> int:
        """Hashed buckets (0 when nothing is hashed)."""
        return 0 if self.hash_bits is None else 1 << self.hash_bits

    @property
    def width(self) -> int:
        """The model's inputs: one per number field, then the buckets."""
        return len(self.numbers) + self.buckets

    @property
    def room(self) -> int:
        """The bytes a model version of this declaration may take, however many of its
        buckets a stream touches (:func:`version_room`; 0 when nothing is hashed)."""
        return 0 if self.hash_bits is None else version_room(self.hash_bits, len(self.numbers))

    @property
    def hashed_from(self) -> int | None:
        """The index of the first hashed bucket among the inputs (None when nothing is
        hashed): the inputs a model's standardisers never centre
        (:func:`~service.learning.serving_pipeline`)."""
        return len(self.numbers) if self.buckets else None
