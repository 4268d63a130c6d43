"""``abstain data fetch``: the datasets the docs and benchmarks name, from their original
sources, checked by sha256.

Each dataset is one or more files under the data folder (:func:`~service.datasets.data_dir`'s
layout: ``phishing/phishing``, ``svmguide1/svmguide1``, ``elec2/elec.csv``), each taken from
its original source (the LIBSVM binary collection; the scikit-multiflow streaming datasets),
brought to the form the project reads (line endings LF; elec2 without its ``date`` and
``day`` columns, its class as 0/1), and kept only when its sha256 is the pinned one. Where
they come from:

- by default, each file's original address;
- ``--mirror URL``: ``URL/<dataset>/<file>`` (a copy of a data folder served over HTTP);
- ``--from DIR``: a local folder of the same layout (a machine without network).

Where they go: ``--dir``, else ``ABSTAIN_DATA_DIR``, else ``var/data`` in the project,
which :func:`~service.datasets.resolve_dataset_path` reads when ``ABSTAIN_DATA_DIR`` is unset
and no ``../shared/data`` sits beside the checkout. A file already there with the right
sha256 is kept; a download larger than :data:`MAX_BYTES`, or of another sha256, is refused
and nothing is written.

>>> [s.name for s in SOURCES]
['phishing', 'svmguide1', 'elec2']
>>> drop_columns("date,day,period,class\\n1,2,0.5,UP\\n")
'period,class\\n0.5,1\\n'
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from service.datasets import data_dir, fetched_dir
from service.errors import AbstainError

__all__ = ["MAX_BYTES", "SOURCES", "FetchError", "Source", "drop_columns", "fetch", "main"]

#: the largest file a download may be (the largest pinned one is 3.6 MB)
MAX_BYTES = 64 * 1024 * 1024
TIMEOUT = 60.0
LIBSVM = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary"
MULTIFLOW = "https://raw.githubusercontent.com/scikit-multiflow/streaming-datasets/master"


class FetchError(AbstainError):
    """A dataset could not be fetched, or is not the file it should be."""


def lf(text: str) -> str:
    """Line endings as LF.

    >>> lf("1 1:0.5\\r\\n0 2:1\\r\\n")
    '1 1:0.5\\n0 2:1\\n'
    """
    return text.replace("\r\n", "\n").replace("\r", "\n")


def drop_columns(text: str, drop: Sequence[str] = ("date", "day")) -> str:
    """elec2 as the project reads it: CSV without the ``drop`` columns, the class as 0/1
    (``DOWN`` 0, ``UP`` 1), line endings LF; already in that form, unchanged."""
    rows = [line.split(",") for line in lf(text).split("\n") if line]
    if not rows:
        return ""
    keep = [i for i, name in enumerate(rows[0]) if name.strip() not in drop]
    classes = {"UP": "1", "DOWN": "0"}
    out = []
    for row in rows:
        cells = [row[i] for i in keep if i < len(row)]
        cells[-1] = classes.get(cells[-1].strip(), cells[-1])
        out.append(",".join(cells))
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class File:
    """One file of a dataset: its name in the data folder, its original address, the
    transformation to the project's form and that form's sha256."""

    name: str
    url: str
    sha256: str
    form: Callable[[str], str] = lf


@dataclass(frozen=True)
class Source:
    """A dataset: its folder under the data folder, its files and whom to credit."""

    name: str
    files: tuple[File, ...]
    credit: str


SOURCES: tuple[Source, ...] = (
    Source(
        "phishing",
        (
            File(
                "phishing",
                f"{LIBSVM}/phishing",
                "0cf66ef36604c393da9359b2e5d894a2df8aee31fd184633cefa138add2ef08a",
            ),
        ),
        "UCI Phishing Websites (Mohammad, Thabtah, McCluskey, 2012), LIBSVM's one-hot form",
    ),
    Source(
        "svmguide1",
        (
            File(
                "svmguide1",
                f"{LIBSVM}/svmguide1",
                "2b9ab55b6236f62cee6b7739b52f9e7cb033771f39b9c22c1f1790d80ef14d7f",
            ),
            File(
                "svmguide1.t",
                f"{LIBSVM}/svmguide1.t",
                "f9c2fd4c725172aeb4476fc1e2327d537f7fbc2f53f49dfd073f80efbe1ba8f7",
            ),
        ),
        "LIBSVM svmguide1 (Hsu, Chang, Lin, A Practical Guide to Support Vector Classification)",
    ),
    Source(
        "elec2",
        (
            File(
                "elec.csv",
                f"{MULTIFLOW}/elec.csv",
                "cdf901433885f29eca6911f70c0eeafb50d90596c879c30c5b99f5a2e8e734ff",
                drop_columns,
            ),
        ),
        "Electricity (Harries, 1999), normalised by Gama et al. (2004), as scikit-multiflow "
        "distributes it",
    ),
)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download(url: str) -> bytes:
    if not url.startswith(("https://", "http://")):
        raise FetchError(f"{url}: only http(s) addresses are fetched")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as response:  # noqa: S310 - checked
            data: bytes = response.read(MAX_BYTES + 1)
    except OSError as exc:
        raise FetchError(f"{url}: {exc}") from exc
    if len(data) > MAX_BYTES:
        raise FetchError(f"{url}: larger than {MAX_BYTES} bytes")
    return data


def _read(path: Path) -> bytes:
    try:
        if path.stat().st_size > MAX_BYTES:
            raise FetchError(f"{path}: larger than {MAX_BYTES} bytes")
        return path.read_bytes()
    except OSError as exc:
        raise FetchError(f"{path}: {exc}") from exc


def _formed(file: File, raw: bytes, where: str) -> bytes:
    try:
        data = file.form(raw.decode("utf-8")).encode("utf-8")
    except (UnicodeDecodeError, IndexError) as exc:
        raise FetchError(f"{where}: not the text it should be ({exc})") from exc
    if _digest(data) != file.sha256:
        raise FetchError(f"{where}: sha256 {_digest(data)} is not the pinned {file.sha256}")
    return data


def fetch(
    names: Sequence[str] = (),
    *,
    into: Path,
    mirror: str | None = None,
    local: Path | None = None,
    say: Callable[[str], None] = print,
) -> list[Path]:
    """Fetch the datasets ``names`` (all when empty) into ``into``; return the files there.

    Raises :class:`FetchError` for an unknown name, a source that cannot be read, or a file
    that is not the pinned one (nothing is written for that file)."""
    known = {s.name: s for s in SOURCES}
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise FetchError(f"unknown dataset(s) {', '.join(unknown)} (known: {', '.join(known)})")
    out = []
    for source in [known[n] for n in names] if names else SOURCES:
        for file in source.files:
            target = into / source.name / file.name
            if target.is_file() and _digest(_read(target)) == file.sha256:
                say(f"{source.name}/{file.name}: already here")
                out.append(target)
                continue
            if local is not None:
                where = str(local / source.name / file.name)
                raw = _read(local / source.name / file.name)
            else:
                where = f"{mirror.rstrip('/')}/{source.name}/{file.name}" if mirror else file.url
                raw = _download(where)
            data = _formed(file, raw, where)
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as part:
                part.write(data)
            os.replace(part.name, target)
            say(f"{source.name}/{file.name}: {len(data):,} bytes from {where} (sha256 checked)")
            out.append(target)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="abstain data",
        description="Fetch the datasets the docs and benchmarks use from their original "
        "sources (sha256 checked).",
    )
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="fetch datasets (all by default)")
    f.add_argument("names", nargs="*", help=", ".join(s.name for s in SOURCES))
    f.add_argument("--dir", type=Path, help="where to (default: ABSTAIN_DATA_DIR or var/data)")
    f.add_argument("--mirror", help="fetch URL/<dataset>/<file> instead of the origins")
    f.add_argument("--from", dest="local", type=Path, help="copy from a local data folder")
    sub.add_parser("list", help="the datasets, their sources and where they are read from")
    args = p.parse_args(argv)
    if args.command == "list":
        for source in SOURCES:
            for file in source.files:
                print(f"{source.name}/{file.name}  {file.url}  sha256 {file.sha256}")
            print(f"  credit: {source.credit}")
        print(f"read from: {data_dir()}")
        return 0
    env = os.environ.get("ABSTAIN_DATA_DIR", "").strip()
    into = args.dir or (Path(env) if env else fetched_dir())
    try:
        fetch(args.names, into=into, mirror=args.mirror, local=args.local)
    except FetchError as exc:
        print(f"abstain data: {exc}", file=sys.stderr)
        return 1
    return 0
