"""The learner's checks of what it reads, and the inputs a request teaches, for one
deployment.

:func:`admission` builds the :class:`~service.records.admission.Admission` of ``settings``
(the models that decide and their widths, the partition each one's key maps to, their
groups, how a request id is derived, whether a declared model's fields encode). The learner
(:mod:`.joiner`, the pending store), a rebuild and the label desk use this one function, so
they agree on what is open.

>>> from service.config import load_settings
>>> admit = admission(load_settings(default_model="m", models={
...     "m": {"algorithm": "dsal", "cost": 0.2, "n_features": 2}}))
>>> admit.widths, admit.groups
({'m': 2}, {'m': ('m',)})

:func:`inputs_of` gives the inputs a request teaches its model: the request's ``features``,
or, for a model that declares ``fields`` (whose scorers send the event's fields and no
features), those fields encoded under the model's declaration as the scorer encoded them
(:mod:`service.features`: seeded hashes, the same on every process). One place for the
learner, a correction's re-derivation, a rebuild and the label desk.

>>> from service.config import ModelConfig
>>> from service.records import LabelRequest
>>> config = ModelConfig.model_validate({"algorithm": "dsal", "fields": {
...     "hash_bits": 2, "fields": {"amount": "number", "country": "category"}}})
>>> request = LabelRequest("r", "e", "m", None, 0.0, 1.0, 0, 1.0, 0, 0.0, 1.0, 0.0,
...                        fields={"amount": 2.5, "country": "SE"})
>>> inputs_of(request, config).tolist()
[2.5, 1.0, 0.0, 0.0, 0.0]
>>> from dataclasses import replace
>>> inputs_of(replace(request, fields={"amount": "2.5"}), config)
Traceback (most recent call last):
service.records.codec.BadMessage: field: field 'amount': a string where a number is declared
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from service.config import ModelConfig, Settings
from service.features import FieldError, FieldsConfig, encoder_of
from service.learning.sparse import SparseRow
from service.records import BadMessage, LabelRequest, request_id
from service.records.admission import Admission
from service.records.codec import SparseNumbers, array_of
from service.stream.kafka.produce import partition_for

__all__ = ["admission", "fits", "inputs_of"]


def admission(settings: Settings) -> Admission:
    """The learner's checks of the label topics and its changelog, for ``settings``."""
    deciding = {name: m for name, m in settings.models.items() if m.champion is None}
    n = settings.partitions.labels
    return Admission(
        widths={name: m.n_inputs for name, m in deciding.items()},
        partitions={name: partition_for(name.encode(), n) for name in deciding},
        groups={name: settings.group(name) for name in deciding},
        shadows={name: m.champion for name, m in settings.models.items() if m.champion},
        derive_id=request_id,
        fits={name: fits(m.fields) for name, m in deciding.items() if m.fields is not None},
    )


def inputs_of(request: LabelRequest, config: ModelConfig, *, rows: bool = False) -> Any:
    """The whole input vector ``request`` teaches a model of ``config``: its features, or its
    fields encoded under the declaration. :class:`~service.records.BadMessage` when the
    fields do not fit it (``field``, naming the field), or the request carries neither
    features nor fields a declaration reads (``feature_count``). ``rows``: a declared
    model's inputs, and features written as their entries, as a
    :class:`~service.learning.sparse.SparseRow` (the same numbers)."""
    if request.features is not None:
        features = request.features
        if rows and type(features) is SparseNumbers:
            return SparseRow.of(features.at, features.values, features.size)
        return array_of(features)
    if config.fields is None or request.fields is None:
        raise BadMessage(
            "feature_count",
            f"request {request.request_id} carries no features, and its model declares no "
            "fields to encode",
        )
    if rows:
        idx, values = _encoded(config.fields, request.fields, dense=False)
        return SparseRow.of(idx, values, encoder_of(config.fields).width)
    dense: np.ndarray = _encoded(config.fields, request.fields, dense=True)
    return dense


def fits(declaration: FieldsConfig) -> Callable[[Mapping[str, Any]], None]:
    """A check that an event's fields encode under ``declaration`` (``field`` names the one
    that does not), without encoding them (:meth:`~service.features.Encoder.check`): the
    learner's admission of a request that carries fields alone."""

    encoder = encoder_of(declaration)

    def check(fields: Mapping[str, Any]) -> None:
        try:
            encoder.check(fields)
        except FieldError as bad:
            raise BadMessage("field", str(bad)) from bad

    return check


def _encoded(declaration: FieldsConfig, fields: Mapping[str, Any], *, dense: bool) -> Any:
    encoder = encoder_of(declaration)
    try:
        return encoder.dense(fields) if dense else encoder.sparse(fields)
    except FieldError as bad:
        raise BadMessage("field", str(bad)) from bad
