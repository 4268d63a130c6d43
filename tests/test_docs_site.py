"""The documentation site, built as ``make docs`` builds it and read in real Chromium with no
network: every formula of a Learn page, a Results page and the Python API page is drawn by
the MathJax served with the site (none is left as TeX), and a formula the build cannot mark
fails the build (``docs/hooks/mathjax.py``)."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]
playwright_sync = pytest.importorskip("playwright.sync_api")
CHROMIUM = os.environ.get("ABSTAIN_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)
# the probe's flags: no background traffic, which the machine's closed network would refuse
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: pages, and how many formulas each draws at least
PAGES = {"learn/learners.html": 8, "results/learning.html": 30, "reference/api.html": 20}


def build(site: Path, config: Path = REPO / "mkdocs.yml") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(  # noqa: S603 - the venv's mkdocs, fixed arguments
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(config),
         "-d", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The built site served on 127.0.0.1 (its base URL)."""
    root = tmp_path_factory.mktemp("site")
    done = build(root)
    assert done.returncode == 0, done.stderr
    handler = functools.partial(_Quiet, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return None


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_formula_of_a_page_is_drawn_with_no_network(
    site: str, page: str, tmp_path: Path
) -> None:
    outside: list[str] = []
    with playwright_sync.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            view = browser.new_page(viewport={"width": 1280, "height": 900})
            # only the site itself: a request anywhere else is refused and recorded
            view.route(
                "**/*",
                lambda route: (
                    route.continue_()
                    if route.request.url.startswith(site)
                    else (outside.append(route.request.url), route.abort())
                ),
            )
            view.goto(site + page)
            view.wait_for_function(
                "() => window.MathJax && window.MathJax.startup && window.MathJax.startup.promise"
            )
            view.evaluate("() => window.MathJax.startup.promise")
            drawn = view.locator("mjx-container svg").count()
            marked = view.locator(".arithmatex").count()
            raw = view.evaluate(
                "() => [...document.querySelectorAll('.arithmatex')]"
                ".filter(e => !e.querySelector('mjx-container')).map(e => e.textContent)"
            )
            errors = view.locator("mjx-merror").count()
            view.screenshot(path=str(tmp_path / (page.replace("/", "-") + ".png")))
        finally:
            browser.close()
    assert drawn >= PAGES[page], f"{page}: {drawn} formulas drawn"
    assert marked >= PAGES[page]
    assert raw == [], f"{page}: left as TeX: {raw[:3]}"
    assert errors == 0, f"{page}: {errors} formulas MathJax could not parse"
    assert [url for url in outside if not url.startswith("data:")] == []


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mathjax_hook", REPO / "docs/hooks/mathjax.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_formula_the_build_cannot_mark_fails_the_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    # a formula inside raw HTML is not Markdown: arithmatex never sees it
    (docs / "index.md").write_text(
        "# A page\n\nThe loss $\\sigma(z)$ is drawn.\n\n<div>but $\\rho + 1$ is not</div>\n"
    )
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        f"site_name: t\nhooks:\n  - {REPO / 'docs/hooks/mathjax.py'}\n"
        "markdown_extensions:\n  - pymdownx.arithmatex:\n      generic: true\n"
    )
    done = build(tmp_path / "site", config)
    assert done.returncode != 0
    assert "index.md: 1 formula(s) left as text" in done.stderr
    assert "\\\\rho + 1" in done.stderr
    (docs / "index.md").write_text("# A page\n\nThe loss $\\sigma(z)$ is drawn.\n")
    assert build(tmp_path / "site", config).returncode == 0


def test_a_mathjax_file_that_is_not_the_pinned_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = _hook()
    fake = tmp_path / "tex-svg.js"
    fake.write_text("window.MathJax = {};")
    monkeypatch.setenv("ABSTAIN_MATHJAX", str(fake))
    with pytest.raises(hook.MathJaxError, match="sha256"):
        hook.mathjax()
