r"""What the learner accepts from the label topics and its pending changelog: one set of
checks for every reader, so that the learner and the label desk agree on which requests are
open and which labels count.

A record that parses (:mod:`.wire`, :mod:`.state`) can still be one the learner refuses: a
model that is not configured or is a shadow (``unknown_model``), the wrong number of
features (``feature_count``), a request id the service would not derive from (model, event)
(``forged_id``), a key that is not the model's name (``bad_key``), a partition the model's
key does not map to (``wrong_partition``), a serving model outside the request's group
(``unknown_model``). :class:`Admission` makes those checks; the layout it checks against
(the configured models, the partition of each, how a request id is derived) is given by
the caller, so this module still imports neither the settings nor a Kafka client.

>>> import hashlib
>>> derive = lambda m, e: hashlib.blake2b(f"{m}\x1f{e}".encode(), digest_size=16).hexdigest()
>>> admit = Admission(widths={"m": 2}, partitions={"m": 1}, groups={"m": ("m",)},
...                   shadows={}, derive_id=derive)
>>> from service.records.wire import Label
>>> admit.label(Label("r", "m", 1, "ann", None), key=b"m", partition=1).model
'm'
>>> admit.label(Label("r", "m", 1, "ann", None), key=b"x", partition=1)
Traceback (most recent call last):
...
service.records.codec.BadMessage: bad_key: key b'x' is not the model name 'm'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from service.records.codec import BadMessage
from service.records.state import PendingEntry
from service.records.wire import Label, LabelRequest

__all__ = ["Admission"]


@dataclass(frozen=True, slots=True)
class Admission:
    """The checks (module docstring) against one deployment's layout.

    ``widths``: the inputs of every model that decides (shadows are not here: they ask for
    nothing and take their champion's labels); ``partitions``: the partition of the label
    topics (and of the learner's changelogs, co-partitioned with them) that each such
    model's key maps to; ``groups``: the models that may serve each (itself and its
    shadows); ``shadows``: shadow -> champion, to say why a shadow's record is refused;
    ``derive_id``: the request id of (model, event id); ``fits``: for each model that
    declares fields, the check that a request's fields encode under its declaration (a
    request of such a model may carry its event's fields and no features).
    """

    widths: Mapping[str, int]
    partitions: Mapping[str, int]
    groups: Mapping[str, tuple[str, ...]]
    shadows: Mapping[str, str]
    derive_id: Callable[[str, str], str]
    fits: Mapping[str, Callable[[Mapping[str, Any]], None]] = field(default_factory=dict)

    def deciding(self, model: str) -> int:
        """The number of inputs of ``model``, a model that decides; ``unknown_model``
        otherwise (no such model, or a shadow)."""
        width = self.widths.get(model)
        if width is not None:
            return width
        champion = self.shadows.get(model)
        if champion is not None:
            raise BadMessage(
                "unknown_model",
                f"model {model!r} is a shadow of {champion!r}: it takes {champion!r}'s labels",
            )
        raise BadMessage("unknown_model", f"no model named {model!r}")

    def placement(self, model: str, *, key: bytes | None, partition: int) -> None:
        """A record about ``model`` read with ``key`` from ``partition``: keyed by the model
        (``bad_key``) and on the partition that key maps to (``wrong_partition``)."""
        if key != model.encode():
            raise BadMessage("bad_key", f"key {key!r} is not the model name {model!r}")
        expected = self.partitions[model]
        if partition != expected:
            raise BadMessage(
                "wrong_partition", f"model {model!r} maps to partition {expected}, not {partition}"
            )

    def request(self, request: LabelRequest) -> LabelRequest:
        """A request's content: a deciding model, its width, the derived id (where it was
        read is :meth:`placement`'s, its serving model :meth:`server`'s)."""
        width = self.deciding(request.model)
        if request.features is None:  # its fields, encoded by the learner
            fits = self.fits.get(request.model)
            if fits is None or request.fields is None:
                raise BadMessage(
                    "feature_count",
                    f"model {request.model!r} takes {width} features, got none (a request "
                    "carries fields alone for a model that declares them)",
                )
            fits(request.fields)
        elif len(request.features) != width:
            raise BadMessage(
                "feature_count",
                f"model {request.model!r} takes {width} features, got {len(request.features)}",
            )
        if request.request_id != self.derive_id(request.model, request.event_id):
            raise BadMessage(
                "forged_id",
                f"{request.request_id} is not the id of event "
                f"{request.event_id!r} of model {request.model!r}",
            )
        return request

    def server(self, request: LabelRequest) -> LabelRequest:
        """The model that decided ``request`` is one of its group."""
        if request.server not in self.groups[request.model]:
            raise BadMessage(
                "unknown_model",
                f"{request.server!r} cannot serve {request.model!r} (not in its group)",
            )
        return request

    def label_request(
        self, request: LabelRequest, *, key: bytes | None, partition: int
    ) -> LabelRequest:
        """A record of the label-requests topic, as the learner takes it, in the learner's
        order of checks (but for ``duplicate_id``, which needs what the learner holds and
        comes between the placement and the server)."""
        self.request(request)
        self.placement(request.model, key=key, partition=partition)
        return self.server(request)

    def label(self, label: Label, *, key: bytes | None, partition: int) -> Label:
        """A record of the labels topic, as the learner takes it before joining it with its
        request (an unknown or expired request, or one answered already, is the join's)."""
        self.deciding(label.model)
        self.placement(label.model, key=key, partition=partition)
        return label

    def pending(self, entry: PendingEntry, *, key: bytes | None, partition: int) -> PendingEntry:
        """A record of the learner's pending changelog: the learner writes an entry under
        its request's id, on its model's partition, only for a request it took."""
        request = self.server(self.request(entry.request))
        if key != request.request_id.encode():
            raise BadMessage("bad_key", f"key {key!r} is not the request id {request.request_id!r}")
        expected = self.partitions[request.model]
        if partition != expected or entry.partition != expected:
            where = f"partition {expected}, not {partition} (the entry says {entry.partition})"
            raise BadMessage("wrong_partition", f"model {request.model!r} maps to {where}")
        return entry
