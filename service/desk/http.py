"""Small pieces of the desk's HTTP side shared by its routes (:mod:`service.desk.web`,
:mod:`service.desk.review.routes`): JSON errors with a stable code, the fields every API body
carries, HTML and redirect responses, form bodies.

>>> json_error(409, "unchanged", 'that is "it"').text
'{"error": "unchanged", "message": "that is \\\\"it\\\\""}'
>>> answer_of({"label": True})
Traceback (most recent call last):
...
aiohttp.web_exceptions.HTTPBadRequest: Bad Request
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from multidict import MultiDictProxy

__all__ = ["answer_of", "form", "html", "json_error", "redirect", "request_id_of"]


def json_error(status: int, code: str, message: str) -> web.HTTPException:
    """An HTTP error whose body is ``{"error": code, "message": message}``."""
    classes: dict[int, type[web.HTTPException]] = {
        400: web.HTTPBadRequest,
        401: web.HTTPUnauthorized,
        403: web.HTTPForbidden,
        404: web.HTTPNotFound,
        409: web.HTTPConflict,
        410: web.HTTPGone,
        429: web.HTTPTooManyRequests,
        503: web.HTTPServiceUnavailable,
    }
    cls = classes.get(status, web.HTTPBadRequest)
    return cls(
        text=f'{{"error": "{code}", "message": {orjson.dumps(message).decode()}}}',
        content_type="application/json",
    )


def request_id_of(body: dict[str, Any]) -> str:
    """The body's ``request_id``: a short string (400 ``bad_request_id`` otherwise)."""
    rid = body.get("request_id")
    if not isinstance(rid, str) or not 0 < len(rid) <= 256:
        raise json_error(400, "bad_request_id", "request_id must be a short string")
    return rid


def answer_of(body: dict[str, Any]) -> int:
    """The body's ``label``: exactly 1 or -1 (400 ``bad_answer`` otherwise)."""
    value = body.get("label")
    if isinstance(value, bool) or value not in (1, -1):
        raise json_error(400, "bad_answer", "label must be 1 or -1")
    return int(value)


async def form(request: web.Request) -> MultiDictProxy[str | bytes | Any]:
    """The fields of a form post (``application/x-www-form-urlencoded``, what the pages
    send); 400 for anything else or a body that does not decode."""
    if request.content_type != "application/x-www-form-urlencoded":
        raise web.HTTPBadRequest(text="expected a form (application/x-www-form-urlencoded)")
    try:
        return await request.post()
    except ValueError:  # not UTF-8, or not a form
        raise web.HTTPBadRequest(text="the form does not decode") from None


def redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def html(page: str, *, status: int = 200) -> web.Response:
    return web.Response(text=page, content_type="text/html", charset="utf-8", status=status)
