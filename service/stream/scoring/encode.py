"""A batch's decisions and label requests encoded together: the very bytes
:meth:`Decision.to_json <service.records.Decision.to_json>` and
:meth:`LabelRequest.to_json <service.records.LabelRequest.to_json>` write, without a record
object per event (pure).

orjson writes a record as its fields in order, each value as orjson writes it alone. So the
encoders here fill each record's template with values orjson wrote for the whole batch at
once: every float of a column in one call (a list of floats, split at its commas; floats
hold no comma), every feature row of the requests in one call (a float64 matrix: orjson
writes a numpy float64 exactly as the float it holds), each id alone (an id may hold a
comma). What is the same for a whole block (model, rho, version, the time) is written once.

>>> import numpy as np
>>> from service.records import Action, Decision
>>> d = Decision("e1", "m", Action.PREDICT, -1, -0.25, 0.5, 3, True, 0.75, 10.5)
>>> values = decisions("m", ["e1"], np.array([-1]), np.array([-0.25]), 0.5, 3,
...                    np.array([True]), np.array([0.75]), now=10.5)
>>> values == [d.to_json()]
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import orjson

from service.records.ids import request_ids
from service.records.wire import FeatureMoments

__all__ = ["decisions", "floats", "label_requests", "priorities"]

#: ``"action"`` and ``"label"`` of a decision, by the learner's label
_ACTIONS: Final = {1: b'predict","label":1', -1: b'predict","label":-1', 0: b'reject","label":null'}
_BOOLS: Final = (b"false", b"true")


def floats(values: Any) -> list[bytes]:
    """Each float of ``values`` as orjson writes it.

    >>> floats(np.array([0.1, -2.0, 1e-7, 1e22]))
    [b'0.1', b'-2.0', b'1e-7', b'1e+22']
    """
    out: list[float] = np.asarray(values, dtype=np.float64).tolist()
    if not out:
        return []
    return orjson.dumps(out)[1:-1].split(b",")


def _text(value: Any) -> bytes:
    """``value`` as orjson writes it, made safe for a %-template."""
    return orjson.dumps(value).replace(b"%", b"%%")


def decisions(
    model: str,
    ids: Sequence[str],
    labels: Any,
    scores: Any,
    rho: float,
    version: int,
    queried: Any,
    probabilities: Any,
    *,
    now: float,
) -> list[bytes]:
    """The decisions of one model's events, as :meth:`Decision.to_json` writes them."""
    template = (
        b'{"id":%b,"model":'
        + _text(model)
        + b',"action":"%b,"score":%b,"rho":'
        + _text(float(rho))
        + b',"model_version":'
        + _text(int(version))
        + b',"queried":%b,"query_probability":%b,"ts":'
        + _text(float(now))
        + b"}"
    )
    dumps, actions, bools = orjson.dumps, _ACTIONS, _BOOLS
    columns = zip(
        ids,
        np.asarray(labels).tolist(),
        floats(scores),
        np.asarray(queried, dtype=bool).tolist(),
        floats(probabilities),
        strict=True,
    )
    return [
        template % (dumps(i), actions.get(label) or _action(label), score, bools[asked], p)
        for i, label, score, asked, p in columns
    ]


def _action(label: int) -> bytes:
    """A label none of +1, -1, 0 (no learner gives one): predicted, as ``Decision`` says."""
    return b'predict","label":' + orjson.dumps(int(label))


def priorities(scores: Any, rho: float) -> np.ndarray:
    """The label queue's priority of each score: closer to either threshold (+-rho) is
    higher, in (0, 1] (the same floats as ``1 / (1 + min(|s - rho|, |s + rho|))``).

    >>> priorities(np.array([0.5, 1.5]), 0.5).tolist()
    [1.0, 0.5]
    """
    s = np.asarray(scores, dtype=np.float64)
    return 1.0 / (1.0 + np.minimum(np.abs(s - rho), np.abs(s + rho)))


def label_requests(
    route: str,
    server: str,
    ids: Sequence[str],
    x: np.ndarray | None,
    labels: Any,
    scores: Any,
    rho: float,
    version: int,
    probabilities: Any,
    *,
    now: float,
    ttl: float,
    shadow_labels: Sequence[Mapping[str, int]] | None = None,
    moments: FeatureMoments | None = None,
    fields: Sequence[Mapping[str, Any] | None] | None = None,
) -> list[bytes]:
    """The label requests for ``route``'s events ``ids`` (raw features ``x``, a row each),
    decided by ``server``, as :meth:`LabelRequest.to_json` writes them (``moments``: those
    the first request carries; ``fields``: each event's shown fields, which a declared
    model's requests carry instead of features: ``x`` is not read then)."""
    served_by = b"null" if server == route else _text(server)
    # a declared model's: its fields alone, the moments as LabelRequest.sparse says
    sparse = fields is not None
    template = (
        b'{"request_id":"%b","event_id":%b,"model":'
        + _text(route)
        + (b',"features":%b' if sparse else b',"features":[%b]')
        + b',"score":%b,"rho":'
        + _text(float(rho))
        + b',"decided_label":%d,"query_probability":%b,"model_version":'
        + _text(int(version))
        + b',"requested_at":'
        + _text(float(now))
        + b',"expires_at":'
        + _text(float(now + ttl))
        + b',"priority":%b'
        + b',"shadow_labels":%b,"served_by":'
        + served_by
        + b',"moments":%b,"fields":%b}'
    )
    shadows = (
        [b"{}"] * len(ids)
        if shadow_labels is None
        else [orjson.dumps(dict(s)) for s in shadow_labels]
    )
    carried = [b"null"] * len(ids)
    if moments is not None and carried:
        carried[0] = orjson.dumps(moments.to_record() if sparse else moments)
    dumps = orjson.dumps
    shown = (
        [b"null"] * len(ids)
        if fields is None
        else [b"null" if f is None else dumps(f) for f in fields]
    )
    columns = zip(
        request_ids(route, ids),
        ids,
        [b"null"] * len(ids) if sparse or x is None else _rows(x),
        floats(scores),
        np.asarray(labels).tolist(),
        floats(probabilities),
        floats(priorities(scores, rho)),
        shadows,
        carried,
        shown,
        strict=True,
    )
    return [
        template % (rid.encode(), dumps(i), row, score, label, p, priority, shadow, m, f)
        for rid, i, row, score, label, p, priority, shadow, m, f in columns
    ]


def _rows(x: np.ndarray) -> list[bytes]:
    """Each row of the float64 matrix ``x`` as orjson writes the list of its floats,
    without the brackets."""
    if x.shape[0] == 0:
        return []
    if x.shape[1] == 0:
        return [b""] * x.shape[0]
    matrix = np.ascontiguousarray(x, dtype=np.float64)
    return orjson.dumps(matrix, option=orjson.OPT_SERIALIZE_NUMPY)[2:-2].split(b"],[")
