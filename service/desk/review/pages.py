"""The review page and the team view's agreement section, rendered on the server (every
value escaped; no inline script or style: the charts are inline SVG drawn by
:func:`service.desk.charts.sparkline`, coloured by ``desk.css``).

>>> from service.desk.review.stats import ModelReview, PersonReview, ReviewStats
>>> stats = ReviewStats([PersonReview("ann", 10, 2, 4, 3, 1, 1)],
...                     [ModelReview("m", 10, 1, 2, 1)])
>>> "3 / 4" in agreement_section(stats, {}, {})
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from service.config import Settings
from service.desk.charts import BUCKET_SECONDS, BUCKETS, sparkline
from service.desk.pages import age, esc, frame, header
from service.desk.present import answer_names, feature_rows
from service.desk.review.item import Item
from service.desk.review.stats import ReviewStats
from service.desk.review.views import name_of, step_text
from service.desk.team import ModelRow

__all__ = ["Found", "agreement_section", "not_a_reviewer_page", "review_page"]

_HOURS = BUCKETS * BUCKET_SECONDS / 3600


def _ratio(part: int, whole: int) -> str:
    if not whole:
        return '<span class="muted">—</span>'
    return f"{part} / {whole} <span class=muted>({100 * part / whole:.0f} %)</span>"


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S UTC")


def _charts(row: ModelRow | None) -> str:
    if row is None or not row.depth:
        return "<td>—</td><td>—</td>"
    depth = sparkline(
        list(row.depth),
        label=f"open requests of {row.model}, last {_HOURS:g} hours (up to {max(row.depth):.0f})",
    )
    answers = sparkline(
        list(row.answered),
        label=f"answers to {row.model} per "
        f"{BUCKET_SECONDS / 60:g} minutes, last {_HOURS:g} hours (up to "
        f"{max(row.answered):.0f})",
    )
    return (
        f'<td class="chart">{depth}<span class="scale">now {row.depth[-1]:.0f}, '
        f"max {max(row.depth):.0f}</span></td>"
        f'<td class="chart answers">{answers}<span class="scale">max '
        f"{max(row.answered):.0f} per {BUCKET_SECONDS / 60:g} min</span></td>"
    )


def agreement_section(
    stats: ReviewStats, medians: Mapping[str, float | None], rows: Mapping[str, ModelRow]
) -> str:
    """Per person: answers, second opinions given, agreement with second opinions and with
    reviewers, median time to answer; per model: labels, the share later corrected, what
    waits for a second opinion and a reviewer, and the charts (``rows``: the team view's
    rows, with their series; ``medians``: person -> median claim-to-answer seconds)."""
    people = (
        "".join(
            f"<tr><th scope=row>{esc(p.person)}</th><td>{p.answers}</td><td>{p.opinions}</td>"
            f"<td>{_ratio(p.agreed, p.checked)}</td><td>{_ratio(p.confirmed, p.reviewed)}</td>"
            f"<td>{age(medians.get(p.person))}</td></tr>"
            for p in stats.people
        )
        or '<tr><td colspan="6">No answers in the last two days.</td></tr>'
    )
    models = "".join(
        f"<tr><th scope=row>{esc(m.model)}</th><td>{m.labels}</td>"
        f"<td>{_ratio(m.corrected, m.labels)}</td><td>{m.opinions_open}</td>"
        f"<td>{m.reviews_open}</td>{_charts(rows.get(m.model))}</tr>"
        for m in stats.models
    )
    return f"""<h2>Agreement</h2>
<table id="agreement"><caption>People, last two days: how often others agreed with their
answers</caption>
<thead><tr><th scope="col">Person</th><th scope="col">Answers</th>
<th scope="col">Second opinions given</th><th scope="col">Agreed with second opinions</th>
<th scope="col">Confirmed by reviewers</th><th scope="col">Median time to answer</th></tr>
</thead><tbody>{people}</tbody></table>
<table id="quality"><caption>Label quality per model, last two days; charts: the last
{_HOURS:g} hours</caption>
<thead><tr><th scope="col">Model</th><th scope="col">Labels</th>
<th scope="col">Later corrected</th><th scope="col">Waiting for a second opinion</th>
<th scope="col">Waiting for a reviewer</th><th scope="col">Open requests</th>
<th scope="col">Answers</th></tr></thead><tbody>{models}</tbody></table>"""


class Found:
    """What the review page lists: the queue, the answers found, and one answer opened."""

    def __init__(
        self,
        queue: Sequence[Item],
        found: Sequence[Item] | None = None,
        item: Item | None = None,
        note: str = "",
    ) -> None:
        self.queue, self.found, self.item, self.note = queue, found, item, note


def _answer(item: Item, names: dict[str, str]) -> str:
    first = f"{esc(name_of(item.first, names))} <span class=muted>by {esc(item.by)}</span>"
    if item.opinion is not None:
        second = (
            f"{esc(name_of(item.opinion.label, names))} <span class=muted>by "
            f"{esc(item.opinion.by)}</span>"
        )
    elif item.flag is not None:
        second = f'<span class="muted">{esc(item.by)} asked for a review</span>'
    else:
        second = '<span class="muted">—</span>'
    return f"<td>{first}</td><td>{second}</td><td>{esc(name_of(item.current, names))}</td>"


def _rows(items: Iterable[Item], settings: Settings, now: float, empty: str) -> str:
    out = []
    for item in items:
        names = answer_names(settings.desk.answer_names.get(item.model))
        link = f'<a href="/review?item={esc(item.request_id)}">{esc(item.request_id[:12])}</a>'
        out.append(
            f"<tr><th scope=row>{link}</th><td>{esc(item.model)}</td>"
            f"{_answer(item, names)}<td>{age(now - item.at)} ago</td></tr>"
        )
    return "".join(out) or f'<tr><td colspan="6">{esc(empty)}</td></tr>'


def _table(tid: str, caption: str, rows: str) -> str:
    return f"""<table id="{tid}"><caption>{caption}</caption>
<thead><tr><th scope="col">Request</th><th scope="col">Model</th>
<th scope="col">First answer</th><th scope="col">Second opinion</th>
<th scope="col">Now</th><th scope="col">Answered</th></tr></thead><tbody>{rows}</tbody></table>"""


def _detail(item: Item, settings: Settings, note: str) -> str:
    """One answer: the request as the labelling view shows it, what happened, the buttons."""
    names = answer_names(settings.desk.answer_names.get(item.model))
    request = item.request
    assert request is not None  # noqa: S101 - the page shows joined answers only
    features = "".join(
        f"<tr><th scope=row>{esc(n)}</th><td>"
        + (f"{v:.4f}" if isinstance(v, float) else esc(v))
        + "</td></tr>"
        for n, v in feature_rows(request, settings.models[item.model])
    )
    decided = {1: names["pos"], -1: names["neg"], 0: "reject"}[request.decided_label]
    steps = "".join(f"<li>{_when(s.at)}: {esc(step_text(s, names))}</li>" for s in item.steps)
    buttons = (
        f'<p class="note" role="note">{esc(note)}</p>'
        if note
        else f"""
<div class="answers" role="group" aria-label="Your decision">
<button class="pos" data-review="1"><kbd>1</kbd> {esc(names["pos"])}</button>
<button class="neg" data-review="-1"><kbd>2</kbd> {esc(names["neg"])}</button></div>
<p class="keys">Your answer is final: it replaces the label (or confirms it) for the model.
Keyboard: <kbd>1</kbd>, <kbd>2</kbd>.</p>"""
    )
    return f"""<section id="item" class="card" data-request="{esc(item.request_id)}"
aria-labelledby="item-title"><h2 id="item-title">Request <code>{esc(item.request_id[:12])}</code>
of {esc(item.model)}</h2>
<dl class="facts"><div><dt>Model's decision</dt><dd>{esc(decided)}</dd></div>
<div><dt>Score f(x)</dt><dd>{request.score:.4f}</dd></div>
<div><dt>Reject threshold ρ</dt><dd>{request.rho:.4f}</dd></div>
<div><dt>Query probability</dt><dd>{request.query_probability:.4f}</dd></div>
<div><dt>Label now</dt><dd id="item-now">{esc(name_of(item.current, names))}</dd></div></dl>
<div class="columns"><table id="item-features"><caption>Features</caption>
<thead><tr><th scope="col">Name</th><th scope="col">Value</th></tr></thead>
<tbody>{features}</tbody></table>
<div><h3>What happened</h3><ol id="item-steps">{steps}</ol></div></div>{buttons}</section>"""


def review_page(
    user: str,
    csrf: str,
    settings: Settings,
    found: Found,
    *,
    now: float,
    person: str = "",
    model: str = "",
    request: str = "",
) -> str:
    """The reviewer's page: the answer opened (if any), the queue of disagreements and
    requests for review, and a finder for any recent answer (by person, model or id)."""
    deciding = [m for m, cfg in settings.models.items() if cfg.champion is None]
    models = "".join(
        f'<option value="{esc(m)}"{" selected" if m == model else ""}>{esc(m)}</option>'
        for m in deciding
    )
    detail = "" if found.item is None else _detail(found.item, settings, found.note)
    results = ""
    if found.found is not None:
        results = _table(
            "found",
            "Answers found (newest first)",
            _rows(found.found, settings, now, "No recent answer matches."),
        )
    body = f"""{header(user, csrf, "/review", reviewer=True)}
<main class="review"><h1>Review</h1>
<p id="status" role="status" aria-live="polite"></p>{detail}
{
        _table(
            "queue",
            "Waiting for a reviewer: second opinions that differ, and answers their "
            "authors asked about (oldest first; not your own)",
            _rows(found.queue, settings, now, "Nothing waits for a reviewer."),
        )
    }
<form class="finder" method="get" action="/review"><h2>Find an answer</h2>
<label for="f-person">Answered by</label><input id="f-person" name="person" value="{esc(person)}">
<label for="f-model">Model</label><select id="f-model" name="model"><option value="">any</option>
{models}</select>
<label for="f-request">Request id</label><input id="f-request" name="request" value="{esc(request)}"
placeholder="the first 12 characters will do"><button type="submit">Find</button></form>
{results}</main>
<script src="/static/review.js"></script>"""
    return frame("Review", body, csrf=csrf)


def not_a_reviewer_page(user: str, csrf: str) -> str:
    """What someone without the reviewer role sees at ``/review`` (with a 403)."""
    body = f"""{header(user, csrf, "/review")}
<main class="review"><h1>Review</h1><p role="alert" class="error">Only reviewers decide others'
answers. Ask whoever runs the desk to add you to <code>desk.reviewers</code> (or to set
<code>reviewer = true</code> for you in the users file).</p></main>"""
    return frame("Review", body, csrf=csrf)
