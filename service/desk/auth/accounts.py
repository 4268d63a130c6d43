"""People: who may use the desk, and which models each may answer for.

The users file (JSON or TOML) maps a user name to a password hash made by
``abstain desk hash-password``, or to a table with the hash and an optional model scope::

    # desk-users.toml
    [users.alice]
    password = "scrypt$16384$8$1$..."
    [users.bob]
    password = "scrypt$16384$8$1$..."
    models = ["fraud"]          # bob answers for `fraud` only
    [users.rita]
    password = "scrypt$16384$8$1$..."
    reviewer = true             # rita decides disagreements and corrects anyone's answers

Behind an authenticating proxy (``desk.auth = "proxy"``) the file is optional: it then only
gives scopes and roles (``password`` may be left out). Scopes fail closed: once the file
lists anyone, a name it does not list answers for no model (:meth:`Accounts.proxied`);
without a file, everyone the proxy vouches for answers for every model. The reviewer role
also comes from ``desk.reviewers`` (either source is enough: :meth:`Person.with_role`).

>>> book = Accounts.parse({"users": {"ann": {"password": "x", "models": ["m"]}}}, "f")
Traceback (most recent call last):
...
service.desk.errors.AccountsError: f: users.ann.password is not a hash made by `abstain desk hash-password`
>>> Person("ann", frozenset({"m"})).may_answer("m"), Person("ann", None).may_answer("z")
(True, True)
>>> Accounts.parse({"rita": {"reviewer": "yes"}}, "f", passwords=False)
Traceback (most recent call last):
...
service.desk.errors.AccountsError: f: users.rita.reviewer must be true or false
"""  # noqa: E501

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from service.config import USER_NAME, read_document
from service.desk.auth.passwords import cost_problem, verify, well_formed
from service.desk.errors import AccountsError

__all__ = ["Account", "Accounts", "Person", "valid_name"]

_NAME: Final = re.compile(USER_NAME)


def valid_name(name: str) -> bool:
    """A user name the desk accepts (it ends up in ``labelled_by``).

    >>> valid_name("alice@example.org"), valid_name("<script>"), valid_name("")
    (True, False, False)
    """
    return bool(_NAME.match(name))


@dataclass(frozen=True, slots=True)
class Person:
    """Who is at the desk: the name the server vouches for, the models they may answer
    for (``None``: every model) and whether they review others' answers."""

    name: str
    models: frozenset[str] | None = None
    reviewer: bool = False

    def may_answer(self, model: str) -> bool:
        return self.models is None or model in self.models

    def with_role(self, reviewers: Collection[str]) -> Person:
        """This person, a reviewer too if ``reviewers`` (``desk.reviewers``) names them.

        >>> Person("rita").with_role(("rita",)).reviewer, Person("ann").with_role(()).reviewer
        (True, False)
        """
        if self.reviewer or self.name not in reviewers:
            return self
        return dataclasses.replace(self, reviewer=True)


@dataclass(frozen=True, slots=True)
class Account:
    """One line of the users file."""

    name: str
    password_hash: str | None
    models: frozenset[str] | None
    reviewer: bool = False

    @property
    def person(self) -> Person:
        return Person(self.name, self.models, self.reviewer)


class Accounts:
    """The accounts of a users file."""

    def __init__(self, accounts: Mapping[str, Account]) -> None:
        self.accounts = dict(accounts)

    def __len__(self) -> int:
        return len(self.accounts)

    @classmethod
    def load(cls, path: Path, *, passwords: bool = True, weak_ok: bool = False) -> Accounts:
        """Read ``path`` (``.json`` or ``.toml``); :class:`AccountsError` says what is wrong.
        A hash weaker than the default (or beyond the bounds of
        :func:`~service.desk.auth.passwords.cost_problem`) is refused unless ``weak_ok`` (tests)."""
        data = read_document(path, what="users file", error=AccountsError)
        return cls.parse(data, str(path), passwords=passwords, weak_ok=weak_ok)

    @classmethod
    def parse(
        cls, data: Any, where: str, *, passwords: bool = True, weak_ok: bool = False
    ) -> Accounts:
        """Accounts from decoded file content (``{"users": {...}}`` or the mapping itself)."""
        if isinstance(data, dict) and isinstance(data.get("users"), dict):
            data = data["users"]
        if not isinstance(data, dict):
            raise AccountsError(f"{where}: expected a mapping of user name to password hash")
        return cls(
            {name: _account(name, value, where, passwords, weak_ok) for name, value in data.items()}
        )

    def check(self, name: str, password: str) -> Person | None:
        """The person if ``password`` is theirs; None otherwise (same cost either way)."""
        account = self.accounts.get(name)
        stored = None if account is None else account.password_hash
        if not verify(password, stored) or account is None:
            return None
        return account.person

    def person(self, name: str) -> Person | None:
        """The account's person (its scope), None if the file does not list ``name``."""
        account = self.accounts.get(name)
        return None if account is None else account.person

    def proxied(self, name: str) -> Person:
        """The person a proxy vouches for as ``name``: the file's (its scope), else, when
        the file lists anyone, a person who answers for no model (scopes fail closed), else
        (no file) one who answers for every model.

        >>> people = Accounts.parse({"bob": {"models": ["m"]}}, "f", passwords=False)
        >>> people.proxied("bob").models, people.proxied("mallory").models
        (frozenset({'m'}), frozenset())
        >>> Accounts({}).proxied("ann").models is None
        True
        """
        person = self.person(name)
        if person is not None:
            return person
        return Person(name, frozenset() if self.accounts else None)


def _account(name: Any, value: Any, where: str, passwords: bool, weak_ok: bool) -> Account:
    if not isinstance(name, str) or not valid_name(name):
        raise AccountsError(f"{where}: bad user name {name!r} (letters, digits, . _ @ + -)")
    if isinstance(value, str):
        value = {"password": value}
    if not isinstance(value, dict) or set(value) - {"password", "models", "reviewer"}:
        raise AccountsError(f"{where}: users.{name} takes `password`, `models` and `reviewer` only")
    secret = value.get("password")
    if secret is None and passwords:
        raise AccountsError(f"{where}: users.{name} has no password")
    if secret is not None and (not isinstance(secret, str) or not well_formed(secret)):
        raise AccountsError(
            f"{where}: users.{name}.password is not a hash made by `abstain desk hash-password`"
        )
    problem = None if secret is None or weak_ok else cost_problem(secret)
    if problem is not None:
        raise AccountsError(
            f"{where}: users.{name}.password: {problem}; make a new one with "
            "`abstain desk hash-password`"
        )
    models = value.get("models")
    if models is not None and (
        not isinstance(models, list) or not all(isinstance(m, str) and m for m in models)
    ):
        raise AccountsError(f"{where}: users.{name}.models must be a list of model names")
    reviewer = value.get("reviewer", False)
    if not isinstance(reviewer, bool):
        raise AccountsError(f"{where}: users.{name}.reviewer must be true or false")
    return Account(name, secret, None if models is None else frozenset(models), reviewer)
