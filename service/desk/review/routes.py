"""The HTTP side of answers after they are given (added to :class:`service.desk.web.DeskWeb`'s
application): the review page, and the JSON API the labelling view and the review page call.

Every call needs a person, the session's CSRF token and a JSON object body, as every other
API call of the desk (:meth:`service.desk.web.DeskWeb.api_person`); a refusal is a ``4xx``
with a stable code and a message, and writes nothing.

======================  ===========================================================
``POST /api/mine``      the person's recent answers (:meth:`.Review.mine`)
``POST /api/undo``      withdraw an answer of theirs; the request's view comes back
``POST /api/correct``   ``{request_id, label}``: change it, or answer again after an undo
``POST /api/again``     the view of a withdrawn answer of theirs, to answer it again
``POST /api/flag``      ask a reviewer to look at an answer of theirs
``POST /api/opinion``   ``{request_id, label}``: a second opinion (never one's own answer)
``POST /api/opinion/skip``, ``/api/opinion/renew``  as for requests
``POST /api/review``    ``{request_id, label}``: a reviewer's final answer
``GET /review``         the review page (reviewers): the queue, one answer, a finder
======================  ===========================================================
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from service.config import Settings
from service.desk.auth.accounts import Person
from service.desk.errors import Refused, Unavailable
from service.desk.http import answer_of, html, json_error, request_id_of
from service.desk.present import present
from service.desk.review.actions import Review
from service.desk.review.item import Item
from service.desk.review.opinions import Opinions
from service.desk.review.pages import Found, not_a_reviewer_page, review_page

__all__ = ["ReviewRoutes"]

ApiPerson = Callable[[web.Request], Awaitable[tuple[Person, dict[str, Any]]]]
Build = Callable[[Person, str], web.Response]  # (person, csrf token) -> the page
Page = Callable[[web.Request, Build], Awaitable[web.StreamResponse]]
_FOUND = 50


class ReviewRoutes:
    """The routes (module docstring) over one :class:`.Review`; ``api_person`` and
    ``page`` are the desk's (who is asking, checked as for every other call; a page built
    for them), ``models`` the snapshots the desk follows (for the request's view)."""

    def __init__(
        self,
        settings: Settings,
        review: Review,
        opinions: Opinions,
        *,
        api_person: ApiPerson,
        page: Page,
        models: Callable[[], dict[str, Any]],
    ) -> None:
        self.settings, self.review, self.opinions = settings, review, opinions
        self.api_person, self.page, self.models = api_person, page, models

    def add(self, router: web.UrlDispatcher) -> None:
        router.add_get("/review", self.get_review)
        for path, handler in (
            ("/api/mine", self.api_mine),
            ("/api/undo", self.api_undo),
            ("/api/correct", self.api_correct),
            ("/api/again", self.api_again),
            ("/api/flag", self.api_flag),
            ("/api/opinion", self.api_opinion),
            ("/api/opinion/skip", self.api_opinion_skip),
            ("/api/opinion/renew", self.api_opinion_renew),
            ("/api/review", self.api_review),
        ):
            router.add_post(path, handler)

    async def _refusing(self, action: Awaitable[Any]) -> Any:
        try:
            return await action
        except Refused as refused:
            self.review.metrics.refusals.labels(code=refused.code).inc()
            raise json_error(refused.status, refused.code, str(refused)) from None
        except (Unavailable, TimeoutError):
            raise json_error(
                503, "unavailable", "Kafka did not acknowledge in time; nothing was saved."
            ) from None

    def _view(self, item: Item, lease_expires_at: float | None = None) -> dict[str, Any]:
        """The labelling view of an answer's request (the card), without the answer."""
        request = item.request
        assert request is not None  # noqa: S101 - only answers joined with their request
        return present(
            request,
            self.settings.models[request.model],
            self.models().get(request.model),
            now=time.time(),
            lease_expires_at=lease_expires_at or 0.0,
            names=self.settings.desk.answer_names.get(request.model),
        )

    # --- the author -------------------------------------------------------------------

    async def api_mine(self, request: web.Request) -> web.StreamResponse:
        person, _ = await self.api_person(request)
        return web.json_response(
            {"answers": self.review.mine(person), "undo_seconds": self.settings.desk.undo_seconds}
        )

    async def api_undo(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        item = await self._refusing(self.review.correct(person, request_id_of(body), None))
        return web.json_response({"withdrawn": True, "request": self._view(item)})

    async def api_correct(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        rid, value = request_id_of(body), answer_of(body)
        item = await self._refusing(self.review.correct(person, rid, value))
        return web.json_response({"saved": True, "request_id": rid, "label": item.current})

    async def api_again(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        rid = request_id_of(body)
        item = await self._refusing(self._withdrawn(person, rid))
        return web.json_response({"request": self._view(item)})

    async def _withdrawn(self, person: Person, rid: str) -> Item:
        """``person``'s own withdrawn answer ``rid`` that they may still answer again."""
        item = self.review.book.items.get(rid)
        if item is None or item.request is None or item.by != person.name:
            raise Refused(404, "unknown_request", "no withdrawn answer of yours to this request")
        if item.current is not None:
            raise Refused(409, "unchanged", "this answer is not withdrawn")
        if self.review.clock() >= self.review.grace_until(item):
            raise Refused(409, "grace_over", "the time to answer this request again is over")
        self.review.require_reach(item)
        return item

    async def api_flag(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        await self._refusing(self.review.ask_review(person, request_id_of(body)))
        return web.json_response({"flagged": True})

    # --- second opinions --------------------------------------------------------------

    async def api_opinion(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        rid, value = request_id_of(body), answer_of(body)
        _, can_change = await self._refusing(self.opinions.answer(person, rid, value))
        # never the first answer, nor whether this one agreed with it
        return web.json_response({"saved": True, "request_id": rid, "can_change": can_change})

    async def api_opinion_skip(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        why = body.get("why", "skip")
        if why not in ("skip", "cant_tell"):
            raise json_error(400, "bad_reason", "why must be skip or cant_tell")
        await self._refusing(self.opinions.give_back(person, request_id_of(body), why))
        return web.json_response({"given_back": True})

    async def api_opinion_renew(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        until = await self._refusing(self.opinions.renew(person, request_id_of(body)))
        return web.json_response({"lease_expires_at": until})

    # --- reviewers --------------------------------------------------------------------

    async def api_review(self, request: web.Request) -> web.StreamResponse:
        person, body = await self.api_person(request)
        rid, value = request_id_of(body), answer_of(body)
        outcome = await self._refusing(self.review.decide(person, rid, value))
        return web.json_response({"decided": outcome, "request_id": rid})

    async def get_review(self, request: web.Request) -> web.StreamResponse:
        q = request.query
        who, model, rid = (q.get(k, "").strip()[:256] for k in ("person", "model", "request"))

        def build(person: Person, csrf: str) -> web.Response:
            if not person.reviewer:
                return html(not_a_reviewer_page(person.name, csrf), status=403)
            found = Found(self.review.review_queue(person), self._find(who, model, rid))
            opened = self.review.book.items.get(q.get("item", ""))
            if opened is not None and opened.request is not None:
                found.item, found.note = opened, self._note(person, opened)
            return html(
                review_page(
                    person.name,
                    csrf,
                    self.settings,
                    found,
                    now=time.time(),
                    person=who,
                    model=model,
                    request=rid,
                )
            )

        return await self.page(request, build)

    def _note(self, person: Person, item: Item) -> str:
        """Why ``person`` cannot decide ``item`` (empty: they can)."""
        if person.name in (item.by, item.opinion_by):
            return "You answered this request yourself: another reviewer decides it."
        if item.decision is not None:
            return f"Decided by {item.decision.by}: final."
        if not self.review.reachable(item):
            return "Too old to correct: the model can no longer reach this label."
        if not person.may_answer(item.model):
            return f"You do not answer for model {item.model}."
        return ""

    def _find(self, person: str, model: str, rid: str) -> list[Item] | None:
        """Recent answers by ``person`` and / or of ``model``, or the one with id (prefix)
        ``rid``; None when nothing was asked."""
        book = self.review.book
        if rid:
            item = book.items.get(rid) or book.items.get(book.short.get(rid[:12], ""))
            return [item] if item is not None and item.request is not None else []
        if not person and not model:
            return None
        ids = book.recent.get(person, ()) if person else book.by_model.get(model, ())
        out = []
        for i in reversed(ids):
            item = book.items.get(i)
            if item is None or item.request is None:
                continue
            if (not model or item.model == model) and (not person or item.by == person):
                out.append(item)
                if len(out) >= _FOUND:
                    break
        return out
