"""The team view marks a model whose change detector fired, in a real Chromium against a real
broker, worker and desk.

Two models: ``fraud`` is served inside the adaptive wrapper (the default), ``payments`` without
it (``adaptive.enabled = false``). Before anything is learned the team view shows ``fraud``
steady with no change yet and ``payments`` with no change detection. Then ``fraud`` is seeded
(``abstain models seed``, the learner's own code path) from labelled history whose labels
flip near its end: its detector fires while the seed is learned, the learner adopts and
republishes the seeded state, and the desk, following the models topic, shows ``fraud``
relearning (the note, the mark in the requests table, its learning row with the change, the
risk since it and the counts), while ``payments`` still shows nothing of the kind. The
screenshot goes to ``docs/desk/team-relearning.png``.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults.desk import DeskProcess
from faults.workers import REPO

from service.desk.auth.passwords import hash_password

playwright_sync = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("ABSTAIN_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)

pytestmark = pytest.mark.integration

Service = Worker = KafkaIO = Any  # fixtures' types live in conftest.py
SHOTS = REPO / "docs" / "desk"
FEATURES = ["amount", "account_age_days", "foreign_ip"]
PASSWORD = "lead-password-1"  # noqa: S105 - a test account
BEFORE, FLIPPED = 300, 80  # rows of the history before and after its labels flip


def concept(x: list[float]) -> int:
    return 1 if x[0] + 0.5 * x[1] - 0.25 * x[2] > 0 else -1


def history(path: Path) -> Path:
    """Labelled history in time order whose labels flip for its last ``FLIPPED`` rows."""
    rng = np.random.default_rng(3)
    lines = [",".join([*FEATURES, "label"])]
    for i, x in enumerate(rng.normal(size=(BEFORE + FLIPPED, 3)).round(4).tolist()):
        y = concept(x) * (-1 if i >= BEFORE else 1)
        lines.append(",".join([*(str(v) for v in x), str(y)]))
    path.write_text("\n".join(lines) + "\n")
    return path


def produce_events(service: Service, kafka_io: KafkaIO, model: str, n: int) -> None:
    rng = np.random.default_rng(len(model) + n)
    events = [
        (eid, {"id": eid, "model": model, "features": x})
        for x in rng.normal(size=(n, 3)).round(3).tolist()
        if (eid := f"ev-{uuid.uuid4().hex[:12]}")
    ]
    kafka_io.produce_json(service.topics["features"], events)


@pytest.fixture(scope="module")
def deployment(
    service_factory: Callable[..., Service],
    kafka_io: KafkaIO,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Service, DeskProcess]]:
    fraud = {"algorithm": "dsal", "cost": 0.25, "feature_names": FEATURES, "audit_rate": 0.05}
    payments = {**fraud, "adaptive": {"enabled": False}}
    desk = {"session_key": "s" * 40, "min_time_left_seconds": 0}
    service = service_factory(
        models={"fraud": fraud, "payments": payments}, default_model="fraud", desk=desk
    )
    worker = service.start()
    worker.wait_ready()
    for model in ("fraud", "payments"):
        produce_events(service, kafka_io, model, 60)
    users = tmp_path_factory.mktemp("desk") / "users.json"
    users.write_text(json.dumps({"lead": hash_password(PASSWORD)}))
    proc = DeskProcess(service, users)
    try:
        proc.wait_ready()
        proc.wait(lambda: proc.open_requests() > 0, "open requests")
        yield service, proc
    finally:
        proc.stop()


def team(browser: Any, desk: DeskProcess) -> Any:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(desk.url + "/login")
    page.get_by_label("User name").fill("lead")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(re.compile(r".*/$"))
    page.goto(desk.url + "/team")
    return page


def learning_row(page: Any, model: str) -> Any:
    return page.locator("#learning tbody tr").filter(
        has=page.locator("th", has_text=re.compile(f"^{model}$"))
    )


def test_a_model_whose_detector_fired_is_marked_relearning_on_the_team_view(
    deployment: tuple[Service, DeskProcess], browser: Any, tmp_path: Path
) -> None:
    service, desk = deployment
    page = team(browser, desk)
    # before: nothing learned, no change; the bare learner shows no change detection
    fraud, payments = learning_row(page, "fraud"), learning_row(page, "payments")
    assert fraud.locator("td").all_text_contents()[:2] == ["Steady", "none yet"]
    assert payments.locator("td").first.text_content() == "no change detection"
    assert page.locator(".relearning-note").count() == 0
    assert page.locator("#models .mark").count() == 0

    out = json.loads(
        service.cli(
            "models", "seed", "--model", "fraud", str(history(tmp_path / "history.csv"))
        ).stdout
    )
    assert out["rows"] == BEFORE + FLIPPED

    def marked() -> bool:
        page.reload()
        return learning_row(page, "fraud").locator(".mark").count() == 1

    desk.wait(marked, "the team view marks fraud relearning", timeout=60)
    cells = [str(c) for c in learning_row(page, "fraud").locator("td").all_text_contents()]
    state, last, risk, changes, takeovers, version = cells
    assert state == "Relearning"
    since = re.fullmatch(r"(\d+) labels? ago \(at label ([\d,]+)\)", last)
    assert since is not None, last
    assert int(since.group(1)) <= FLIPPED  # the change is in the flipped rows
    assert int(since.group(2).replace(",", "")) >= BEFORE
    assert re.fullmatch(r"\d\.\d{3} over \d+ labels?", risk), risk
    assert int(changes) >= 1
    assert int(takeovers) <= int(changes)  # a challenger takes over only after a change
    assert int(version.replace(",", "")) >= 1
    note = page.locator(".relearning-note")
    assert note.is_visible()
    assert "fraud" in str(note.text_content())
    assert "payments" not in str(note.text_content())
    requests = page.locator("#models tbody tr", has=page.locator(".mark"))
    assert requests.count() == 1
    assert str(requests.locator("th").text_content()).startswith("fraud")
    payments = learning_row(page, "payments")
    assert payments.locator("td").all_text_contents() == ["no change detection", *["—"] * 5]
    assert payments.locator(".mark").count() == 0
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "team-relearning.png"), full_page=True)
    page.context.close()
