"""Read labelled binary-classification datasets into dense arrays (numpy + stdlib only).

Two text formats are understood:

* LIBSVM sparse text, ``label index:value index:value ...`` with indices from 1 (the
  format of the shared Phishing and Guide files);
* CSV with numeric columns; the label is the column named ``label`` (any case) when the
  first row is a header that has one, otherwise the last column.

Either may be gzipped: a file whose name ends in ``.gz`` is decompressed while it is read
(UTF-8 text, as for plain files).

Dataset names resolve under :func:`data_dir` (``ABSTAIN_DATA_DIR``, else ``../shared/data``
beside the repository when it is there, else ``var/data``, which ``abstain data fetch``
fills from the original sources: :mod:`service.sources`); the demo dataset, Phishing,
also ships gzipped inside the package (``service/data/phishing.gz``, attribution in
``service/data/README.md``) and is used when neither place has it, with the names of its
68 one-hot columns
(``service/data/phishing-features.txt``, :func:`feature_names`).

Labels are returned in ``{-1, +1}``: files may store ``{0, 1}`` (``0`` becomes ``-1``) or
``{-1, +1}``; anything else is an error naming the line.

Exceptions::

    AbstainError (service.errors), ValueError
     +-- DatasetError          unreadable, malformed or empty dataset (message names the
                               file and, for malformed content, the 1-based line number)

A missing file is reported as a ``DatasetError`` too (wrapping the ``OSError``).

>>> import tempfile, pathlib
>>> with tempfile.TemporaryDirectory() as tmp:
...     path = pathlib.Path(tmp) / "tiny.svm"
...     _ = path.write_text("1 1:0.5 3:2\\n0 2:1\\n")
...     X, y = load_dataset(path)
>>> X.tolist(), y.tolist()
([[0.5, 0.0, 2.0], [0.0, 1.0, 0.0]], [1, -1])
"""

from __future__ import annotations

import csv
import gzip
import math
import os
import zlib
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import IO, Any, Literal, TypeGuard

import numpy as np
import numpy.typing as npt
import orjson

from service.errors import AbstainError
from service.features import Encoder, FieldError

__all__ = [
    "PACKAGED",
    "EVENT_SUFFIXES",
    "DatasetError",
    "csv_header",
    "dataset_format",
    "data_dir",
    "feature_names",
    "fetched_dir",
    "load_csv",
    "load_dataset",
    "load_events",
    "load_libsvm",
    "packaged_dataset_path",
    "resolve_dataset_path",
]

Format = Literal["libsvm", "csv"]
#: the names of JSON-lines files of events (``abstain replay`` reads them as events)
EVENT_SUFFIXES = (".jsonl", ".ndjson")
FloatArray = npt.NDArray[np.float64]
LabelArray = npt.NDArray[np.int64]

_LABELS = {0.0: -1, -1.0: -1, 1.0: 1}

# datasets shipped gzipped in ``service/data`` (package data), by name
PACKAGED = frozenset({"phishing"})

# what reading a damaged gzip raises besides OSError (gzip.BadGzipFile is an OSError)
_READ_ERRORS = (OSError, UnicodeDecodeError, EOFError, zlib.error)


class DatasetError(AbstainError, ValueError):
    """A dataset file is missing, unreadable, malformed or empty."""


def fetched_dir() -> Path:
    """``<repo>/var/data``: where ``abstain data fetch`` puts the datasets by default
    (:mod:`service.sources`), ``<repo>`` the directory that contains the ``service`` package."""
    return Path(__file__).resolve().parent.parent / "var" / "data"


def data_dir() -> Path:
    """Directory holding the datasets.

    ``ABSTAIN_DATA_DIR`` when set; else ``<repo>/../shared/data`` when that folder exists
    beside the checkout; else :func:`fetched_dir` (``abstain data fetch`` fills it). The
    directory need not exist: see :func:`resolve_dataset_path` for the packaged fallback.
    """
    env = os.environ.get("ABSTAIN_DATA_DIR", "").strip()
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent
    shared = repo.parent / "shared" / "data"
    return shared if shared.is_dir() else fetched_dir()


def packaged_dataset_path(name: str) -> Path | None:
    """Path of the gzipped copy of dataset ``name`` shipped in ``service/data``, if any.

    ``None`` for a name not in :data:`PACKAGED`, or when the package is not installed as
    plain files (e.g. imported from a zip).
    """
    if name not in PACKAGED:
        return None
    packaged = files("service").joinpath("data", f"{name}.gz")
    return packaged if isinstance(packaged, Path) else None


def feature_names(name_or_path: str | os.PathLike[str], n_features: int) -> tuple[str, ...] | None:
    """The column names of a packaged dataset (``service/data/NAME-features.txt``, one per
    line) when ``name_or_path`` is that dataset (its name, or a file named after it) and
    it has ``n_features`` columns; None otherwise.

    >>> names = feature_names("phishing", 68)
    >>> names[:3], len(names)
    (('having_ip_address=-1', 'url_length=1', 'shortining_service=1'), 68)
    >>> feature_names("phishing", 4) is None, feature_names("svmguide1", 4) is None
    (True, True)
    """
    stem = Path(name_or_path).name.removesuffix(".gz")
    if stem not in PACKAGED:
        return None
    text = files("service").joinpath("data", f"{stem}-features.txt").read_text("utf-8")
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    return names if len(names) == n_features else None


def resolve_dataset_path(name_or_path: str | os.PathLike[str]) -> Path:
    """Path of a dataset given as a file path or as a name under :func:`data_dir`.

    An existing path wins; otherwise ``data_dir()/NAME/NAME`` then ``data_dir()/NAME`` are
    tried (so ``"phishing"`` finds ``phishing/phishing``), then, for a name shipped with
    the package (:data:`PACKAGED`), its gzipped copy ``service/data/NAME.gz``. Raises
    ``DatasetError`` naming every place that was looked at.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    root = data_dir()
    candidates = [root / path / path.name, root / path]
    packaged = packaged_dataset_path(str(name_or_path))
    if packaged is not None:
        candidates.append(packaged)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(p) for p in [path, *candidates])
    raise DatasetError(
        f"dataset {str(name_or_path)!r} not found (looked at: {looked}); "
        "`abstain data fetch` fetches the datasets the docs name"
    )


def _label(token: str, where: str) -> int:
    try:
        value = float(token)
    except ValueError:
        raise DatasetError(f"{where}: label {token!r} is not a number") from None
    label = _LABELS.get(value)
    if label is None:
        raise DatasetError(f"{where}: label {token!r} is not one of 0, 1, -1, +1")
    return label


def _finite(token: str, where: str, what: str) -> float:
    try:
        value = float(token)
    except ValueError:
        raise DatasetError(f"{where}: {what} {token!r} is not a number") from None
    if not math.isfinite(value):
        raise DatasetError(f"{where}: {what} {token!r} is not finite")
    return value


def _is_gzip(path: Path) -> bool:
    return path.suffix.lower() == ".gz"


def _open_text(path: Path, newline: str | None = None) -> IO[str]:
    """``path`` opened for reading as UTF-8 text, decompressed on the fly if it is ``.gz``."""
    if _is_gzip(path):
        return gzip.open(path, "rt", encoding="utf-8", newline=newline)
    return path.open("r", encoding="utf-8", newline=newline)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with _open_text(path) as handle:
            yield from enumerate(handle, start=1)
    except FileNotFoundError as exc:
        raise DatasetError(f"{path}: no such file") from exc
    except _READ_ERRORS as exc:
        raise DatasetError(f"{path}: cannot read ({exc})") from exc


def load_events(path: str | os.PathLike[str], encoder: Encoder) -> tuple[FloatArray, LabelArray]:
    """Read a JSON-lines file of events as producers write them, one per line with its
    label (``{"features": {...}, "label": 1}``; ``id``, ``model`` and ``ts`` may be there
    too, unused), each encoded by ``encoder`` (a model's declaration, exactly as a worker
    encodes it). A line that does not parse, lacks a label of +-1 (or 0 for -1) or has a
    field the declaration refuses is a :class:`DatasetError` naming its line and field.

    >>> import tempfile
    >>> from service.features import Encoder, FieldsConfig
    >>> enc = Encoder(FieldsConfig.model_validate({"fields": {"a": "number", "b": "number"}}))
    >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
    ...     _ = f.write('{"features": {"a": 1, "b": null}, "label": 1}\\n')
    >>> X, y = load_events(f.name, enc)
    >>> X.tolist(), y.tolist()
    ([[1.0, 0.0]], [1])
    """
    path = Path(path)
    rows: list[FloatArray] = []
    labels: list[int] = []
    for number, raw in _lines(path):
        line = raw.strip()
        if not line:
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{number}: not JSON ({exc})") from None
        if type(record) is not dict or type(record.get("features")) is not dict:
            raise DatasetError(f"{path}:{number}: expected an object with an object 'features'")
        raw_label = record.get("label")
        label = _LABELS.get(float(raw_label)) if _is_label(raw_label) else None
        if label is None:
            raise DatasetError(f"{path}:{number}: 'label' must be 1 or -1 (or 0)")
        try:
            rows.append(encoder.dense(record["features"]))
        except FieldError as exc:
            raise DatasetError(f"{path}:{number}: {exc}") from None
        labels.append(label)
    if not rows:
        raise DatasetError(f"{path}: no events")
    return np.vstack(rows), np.asarray(labels, dtype=np.int64)


def _is_label(value: Any) -> TypeGuard[int | float]:
    return type(value) in (int, float)


def load_libsvm(
    path: str | os.PathLike[str], n_features: int | None = None
) -> tuple[FloatArray, LabelArray]:
    """Read a LIBSVM sparse text file into ``(X, y)``.

    ``X`` is dense float64 of shape ``(n, d)`` with ``d = n_features`` or, when not given,
    the largest index in the file. ``y`` is int64 in ``{-1, +1}``. Blank lines and
    ``# comments`` are skipped and ``qid:`` tokens are ignored. Indices start at 1 and may
    appear at most once per line.
    """
    path = Path(path)
    if n_features is not None and n_features < 1:
        raise DatasetError(f"n_features must be >= 1, got {n_features}")
    labels: list[int] = []
    rows: list[tuple[list[int], list[float]]] = []
    max_index = 0
    for lineno, raw in _lines(path):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{lineno}"
        tokens = line.split()
        labels.append(_label(tokens[0], where))
        indices: list[int] = []
        values: list[float] = []
        seen: set[int] = set()
        for token in tokens[1:]:
            key, sep, value = token.partition(":")
            if not sep:
                raise DatasetError(f"{where}: expected index:value, got {token!r}")
            if key == "qid":
                continue
            if not key.isdigit() or int(key) < 1:
                raise DatasetError(f"{where}: feature index {key!r} is not an integer >= 1")
            index = int(key)
            if n_features is not None and index > n_features:
                raise DatasetError(
                    f"{where}: feature index {index} exceeds n_features={n_features}"
                )
            if index in seen:
                raise DatasetError(f"{where}: feature index {index} appears twice")
            seen.add(index)
            indices.append(index - 1)
            values.append(_finite(value, where, f"value of feature {index}"))
            max_index = max(max_index, index)
        rows.append((indices, values))
    if not rows:
        raise DatasetError(f"{path}: no data rows")
    width = n_features if n_features is not None else max_index
    if width < 1:
        raise DatasetError(f"{path}: no features in any row; pass n_features")
    X = np.zeros((len(rows), width), dtype=np.float64)
    for i, (indices, values) in enumerate(rows):
        X[i, indices] = values
    return X, np.asarray(labels, dtype=np.int64)


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def load_csv(path: str | os.PathLike[str]) -> tuple[FloatArray, LabelArray]:
    """Read a numeric CSV file into ``(X, y)``.

    A first row with a non-numeric field is a header; if the header names a ``label``
    column (any case) that column holds the labels, otherwise the last column does. Every
    row must have the same number of fields and every feature must be a finite number.
    """
    path = Path(path)
    labels: list[int] = []
    rows: list[list[float]] = []
    label_col = -1
    width: int | None = None
    try:
        with _open_text(path, newline="") as handle:
            reader = csv.reader(handle)
            for raw_fields in reader:
                where = f"{path}:{reader.line_num}"
                fields = [f.strip() for f in raw_fields]
                if not any(fields):
                    continue
                if width is None:
                    width = len(fields)
                    if width < 2:
                        raise DatasetError(f"{where}: need at least one feature and a label")
                    if not all(_is_number(f) for f in fields):
                        lowered = [f.lower() for f in fields]
                        label_col = lowered.index("label") if "label" in lowered else width - 1
                        continue
                    label_col = width - 1
                if len(fields) != width:
                    raise DatasetError(f"{where}: expected {width} fields, got {len(fields)}")
                labels.append(_label(fields[label_col], where))
                rows.append(
                    [
                        _finite(f, where, f"column {j + 1}")
                        for j, f in enumerate(fields)
                        if j != label_col
                    ]
                )
    except FileNotFoundError as exc:
        raise DatasetError(f"{path}: no such file") from exc
    except (*_READ_ERRORS, csv.Error) as exc:
        raise DatasetError(f"{path}: cannot read ({exc})") from exc
    if not rows:
        raise DatasetError(f"{path}: no data rows")
    return np.asarray(rows, dtype=np.float64), np.asarray(labels, dtype=np.int64)


def _sniff(path: Path) -> Format:
    name = path.with_suffix("") if _is_gzip(path) else path
    if name.suffix.lower() == ".csv":
        return "csv"
    for _, raw in _lines(path):
        line = raw.split("#", 1)[0].strip()
        if line:
            return "libsvm" if ":" in line or "," not in line else "csv"
    return "libsvm"


def dataset_format(path: str | os.PathLike[str]) -> Format:
    """The format :func:`load_dataset` reads ``path`` in when none is given (see there)."""
    return _sniff(Path(path))


def csv_header(path: str | os.PathLike[str]) -> list[str] | None:
    """The header of a CSV file as :func:`load_csv` reads it (its first non-blank row, when a
    field of it is not a number), stripped; None when the file has no header."""
    path = Path(path)
    try:
        with _open_text(path, newline="") as handle:
            for raw_fields in csv.reader(handle):
                fields = [f.strip() for f in raw_fields]
                if any(fields):
                    return None if all(_is_number(f) for f in fields) else fields
    except FileNotFoundError as exc:
        raise DatasetError(f"{path}: no such file") from exc
    except (*_READ_ERRORS, csv.Error) as exc:
        raise DatasetError(f"{path}: cannot read ({exc})") from exc
    return None


def load_dataset(
    path: str | os.PathLike[str], format: Format | None = None
) -> tuple[FloatArray, LabelArray]:
    """Read a dataset in ``format`` (``"libsvm"`` or ``"csv"``), guessed when ``None``.

    The guess: a ``.csv`` (or ``.csv.gz``) suffix means CSV; otherwise the first data line
    decides (``index:value`` tokens or no commas mean LIBSVM, commas mean CSV). A ``.gz``
    file is decompressed while it is read.
    """
    path = Path(path)
    fmt = _sniff(path) if format is None else format
    if fmt == "libsvm":
        return load_libsvm(path)
    if fmt == "csv":
        return load_csv(path)
    raise DatasetError(f"unknown dataset format {fmt!r} (expected 'libsvm' or 'csv')")
