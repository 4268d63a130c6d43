"""One version: the package's, the command line's, the chart's appVersion, the image's label
and the changelog's newest release say the same."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

import service

REPO = Path(__file__).resolve().parents[1]


def test_abstain_version_prints_the_package_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "service", "--version"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert done.stdout.strip() == f"abstain {service.__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", service.__version__)


def test_the_chart_the_image_and_the_changelog_agree_with_it() -> None:
    chart = yaml.safe_load((REPO / "helm" / "abstain" / "Chart.yaml").read_text())
    assert chart["appVersion"] == service.__version__
    dockerfile = (REPO / "Dockerfile").read_text()
    label = re.search(r'org\.opencontainers\.image\.version="([^"]+)"', dockerfile)
    assert label is not None
    assert label.group(1) == service.__version__
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", (REPO / "CHANGELOG.md").read_text(), re.M)
    assert releases
    assert releases[0] == service.__version__


def test_the_released_section_is_dated_and_unreleased_comes_first() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\](.*)$", text, re.M)
    assert headings[0] == ("Unreleased", "")
    version, rest = headings[1]
    assert version == service.__version__
    assert re.fullmatch(r" - \d{4}-\d{2}-\d{2}", rest)
    released = text.split(f"## [{version}]", 1)[1]
    bullets = [line for line in released.splitlines() if line.startswith("- ")]
    assert bullets
    # one line each: the details live in the documentation and the commit messages
    assert not [line for line in released.splitlines() if line.startswith("  ")]
