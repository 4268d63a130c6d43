"""What the change detectors share: the state record's envelope and the checks of their
parameters and inputs (see :mod:`service.learning.drift`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from .. import state as st
from ..errors import HyperparameterError, InputError, StateError

__all__ = ["DRIFT_FORMAT", "flag", "float_rows", "open_record", "real", "record", "value"]

DRIFT_FORMAT: Final = "abstain.drift-detector"


def real(name: str, value: Any, low: float, high: float, *, open_low: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HyperparameterError(f"{name} must be a number, got {value!r}")
    v = float(value)
    above = v > low if open_low else v >= low
    if not (math.isfinite(v) and above and v <= high):
        left = "(" if open_low else "["
        raise HyperparameterError(f"{name} must be in {left}{low:g}, {high:g}], got {value!r}")
    return v


def value(x: Any) -> float:
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise InputError(f"a detector reads numbers, got {x!r}")
    v = float(x)
    if not math.isfinite(v):
        raise InputError(f"a detector reads finite numbers, got {x!r}")
    return v


def record(kind: str, params: Mapping[str, Any], learned: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "format": DRIFT_FORMAT,
        "version": st.VERSION,
        "kind": kind,
        "params": dict(params),
        "learned": dict(learned),
    }


def open_record(state: Any, kind: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    rec = st.read_record(state, DRIFT_FORMAT)
    if rec.get("kind") != kind:
        raise StateError(f"state is for detector {rec.get('kind')!r}, not {kind!r}")
    return st.read_mapping(rec, "params"), st.read_mapping(rec, "learned")


def float_rows(learned: Mapping[str, Any], key: str) -> list[list[float]]:
    rows = learned.get(key)
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise StateError(f"detector state field {key!r} must be a list of lists of numbers")
    out = []
    for row in rows:
        values = []
        for v in row:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise StateError(f"detector state field {key!r} holds a non-number {v!r}")
            values.append(float(v))
        out.append(values)
    return out


def flag(learned: Mapping[str, Any], key: str) -> bool:
    value = learned.get(key)
    if not isinstance(value, bool):
        raise StateError(f"detector state field {key!r} must be true or false, got {value!r}")
    return value
