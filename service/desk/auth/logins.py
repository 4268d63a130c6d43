"""Login attempts: password checks off the event loop, throttled per account and per client
address, so that a flood of guesses neither slows the people already signed in nor gets
an attacker many guesses.

- **Off the loop.** A check (scrypt, ~50 ms of CPU and 16 MiB) runs in a small thread pool
  (``threads``, 1 by default; ``hashlib.scrypt`` releases the GIL) at a lower CPU priority
  (nice +10 on Linux), so the event loop keeps serving pages, the API, ``/healthz`` and the
  Kafka readers meanwhile, first. At most ``waiting`` checks wait for it; an attempt beyond
  that is refused (``busy``), checking nothing.
- **Throttled.** Each account name (known or not: a difference would tell which names
  exist) and each client address (an IPv6 address by its /64) has a budget: ``free``
  attempts, then one more after 1 s, 2 s, 4 s, ... up to ``longest`` between attempts.
  An attempt refused by either budget is answered at once (``throttled``, with the seconds
  to wait), checking nothing and costing nothing; a budget is spent when a check starts, so
  sixteen attempts at the same moment get ``free`` checks, not sixteen. A signed-in account
  starts afresh; its address gets back the attempt that succeeded, no more (so the people
  of an office behind one address are not slowed by each other's logins, and logging in to
  one's own account between guesses does not reset the address). A budget untouched for
  ``forget`` seconds is forgotten; at most ``max_tracked`` of each are kept (the least
  recently used go first).
- **Refused slowly.** A refused attempt is answered after ``refusal_delay`` seconds (1 s,
  or the wait if shorter), with the wait that is left: a client that waits for its answers
  (a browser, a script guessing in a loop) cannot turn the cheap refusals into a flood that
  takes the event loop from everybody else. (Many parallel connections are a plain HTTP
  flood: rate-limit those at the proxy in front.)

>>> import asyncio
>>> from service.desk.auth.accounts import Account, Accounts
>>> from service.desk.auth.passwords import hash_password
>>> book = Accounts({"ann": Account("ann", hash_password("pw-ann-1", n=2**8), None)})
>>> gate = LoginGate(book, clock=lambda: 100.0, free=2, refusal_delay=0.0)
>>> [asyncio.run(gate.attempt("ann", "wrong", "192.0.2.1")).outcome for _ in range(3)]
['failed', 'failed', 'throttled']
>>> asyncio.run(gate.attempt("ann", "pw-ann-1", "192.0.2.1")).retry_after
1.0
>>> gate.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final, Literal

from service.desk.auth.accounts import Accounts, Person, valid_name

__all__ = ["LoginGate", "LoginResult", "Throttle", "address_key"]

Outcome = Literal["ok", "failed", "throttled", "busy"]

FREE: Final = 5  # attempts before the first wait
LONGEST: Final = 60.0  # seconds: the longest wait between two attempts
FORGET: Final = 900.0  # seconds without an attempt before a budget is forgotten
REFUSAL_DELAY: Final = 1.0  # seconds before a refused attempt is answered
NICE: Final = 10  # how much lower the checking threads' CPU priority is (Linux)
MAX_TRACKED: Final = 100_000  # budgets kept per kind (accounts, addresses)


@dataclass(frozen=True, slots=True)
class LoginResult:
    """How an attempt ended: ``person`` when signed in; ``retry_after`` (seconds) when it
    was refused before any check."""

    outcome: Outcome
    person: Person | None = None
    retry_after: float = 0.0


@dataclass(slots=True)
class _Budget:
    attempts: int = 0
    next_at: float = 0.0  # no attempt before this time
    last: float = 0.0  # time of the last attempt


class Throttle:
    """Attempts per key with exponential backoff (module docstring).

    >>> t = Throttle(free=1, longest=4.0, forget=60.0)
    >>> [t.wait("k", now=s) for s in (0.0, 0.0)], t.spend("k", now=0.0), t.wait("k", now=0.0)
    ([0.0, 0.0], None, 1.0)
    >>> t.spend("k", now=1.0), t.wait("k", now=1.0), t.wait("k", now=61.0 + 2.0)
    (None, 2.0, 0.0)
    """

    def __init__(
        self,
        *,
        free: int = FREE,
        longest: float = LONGEST,
        forget: float = FORGET,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self.free, self.longest, self.forget, self.max_tracked = free, longest, forget, max_tracked
        self._budgets: OrderedDict[str, _Budget] = OrderedDict()

    def __len__(self) -> int:
        return len(self._budgets)

    def _get(self, key: str, now: float) -> _Budget | None:
        budget = self._budgets.get(key)
        if budget is not None and now - budget.last > self.forget and now >= budget.next_at:
            del self._budgets[key]
            return None
        return budget

    def wait(self, key: str, *, now: float) -> float:
        """Seconds before ``key`` may try again (0: now)."""
        budget = self._get(key, now)
        return 0.0 if budget is None else max(0.0, budget.next_at - now)

    def spend(self, key: str, *, now: float) -> None:
        """One attempt for ``key`` starts now: past the free ones, the next waits 1 s,
        then 2 s, 4 s, ... at most ``longest``."""
        budget = self._get(key, now) or _Budget()
        budget.attempts += 1
        budget.last = now
        beyond = budget.attempts - self.free
        if beyond >= 0:
            budget.next_at = now + min(self.longest, 2.0 ** min(beyond, 32))
        self._budgets[key] = budget
        self._budgets.move_to_end(key)
        while len(self._budgets) > self.max_tracked:
            self._budgets.popitem(last=False)

    def reset(self, key: str) -> None:
        """``key`` starts afresh (its account signed in)."""
        self._budgets.pop(key, None)

    def refund(self, key: str) -> None:
        """Give ``key`` back one attempt (it succeeded): its wait is what its other
        attempts alone would make it."""
        budget = self._budgets.get(key)
        if budget is None:
            return
        budget.attempts = max(0, budget.attempts - 1)
        beyond = budget.attempts - self.free
        budget.next_at = (
            budget.last + min(self.longest, 2.0 ** min(beyond, 32)) if beyond >= 0 else 0.0
        )


def address_key(address: str | None) -> str:
    """The key a client address is throttled by: the address, an IPv6 address by its /64
    (one client commonly holds the whole /64).

    >>> address_key("192.0.2.1"), address_key("2001:db8::1:2"), address_key(None)
    ('192.0.2.1', '2001:db8::/64', '?')
    """
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return address or "?"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class LoginGate:
    """Checks passwords for the login page (module docstring)."""

    def __init__(
        self,
        accounts: Accounts,
        *,
        clock: Callable[[], float],
        threads: int = 1,
        waiting: int = 8,
        free: int = FREE,
        longest: float = LONGEST,
        forget: float = FORGET,
        max_tracked: int = MAX_TRACKED,
        refusal_delay: float = REFUSAL_DELAY,
    ) -> None:
        self.accounts, self.clock, self.waiting = accounts, clock, waiting
        self.threads, self.refusal_delay = threads, refusal_delay
        self._pool = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="desk-login", initializer=_lower_priority
        )
        self._running = 0  # checks in the pool or waiting for it
        self.accounts_throttle = Throttle(
            free=free, longest=longest, forget=forget, max_tracked=max_tracked
        )
        self.addresses_throttle = Throttle(
            free=free, longest=longest, forget=forget, max_tracked=max_tracked
        )

    async def attempt(self, user: str, password: str, address: str | None) -> LoginResult:
        """Check ``user``'s ``password``, tried from client ``address``."""
        now, where = self.clock(), address_key(address)
        account = f"user:{user}" if valid_name(user) else "user:?"
        wait = max(
            self.accounts_throttle.wait(account, now=now),
            self.addresses_throttle.wait(where, now=now),
        )
        if wait > 0:
            slept = await self.pause(wait)
            return LoginResult("throttled", retry_after=float(max(1, math.ceil(wait - slept))))
        if self._running >= self.threads + self.waiting:
            await self.pause(1.0)
            return LoginResult("busy", retry_after=1.0)
        self.accounts_throttle.spend(account, now=now)
        self.addresses_throttle.spend(where, now=now)
        if not valid_name(user):
            return LoginResult("failed")
        self._running += 1
        try:
            loop = asyncio.get_running_loop()
            person = await loop.run_in_executor(self._pool, self.accounts.check, user, password)
        finally:
            self._running -= 1
        if person is None:
            return LoginResult("failed")
        self.accounts_throttle.reset(account)
        self.addresses_throttle.refund(where)
        return LoginResult("ok", person)

    async def pause(self, most: float) -> float:
        """Hold a refused attempt's answer back (``refusal_delay``, at most ``most`` seconds);
        the seconds waited."""
        delay = min(most, self.refusal_delay)
        if delay > 0:
            await asyncio.sleep(delay)
        return delay

    def close(self) -> None:
        """Stop the pool (checks under way finish)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _lower_priority() -> None:
    """A checking thread runs at a lower CPU priority than the event loop (Linux sets the
    priority per thread; elsewhere, or without the right, it stays as it is)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(
            os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + NICE
        )
