"""The one module that knows how learner and preprocessing state is written down.

A state is a plain JSON-safe ``dict`` (str keys; str, int, float, bool, list, dict
values; never NaN or infinity), versioned so a future release can still read it, and
never a pickle. A learner's record::

    {"format": "abstain.learner", "version": 1, "algorithm": "dsal",
     "params":  {...hyperparameters, as given to the constructor...},
     "learned": {...what the learner has learned: w, rho, steps, generator state...}}

Preprocessing uses ``"format": "abstain.preprocessor"`` (one step, with ``"kind"``) and
``"abstain.pipeline"`` (``"steps"``: a list of preprocessor records). A query budget
(:class:`~service.learning.budget.query.QueryBudget`) is an ``"abstain.budget"`` record with
``params`` and ``learned`` like a learner's; a learner held to a budget
(:class:`~service.learning.budget.budgeted.Budgeted`) an ``"abstain.budgeted"`` record holding
both (``"learner"``, ``"budget"``); a collapse detector
(:class:`~service.learning.risk.collapse.CollapseWatch`) an ``"abstain.collapse-watch"`` record;
a risk estimate (:class:`~service.learning.risk.estimate.RiskEstimate`) an
``"abstain.risk-estimate"`` record, and a model's scorecard
(:class:`~service.learning.risk.shadow.Scorecard`) an ``"abstain.scorecard"`` record holding one.

Floats are stored as Python floats: :mod:`json` (and orjson) write the shortest repr that
reads back to the same double, so a JSON round trip is bit-exact. Integers wider than
64 bits (the random generator's 128-bit words) are written as decimal strings, so any JSON
library (orjson included) round-trips a state exactly.

Anything unreadable raises :class:`~service.learning.errors.StateError` with what to do.

>>> rec = learner_record("dral", {"n_features": 2}, {"rho": 1.0})
>>> read_record(loads(dumps(rec)), LEARNER_FORMAT)["algorithm"]
'dral'
>>> read_record({"format": "abstain.learner", "version": 9}, LEARNER_FORMAT)
Traceback (most recent call last):
...
service.learning.errors.StateError: state record 'abstain.learner' version 9 is not readable \
by this release, which reads version 1; upgrade abstain to a release that reads version 9, \
or rebuild the model by replaying its label log
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

import numpy as np
import numpy.typing as npt

from .errors import StateError

__all__ = [
    "BUDGETED_FORMAT",
    "BUDGET_FORMAT",
    "COLLAPSE_FORMAT",
    "LEARNER_FORMAT",
    "PIPELINE_FORMAT",
    "PREPROCESSOR_FORMAT",
    "RISK_FORMAT",
    "SCORECARD_FORMAT",
    "SHARED_FROM",
    "VERSION",
    "FloatList",
    "FrozenRecord",
    "IndexList",
    "Listed",
    "changed",
    "changes_from",
    "entries_record",
    "dumps",
    "float_list",
    "learner_record",
    "loads",
    "budget_record",
    "open_learner_record",
    "read_float",
    "read_entries",
    "read_floats",
    "read_int",
    "read_mapping",
    "read_optional_float",
    "read_record",
    "rng_from_state",
    "rng_state",
]

LEARNER_FORMAT: Final = "abstain.learner"
PREPROCESSOR_FORMAT: Final = "abstain.preprocessor"
PIPELINE_FORMAT: Final = "abstain.pipeline"
BUDGET_FORMAT: Final = "abstain.budget"
BUDGETED_FORMAT: Final = "abstain.budgeted"
COLLAPSE_FORMAT: Final = "abstain.collapse-watch"
RISK_FORMAT: Final = "abstain.risk-estimate"
SCORECARD_FORMAT: Final = "abstain.scorecard"
VERSION: Final = 1
_WHAT_TO_DO: Final = "rebuild the model by replaying its label log"


def learner_record(
    algorithm: str, params: Mapping[str, Any], learned: Mapping[str, Any]
) -> dict[str, Any]:
    """Assemble a versioned learner record."""
    return {
        "format": LEARNER_FORMAT,
        "version": VERSION,
        "algorithm": algorithm,
        "params": dict(params),
        "learned": dict(learned),
    }


def budget_record(params: Mapping[str, Any], learned: Mapping[str, Any]) -> dict[str, Any]:
    """Assemble a versioned query-budget record."""
    return {
        "format": BUDGET_FORMAT,
        "version": VERSION,
        "params": dict(params),
        "learned": dict(learned),
    }


def read_record(state: Any, fmt: str) -> Mapping[str, Any]:
    """Check the envelope (``format`` and ``version``) of a state record and return it."""
    if not isinstance(state, Mapping):
        raise StateError(
            f"a {fmt!r} state must be a JSON object (dict), got {type(state).__name__}; "
            f"pass the dict produced by to_state(), or {_WHAT_TO_DO}"
        )
    found = state.get("format")
    if found != fmt:
        raise StateError(
            f"expected a state record with format {fmt!r}, got format {found!r}; "
            f"check that the right record was passed (a learner, a pipeline, ...), or "
            f"{_WHAT_TO_DO}"
        )
    version = state.get("version")
    if version != VERSION or isinstance(version, bool):
        raise StateError(
            f"state record {fmt!r} version {version!r} is not readable by this release, "
            f"which reads version {VERSION}; upgrade abstain to a release that reads "
            f"version {version!r}, or {_WHAT_TO_DO}"
        )
    return state


_T = TypeVar("_T")


def open_learner_record(
    state: Any, algorithm: str, param_names: Sequence[str], build: Callable[..., _T]
) -> tuple[_T, Mapping[str, Any]]:
    """Check a learner record for ``algorithm``, build the learner from its hyperparameters
    with ``build(**params)``, and return it with the ``learned`` section still to restore."""
    record = read_record(state, LEARNER_FORMAT)
    if record.get("algorithm") != algorithm:
        raise StateError(
            f"state is for algorithm {record.get('algorithm')!r}, not {algorithm!r}; "
            "use learner_from_state() to rebuild whichever learner it holds"
        )
    params = read_mapping(record, "params")
    learned = read_mapping(record, "learned")
    unknown = set(params) - set(param_names)
    if unknown:
        raise StateError(f"state params hold unknown hyperparameters {sorted(unknown)}")
    try:
        learner = build(**params)
    except (TypeError, ValueError) as exc:
        raise StateError(f"state params are invalid: {exc}") from exc
    return learner, learned


def read_mapping(record: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``record[key]`` if it is a mapping (the ``params`` or ``learned`` section)."""
    section = record.get(key)
    if not isinstance(section, Mapping):
        raise StateError(f"state field {key!r} must be an object, got {section!r}; {_WHAT_TO_DO}")
    return section


def read_float(section: Mapping[str, Any], key: str, *, minimum: float | None = None) -> float:
    """A finite float field (JSON integers are accepted)."""
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StateError(f"state field {key!r} must be a number, got {value!r}; {_WHAT_TO_DO}")
    v = float(value)
    if not math.isfinite(v) or (minimum is not None and v < minimum):
        raise StateError(f"state field {key!r} is out of range: {value!r}; {_WHAT_TO_DO}")
    return v


def read_optional_float(
    section: Mapping[str, Any], key: str, *, minimum: float | None = None
) -> float | None:
    """A finite float field, or ``None`` (JSON ``null``, or absent) for "not known yet"."""
    if section.get(key) is None:
        return None
    return read_float(section, key, minimum=minimum)


def read_int(section: Mapping[str, Any], key: str, *, minimum: int = 0) -> int:
    """An integer field ``>= minimum``."""
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StateError(
            f"state field {key!r} must be an integer >= {minimum}, got {value!r}; {_WHAT_TO_DO}"
        )
    return value


class FloatList(list[float]):
    """A list of floats that keeps a copy of the array it was made from (:attr:`array`), so
    that a writer taking arrays (a model version's packed form) need not convert it back;
    any change to the list drops the copy.

    >>> f = float_list(np.array([0.5, 1.5]))
    >>> f == [0.5, 1.5], f.array is not None
    (True, True)
    >>> f[0] = 2.0; f.array is None
    True
    """

    __slots__ = ("array",)

    def __init__(self, values: npt.NDArray[np.float64]) -> None:
        super().__init__(values.tolist())
        self.array: npt.NDArray[np.float64] | None = values.copy()

    @classmethod
    def patched(
        cls, since: FloatList, at: npt.NDArray[np.intp], values: npt.NDArray[np.float64]
    ) -> FloatList:
        """The list of ``values``: ``since`` (the list of an array that differs from them
        at the indices ``at`` alone) copied, and those set."""
        out = cls.__new__(cls)
        list.extend(out, since)
        setitem = list.__setitem__
        for i, v in zip(at.tolist(), values[at].tolist(), strict=True):
            setitem(out, i, v)
        out.array = values.copy()
        return out


class IndexList(list[int]):
    """A list of indices that keeps the array it was made from (:attr:`array`), as
    :class:`FloatList` does: any change to the list drops it.

    >>> i = IndexList(np.array([2, 5])); i == [2, 5], i.array is not None
    (True, True)
    >>> i.append(7); i.array is None
    True
    """

    __slots__ = ("array",)

    def __init__(self, values: npt.NDArray[np.int64]) -> None:
        super().__init__(values.tolist())
        self.array: npt.NDArray[np.int64] | None = values.copy()


def forgets_on_change(cls: type[list[Any]], *attrs: str) -> None:
    """Make every method by which a list of ``cls`` changes in place first set its
    attributes ``attrs`` to None: what it kept of its items (an array, their positions) no
    longer holds."""
    for name in (
        "__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend", "insert",
        "pop", "remove", "clear", "sort", "reverse",
    ):  # fmt: skip
        method = getattr(list, name)

        def changed(self: list[Any], *args: Any, _method: Any = method) -> Any:
            for attr in attrs:
                setattr(self, attr, None)
            return _method(self, *args)

        changed.__name__ = name
        setattr(cls, name, changed)


forgets_on_change(FloatList, "array")
forgets_on_change(IndexList, "array")


class FrozenRecord(dict[str, Any]):
    """A part of a state that never changes once made (its mutators raise ``TypeError``),
    shared by every state written while it lasts (a remembered label): what a writer derives
    from it once, such as a check of its numbers, is kept in :attr:`memo`, and holds while
    :meth:`unchanged` (its values are numbers, text, or :class:`FloatList` and
    :class:`IndexList` values that still hold their arrays: a change to a list drops its
    array).

    >>> r = FrozenRecord(n=1, x=float_list(np.array([0.5])))
    >>> r["x"], r == {"n": 1, "x": [0.5]}, r.unchanged()
    ([0.5], True, True)
    >>> r["x"][0] = 2.0; r.unchanged()
    False
    >>> r["n"] = 2
    Traceback (most recent call last):
    TypeError: a FrozenRecord does not change
    """

    __slots__ = ("_lists", "_plain", "memo")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.memo: dict[str, Any] = {}
        self._lists = tuple(v for v in self.values() if type(v) in _ARRAY_LISTS)
        self._plain = all(type(v) in _IMMUTABLE or type(v) in _ARRAY_LISTS for v in self.values())

    def unchanged(self) -> bool:
        """Whether every value is still what it was made as (see the class docstring)."""
        return self._plain and all(v.array is not None for v in self._lists)

    def __reduce__(self) -> tuple[Any, ...]:  # copies and pickles: made anew from the items
        return (FrozenRecord, (dict(self),))

    def _frozen(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a FrozenRecord does not change")

    __setitem__ = __delitem__ = __ior__ = _frozen
    clear = pop = popitem = setdefault = update = _frozen


#: the types of a value that cannot change in place
_IMMUTABLE: Final = frozenset({int, float, str, bool, type(None), np.float64})
#: the lists that tell when they have changed (they drop their arrays)
_ARRAY_LISTS: Final = frozenset({FloatList, IndexList})


#: the shortest array whose list :func:`float_list` makes from the one before (``since``)
SHARED_FROM: Final = 256


def float_list(values: npt.NDArray[np.float64], since: Any = None) -> list[Any]:
    """An array as (nested) lists of Python floats: JSON-safe and bit-exact (one dimension:
    a :class:`FloatList`).

    ``since``: the list the same field's previous state held. When it is a
    :class:`FloatList` that still holds its array, as long as ``values`` (at least
    :data:`SHARED_FROM`), and at most a quarter of the numbers differ from it, bit for bit,
    the list is a copy of it with those set: a label moves a few hundred of a wide sparse
    model's thousands of numbers, and a copy shares the floats that did not move instead of
    making every one again.

    >>> a = float_list(np.zeros(300)); b = float_list(np.eye(1, 300, 7)[0], since=a)
    >>> b[7], b[6] is a[6], float(b.array[7])
    (1.0, True, 1.0)
    """
    if values.ndim != 1 or values.dtype != np.float64:
        out: list[Any] = values.tolist()
        return out
    if (
        type(since) is FloatList
        and since.array is not None
        and since.array.shape == values.shape
        and values.size >= SHARED_FROM
    ):
        at = np.flatnonzero(since.array.view(np.int64) != values.view(np.int64))
        if 4 * at.size <= values.size:
            return FloatList.patched(since, at, values)
    return FloatList(values)


def _bits(values: Any) -> npt.NDArray[np.uint64]:
    array = values.array if type(values) is FloatList and values.array is not None else None
    if array is None:
        array = np.asarray(values, dtype=np.float64)
    return array.view(np.uint64)


def changes_from(values: Any, base: Any) -> tuple[IndexList, list[Any]] | None:
    """Where ``values`` differ from ``base`` (equally long lists or arrays of floats), bit
    for bit, and their values there; None without a base of that length, or when more
    than half differ (the whole list is then smaller: an index costs a few bytes).

    >>> base = np.array([1.0, 0.0, 2.0, 4.0])
    >>> at, to = changes_from(np.array([1.0, -0.0, 3.0, 4.0]), base)
    >>> at, to
    ([1, 2], [-0.0, 3.0])
    >>> changed({"w_at": at, "w_to": to}, "w", base, 4, "x").tolist()
    [1.0, -0.0, 3.0, 4.0]
    """
    if base is None or len(base) != len(values):
        return None
    mine = _bits(values)
    at = np.flatnonzero(mine != _bits(base))
    if 2 * at.size > len(values):
        return None
    return IndexList(at), float_list(mine[at].view(np.float64))


def changed(
    item: Mapping[str, Any], field: str, base: Any, n: int, what: str, *, copy: bool = True
) -> npt.NDArray[np.float64]:
    """``base`` (``n`` floats) with the values ``<field>_to`` of ``item`` put at its indices
    ``<field>_at``: what :func:`changes_from` wrote, read back as untrusted input (``what``
    names it in the error). Not ``copy``: ``base`` is a float64 array of the caller's own,
    written in place."""
    at = item.get(f"{field}_at")
    if type(at) is IndexList and at.array is not None:  # made of integers (a packed read)
        index = at.array
    elif not isinstance(at, list) or not all(type(i) is int for i in at):
        raise StateError(f"{what}'s '{field}_at' must be a list of indices")
    else:
        index = np.asarray(at, dtype=np.int64)
    if index.size and (index[0] < 0 or index[-1] >= n or (np.diff(index) <= 0).any()):
        raise StateError(f"{what}'s '{field}_at' must be increasing indices below {n}")
    values = read_floats(item, f"{field}_to", (index.size,))
    if base is None or len(base) != n:
        raise StateError(f"{what} written against weights that are not there")
    out: npt.NDArray[np.float64] = np.array(base, dtype=np.float64) if copy else base
    out[index] = values
    return out


def entries_record(
    field: str, values: npt.NDArray[np.float64], listed: Listed | None = None
) -> dict[str, Any]:
    """``values`` as field ``field`` of a record: where they are not +0.0
    (``<field>_at``, and ``<field>_to`` there, bit for bit) when at most half of at least
    :data:`SHARED_FROM` are (a wide model's weights and statistics: a stream sets a few
    thousand of 2^18), else whole (``listed``: made from the last state's list).

    >>> entries_record("w", np.eye(1, 300, 7)[0])
    {'w_at': [7], 'w_to': [1.0]}
    >>> read_entries({"w_at": [7], "w_to": [1.0]}, "w", 300, "x")[5:9].tolist()
    [0.0, 0.0, 1.0, 0.0]
    """
    if values.size >= SHARED_FROM:
        at = np.flatnonzero(values.view(np.uint64) != 0)  # bits other than +0.0's
        if 2 * at.size <= values.size:
            return {f"{field}_at": IndexList(at), f"{field}_to": float_list(values[at])}
    return {field: float_list(values) if listed is None else listed(field, values)}


def read_entries(
    section: Mapping[str, Any], field: str, n: int, what: str
) -> npt.NDArray[np.float64]:
    """Field ``field`` of ``n`` floats as :func:`entries_record` wrote it, either form."""
    if f"{field}_at" not in section:
        return read_floats(section, field, (n,))
    if field in section:
        raise StateError(f"{what}: '{field}' is written whole and as its entries; {_WHAT_TO_DO}")
    return changed(section, field, np.zeros(n), n, what, copy=False)


class Listed:
    """The lists of an object's last state, by field: its next state's list of a field is
    made from the last one (:func:`float_list`'s ``since``)."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[str, list[Any]] = {}

    def __call__(self, field: str, values: npt.NDArray[np.float64]) -> list[Any]:
        """``values`` as field ``field`` of the next state writes them."""
        out = self._last[field] = float_list(values, self._last.get(field))
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> Listed:
        return Listed()  # a copy starts afresh (its lists are made whole)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Listed, ())


def read_floats(
    section: Mapping[str, Any], key: str, shape: tuple[int, ...]
) -> npt.NDArray[np.float64]:
    """A (nested) list of finite numbers with the given shape, as a new float64 array."""
    value = section.get(key)
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise StateError(f"state field {key!r} must be a list of numbers; {_WHAT_TO_DO}")
    if type(value) is FloatList and value.array is not None:
        arr = value.array.copy()  # the array the list was made from (unchanged since)
    else:
        try:
            arr = np.array(value, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise StateError(
                f"state field {key!r} is not a list of numbers; {_WHAT_TO_DO}"
            ) from exc
    if arr.shape != shape:
        raise StateError(
            f"state field {key!r} has shape {arr.shape}, expected {shape}; {_WHAT_TO_DO}"
        )
    if not np.isfinite(arr).all():
        raise StateError(f"state field {key!r} holds non-finite values; {_WHAT_TO_DO}")
    return arr


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """The generator's bit-generator state, JSON-safe for any JSON library: PCG64's 128-bit
    ``state`` and ``inc`` are written as decimal strings (most JSON libraries refuse, or
    round to a float, integers wider than 64 bits).

    >>> s = rng_state(np.random.default_rng(0))
    >>> isinstance(s["state"]["state"], str), int(s["state"]["inc"]) > 2**64
    (True, True)
    """
    raw = dict(rng.bit_generator.state)
    inner = raw.get("state")
    if isinstance(inner, Mapping):
        raw["state"] = {k: str(v) if isinstance(v, int) else v for k, v in inner.items()}
    return raw


def _wide_int(value: Any, key: str) -> int:
    """A 128-bit generator word written as a decimal string (or, as older records did, an int)."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise StateError(
        f"state field 'rng.state.{key}' must be a non-negative decimal integer string; "
        f"{_WHAT_TO_DO}"
    )


def rng_from_state(state: Any) -> np.random.Generator:
    """Rebuild a PCG64 generator from :func:`rng_state` output."""
    if not isinstance(state, Mapping) or state.get("bit_generator") != "PCG64":
        raise StateError(f"state field 'rng' must be a PCG64 generator state; {_WHAT_TO_DO}")
    inner = state.get("state")
    if not isinstance(inner, Mapping):
        raise StateError(f"state field 'rng.state' must be an object; {_WHAT_TO_DO}")
    words = {key: _wide_int(inner.get(key), key) for key in ("state", "inc")}
    bit_generator = np.random.PCG64()
    try:
        full: dict[str, Any] = {**state, "state": words}
        bit_generator.state = full  # type: ignore[assignment]
    except (TypeError, ValueError, KeyError) as exc:
        raise StateError(f"state field 'rng' is corrupt: {exc}; {_WHAT_TO_DO}") from exc
    return np.random.Generator(bit_generator)


def dumps(state: Mapping[str, Any]) -> str:
    """Serialise a state record to JSON (strict: NaN and infinity are refused)."""
    try:
        return json.dumps(state, allow_nan=False, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise StateError(f"state is not JSON-safe: {exc}") from exc


def loads(text: str | bytes) -> Any:
    """Parse a JSON state record (the envelope is checked by the ``from_state`` readers)."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise StateError(f"state is not valid JSON: {exc}; {_WHAT_TO_DO}") from exc
