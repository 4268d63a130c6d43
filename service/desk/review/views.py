"""What people are shown of an answer: its author, in "my recent answers" (what happened
to it since, and what they may still do), and the words for each step.

>>> from service.desk.review.item import Item, Step
>>> item = Item("r1", "m", "ann", 1, at=100.0, partition=0, offset=7)
>>> names = {"pos": "fraud", "neg": "legitimate"}
>>> status(item, names)
'Saved'
>>> item.current = -1; status(item, names)
'Changed to legitimate'
>>> item.decision = Step("confirmed", "rita", -1, 200.0); item.confirmed = True
>>> status(item, names)
'Changed to legitimate · confirmed by a reviewer'
"""

from __future__ import annotations

from typing import Any, Final, Literal

from service.desk.review.item import Item, Step

__all__ = ["Action", "mine_row", "name_of", "status", "step_text"]

Action = Literal["undo", "change", "again", "review"]

_STEPS: Final = {
    "label": "answered",
    "withdrew": "withdrew the answer",
    "changed": "changed it to",
    "again": "answered again:",
    "kept": "kept",
    "opinion": "second opinion:",
    "flag": "asked for a review of",
    "confirmed": "confirmed",
    "corrected": "corrected it to",
}


def name_of(label: int | None, names: dict[str, str]) -> str:
    """The display name of an answer (``names``: :func:`service.desk.present.answer_names`)."""
    if label is None:
        return "withdrawn"
    return names["pos"] if label == 1 else names["neg"]


def step_text(step: Step, names: dict[str, str]) -> str:
    """``ann answered fraud``, ``rita corrected it to legitimate``, ``ann withdrew ...``."""
    verb = _STEPS[step.kind]
    who = step.by or "(no name)"
    if step.kind == "withdrew":
        return f"{who} {verb}"
    return f"{who} {verb} {name_of(step.label, names)}"


def status(item: Item, names: dict[str, str]) -> str:
    """What happened to an answer since, in a few words (for its author)."""
    parts = []
    if item.current is None:
        parts.append("Withdrawn")
    elif item.corrected and (item.decision is None or item.decision.kind == "confirmed"):
        parts.append(f"Changed to {name_of(item.current, names)}")
    if item.decision is not None:
        if item.decision.kind == "confirmed":
            parts.append("confirmed by a reviewer")
        else:
            parts.append(f"corrected by a reviewer to {name_of(item.decision.label, names)}")
    elif item.flag is not None and item.current is not None:
        parts.append("under review (you asked)")
    elif item.agrees is False and item.current is not None:
        parts.append("a second opinion differs: under review")
    elif item.agrees:
        parts.append("a second opinion agreed")
    text = " · ".join(parts) or "Saved"
    return text[0].upper() + text[1:]


def mine_row(
    item: Item, names: dict[str, str], *, grace_until: float, now: float, reachable: bool
) -> dict[str, Any]:
    """One row of "my recent answers": the answer, what it is now, its status, until when
    it may be undone or changed, and the actions left (``undo``, ``change``, ``again``
    after an undo, ``review``: ask for one)."""
    actions: list[Action] = []
    open_ = reachable and item.decision is None
    in_grace = open_ and now < grace_until
    if in_grace:
        actions += ["undo", "change"] if item.current is not None else ["again"]
    if open_ and not in_grace and item.flag is None and item.current is not None:
        actions.append("review")
    return {
        "request_id": item.request_id,
        "short": item.request_id[:12],
        "model": item.model,
        "at": item.at,
        "answer": name_of(item.first, names),
        "label": item.current,
        "now": name_of(item.current, names),
        "status": status(item, names)
        if reachable or item.decision
        else status(item, names) + " · too old to change",
        "grace_until": grace_until if in_grace else None,
        "actions": actions,
    }
