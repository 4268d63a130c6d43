"""The promises, checked from what is in Kafka after a run.

- :func:`check_decisions`: every accepted event has a decision; repeats of one
  (event id, model version) never differ.
- :func:`model_chain`: every model version ever written (models topic and the table's
  changelog); copies of one version never differ.
- :func:`explain_chain`: each version step is the effect of exactly one label, found
  independently (by offset, else by trying the unused ones) and re-applied through
  :mod:`service.learning`; no label explains two steps.
- :func:`replay`: the distinct applied labels, in order, from the initial model through
  :mod:`service.learning` give the final (w, rho, version) the service wrote.
- :func:`final_entries`: the last value per key of a changelog (pending requests).
- :func:`non_finite_floats`: every float in a JSON document, checked.
- :func:`foreign_served`: what a worker served that is none of the learner's versions.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.config import ModelConfig
from service.learning import Parts, Pipeline, learner_for
from service.learning.adaptive import is_adaptive_state
from service.learning.moments import Moments
from service.records.signing import Signer, moments_message
from service.records.state import MAX_MAGNITUDE
from service.stream.models.served import initial_envelope
from service.stream.models.served import served_learner as config_learner

from .kafkaio import Rec, loads
from .oracle import SeenDecision
from .workers import Served

__all__ = [
    "Chain",
    "DecisionReport",
    "check_decisions",
    "expect_decision",
    "expect_update",
    "explain_chain",
    "final_entries",
    "foreign_served",
    "learn_row",
    "model_chain",
    "non_finite_floats",
    "replay",
]


@dataclass
class DecisionReport:
    sent: int
    decided: int
    records: int
    duplicates: int  # records beyond the first per event id
    missing: list[str]
    contradictions: list[tuple[str, int]]  # (event id, model version) with differing copies
    unexpected: list[str]  # decided ids that were never sent as good events


def check_decisions(
    decisions: Mapping[str, Sequence[SeenDecision]], sent: Iterable[str]
) -> DecisionReport:
    """Coverage and consistency of the decisions seen for the good events ``sent``."""
    ids = set(sent)
    records = sum(len(v) for v in decisions.values())
    contradictions = []
    for eid, seen in decisions.items():
        by_version: dict[int, set[tuple[str, int | None, bool]]] = defaultdict(set)
        for d in seen:
            by_version[d.model_version].add((d.action, d.label, d.queried))
        contradictions += [(eid, v) for v, kinds in by_version.items() if len(kinds) > 1]
    return DecisionReport(
        sent=len(ids),
        decided=sum(1 for i in ids if i in decisions),
        records=records,
        duplicates=records - len(decisions),
        missing=sorted(i for i in ids if i not in decisions)[:20],
        contradictions=contradictions[:20],
        unexpected=sorted(set(decisions) - ids)[:20],
    )


def champion_record(learner: Mapping[str, Any]) -> Mapping[str, Any]:
    """The record of the learner that decides: an adaptive record's champion, or the
    record itself (a model served without the wrapper)."""
    return learner["champion"] if is_adaptive_state(learner) else learner


def served_learner(learner: Mapping[str, Any]) -> Any:
    """The learner object of a model's learner record, as a default worker serves it."""
    return learner_for(dict(learner), Parts() if is_adaptive_state(learner) else None)


def _learned(state: Mapping[str, Any]) -> tuple[list[float], float, Any]:
    learned = champion_record(state["learner"])["learned"]
    steps = [s.get("learned") for s in state["pipeline"]["steps"]]
    return list(learned["w"]), float(learned["rho"]), steps


@dataclass
class Chain:
    """Every version of one model, 0 (configured) to the newest."""

    states: list[dict[str, Any]]  # index = version
    copies: int  # records read (topic + changelog)
    gaps: list[int]  # versions missing from both sources
    forks: list[int]  # versions written twice with different parameters

    @property
    def final(self) -> dict[str, Any]:
        return self.states[-1]

    @property
    def version(self) -> int:
        return len(self.states) - 1


def model_chain(
    name: str, config: ModelConfig, topic: Sequence[Rec], changelog: Sequence[Rec]
) -> Chain:
    """Collect the versions of model ``name`` from its snapshots and its table changelog."""
    by_version: dict[int, list[dict[str, Any]]] = defaultdict(list)
    copies = 0
    for rec in [*topic, *changelog]:
        if rec.key != name.encode() or rec.value is None:
            continue
        state = rec.json()
        by_version[int(state["version"])].append(state)
        copies += 1
    top = max(by_version, default=0)
    states = [initial_envelope(name, config).to_dict()]
    gaps, forks = [], []
    for v in range(1, top + 1):
        got = by_version.get(v)
        if not got:
            gaps.append(v)
            states.append(states[-1])
            continue
        if any(_learned(s) != _learned(got[0]) for s in got[1:]):
            forks.append(v)
        states.append(got[0])
    return Chain(states, copies, gaps, forks)


@dataclass
class Explained:
    order: list[str] = field(default_factory=list)  # request ids, one per version step
    unexplained: list[int] = field(default_factory=list)  # versions no label explains
    twice: list[str] = field(default_factory=list)  # labels that explain a second step
    parked: int = 0  # steps applied out of offset order (label before its request)


#: what a label teaches from: the features of its request, or the request itself (its
#: features and the moments of the events the scorer scored since its last request)
Row = list[float] | Mapping[str, Any]


def learn_row(pipeline: Pipeline, row: Row, signer: Signer | None = None) -> np.ndarray:
    """The preprocessing learns what a labelled request brings, as the label path does
    (:meth:`~service.learning.Pipeline.learn_label`); returns the request's features.
    ``signer``: the deployment's key (its moments signed by it are trusted, any others
    refused, as the learner judges them: :func:`service.records.moments.moments_trust`)."""
    features = row["features"] if isinstance(row, Mapping) else row
    x = np.asarray(features, dtype=np.float64)
    moments = row.get("moments") if isinstance(row, Mapping) else None
    seen = None if moments is None else Moments.from_record(moments, x.shape[0])
    trusted = False
    if signer is not None and seen is not None and isinstance(row, Mapping):
        signature = moments.get("signature") if isinstance(moments, Mapping) else None
        signed = moments_message(
            str(row["model"]), str(row["request_id"]), moments["count"], moments["mean"],
            moments["m2"],
        )  # fmt: skip
        trusted = signer.verify(*signed, None if signature is None else signature.encode()) is None
        seen = seen if trusted else None
    pipeline.learn_label(x, seen, trusted=trusted)
    return x


def _step(
    state: Mapping[str, Any], row: Row, y: int, signer: Signer | None = None
) -> tuple[Pipeline, Any]:
    pipeline = Pipeline.from_state(state["pipeline"])
    learner = served_learner(state["learner"])
    xa = learn_row(pipeline, row, signer)
    learner.update(pipeline.transform(xa), y)
    return pipeline, learner


def _same(state: Mapping[str, Any], pipeline: Pipeline, learner: Any) -> bool:
    w, rho, steps = _learned(state)
    mine = [s.get("learned") for s in pipeline.to_state()["steps"]]
    return bool(
        np.array_equal(np.asarray(w), np.asarray(learner.w))
        and rho == float(learner.rho)
        and mine == steps
    )


def explain_chain(
    chain: Chain,
    labels: Sequence[Rec],
    features: Mapping[str, Row],
    signer: Signer | None = None,
) -> Explained:
    """Find, for each version step, the one label (request id) that produced it.

    ``labels``: the model's records of the labels topic; ``features``: request id ->
    the request (or its features alone, for a scorer that sends no moments). A step is
    explained only if applying that label to the previous version gives the next one
    exactly; a label that explains a second step (applied twice) is listed in ``twice``."""
    by_offset: dict[int, tuple[str, int]] = {}
    for rec in labels:
        try:
            obj = rec.json()
            rid, y = str(obj["request_id"]), obj["label"]
        except (ValueError, TypeError, KeyError):
            continue
        if y in (1, -1) and not isinstance(y, bool | float) and rid in features:
            by_offset[rec.offset] = (rid, int(y))
    out = Explained()
    used: set[str] = set()
    for v in range(1, len(chain.states)):
        before, after = chain.states[v - 1], chain.states[v]
        lo_before, lo_after = int(before["labels_offset"]), int(after["labels_offset"])
        candidates = [by_offset[lo_after]] if lo_after in by_offset else []
        if lo_after <= lo_before:  # out of offset order: any label so far may explain it
            candidates = [by_offset[o] for o in sorted(by_offset) if o <= lo_before]
        found = None
        for rid, y in sorted(candidates, key=lambda c: c[0] in used):  # unused ones first
            pipeline, learner = _step(before, features[rid], y, signer)
            if _same(after, pipeline, learner):
                found = rid
                break
        if found is None:
            out.unexplained.append(v)
            continue
        if found in used:
            out.twice.append(found)
        used.add(found)
        out.order.append(found)
        out.parked += int(lo_after <= lo_before)
    return out


@dataclass
class Replay:
    version: int
    w: list[float]
    rho: float
    max_abs_diff: float
    equal: bool  # bit for bit


def learn_offline(
    name: str,
    config: ModelConfig | Mapping[str, Any],
    labelled: Iterable[tuple[Row, int]],
    signer: Signer | None = None,
) -> tuple[Pipeline, Any]:
    """The pipeline and the learner a worker serves for ``config`` (a model's settings),
    from version 0, after ``labelled`` (each a request, or its features, and its label) in
    order: service.learning directly."""
    config = ModelConfig.model_validate(config)
    start = initial_envelope(name, config).to_dict()
    pipeline = Pipeline.from_state(start["pipeline"])
    learner = config_learner(config, start["learner"])
    for row, y in labelled:
        xa = learn_row(pipeline, row, signer)
        learner.update(pipeline.transform(xa), y)
    return pipeline, learner


def replay(
    name: str,
    config: ModelConfig,
    labelled: Sequence[tuple[Row, int]],
    final: Mapping[str, Any],
    signer: Signer | None = None,
) -> Replay:
    """Offline: ``labelled`` in order from version 0 through service.learning, compared
    with the ``final`` state the service wrote."""
    pipeline, learner = learn_offline(name, config, labelled, signer)
    w, rho, _ = _learned(final)
    diff = float(np.max(np.abs(np.asarray(w) - np.asarray(learner.w)), initial=0.0))
    diff = max(diff, abs(rho - float(learner.rho)))
    return Replay(
        version=len(labelled),
        w=[float(v) for v in learner.w],
        rho=float(learner.rho),
        max_abs_diff=diff,
        equal=_same(final, pipeline, learner),
    )


def final_entries(changelog: Sequence[Rec]) -> dict[str, Any]:
    """Last value per key of a table changelog (None = deleted)."""
    out: dict[str, Any] = {}
    for rec in changelog:
        if rec.key is not None:
            out[rec.key.decode()] = loads(rec.value)
    return out


def non_finite_floats(value: Any, path: str = "$") -> list[str]:
    """Paths of every NaN / infinity inside a decoded JSON value."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in non_finite_floats(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in non_finite_floats(v, f"{path}[{i}]")]
    return []


def _huge(value: Any) -> bool:
    """A learned number (outside a ``params`` part) of magnitude >= ``MAX_MAGNITUDE``."""
    if isinstance(value, float):
        return abs(value) >= MAX_MAGNITUDE
    if isinstance(value, dict):
        return any(_huge(v) for k, v in value.items() if k != "params")
    if isinstance(value, list):
        return any(_huge(v) for v in value)
    return False


def _finite_state(pipeline: Pipeline, learner: Any) -> bool:
    """Finite, and every learned number below the bound the service keeps models in."""
    values = [np.asarray(learner.w, dtype=float), np.asarray([float(learner.rho)])]
    finite = bool(all(np.isfinite(v).all() for v in values))
    small = bool(all((np.abs(v) < MAX_MAGNITUDE).all() for v in values))
    # the whole record, as the service's encoder checks it: the champion's and also the
    # challengers' and the detector's numbers of an adaptive learner
    states = [pipeline.to_state(), learner.to_state()]
    return finite and small and not any(non_finite_floats(s) or _huge(s) for s in states)


def expect_update(state: Mapping[str, Any], x: list[float], y: int) -> dict[str, Any] | None:
    """Offline: the state after applying label ``y`` for features ``x`` to ``state``, or None
    when the update would not be finite (and must be refused)."""
    try:
        with np.errstate(all="ignore"):
            pipeline, learner = _step(state, x, y)
    except ValueError:  # service.learning refuses non-finite updates itself
        return None
    if not _finite_state(pipeline, learner):
        return None
    return {**state, "pipeline": pipeline.to_state(), "learner": learner.to_state()}


def expect_decision(state: Mapping[str, Any], x: list[float], coin: float) -> Any:
    """Offline: the learner's decision for raw features ``x`` at ``state`` (None when the
    scaled features or the score overflow and the event must be refused)."""
    pipeline = Pipeline.from_state(state["pipeline"])
    learner = served_learner(state["learner"])
    with np.errstate(all="ignore"):
        z = pipeline.transform(np.asarray(x, dtype=np.float64))
    if not np.isfinite(z).all():
        return None
    try:
        return learner.decide(z, coin=coin)
    except ValueError:
        return None


def foreign_served(samples: Sequence[Served], chain: Chain) -> list[Served]:
    """The samples (taken once the worker had read the models topic) whose served model is
    none of the versions in ``chain`` (the learner's): ``/readyz`` names another version,
    or the gauges (version, rho, ||w||, read together) are not those of that version."""
    states = {}
    for v, state in enumerate(chain.states):
        w, rho, _ = _learned(state)
        states[v] = (rho, float(np.linalg.norm(np.asarray(w, dtype=np.float64))))
    out = []
    for s in samples:
        if not s.loaded:
            continue
        if s.ready_version is not None and s.ready_version not in states:
            out.append(s)
            continue
        if s.version is None or s.rho is None:
            continue
        want = states.get(int(s.version))
        norm_ok = s.weight_norm is None or (
            want is not None and math.isclose(want[1], s.weight_norm, rel_tol=1e-12)
        )
        if want is None or s.version != int(s.version) or want[0] != s.rho or not norm_ok:
            out.append(s)
    return out
