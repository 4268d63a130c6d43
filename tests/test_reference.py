"""The reference pages are what the code says, and say all of it: every setting, command,
series and topic is enumerated here from the code itself and must have its row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from service.__main__ import COMMANDS
from service.config import ModelConfig, Settings
from service.desk.metrics import DeskMetrics
from service.metrics import Metrics
from service.records import parse_feature_event
from service.reference import DOCS, FEATURE_EVENTS, HIDDEN_SUBCOMMANDS, main, pages
from service.stream.kafka.topics import CATALOGUE

GENERATED = pages()


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_each_page_in_the_docs_is_the_generated_one(name: str) -> None:
    assert (DOCS / name).read_text() == GENERATED[name], (
        f"docs/reference/{name} is stale: run python -m service.reference"
    )


def _walk(model: type[BaseModel], prefix: str) -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += _walk(annotation, f"{prefix}{name}.")
        elif name == "models" and prefix == "":
            out += ["models", *_walk(ModelConfig, "models.<name>.")]
        else:
            args = getattr(annotation, "__args__", ())
            nested = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            out += _walk(nested[0], f"{prefix}{name}.") if nested else [f"{prefix}{name}"]
    return out


def test_every_setting_has_its_row_with_a_description_and_its_environment_variable() -> None:
    page = GENERATED["configuration.md"]
    paths = _walk(Settings, "")
    assert len(paths) > 80
    for path in paths:
        row = next((line for line in page.splitlines() if line.startswith(f"| `{path}`<br>")), None)
        assert row is not None, f"no row for {path}"
        first, _, text = (c.strip() for c in row.strip("|").split("|"))
        assert not text.startswith("<br>chart"), f"{path} has no description"
        if not path.startswith("models.<name>."):
            assert first.endswith("<br>ABSTAIN_" + path.upper().replace(".", "__"))


def test_every_command_and_subcommand_has_its_help_in_the_page() -> None:
    page = GENERATED["cli.md"]
    for name in COMMANDS:
        assert f"## abstain {name}\n" in page
    for command, sub in HIDDEN_SUBCOMMANDS:
        assert f"## abstain {command} {sub}\n" in page
    for sub in ("list", "submit", "correct"):
        assert f"## abstain labels {sub}\n" in page
    assert "--offset OFFSET" in page  # an option of a command, as its parser prints it


def test_every_series_the_processes_export_has_its_row() -> None:
    page = GENERATED["metrics.md"]
    for metrics in (
        Metrics(CollectorRegistry(), models=["m"]),
        DeskMetrics(CollectorRegistry(), models=["m"]),
    ):
        for family in metrics.registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            assert f"| `{name}` | {family.type} |" in page, name


def test_every_topic_of_the_catalogue_has_its_row() -> None:
    page = GENERATED["topics.md"]
    s = Settings()
    for entry in CATALOGUE:
        assert f"`{entry.name(s).replace('abstain-', '<app_id>-')}" in page.replace(
            "`abstain-", "`<app_id>-"
        ), entry.name(s)


def test_check_names_a_stale_page_and_write_mends_it(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    assert main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "metrics.md").write_text("old")
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / "metrics.md").read_text() == GENERATED["metrics.md"]


def test_every_record_of_the_catalogue_has_its_example_and_the_examples_parse() -> None:
    page = GENERATED["records.md"]
    named = {n for e in CATALOGUE for n in re.findall(r"`(\w+)`", e.value)}
    assert {"Decision", "LabelRequest", "Label", "Correction", "SkipOrder"} <= named
    for name in named - {"FeatureEvent", "Step", "PendingEntry", "ParkedLabel"}:
        assert f": `{name}`\n" in page, name
    for raw in FEATURE_EVENTS:
        event = parse_feature_event(raw.encode(), default_model="fraud")
        assert event.id.startswith("e-")
