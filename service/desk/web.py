"""The desk's HTTP side (aiohttp): pages, the JSON API the page calls, /metrics.

Every page but the login page, and every API call, needs a person: a session cookie
(HttpOnly, SameSite=Strict, Secure over TLS or when configured) or, with
``desk.auth = "proxy"``, the proxy's header bound to such a cookie (believed only from
``desk.trusted_proxies``, :mod:`service.desk.auth.proxies`). Every state-changing request
carries the session's CSRF token (``X-CSRF-Token`` header or ``csrf`` form field) and, when
the browser sends one, an ``Origin`` of this very host; anything else is refused before it
reaches the desk. ``labelled_by`` is always the signed-in name.

Passwords are checked off the event loop and login attempts are throttled per account and
per client address (:mod:`service.desk.auth.logins`: ``429`` with ``Retry-After``). Logging out
revokes the session on every replica (a record on the revocations topic). Until the desk
has read its topics (the revocations among them) its pages answer ``503`` with a page that
reloads itself, and the API ``503 loading``. A body that is not what the route takes is a
``4xx``, never a ``5xx``.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Final, Protocol

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from service.config import Settings
from service.desk.auth.accounts import Accounts, Person, valid_name
from service.desk.auth.logins import LoginGate
from service.desk.auth.proxies import PROXIED, Proxies
from service.desk.auth.sessions import Session, Sessions
from service.desk.changes import Changes
from service.desk.core import Desk
from service.desk.errors import Refused, Unavailable
from service.desk.http import form as read_form
from service.desk.http import html, json_error, redirect, request_id_of
from service.desk.pages import labelling_page, login_page, starting_page, team_page
from service.desk.present import present
from service.desk.review.pages import agreement_section
from service.desk.review.routes import ReviewRoutes

__all__ = ["DeskWeb", "RevocationLog", "SESSION_COOKIE"]

SESSION_COOKIE: Final = "abstain_desk"
LOGIN_COOKIE: Final = "abstain_desk_login"
_CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
_STATIC: Final = {
    "desk.js": "text/javascript",
    "review.js": "text/javascript",
    "desk.css": "text/css",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", _CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


class RevocationLog(Protocol):
    """The revocations topic: returns once Kafka acknowledged the record (acks=all), or
    raises :class:`~service.desk.errors.Unavailable`."""

    async def publish(self, value: bytes, sid: str) -> None: ...


class DeskWeb:
    """Routes and handlers; ``models`` gives served models (the top features, the team view's
    learning rows), ``logins`` checks passwords (a
    :class:`~service.desk.auth.logins.LoginGate` of ``accounts`` by default), ``revocations``
    tells every replica of a logout (this one only when None)."""

    def __init__(
        self,
        settings: Settings,
        desk: Desk,
        accounts: Accounts,
        sessions: Sessions,
        *,
        models: Callable[[], dict[str, Any]] | None = None,
        logins: LoginGate | None = None,
        revocations: RevocationLog | None = None,
    ) -> None:
        self.settings, self.desk, self.accounts, self.sessions = settings, desk, accounts, sessions
        self.models = models or dict
        self.changes = Changes()  # each model's learning, reread when its snapshot changes
        self.logins = logins or LoginGate(accounts, clock=sessions.clock)
        self.revocations = revocations
        self.proxies = Proxies(settings.desk.trusted_proxies)

    def app(self) -> web.Application:
        proxies = self.proxies

        @web.middleware
        async def forwarded(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await handler(proxies.resolve(request))

        app = web.Application(middlewares=[forwarded, _headers], client_max_size=64 * 1024)
        r = app.router
        r.add_get("/login", self.get_login)
        r.add_post("/login", self.post_login)
        r.add_post("/logout", self.post_logout)
        r.add_get("/", self.get_desk)
        r.add_get("/team", self.get_team)
        r.add_get("/static/{name}", self.get_static)
        r.add_post("/api/next", self.api_next)
        r.add_post("/api/renew", self.api_renew)
        r.add_post("/api/answer", self.api_answer)
        r.add_post("/api/skip", self.api_skip)
        r.add_get("/metrics", self.get_metrics)
        r.add_get("/healthz", self.get_health)
        r.add_get("/readyz", self.get_ready)
        desk = self.desk
        if desk.review is not None and desk.opinions is not None:
            ReviewRoutes(
                self.settings,
                desk.review,
                desk.opinions,
                api_person=self.api_person,
                page=self.page,
                models=self.models,
            ).add(r)
        return app

    # --- who is asking ------------------------------------------------------------------

    def _cookie(
        self,
        response: web.StreamResponse,
        name: str,
        value: str,
        request: web.Request,
        max_age: float,
    ) -> None:
        secure = self.settings.desk.secure_cookie or request.secure
        response.set_cookie(
            name,
            value,
            httponly=True,
            samesite="Strict",
            secure=secure,
            path="/",
            max_age=int(max_age),
        )

    def _proxy_user(self, request: web.Request) -> str:
        """With ``auth = proxy``, the name the proxy vouches for: only from a trusted proxy
        (empty otherwise)."""
        if not request.get(PROXIED):
            return ""
        return request.headers.get(self.settings.desk.proxy_header, "").strip()

    def _identify(self, request: web.Request) -> tuple[Person, Session] | None:
        session = self.sessions.read(request.cookies.get(SESSION_COOKIE))
        if self.settings.desk.auth == "proxy":
            name = self._proxy_user(request)
            if not valid_name(name) or session is None or session.user != name:
                return None
            return self.accounts.proxied(name).with_role(self.settings.desk.reviewers), session
        if session is None:
            return None
        person = self._person(session.user)
        return None if person is None else (person, session)

    def _person(self, name: str) -> Person | None:
        """The users file's person (its scope and role), a reviewer too if
        ``desk.reviewers`` names them; None if the file does not list ``name``."""
        person = self.accounts.person(name)
        return None if person is None else person.with_role(self.settings.desk.reviewers)

    def _page_identity(self, request: web.Request) -> tuple[Person, Session, str | None]:
        """The person of a page view; behind a proxy a session is started on the first view
        (its cookie value returned). Raises a redirect to the login page otherwise, and a
        ``503`` page while the desk reads its topics (a session revoked on another replica
        is known only once they are read)."""
        if not self.desk.ready:
            raise web.HTTPServiceUnavailable(
                text=starting_page(), content_type="text/html", headers={"Retry-After": "2"}
            )
        found = self._identify(request)
        if found is not None:
            return found[0], found[1], None
        name = self._proxy_user(request)
        if self.settings.desk.auth == "proxy" and valid_name(name):
            cookie = self.sessions.issue(name)
            session = self.sessions.read(cookie)
            assert session is not None  # noqa: S101 - just issued
            person = self.accounts.proxied(name).with_role(self.settings.desk.reviewers)
            return person, session, cookie
        if self.settings.desk.auth == "proxy":
            raise web.HTTPUnauthorized(text="the proxy sent no user")
        raise web.HTTPSeeOther("/login")

    def _same_origin(self, request: web.Request) -> bool:
        """No ``Origin`` (not a browser, or a same-origin GET) or this very host."""
        origin = request.headers.get("Origin")
        return origin is None or origin.split("://", 1)[-1] == request.host

    async def api_person(self, request: web.Request) -> tuple[Person, dict[str, Any]]:
        """The person of an API call and its JSON body; 401/403/400 otherwise (503 while
        the desk reads its topics)."""
        if not self.desk.ready:
            self.desk.metrics.refusals.labels(code="loading").inc()
            raise json_error(503, "loading", "the desk is still reading the topics; try again")
        found = self._identify(request)
        if found is None:
            raise json_error(401, "login", "log in first")
        person, session = found
        token = request.headers.get("X-CSRF-Token")
        if not self._same_origin(request) or not self.sessions.csrf_ok(session, token):
            raise json_error(403, "csrf", "missing or wrong CSRF token")
        try:  # orjson: a body nested deeper than 1024 levels is an error, not a recursion
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise json_error(400, "bad_json", "the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise json_error(400, "bad_json", "the body must be a JSON object")
        return person, body

    # --- pages ----------------------------------------------------------------------------

    async def get_login(self, request: web.Request) -> web.StreamResponse:
        if self.settings.desk.auth == "proxy":
            raise web.HTTPSeeOther("/")
        nonce = secrets.token_urlsafe(16)
        response = html(login_page(self.sessions.login_token(nonce)))
        self._cookie(response, LOGIN_COOKIE, nonce, request, 3600)
        return response

    async def post_login(self, request: web.Request) -> web.StreamResponse:
        if self.settings.desk.auth == "proxy":
            raise web.HTTPNotFound()
        form = await read_form(request)
        user, password = str(form.get("user", ""))[:256], str(form.get("password", ""))[:1024]
        nonce = request.cookies.get(LOGIN_COOKIE)
        if not self._same_origin(request) or not self.sessions.login_ok(
            nonce, str(form.get("token", ""))
        ):
            self.desk.metrics.logins.labels(outcome="failed").inc()
            await self.logins.pause(self.logins.refusal_delay)  # refused slowly, like a guess
            return await self._login_again(
                request, "The form expired: please log in again.", user, 403
            )
        result = await self.logins.attempt(user, password, request.remote)
        self.desk.metrics.logins.labels(outcome=result.outcome).inc()
        if result.outcome in ("throttled", "busy"):
            wait = int(result.retry_after)
            why = (
                "Too many login attempts for this account or from your address"
                if result.outcome == "throttled"
                else "The desk is checking many logins"
            )
            response = await self._login_again(
                request, f"{why}: try again in {_seconds(wait)}.", user, 429
            )
            response.headers["Retry-After"] = str(wait)
            return response
        if result.person is None:
            return await self._login_again(request, "Wrong user name or password.", user, 401)
        response = redirect("/")
        self._cookie(
            response,
            SESSION_COOKIE,
            self.sessions.issue(result.person.name),
            request,
            self.settings.desk.session_seconds,
        )
        response.del_cookie(LOGIN_COOKIE, path="/")
        return response

    async def _login_again(
        self, request: web.Request, error: str, user: str, status: int
    ) -> web.StreamResponse:
        nonce = secrets.token_urlsafe(16)
        response = html(
            login_page(self.sessions.login_token(nonce), error=error, user=user), status=status
        )
        self._cookie(response, LOGIN_COOKIE, nonce, request, 3600)
        return response

    async def post_logout(self, request: web.Request) -> web.StreamResponse:
        found = self._identify(request)
        form = await read_form(request)
        if found is None:
            raise web.HTTPSeeOther("/login")
        if not self._same_origin(request) or not self.sessions.csrf_ok(
            found[1], str(form.get("csrf", ""))
        ):
            raise web.HTTPForbidden(text="missing or wrong CSRF token")
        record = self.sessions.revoke(found[1])
        try:
            if self.revocations is not None:
                await self.revocations.publish(record, found[1].sid)
        except Unavailable:
            # logged out here and in this browser; the other replicas were not told
            response = await self._login_again(
                request,
                "You are logged out of this browser, but Kafka did not confirm the "
                "logout to the other desk replicas: log in and out again when it is back.",
                "",
                503,
            )
        else:
            response = redirect("/login")
        response.del_cookie(SESSION_COOKIE, path="/")
        return response

    async def page(
        self, request: web.Request, build: Callable[[Person, str], web.Response]
    ) -> web.StreamResponse:
        """A page for the person asking: ``build(person, csrf token)`` (behind a proxy, with
        the session's cookie on the first view)."""
        person, session, cookie = self._page_identity(request)
        return self._with_session(build(person, self.sessions.csrf(session)), request, cookie)

    async def get_desk(self, request: web.Request) -> web.StreamResponse:
        def build(person: Person, csrf: str) -> web.Response:
            models = [m for m in self.settings.models if person.may_answer(m)]
            return html(
                labelling_page(
                    person.name,
                    csrf,
                    models,
                    self.settings.desk.lease_seconds,
                    reviewer=person.reviewer,
                )
            )

        return await self.page(request, build)

    async def get_team(self, request: web.Request) -> web.StreamResponse:
        # as of the desk's last tick (once a second): a refresh costs the same whatever the
        # number of open requests
        def build(person: Person, csrf: str) -> web.Response:
            team = self.desk.team_view()
            agreement = self.desk.agreement_view()
            section = (
                ""
                if agreement is None
                else agreement_section(
                    agreement,
                    {p.person: p.median_answer_seconds for p in team.people},
                    {row.model: row for row in team.models},
                )
            )
            served = self.models()
            return html(
                team_page(
                    person.name,
                    csrf,
                    team,
                    self.changes.rows(served),
                    reviewer=person.reviewer,
                    agreement=section,
                    waiting=self.desk.waiting.counts(served),
                )
            )

        return await self.page(request, build)

    def _with_session(
        self, response: web.StreamResponse, request: web.Request, cookie: str | None
    ) -> web.StreamResponse:
        if cookie is not None:
            self._cookie(
                response, SESSION_COOKIE, cookie, request, self.settings.desk.session_seconds
            )
        return response

    async def get_static(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in _STATIC:
            raise web.HTTPNotFound()
        body = resources.files("service.desk").joinpath("static", name).read_bytes()
        response = web.Response(body=body, content_type=_STATIC[name])
        response.headers["Cache-Control"] = "no-cache"
        return response

    # --- the JSON API ---------------------------------------------------------------------

    async def api_next(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        model = body.get("model")
        if model is not None and (not isinstance(model, str) or model not in self.settings.models):
            raise json_error(400, "bad_model", "no such model")
        claimed = await self._refusing(self.desk.next(person, model))
        if claimed is None:
            return web.json_response({"request": None})
        req = claimed.request
        view = present(
            req,
            self.settings.models[req.model],
            self.models().get(req.model),
            now=time.time(),
            lease_expires_at=claimed.lease_expires_at,
            names=self.settings.desk.answer_names.get(req.model),
        )
        view["second_opinion"] = claimed.opinion  # (and never the first answer)
        if claimed.until is not None and math.isfinite(claimed.until):
            view["expires_at"] = claimed.until  # the time left is the model's reach
        return web.json_response({"request": view})

    async def api_renew(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        until = await self._refusing(self.desk.renew(person, request_id_of(body)))
        return web.json_response({"lease_expires_at": until})

    async def api_answer(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        value = body.get("label")
        if isinstance(value, bool) or value not in (1, -1):
            raise json_error(400, "bad_answer", "label must be 1 or -1")
        label = await self._refusing(self.desk.answer(person, request_id_of(body), int(value)))
        saved = {"request_id": label.request_id, "label": label.label, "by": label.labelled_by}
        return web.json_response({"saved": True, **saved})

    async def api_skip(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        why = body.get("why", "skip")
        if why not in ("skip", "cant_tell"):
            raise json_error(400, "bad_reason", "why must be skip or cant_tell")
        await self._refusing(self.desk.give_back(person, request_id_of(body), why))
        return web.json_response({"given_back": True})

    async def _refusing(self, action: Awaitable[Any]) -> Any:
        try:
            return await action
        except Refused as refused:
            self.desk.metrics.refusals.labels(code=refused.code).inc()
            raise json_error(refused.status, refused.code, str(refused)) from None
        except Unavailable:
            raise json_error(
                503, "unavailable", "Kafka did not acknowledge in time; nothing was saved."
            ) from None

    # --- operations -----------------------------------------------------------------------

    async def get_metrics(self, request: web.Request) -> web.StreamResponse:
        body = generate_latest(self.desk.metrics.registry)
        response = web.Response(body=body)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def get_health(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"live": True})

    async def get_ready(self, request: web.Request) -> web.StreamResponse:
        ready = self.desk.ready
        return web.json_response(
            {"ready": ready, "open": len(self.desk.queue.requests)}, status=200 if ready else 503
        )


def _seconds(n: int) -> str:
    """``n`` seconds in words (``1 second``, ``45 seconds``, ``2 minutes``)."""
    if n >= 120:
        return f"{round(n / 60)} minutes"
    return "1 second" if n == 1 else f"{n} seconds"
