"""The learner's history over a plain dict: what it keeps, where the reach begins, when it
starts again, and that its index is what the table holds."""

from __future__ import annotations

import pytest

from service.config import CorrectionsConfig, ModelConfig, Settings
from service.records import ModelEnvelope, request_id
from service.records.history import Step
from service.stream.labels.history import History
from service.stream.models.served import initial_envelope

from ..memory import CFG, request


def settings(reach: int, **kw: object) -> Settings:
    cfg = CFG.model_copy(update={"corrections": CorrectionsConfig(reach=reach)})
    models: dict[str, ModelConfig] = {"m": cfg}
    if kw.get("shadow"):
        models["s"] = ModelConfig(algorithm="dral", n_features=3, champion="m")
    return Settings(models=models, default_model="m")  # type: ignore[arg-type]


def states(s: Settings) -> dict[str, ModelEnvelope]:
    return {name: initial_envelope(name, cfg) for name, cfg in s.models.items()}


def add(
    history: History,
    s: Settings,
    offset: int,
    *,
    members: tuple[str, ...] = ("m",),
    partition: int = 0,
) -> int:
    """Record a label at ``offset``; the reach afterwards."""
    plan = history.plan("m", members, offset=offset, partition=partition)
    req = request([1.0, 2.0, 3.0], f"e{offset}")
    step = Step("m", plan.seq, partition, offset, req, 1, 1, "alice", None, 1.0)
    history.record(plan, step, {m: states(s)[m] for m in members})
    assert history.reach_from("m") == plan.reach_from
    return plan.reach_from


def steps(table: dict[bytes, bytes]) -> list[bytes]:
    return sorted(k for k in table if b"@" in k)


def checkpoints(table: dict[bytes, bytes]) -> list[bytes]:
    return sorted(k for k in table if b"#" in k)


@pytest.mark.parametrize("reach", [1, 5, 10, 23])
def test_it_keeps_between_reach_and_reach_plus_every_labels(reach: int) -> None:
    s = settings(reach)
    table: dict[bytes, bytes] = {}
    history = History(table, s)
    every = s.models["m"].corrections.every
    for offset in range(100):
        reach_from = add(history, s, offset)
        kept = len(steps(table))
        assert min(reach, offset + 1) <= kept <= reach + every - 1
        assert reach_from == offset + 1 - kept  # the oldest kept label's offset
        assert len(checkpoints(table)) == -(-kept // every)  # one before every every-th


def test_off_keeps_nothing_and_says_so() -> None:
    s = settings(0)
    table: dict[bytes, bytes] = {}
    history = History(table, s)
    assert add(history, s, 0) == -1
    assert table == {}


def test_a_redone_label_keeps_its_place_and_writes_nothing_new() -> None:
    s = settings(10)
    table: dict[bytes, bytes] = {}
    history = History(table, s)
    for offset in range(5):
        add(history, s, offset)
    before = dict(table)
    plan = history.plan("m", ("m",), offset=3, partition=0)
    assert (plan.seq, plan.cut, plan.checkpoint) == (3, False, False)
    add(history, s, 3)
    assert table == before


def test_it_starts_again_when_the_members_or_the_partition_change() -> None:
    s = settings(50, shadow=True)
    table: dict[bytes, bytes] = {}
    history = History(table, s)
    for offset in range(7):
        add(history, s, offset)
    assert add(history, s, 7, members=("m", "s")) == 7  # a shadow joined: a new history
    assert steps(table) == [b"m@7"]
    assert checkpoints(table) == [b"m#0", b"s#0"]
    assert add(history, s, 8, members=("m", "s"), partition=1) == 8  # another partition
    assert steps(table) == [b"m@8"]
    history.cut("m")
    assert table == {}
    assert history.reach_from("m") == -1


def test_the_index_is_rebuilt_from_the_table() -> None:
    s = settings(10)
    table: dict[bytes, bytes] = {}
    history = History(table, s)
    for offset in range(23):
        add(history, s, offset)
    again = History(dict(table), s)
    assert again.reach_from("m") == history.reach_from("m")
    rid = request_id("m", "e20")
    assert again.step("m", rid) == history.step("m", rid)
    assert [x.seq for x in again.steps_from("m", 0)] == [x.seq for x in history.steps_from("m", 0)]
    base = again.base("m", 21)
    assert base is not None
    assert base[0] == 21  # every label has its checkpoint with reach 10
    assert again.plan("m", ("m",), offset=23, partition=0).seq == 23


def test_entries_that_do_not_parse_or_belong_to_no_model_are_skipped() -> None:
    s = settings(10)
    table: dict[bytes, bytes] = {}
    history = History(table, s)
    for offset in range(3):
        add(history, s, offset)
    table[b"m@99"] = b"{not json"
    table[b"ghost@1"] = table[b"m@1"]
    table[b"ghost#0"] = table[b"m#0"]
    again = History(table, s)
    assert [x.offset for x in again.steps_from("m", 0)] == [0, 1, 2]
    assert again.step("ghost", request_id("m", "e1")) is None


def _history(reach: int, labels: int) -> tuple[Settings, dict[bytes, bytes]]:
    s = settings(reach)
    table: dict[bytes, bytes] = {}
    history = History(table, s)
    for offset in range(labels):
        add(history, s, offset)
    return s, table


def test_a_gap_in_the_steps_read_back_leaves_out_everything_before_it() -> None:
    s, table = _history(40, 45)  # checkpoints before steps 0, 10, 20, 30, 40
    del table[b"m@23"]  # a step gone (refused when read back, say)
    again = History(table, s)
    assert again.reach_from("m") == 30  # the first checkpoint after the gap
    assert again.untrusted_below("m") == 30
    assert again.step("m", request_id("m", "e22")) is None
    assert again.step("m", request_id("m", "e31")) is not None
    assert [x.seq for x in again.steps_from("m", 0)] == list(range(30, 45))


def test_a_seq_claimed_twice_is_a_gap() -> None:
    s, table = _history(40, 25)
    twin = table[b"m@12"].replace(b'"offset":12', b'"offset":99')
    table[b"m@99"] = twin  # seq 12 a second time, at another offset
    again = History(table, s)
    assert again.reach_from("m") == 20
    assert again.step("m", request_id("m", "e12")) is None


def test_a_checkpoint_without_every_member_is_not_a_base() -> None:
    s = settings(40, shadow=True)
    table: dict[bytes, bytes] = {}
    history = History(table, s)
    for offset in range(25):
        add(history, s, offset, members=("m", "s"))
    del table[b"s#20"]  # the shadow's state before step 20 is gone
    again = History(table, s)
    base = again.base("m", 22)
    assert base is not None
    assert base[0] == 10  # the one before, complete
    assert again.untrusted_below("m") == 0


def test_distrusted_steps_take_what_precedes_them_out() -> None:
    s, table = _history(40, 35)
    history = History(table, s)
    history.distrust("m", [14])
    assert history.reach_from("m") == 20
    assert history.untrusted_below("m") == 20


def test_a_pin_keeps_a_checkpoint_without_widening_the_reach() -> None:
    s = settings(10)
    table: dict[bytes, bytes] = {}
    history = History(table, s)
    for offset in range(12):
        add(history, s, offset)
    history.pin("m", 3)  # a correction of step 3 waits for its derivation
    free = History(dict(table), s)
    for offset in range(12, 30):
        add(history, s, offset)
        add(free, s, offset)
    assert history.reach_from("m") == free.reach_from("m")  # what corrections can reach
    assert history.step("m", request_id("m", "e5")) is None
    assert history.base_seq("m", 3) == 3  # kept for the derivation that waits
    assert history.raw_base("m", 3) is not None
    history.unpin("m")
    add(history, s, 30)
    add(free, s, 30)
    assert history.first_checkpoint("m") == free.first_checkpoint("m")
