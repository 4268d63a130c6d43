"""Accounts, password hashes and session cookies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.desk.auth.accounts import Accounts
from service.desk.auth.passwords import hash_password, verify
from service.desk.auth.sessions import Sessions
from service.desk.errors import AccountsError
from service.records import BadMessage

FAST = 2**8  # tests hash with a cheap cost


def test_a_hash_is_salted_and_verifies_only_its_password() -> None:
    a, b = hash_password("pw-12345", n=FAST), hash_password("pw-12345", n=FAST)
    assert a != b
    assert verify("pw-12345", a)
    assert not verify("pw-1234", a)
    assert not verify("pw-12345", None)
    assert not verify("pw-12345", "garbage")


def test_the_users_file_gives_people_and_scopes(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text(
        json.dumps(
            {
                "users": {
                    "ann": hash_password("a-secret", n=FAST),
                    "bob": {"password": hash_password("b-secret", n=FAST), "models": ["m"]},
                }
            }
        )
    )
    accounts = Accounts.load(path, weak_ok=True)
    ann = accounts.check("ann", "a-secret")
    assert ann is not None
    assert ann.models is None
    bob = accounts.check("bob", "b-secret")
    assert bob is not None
    assert bob.may_answer("m")
    assert not bob.may_answer("z")
    assert accounts.check("ann", "b-secret") is None
    assert accounts.check("nobody", "a-secret") is None


def test_toml_users_files_work_too(tmp_path: Path) -> None:
    path = tmp_path / "users.toml"
    path.write_text(f'[users.ann]\npassword = "{hash_password("a-secret", n=FAST)}"\n')
    assert Accounts.load(path, weak_ok=True).check("ann", "a-secret") is not None


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"ann": "plain-text"}, "not a hash"),
        ({"<b>": "x"}, "bad user name"),
        ({"ann": {"password": "x", "role": "admin"}}, "takes `password`, `models` and"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_a_bad_users_file_says_what_to_fix(tmp_path: Path, content: object, message: str) -> None:
    path = tmp_path / "users.json"
    path.write_text(json.dumps(content))
    with pytest.raises(AccountsError, match=message):
        Accounts.load(path)


def test_a_session_cookie_cannot_be_forged_and_ends() -> None:
    now = [0.0]
    sessions = Sessions(b"k" * 32, lifetime=60.0, clock=lambda: now[0])
    cookie = sessions.issue("ann")
    session = sessions.read(cookie)
    assert session is not None
    assert session.user == "ann"
    other = Sessions(b"x" * 32, lifetime=60.0, clock=lambda: now[0])
    assert other.read(cookie) is None
    body, mac = cookie.split(".")
    tampered = body[:-2] + ("AA" if body[-2:] != "AA" else "BB")
    assert sessions.read(tampered + "." + mac) is None
    assert sessions.csrf_ok(session, sessions.csrf(session))
    assert not sessions.csrf_ok(session, None)
    assert not sessions.csrf_ok(session, "x")
    sessions.revoke(session)
    assert sessions.read(cookie) is None
    fresh = sessions.issue("ann")
    now[0] = 61.0
    assert sessions.read(fresh) is None


def test_revocations_read_from_the_topic_are_checked_and_kept_no_longer_than_a_session() -> None:
    now = [0.0]
    sessions = Sessions(b"k" * 32, lifetime=60.0, clock=lambda: now[0])
    cookie = sessions.issue("ann")
    session = sessions.read(cookie)
    assert session is not None
    for bad in (
        b"{",
        b'{"sid": "x", "ends": 50}',
        b'{"sid": 7, "ends": 50}',
        b'{"sid": "' + b"a" * 22 + b'", "ends": "soon"}',
        b"[" * 3000,
    ):
        with pytest.raises(BadMessage):
            sessions.on_revocation(bad)
    assert sessions.read(cookie) is not None
    forged_forever = b'{"sid": "' + session.sid.encode() + b'", "ends": 1e300}'
    sessions.on_revocation(forged_forever)
    assert sessions.read(cookie) is None
    now[0] = 61.0  # kept for a session's lifetime at most, then forgotten
    sessions.on_revocation(b'{"sid": "' + b"b" * 22 + b'", "ends": 100}')
    assert not sessions.is_revoked(session.sid)
    assert sessions.is_revoked("b" * 22)
