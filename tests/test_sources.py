"""``abstain data fetch``: every dataset the docs name, from a source over HTTP (a mirror on
127.0.0.1 here) or a local folder, brought to the project's form and kept only with its
pinned sha256; the folder it fills is where dataset names resolve."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from service import datasets, sources
from service.datasets import load_dataset, resolve_dataset_path

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
if not (SHARED / "elec2" / "elec.csv").is_file():
    pytest.skip(f"no datasets at {SHARED}", allow_module_level=True)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return None


@pytest.fixture
def serve() -> Iterator[functools.partial[str]]:
    """``serve(folder)``: the folder over HTTP on 127.0.0.1; its base URL."""
    servers: list[ThreadingHTTPServer] = []

    def start(folder: Path) -> str:
        server = ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder))
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield functools.partial(start)
    for server in servers:
        server.shutdown()
        server.server_close()


def origin_forms(folder: Path) -> None:
    """The datasets as their origins distribute them: CRLF line endings, and elec2 with its
    ``date`` and ``day`` columns and its class as UP/DOWN."""
    for name in ("phishing/phishing", "svmguide1/svmguide1", "svmguide1/svmguide1.t"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes((SHARED / name).read_bytes().replace(b"\n", b"\r\n"))
    lines = (SHARED / "elec2/elec.csv").read_text().splitlines()
    rows = ["date,day," + lines[0]]
    for i, line in enumerate(lines[1:]):
        cells = line.split(",")
        cells[-1] = {"1": "UP", "0": "DOWN"}[cells[-1]]
        rows.append(f"{960000 + i // 48},{1 + (i // 48) % 7}," + ",".join(cells))
    (folder / "elec2").mkdir(parents=True, exist_ok=True)
    (folder / "elec2/elec.csv").write_text("\r\n".join(rows) + "\r\n")


def test_every_dataset_comes_from_its_origin_form_as_the_project_reads_it(
    tmp_path: Path, serve: functools.partial[str]
) -> None:
    origin = tmp_path / "origin"
    origin_forms(origin)
    said: list[str] = []
    got = sources.fetch(into=tmp_path / "data", mirror=serve(origin), say=said.append)
    assert len(got) == 4
    for path in got:
        assert path.read_bytes() == (SHARED / path.relative_to(tmp_path / "data")).read_bytes()
    assert all("sha256 checked" in line for line in said)
    # a second fetch keeps what is there
    said.clear()
    sources.fetch(["elec2"], into=tmp_path / "data", mirror="http://127.0.0.1:9", say=said.append)
    assert said == ["elec2/elec.csv: already here"]


def test_a_file_that_is_not_the_pinned_one_is_refused_and_nothing_is_written(
    tmp_path: Path, serve: functools.partial[str]
) -> None:
    bad = tmp_path / "bad"
    (bad / "svmguide1").mkdir(parents=True)
    text = (SHARED / "svmguide1/svmguide1").read_text()
    (bad / "svmguide1/svmguide1").write_text(text.replace("1:", "1:9", 1))  # one value changed
    with pytest.raises(sources.FetchError, match="is not the pinned"):
        sources.fetch(["svmguide1"], into=tmp_path / "data", mirror=serve(bad), say=print)
    assert not (tmp_path / "data/svmguide1/svmguide1").exists()


def test_a_download_over_the_bound_or_a_missing_file_is_an_error(
    tmp_path: Path, serve: functools.partial[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = serve(SHARED)
    monkeypatch.setattr(sources, "MAX_BYTES", 1000)
    with pytest.raises(sources.FetchError, match="larger than 1000 bytes"):
        sources.fetch(["phishing"], into=tmp_path, mirror=base, say=print)
    monkeypatch.undo()
    with pytest.raises(sources.FetchError, match="404"):
        sources.fetch(["phishing"], into=tmp_path, mirror=base + "/nowhere", say=print)
    with pytest.raises(sources.FetchError, match="unknown dataset"):
        sources.fetch(["gisette"], into=tmp_path, say=print)
    assert not list(tmp_path.rglob("phishing"))


def test_the_command_fills_the_data_folder_that_names_resolve_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ABSTAIN_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(datasets.DatasetError, match="abstain data fetch"):
        resolve_dataset_path("svmguide1")
    assert sources.main(["fetch", "svmguide1", "--from", str(SHARED)]) == 0
    assert "svmguide1/svmguide1.t" in capsys.readouterr().out
    X, y = load_dataset(resolve_dataset_path("svmguide1"))
    assert X.shape == (3089, 4)
    assert sources.main(["fetch", "nope", "--from", str(SHARED)]) == 1
    assert "unknown dataset(s) nope" in capsys.readouterr().err


def test_without_a_setting_or_a_shared_folder_names_resolve_in_the_fetched_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ABSTAIN_DATA_DIR", raising=False)
    repo = tmp_path / "clone"
    monkeypatch.setattr(datasets, "__file__", str(repo / "service" / "datasets.py"))
    assert datasets.data_dir() == repo / "var" / "data" == datasets.fetched_dir()
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert datasets.data_dir() == tmp_path / "shared" / "data"
    monkeypatch.setenv("ABSTAIN_DATA_DIR", "  ")  # blank: as if unset
    assert datasets.data_dir() == tmp_path / "shared" / "data"
