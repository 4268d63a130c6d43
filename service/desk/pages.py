"""Server-rendered pages of the desk. Every value is escaped; no inline script or style
(the Content-Security-Policy allows the desk's own files only)."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping

from service.desk.changes import ChangeRow
from service.desk.team import TeamStats

__all__ = [
    "age",
    "esc",
    "frame",
    "header",
    "labelling_page",
    "login_page",
    "starting_page",
    "team_page",
]


def esc(value: object) -> str:
    """``value`` as HTML text (quotes too)."""
    return html.escape(str(value), quote=True)


def frame(title: str, body: str, *, csrf: str = "", refresh: int | None = None) -> str:
    """A whole page: ``body`` in the desk's frame (its stylesheet, no inline script)."""
    meta = f'<meta name="csrf-token" content="{esc(csrf)}">' if csrf else ""
    if refresh:
        meta += f'<meta http-equiv="refresh" content="{refresh}">'
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · abstain label desk</title>{meta}
<link rel="stylesheet" href="/static/desk.css"></head>
<body>{body}</body></html>"""


def header(user: str, csrf: str, current: str, *, reviewer: bool = False) -> str:
    """The bar at the top: the pages (Review for reviewers), who is signed in, log out."""
    links = [("/", "Label"), ("/team", "Team"), *([("/review", "Review")] if reviewer else [])]
    nav = " ".join(
        f'<a href="{href}"{" aria-current=page" if href == current else ""}>{name}</a>'
        for href, name in links
    )
    return f"""<header class="bar"><span class="brand">abstain label desk</span>
<nav aria-label="Desk">{nav}</nav>
<form method="post" action="/logout" class="logout"><span class="who">Signed in as
<strong id="who">{esc(user)}</strong></span>
<input type="hidden" name="csrf" value="{esc(csrf)}">
<button type="submit">Log out</button></form></header>"""


def login_page(token: str, *, error: str = "", user: str = "") -> str:
    """The login form (``token``: the pre-login CSRF token)."""
    alert = f'<p class="error" role="alert">{esc(error)}</p>' if error else ""
    # the cursor where typing goes on: the password once the name is filled in
    first, then = ("", " autofocus") if user else (" autofocus", "")
    body = f"""<main class="login"><h1>abstain label desk</h1>{alert}
<form method="post" action="/login">
<input type="hidden" name="token" value="{esc(token)}">
<label for="user">User name</label>
<input id="user" name="user" autocomplete="username" required value="{esc(user)}"{first}>
<label for="password">Password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required
{then}>
<button type="submit">Log in</button></form></main>"""
    return frame("Log in", body)


def starting_page() -> str:
    """What a page shows while the desk reads its topics (it reloads itself)."""
    body = """<main class="login"><h1>abstain label desk</h1>
<p role="status">The desk is starting: it is reading its topics. This page reloads in a
moment.</p></main>"""
    return frame("Starting", body, refresh=3)


def labelling_page(
    user: str, csrf: str, models: Iterable[str], lease_seconds: float, *, reviewer: bool = False
) -> str:
    """The labelling view and the person's recent answers; ``desk.js`` fills them from the
    JSON API."""
    options = "".join(f'<option value="{esc(m)}">{esc(m)}</option>' for m in models)
    body = f"""{header(user, csrf, "/", reviewer=reviewer)}
<main id="desk" data-lease="{lease_seconds:g}">
<div class="filter"><label for="model">Model</label>
<select id="model"><option value="">all models</option>{options}</select></div>
<p id="status" role="status" aria-live="polite">Loading…</p>
<section id="card" hidden aria-labelledby="card-title">
<p id="mode" class="mode" hidden></p>
<h1 id="card-title">Request <code id="rid"></code></h1>
<dl class="facts">
<div><dt>Model</dt><dd id="f-model"></dd></div>
<div><dt>Model's decision</dt><dd id="f-decision"></dd></div>
<div><dt>Score f(x)</dt><dd id="f-score"></dd></div>
<div><dt>Reject threshold ρ</dt><dd id="f-rho"></dd></div>
<div><dt>Query probability</dt><dd id="f-qp"></dd></div>
<div><dt>Time left</dt><dd id="f-left"></dd></div>
</dl>
<div class="columns">
<table id="features"><caption>Features</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Value</th></tr></thead><tbody></tbody>
</table>
<table id="top" hidden><caption>Weighing most in the score (w·x)</caption>
<thead><tr><th scope="col">Feature</th><th scope="col">Contribution</th></tr></thead>
<tbody></tbody></table>
</div>
<div class="answers" role="group" aria-label="Answer">
<button id="a-pos" class="pos" data-answer="1"><kbd>1</kbd> <span></span></button>
<button id="a-neg" class="neg" data-answer="-1"><kbd>2</kbd> <span></span></button>
<button id="a-skip" data-skip="skip"><kbd>S</kbd> Skip</button>
<button id="a-cant" data-skip="cant_tell"><kbd>C</kbd> Can't tell</button>
</div>
<p class="keys" id="keys">Keyboard: <kbd>1</kbd> first answer · <kbd>2</kbd> second answer ·
<kbd>S</kbd> skip · <kbd>C</kbd> can't tell · <kbd>U</kbd> undo your last answer ·
<kbd>R</kbd> reload the queue</p>
</section>
<section id="mine" aria-labelledby="mine-title">
<h2 id="mine-title">My recent answers</h2>
<p class="muted" id="mine-note">You can undo or change an answer for a while after giving it;
then ask for a review if you think it was wrong.</p>
<table id="mine-list"><thead><tr><th scope="col">Request</th><th scope="col">Model</th>
<th scope="col">Answer</th><th scope="col">What happened</th><th scope="col">Actions</th></tr>
</thead><tbody><tr><td colspan="5" class="muted">No answers yet.</td></tr></tbody></table>
</section></main>
<script src="/static/desk.js"></script>"""
    return frame("Label", body, csrf=csrf)


def age(seconds: float | None) -> str:
    """A duration in words: ``4.2 s``, ``45 s``, ``3.5 min``, ``—`` for none."""
    if seconds is None:
        return "—"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


def _count(n: int, one: str) -> str:
    return f"{n:,} {one}" if n == 1 else f"{n:,} {one}s"


RELEARNING = '<span class="mark">Relearning</span>'


def _learning_row(model: str, row: ChangeRow | None) -> str:
    """One model's learning: state, last change, risk since, changes, takeovers, version."""
    if row is None:
        dashes = "<td>—</td>" * 5
        return (
            f'<tr class="fixed"><th scope=row>{esc(model)}</th>'
            f'<td class="muted">no change detection</td>{dashes}</tr>'
        )
    if row.relearning:
        state, css = RELEARNING, ' class="relearning"'
    else:
        state, css = ("Steady" if row.detects else "detection off"), ""
    last, risk = "none yet", "—"
    if row.since is not None:
        at = f"<span class=muted>(at label {row.last_change:,})</span>"
        last = f"{_count(row.since, 'label')} ago {at}"
    if row.risk is not None:
        risk = f"{row.risk:.3f} <span class=muted>over {_count(row.risk_labels, 'label')}</span>"
    return (
        f"<tr{css}><th scope=row>{esc(model)}</th><td>{state}</td><td>{last}</td>"
        f"<td>{risk}</td><td>{row.changes:,}</td><td>{row.takeovers:,}</td>"
        f"<td>{row.version:,}</td></tr>"
    )


def _waiting(waiting: Mapping[str, int]) -> str:
    """The note on the corrections the learner has not applied yet (it applies those that
    wait together, once it has derived them)."""
    if not waiting:
        return ""
    which = ", ".join(f"<strong>{esc(m)}</strong> {n:,}" for m, n in sorted(waiting.items()))
    return (
        f'<p class="corrections-note" role="status">Corrections queued, not yet in the '
        f"model: {which}. The learner applies them together; answers go on as "
        "usual.</p>"
    )


def _learning(models: Iterable[str], changes: Mapping[str, ChangeRow]) -> tuple[str, str]:
    """The note on the models relearning now, and the learning table."""
    names = list(models)
    hot = [m for m in names if (r := changes.get(m)) is not None and r.relearning]
    note = ""
    if hot:
        which = ", ".join(f"<strong>{esc(m)}</strong>" for m in hot)
        one = len(hot) == 1
        note = (
            f'<p class="relearning-note" role="status">{RELEARNING} {which}: '
            f"{'its' if one else 'their'} labels changed recently and "
            f"{'it is' if one else 'they are'} learning the new pattern; answers for "
            f"{'it' if one else 'them'} count more than usual now.</p>"
        )
    rows = "".join(_learning_row(m, changes.get(m)) for m in names)
    table = f"""<table id="learning"><caption>Learning per model</caption>
<thead><tr><th scope="col">Model</th><th scope="col">State</th>
<th scope="col">Last detected change</th><th scope="col">Risk since change or takeover</th>
<th scope="col">Changes</th><th scope="col">Takeovers</th><th scope="col">Version</th></tr>
</thead><tbody>{rows}</tbody></table>"""
    return note, table


def team_page(
    user: str,
    csrf: str,
    stats: TeamStats,
    changes: Mapping[str, ChangeRow] | None = None,
    *,
    reviewer: bool = False,
    agreement: str = "",
    waiting: Mapping[str, int] | None = None,
) -> str:
    """Open requests per model, how each model learns (:mod:`service.desk.changes`: a model
    relearning after a detected change is marked; corrections written that the model does
    not hold yet, ``waiting``), answers per hour, people, and the ``agreement`` section
    (:mod:`service.desk.review.pages`: HTML, already escaped) (refreshes every 15 s)."""
    changes = changes or {}
    note, learning = _learning([r.model for r in stats.models], changes)
    note += _waiting(waiting or {})

    def name(model: str) -> str:
        row = changes.get(model)
        mark = f" {RELEARNING}" if row is not None and row.relearning else ""
        return f"{esc(model)}{mark}"

    models = "".join(
        f"<tr><th scope=row>{name(r.model)}</th><td>{r.open}</td><td>{r.held}</td>"
        f"<td>{age(r.oldest_age)}</td><td>{r.answers_last_hour}</td>"
        f"<td>{r.expired_last_hour}</td></tr>"
        for r in stats.models
    )
    people = (
        "".join(
            f"<tr><th scope=row>{esc(p.person)}</th><td>{p.answers_last_hour}</td>"
            f"<td>{p.answers_last_day}</td><td>{age(p.median_answer_seconds)}</td></tr>"
            for p in stats.people
        )
        or '<tr><td colspan="4">No answers in the last day.</td></tr>'
    )
    body = f"""{header(user, csrf, "/team", reviewer=reviewer)}
<main class="team"><h1>Team</h1>
<p class="summary"><strong id="answers-hour">{stats.answers_last_hour}</strong> answers in the
last hour</p>{note}
<table id="models"><caption>Requests per model</caption>
<thead><tr><th scope="col">Model</th><th scope="col">Open</th><th scope="col">Being answered</th>
<th scope="col">Oldest open</th><th scope="col">Answers, last hour</th>
<th scope="col">Expired, last hour</th></tr></thead><tbody>{models}</tbody></table>
{learning}
<table id="people"><caption>People</caption>
<thead><tr><th scope="col">Person</th><th scope="col">Answers, last hour</th>
<th scope="col">Answers, last day</th><th scope="col">Median time to answer</th></tr></thead>
<tbody>{people}</tbody></table>
{agreement}</main>"""
    return frame("Team", body, csrf=csrf, refresh=15)
