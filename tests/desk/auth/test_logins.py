"""Login attempts: checked off the event loop, a bounded number at a time, throttled per
account and per client address with a growing wait; weak hashes refused at start-up."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from service.desk.auth.accounts import Account, Accounts, Person
from service.desk.auth.logins import LoginGate, Throttle
from service.desk.auth.passwords import DEFAULT_N, hash_password
from service.desk.cli import main

FAST = 2**8


class CountingAccounts(Accounts):
    """Accounts that count checks and where they ran; ``gate`` holds checks until set."""

    def __init__(self, hold: bool = False) -> None:
        super().__init__({"ann": Account("ann", hash_password("ann-pass", n=FAST), None)})
        self.checks = 0
        self.threads: set[int] = set()
        self.gate = threading.Event()
        if not hold:
            self.gate.set()

    def check(self, name: str, password: str) -> Person | None:
        self.checks += 1
        self.threads.add(threading.get_ident())
        self.gate.wait(10)
        return super().check(name, password)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_sixteen_guesses_at_once_get_the_free_checks_and_the_rest_wait() -> None:
    accounts, clock = CountingAccounts(), Clock()
    gate = LoginGate(accounts, clock=clock, refusal_delay=0.0, free=5, waiting=32)
    results = await asyncio.gather(
        *(gate.attempt("ann", f"guess-{i}", "192.0.2.1") for i in range(16))
    )
    outcomes = [r.outcome for r in results]
    assert outcomes.count("failed") == 5
    assert outcomes.count("throttled") == 11
    assert accounts.checks == 5  # a throttled attempt checks nothing
    assert {r.retry_after for r in results if r.outcome == "throttled"} == {1.0}
    assert threading.get_ident() not in accounts.threads  # checked off the event loop
    gate.close()


async def test_the_wait_doubles_up_to_the_longest_and_is_forgotten() -> None:
    accounts, clock = CountingAccounts(), Clock()
    gate = LoginGate(accounts, clock=clock, refusal_delay=0.0, free=1, longest=8.0, forget=100.0)
    waits = []
    for _ in range(6):
        result = await gate.attempt("ann", "wrong", "192.0.2.1")
        assert result.outcome == "failed"
        throttled = await gate.attempt("ann", "wrong", "192.0.2.1")
        assert throttled.outcome == "throttled"
        waits.append(throttled.retry_after)
        clock.now += throttled.retry_after
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    clock.now += 101.0  # quiet for longer than `forget`: a fresh start
    assert (await gate.attempt("ann", "ann-pass", "192.0.2.1")).outcome == "ok"
    gate.close()


async def test_an_address_is_throttled_across_accounts_and_others_are_not() -> None:
    accounts, clock = CountingAccounts(), Clock()
    gate = LoginGate(accounts, clock=clock, refusal_delay=0.0, free=3)
    for i in range(3):
        assert (await gate.attempt(f"user{i}", "x", "2001:db8::1")).outcome == "failed"
    # the same /64, another account: throttled; another address: checked
    assert (await gate.attempt("ann", "ann-pass", "2001:db8::99")).outcome == "throttled"
    assert (await gate.attempt("ann", "ann-pass", "192.0.2.8")).outcome == "ok"
    gate.close()


async def test_signing_in_resets_the_account_but_not_the_address() -> None:
    accounts, clock = CountingAccounts(), Clock()
    gate = LoginGate(accounts, clock=clock, refusal_delay=0.0, free=3)
    for _ in range(2):
        assert (await gate.attempt("ann", "wrong", "192.0.2.1")).outcome == "failed"
    assert (await gate.attempt("ann", "ann-pass", "192.0.2.1")).outcome == "ok"
    assert gate.accounts_throttle.wait("user:ann", now=clock.now) == 0.0
    # the address keeps its two failures: one more guess, then it waits (any account)
    assert (await gate.attempt("ann", "wrong", "192.0.2.1")).outcome == "failed"
    assert (await gate.attempt("bob", "wrong", "192.0.2.1")).outcome == "throttled"
    assert (await gate.attempt("bob", "wrong", "192.0.2.2")).outcome == "failed"
    gate.close()


async def test_an_office_behind_one_address_signs_in_as_often_as_it_likes() -> None:
    accounts, clock = CountingAccounts(), Clock()
    gate = LoginGate(accounts, clock=clock, refusal_delay=0.0, free=3)
    outcomes = [(await gate.attempt("ann", "ann-pass", "192.0.2.1")).outcome for _ in range(20)]
    assert outcomes == ["ok"] * 20
    gate.close()


async def test_beyond_the_checks_that_may_wait_an_attempt_is_refused_at_once() -> None:
    accounts, clock = CountingAccounts(hold=True), Clock()
    gate = LoginGate(accounts, clock=clock, refusal_delay=0.0, threads=1, waiting=2, free=100)
    running = [asyncio.ensure_future(gate.attempt(f"u{i}", "x", f"192.0.2.{i}")) for i in range(3)]
    await asyncio.sleep(0.05)
    busy = await gate.attempt("ann", "ann-pass", "192.0.2.99")
    assert (busy.outcome, busy.retry_after) == ("busy", 1.0)
    accounts.gate.set()
    assert [r.outcome for r in await asyncio.gather(*running)] == ["failed"] * 3
    assert accounts.checks == 3
    assert (await gate.attempt("ann", "ann-pass", "192.0.2.99")).outcome == "ok"
    gate.close()


async def test_a_refused_attempt_is_answered_late_with_the_wait_that_is_left() -> None:
    accounts = CountingAccounts()
    gate = LoginGate(accounts, clock=time.monotonic, free=1, longest=1.0, refusal_delay=0.3)
    for _ in range(2):
        await gate.attempt("ann", "wrong", "192.0.2.1")
        began = time.monotonic()
        refused = await gate.attempt("ann", "wrong", "192.0.2.1")
        assert refused.outcome == "throttled"
        assert time.monotonic() - began >= 0.3  # held back: a loop of guesses is slowed
        assert refused.retry_after >= 1.0
        await asyncio.sleep(max(0.0, refused.retry_after - 0.3) + 0.05)
    assert accounts.checks == 2
    gate.close()


def test_a_throttle_keeps_a_bounded_number_of_budgets() -> None:
    throttle = Throttle(free=1, max_tracked=100)
    for i in range(1000):
        throttle.spend(f"k{i}", now=0.0)
    assert len(throttle) == 100
    assert throttle.wait("k999", now=0.0) == 1.0


@pytest.mark.parametrize(
    ("n", "r", "p", "message"),
    [
        (2**10, 8, 1, "at least 16 MiB"),
        (2**14, 2, 1, "at least 16 MiB"),
        (2**20, 8, 1, "at most 64 MiB"),
        (2**14, 8, 16, "more than four default checks"),
    ],
)
def test_a_users_file_with_weak_or_ruinous_hashes_stops_the_desk_at_start_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], n: int, r: int, p: int, message: str
) -> None:
    good = hash_password("b-secret-1", n=DEFAULT_N)
    head, _, _, _, salt, digest = good.split("$")
    odd = "$".join([head, str(n), str(r), str(p), salt, digest])
    users = tmp_path / "users.json"
    users.write_text(json.dumps({"users": {"bob": good, "ann": odd}}))
    assert main(["--users", str(users)]) == 2
    err = capsys.readouterr().err
    assert "users.ann.password" in err
    assert message in err
    assert "abstain desk hash-password" in err
