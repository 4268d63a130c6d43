"""The README is a front door: short, its two commands first, its results table the one the
results page carries (each number stated once in the site), its links alive."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
RESULTS = (REPO / "docs" / "results" / "index.md").read_text()
BLOCK = re.compile(r"<!-- headline:begin -->\n(.*?)<!-- headline:end -->", re.S)
#: a measured number: a ratio, a percentage, a duration or a rate
MEASURED = re.compile(r"\d+(?:[.,]\d+)?\s*(?:×|%|ms\b|µs\b|s\b|events/s|MB\b)")


def test_the_readme_is_short_and_starts_with_its_two_commands() -> None:
    lines = README.splitlines()
    assert len(lines) <= 150
    commands = re.search(r"```bash\n(.*?)```", README, re.S)
    assert commands is not None
    first = [c.split()[0:2] for c in commands.group(1).splitlines()]
    assert first == [["make", "run"], ["make", "test"]]


def _cells(block: str) -> list[list[str]]:
    """The table's cells, links reduced to their text (the two files link from elsewhere)."""
    text = re.sub(r"\]\([^)]*\)", "]", block)
    return [[c.strip() for c in row.strip("|").split("|")] for row in text.splitlines()]


def test_the_headline_table_is_the_results_page_s() -> None:
    ours, theirs = BLOCK.search(README), BLOCK.search(RESULTS)
    assert ours is not None
    assert theirs is not None
    assert _cells(ours.group(1)) == _cells(theirs.group(1))
    assert len(_cells(ours.group(1))) >= 4


def test_no_measured_number_stands_in_the_readme_outside_the_headline_table() -> None:
    outside = BLOCK.sub("", README)
    outside = re.sub(r"```.*?```", "", outside, flags=re.S)  # commands, the topic picture
    assert MEASURED.findall(outside) == []


def test_every_link_of_the_readme_leads_to_a_file() -> None:
    for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README):
        if not re.match(r"[a-z]+://", link):
            assert (REPO / link).exists(), link
