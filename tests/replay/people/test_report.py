"""One run's measures and the table over runs."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

from service.config import LabelBudget, ModelConfig
from service.replay.people import PeopleRun, Work, measures, table
from service.stream.models.served import initial_envelope


def _run(loss: list[float], work: Work, decided: list[int] | None = None) -> PeopleRun:
    config = ModelConfig(n_features=2, label_budget=LabelBudget(fraction=0.1))
    n = len(loss)
    labels = np.array(decided if decided is not None else [1] * n, dtype=np.int8)
    return PeopleRun(
        np.array(loss),
        labels,
        np.zeros(n, dtype=bool),
        work,
        {"changed": 3, "withdrawn": 0, "unchanged": 2},
        4,
        initial_envelope("m", config),
        1.234,
    )


def test_the_peoples_work_is_counted_apart_from_the_models_labels() -> None:
    work = Work(
        labels=20, wrong=6, opinions=Counter(weight=4, share=1), disagreements=5, reviews=5, undos=2
    )
    m = measures(_run([0.0, 1.0, 0.25, 0.25], work), after=2)
    assert m["risk"] == 0.375
    assert m["risk_after"] == 0.25
    assert (m["labels"], m["second_opinions"], m["opinion_share"]) == (20, 5, 0.25)
    assert m["extra_work"] == (5 + 5 + 2) / 20
    assert (m["changed"], m["confirmed"], m["wrong_left"]) == (3, 2, 4)
    assert m["opinion_reasons"] == {"share": 1, "weight": 4}
    assert not m["ends_rejecting"]
    assert json.loads(json.dumps(m)) == m


def test_a_model_that_rejects_the_last_events_ends_rejecting() -> None:
    decided = [1] * 600 + [0] * 480 + [1] * 20  # 96 % of the last 500 rejected
    assert measures(_run([0.25] * 1100, Work(labels=5), decided), after=0)["ends_rejecting"]
    decided = [1] * 600 + [0] * 470 + [1] * 30  # 94 %
    assert not measures(_run([0.25] * 1100, Work(labels=5), decided), after=0)["ends_rejecting"]


def test_the_table_has_one_row_per_stream_and_arm_with_median_and_range() -> None:
    runs = [
        {"risk": r, "labels": n, "end": e}
        for r, n, e in ((0.1, 10, True), (0.3, 30, False), (0.2, 20, True))
    ]
    columns = (("risk", ".2f", "risk"), ("labels", ".0f", "labels"), ("end", "count", "end"))
    text = table(
        [("phishing", "noise 5 %", runs), ("label-flip", "perfect", runs[:1])], columns=columns
    )
    lines = text.splitlines()
    assert lines[0] == "| stream | people | risk | labels | end |"
    assert lines[2] == "| phishing | noise 5 % | 0.20 [0.10-0.30] | 20 [10-30] | 2/3 |"
    assert lines[3] == "| label-flip | perfect | 0.10 [0.10-0.10] | 10 [10-10] | 1/1 |"
