"""MkDocs hooks: formulas rendered in the site, served with it, never from a CDN.

Pages and docstrings write TeX between ``$...$`` (inline) and ``$$...$$`` (display);
``pymdownx.arithmatex`` (generic) marks them, and MathJax's TeX-to-SVG build, served from
the site itself (``javascripts/vendor/mathjax/tex-svg.js``), draws them in the browser with
no network. The build takes that file, by its sha256, from:

1. ``ABSTAIN_MATHJAX``: a path to a ``tex-svg.js`` (a machine without the npm registry);
2. the cache ``var/mathjax/<version>/tex-svg.js``;
3. the npm registry: ``npm pack mathjax@<version>`` into the cache.

A file whose sha256 is not the pinned one is refused. After each page is rendered, a
formula left as text (a ``$`` pair holding a TeX command outside the marked math, code
and pre blocks, or an RST ``.. math::`` block from a docstring) fails the build.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

VERSION = "3.2.2"
SHA256 = "d4295dc33744836935c1399feece5159577b34c5c8ffb9f1c6324cd82e03a882"  # es5/tex-svg.js
TARGET = "javascripts/vendor/mathjax/tex-svg.js"
ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "var" / "mathjax" / VERSION / "tex-svg.js"

# what is not prose: code, pre blocks and the math arithmatex marked
_SKIP = re.compile(
    r"<(pre|code|script|style)\b.*?</\1>|<(span|div) class=\"arithmatex\">.*?</\2>", re.S
)
_RAW_TEX = re.compile(r"\$[^$\n]{0,200}?\\[A-Za-z]+[^$\n]{0,200}?\$|\.\. math::")


class MathJaxError(Exception):
    """The MathJax build could not be had, or a page holds a formula left as text."""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checked(path: Path, where: str) -> Path:
    if not path.is_file():
        raise MathJaxError(f"{where}: no file at {path}")
    if _digest(path) != SHA256:
        raise MathJaxError(f"{where}: {path} is not MathJax {VERSION}'s es5/tex-svg.js (sha256)")
    return path


def _from_npm() -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise MathJaxError(
            f"MathJax {VERSION} is not cached at {CACHE} and npm is not installed: install "
            "npm, or set ABSTAIN_MATHJAX to a copy of its es5/tex-svg.js"
        )
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(  # noqa: S603 - fixed arguments
            [npm, "pack", f"mathjax@{VERSION}", "--pack-destination", tmp, "--silent"],
            check=True,
            capture_output=True,
            timeout=300,
        )
        with tarfile.open(Path(tmp) / f"mathjax-{VERSION}.tgz") as tar:
            member = tar.extractfile("package/es5/tex-svg.js")
            if member is None:
                raise MathJaxError(f"mathjax@{VERSION} has no es5/tex-svg.js")
            part = Path(tmp) / "tex-svg.js"
            part.write_bytes(member.read())
        _checked(part, f"npm's mathjax@{VERSION}")
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(part, CACHE)
    return CACHE


def mathjax() -> Path:
    """The checked ``tex-svg.js`` (module docstring: where it comes from)."""
    given = os.environ.get("ABSTAIN_MATHJAX", "").strip()
    if given:
        return _checked(Path(given), "ABSTAIN_MATHJAX")
    if CACHE.is_file():
        return _checked(CACHE, "the cache")
    return _from_npm()


def unrendered(html: str) -> list[str]:
    """The formulas of a rendered page left as text.

    >>> unrendered('<p><span class="arithmatex">\\\\(x\\\\)</span> costs $5 and $6</p>')
    []
    >>> unrendered(r"<p>the loss $\\sigma(z)$ and <code>$\\x$</code></p>")
    ['$\\\\sigma(z)$']
    """
    prose = _SKIP.sub(" ", html)
    return [m.group(0) for m in _RAW_TEX.finditer(prose)]


def on_post_page(output: str, page: Any, config: Any) -> str:
    left = unrendered(output)
    if left:
        shown = ", ".join(repr(f) for f in left[:3])
        raise MathJaxError(f"{page.file.src_uri}: {len(left)} formula(s) left as text: {shown}")
    return output


def on_post_build(config: Any) -> None:
    target = Path(config["site_dir"]) / TARGET
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(mathjax(), target)
