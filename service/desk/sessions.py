"""Session cookies and CSRF tokens, signed so that any desk replica with the same
``desk.session_key`` accepts them (no shared session store).

A cookie is ``<payload>.<mac>``: the payload names the user, the session id and when it
ends; the MAC is HMAC-SHA256 over the payload. The CSRF token of a session is a second MAC,
over its session id: a page gets it in a ``<meta>`` tag and sends it back in a header or a
form field, which a cross-site page cannot read. Logging out revokes the session id on the
replica that served the logout (the cookie is also deleted from the browser); other replicas
honour the cookie until it ends, so keep ``session_seconds`` modest (docs/desk.md).

>>> clock = iter([100.0, 100.0, 200.0]).__next__
>>> sessions = Sessions(b"k" * 32, lifetime=60.0, clock=clock)
>>> cookie = sessions.issue("ann")
>>> sessions.read(cookie).user
'ann'
>>> sessions.read(cookie) is None  # at t=200 the 60 s session has ended
True
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import orjson

__all__ = ["Session", "Sessions"]


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

    def _mac(self, purpose: str, data: bytes) -> str:
        return _b64(hmac.new(self._key, purpose.encode() + b"\x1f" + data, hashlib.sha256).digest())

    def issue(self, user: str) -> str:
        """A new session cookie value for ``user``."""
        payload = orjson.dumps({"u": user, "s": secrets.token_urlsafe(16),
                                "e": self.clock() + self.lifetime})  # fmt: skip
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

    def csrf(self, session: Session) -> str:
        """The CSRF token of ``session``."""
        return self._mac("csrf", session.sid.encode())

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        """True if ``token`` is the CSRF token of ``session``."""
        return bool(token) and hmac.compare_digest(str(token), self.csrf(session))

    def revoke(self, session: Session) -> None:
        """Log ``session`` out (on this replica); forget revocations that have ended."""
        now = self.clock()
        self._revoked = {sid: end for sid, end in self._revoked.items() if end > now}
        self._revoked[session.sid] = session.ends

    def login_token(self, nonce: str) -> str:
        """The token the login form carries for the pre-login cookie ``nonce``."""
        return self._mac("login", nonce.encode())

    def login_ok(self, nonce: str | None, token: str | None) -> bool:
        """True if the login form's ``token`` belongs to the pre-login cookie ``nonce``."""
        if not nonce or not token:
            return False
        return hmac.compare_digest(str(token), self.login_token(nonce))
