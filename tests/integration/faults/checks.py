"""The promises, checked from what is in Kafka after a run.

- :func:`check_decisions`: every accepted event has a decision; repeats of one
  (event id, model version) never differ.
- :func:`model_chain`: every model version ever written (models topic and the table's
  changelog); copies of one version never differ. A learner writes one version per model
  per group of labels, so the versions written have gaps.
- :func:`version_marks`: which label the pending table's applied marks say made each
  version (a version number counts labels).
- :func:`explain_chain`: each step between two written versions is the effect of exactly
  the labels marked for the versions in between, in order, re-applied through
  :mod:`service.learning` and compared bit for bit; every version is claimed by one label
  and no label by two versions.
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
    "version_marks",
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
    """The versions of one model that were written: 0 (configured) to the newest."""

    states: dict[int, dict[str, Any]]  # version -> state, the versions written and 0
    copies: int  # records read (topic + changelog)
    forks: list[int]  # versions written twice with different parameters

    @property
    def final(self) -> dict[str, Any]:
        return self.states[self.version]

    @property
    def version(self) -> int:
        return max(self.states)


def model_chain(
    name: str, config: ModelConfig, topic: Sequence[Rec], changelog: Sequence[Rec]
) -> Chain:
    """Collect the versions of model ``name`` from its snapshots and its table changelog."""
    by_version: dict[int, list[dict[str, Any]]] = defaultdict(list)
    copies = 0
    for rec in [*changelog, *topic]:  # a state first: the topic carries what a scorer reads
        if rec.key != name.encode() or rec.value is None:
            continue
        state = rec.json()
        by_version[int(state["version"])].append(state)
        copies += 1
    states = {0: initial_envelope(name, config).to_dict()}
    forks = []
    for v, got in sorted(by_version.items()):
        if any(_learned(s) != _learned(got[0]) for s in got[1:]):
            forks.append(v)
        states[v] = got[0]
    return Chain(states, copies, forks)


def version_marks(pending_changelog: Sequence[Rec], name: str) -> dict[int, set[tuple[str, int]]]:
    """version of ``name`` -> the (request id, labels offset) of each label an applied mark
    of the pending table's changelog says produced it (every record read, not only each
    key's last: a label marked twice with different versions shows as two claims)."""
    out: dict[int, set[tuple[str, int]]] = defaultdict(set)
    for rec in pending_changelog:
        entry = loads(rec.value) if rec.value is not None else None
        if not isinstance(entry, dict) or not entry.get("applied"):
            continue
        server = entry.get("served_by") or entry.get("model")
        version = entry.get("applied_version") if server == name else None
        if version is None:
            version = (entry.get("shadow_versions") or {}).get(name)
        if version is not None:
            out[int(version)].add((str(entry["request_id"]), int(entry["applied_offset"])))
    return dict(out)


@dataclass
class Explained:
    order: list[str] = field(default_factory=list)  # request ids, one per version
    unexplained: list[int] = field(default_factory=list)  # versions no single label explains
    twice: list[str] = field(default_factory=list)  # labels that explain a second version
    parked: int = 0  # labels applied out of offset order (label before its request)


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
    marks: Mapping[int, set[tuple[str, int]]],
    signer: Signer | None = None,
) -> Explained:
    """Check each step between two versions written: the labels marked for the versions
    in between (:func:`version_marks`), applied in that order to the earlier version, give
    the later one exactly.

    ``labels``: the model's records of the labels topic (what each request was answered);
    ``features``: request id -> the request (or its features alone, for a scorer that
    sends no moments). A version that no label or two labels claim, or a step the marked
    labels do not give, is listed in ``unexplained``; a label that claims a second version
    (applied twice) in ``twice``."""
    answers: dict[str, int] = {}
    for rec in labels:
        try:
            obj = rec.json()
            rid, y = str(obj["request_id"]), obj["label"]
        except (ValueError, TypeError, KeyError):
            continue
        if y in (1, -1) and not isinstance(y, bool | float) and rid in features:
            answers.setdefault(rid, int(y))
    out = Explained()
    used: set[str] = set()
    last_offset = -1
    written = sorted(chain.states)
    for before, after in zip(written, written[1:], strict=False):
        claims = [sorted(marks.get(v, ())) for v in range(before + 1, after + 1)]
        step = [c[0] for c in claims if len(c) == 1 and c[0][0] in answers]
        if len(step) != len(claims):
            versions = range(before + 1, after + 1)
            bad = [v for v, c in zip(versions, claims, strict=True) if len(c) != 1]
            out.unexplained += bad or [after]
            continue
        state = chain.states[before]
        pipeline = Pipeline.from_state(state["pipeline"])
        learner = served_learner(state["learner"])
        for rid, _ in step:
            xa = learn_row(pipeline, features[rid], signer)
            learner.update(pipeline.transform(xa), answers[rid])
        if not _same(chain.states[after], pipeline, learner):
            out.unexplained.append(after)
            continue
        for rid, offset in step:
            if rid in used:
                out.twice.append(rid)
            used.add(rid)
            out.order.append(rid)
            out.parked += int(offset < last_offset)
            last_offset = max(last_offset, offset)
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
    learner = config_learner(config, start["learner"], serving=False)  # to learn on
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
    for v, state in chain.states.items():
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
