"""Session cookies and CSRF tokens, signed so that any desk replica with the same
``desk.session_key`` accepts them (no shared session store).

A cookie is ``<payload>.<mac>``: the payload names the user, the session id and when it
ends; the MAC is HMAC-SHA256 over the payload. The CSRF token of a session is a second MAC,
over its session id: a page gets it in a ``<meta>`` tag and sends it back in a header or a
form field, which a cross-site page cannot read. Logging out revokes the session id: the
replica that served the logout at once, and every replica (itself after a restart included)
once it reads the revocation record the desk writes to its revocations topic
(:meth:`Sessions.revoke` makes it, :meth:`Sessions.on_revocation` reads it); the cookie is
also deleted from the browser.

>>> clock = iter([100.0, 100.0, 200.0]).__next__
>>> sessions = Sessions(b"k" * 32, lifetime=60.0, clock=clock)
>>> cookie = sessions.issue("ann")
>>> sessions.read(cookie).user
'ann'
>>> sessions.read(cookie) is None  # at t=200 the 60 s session has ended
True

A revocation read from the topic ends the session on this replica too:

>>> other = Sessions(b"k" * 32, lifetime=60.0, clock=lambda: 0.0)
>>> session = other.read(other.issue("bob"))
>>> other.on_revocation(Sessions(b"k" * 32, lifetime=60.0, clock=lambda: 0.0).revoke(session))
>>> other.read(other.issue("bob")) is not None, other.is_revoked(session.sid)
(True, True)
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import orjson

from service.records import BadMessage
from service.records.codec import decode_object, number, text

__all__ = ["Session", "Sessions"]

_SID: Final = re.compile(r"^[A-Za-z0-9_-]{16,64}$")  # secrets.token_urlsafe(16): 22 characters


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in person's session."""

    user: str
    sid: str
    ends: float


class Sessions:
    """Issues and checks session cookies and their CSRF tokens."""

    def __init__(self, key: bytes, *, lifetime: float, clock: Callable[[], float]) -> None:
        self._key = key
        self.lifetime = lifetime
        self.clock = clock
        self._revoked: dict[str, float] = {}  # sid -> end of the session (then forgotten)
        self._ends: list[tuple[float, str]] = []  # heap of (end, sid): forgotten in order

    def _mac(self, purpose: str, data: bytes) -> str:
        return _b64(hmac.new(self._key, purpose.encode() + b"\x1f" + data, hashlib.sha256).digest())

    def issue(self, user: str) -> str:
        """A new session cookie value for ``user``."""
        payload = orjson.dumps(
            {"u": user, "s": secrets.token_urlsafe(16), "e": self.clock() + self.lifetime}
        )
        return f"{_b64(payload)}.{self._mac('session', payload)}"

    def read(self, cookie: str | None) -> Session | None:
        """The session of ``cookie`` if it is genuine, not revoked and not over."""
        if not cookie or cookie.count(".") != 1 or len(cookie) > 1024:
            return None
        body, mac = cookie.split(".")
        try:
            payload = _unb64(body)
        except ValueError:
            return None
        if not hmac.compare_digest(mac, self._mac("session", payload)):
            return None
        try:
            data = orjson.loads(payload)
            session = Session(str(data["u"]), str(data["s"]), float(data["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        if session.ends <= self.clock() or session.sid in self._revoked:
            return None
        return session

    def is_revoked(self, sid: str) -> bool:
        return sid in self._revoked

    def csrf(self, session: Session) -> str:
        """The CSRF token of ``session``."""
        return self._mac("csrf", session.sid.encode())

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        """True if ``token`` is the CSRF token of ``session``."""
        return bool(token) and hmac.compare_digest(str(token), self.csrf(session))

    def revoke(self, session: Session) -> bytes:
        """Log ``session`` out on this replica; the record that tells every replica (the
        value for the revocations topic, key = the session id)."""
        self._remember(session.sid, session.ends)
        return orjson.dumps({"sid": session.sid, "ends": session.ends, "at": self.clock()})

    def on_revocation(self, raw: bytes) -> None:
        """A record of the revocations topic (anyone with access could write one): a
        session id of the desk's shape and when that session ends, kept no longer than a
        session lasts from now. :class:`~service.records.BadMessage` if it is not one."""
        record = decode_object(raw, max_bytes=1024)
        sid = record.get("sid")
        if not isinstance(sid, str) or not _SID.match(text(sid, "sid")):
            raise BadMessage("schema", "sid must be a session id")
        now = self.clock()
        ends = min(number(record, "ends"), now + self.lifetime)
        if ends > now:
            self._remember(sid, ends)

    def _remember(self, sid: str, ends: float) -> None:
        """Revoke ``sid`` until ``ends``; forget the revocations whose sessions are over."""
        now = self.clock()
        while self._ends and self._ends[0][0] <= now:
            end, old = heapq.heappop(self._ends)
            if self._revoked.get(old) == end:
                del self._revoked[old]
        if ends > self._revoked.get(sid, now):
            self._revoked[sid] = ends
            heapq.heappush(self._ends, (ends, sid))

    def login_token(self, nonce: str) -> str:
        """The token the login form carries for the pre-login cookie ``nonce``."""
        return self._mac("login", nonce.encode())

    def login_ok(self, nonce: str | None, token: str | None) -> bool:
        """True if the login form's ``token`` belongs to the pre-login cookie ``nonce``."""
        if not nonce or not token:
            return False
        return hmac.compare_digest(str(token), self.login_token(nonce))
