"""Reading LIBSVM / CSV datasets: parsing, label mapping, errors, and the shared files."""

from __future__ import annotations

import gzip
from importlib.resources import files
from pathlib import Path

import numpy as np
import pytest

from service import datasets
from service.datasets import (
    DatasetError,
    data_dir,
    feature_names,
    fetched_dir,
    load_csv,
    load_dataset,
    load_libsvm,
    packaged_dataset_path,
    resolve_dataset_path,
)

SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
SHARED_PHISHING = SHARED_DATA / "phishing" / "phishing"
SHARED_GUIDE = SHARED_DATA / "svmguide1"

# svmguide1 does not ship with the package: its checks need ../shared/data beside the clone
needs_shared_guide = pytest.mark.skipif(
    not SHARED_GUIDE.exists(),
    reason=f"{SHARED_GUIDE} is absent (svmguide1 is not packaged; CI lays ../shared beside)",
)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# --- LIBSVM -----------------------------------------------------------------------------


def test_libsvm_is_densified_with_one_based_indices(tmp_path: Path) -> None:
    path = write(tmp_path, "a.svm", "1 1:0.5 3:-2\n0 2:1.5\n")
    X, y = load_libsvm(path)
    assert X.dtype == np.float64
    np.testing.assert_array_equal(X, [[0.5, 0.0, -2.0], [0.0, 1.5, 0.0]])
    np.testing.assert_array_equal(y, [1, -1])


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [(["0", "1"], [-1, 1]), (["-1", "+1"], [-1, 1]), (["1.0", "0.0"], [1, -1])],
)
def test_libsvm_labels_map_to_minus_one_plus_one(
    tmp_path: Path, tokens: list[str], expected: list[int]
) -> None:
    path = write(tmp_path, "a.svm", "".join(f"{t} 1:1\n" for t in tokens))
    _, y = load_libsvm(path)
    assert y.tolist() == expected


def test_libsvm_n_features_pads_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "a.svm", "1 2:1\n")
    X, _ = load_libsvm(path, n_features=5)
    assert X.shape == (1, 5)
    assert X[0, 1] == 1.0


def test_libsvm_skips_blank_lines_comments_and_qid(tmp_path: Path) -> None:
    path = write(tmp_path, "a.svm", "# header\n\n1 qid:3 1:2 # note\n\n-1 1:4\n")
    X, y = load_libsvm(path)
    np.testing.assert_array_equal(X, [[2.0], [4.0]])
    np.testing.assert_array_equal(y, [1, -1])


def test_libsvm_row_without_features_is_all_zero(tmp_path: Path) -> None:
    path = write(tmp_path, "a.svm", "1\n0 2:3\n")
    X, _ = load_libsvm(path)
    np.testing.assert_array_equal(X, [[0.0, 0.0], [0.0, 3.0]])


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("1 1:1\n2 1:1\n", 2, "label '2'"),
        ("1 1:1\nyes 1:1\n", 2, "not a number"),
        ("1 1:1\n\n1 0:1\n", 3, "index '0'"),
        ("1 1:1\n1 a:1\n", 2, "index 'a'"),
        ("1 1:x\n", 1, "not a number"),
        ("1 1:nan\n", 1, "not finite"),
        ("1 1:1 1:2\n", 1, "appears twice"),
        ("1 1:1 2\n", 1, "expected index:value"),
    ],
)
def test_libsvm_malformed_line_is_named(
    tmp_path: Path, text: str, line: int, fragment: str
) -> None:
    path = write(tmp_path, "bad.svm", text)
    with pytest.raises(DatasetError) as info:
        load_libsvm(path)
    message = str(info.value)
    assert f"bad.svm:{line}:" in message
    assert fragment in message


def test_libsvm_index_beyond_n_features_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "a.svm", "1 4:1\n")
    with pytest.raises(DatasetError, match="exceeds n_features=3"):
        load_libsvm(path, n_features=3)


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, "empty.svm", "\n# nothing\n")
    with pytest.raises(DatasetError, match="no data rows"):
        load_libsvm(path)


def test_missing_file_is_a_dataset_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such file"):
        load_dataset(tmp_path / "absent.svm")


def test_dataset_error_is_a_value_error() -> None:
    assert issubclass(DatasetError, ValueError)


# --- CSV --------------------------------------------------------------------------------


def test_csv_without_header_uses_last_column(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "0.5,2,1\n1.5,-1,0\n")
    X, y = load_csv(path)
    np.testing.assert_array_equal(X, [[0.5, 2.0], [1.5, -1.0]])
    np.testing.assert_array_equal(y, [1, -1])


def test_csv_header_label_column_anywhere(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "a,Label,b\n1,-1,2\n3,1,4\n")
    X, y = load_csv(path)
    np.testing.assert_array_equal(X, [[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(y, [-1, 1])


def test_csv_header_without_label_uses_last_column(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "a,b,target\n1,2,0\n")
    X, y = load_csv(path)
    np.testing.assert_array_equal(X, [[1.0, 2.0]])
    np.testing.assert_array_equal(y, [-1])


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("a,b,label\n1,2,1\n1,2\n", 3, "expected 3 fields"),
        ("1,2,1\n1,x,0\n", 2, "column 2"),
        ("1,2,1\n1,2,5\n", 2, "label '5'"),
        ("1,2,1\n\n1,inf,1\n", 3, "not finite"),
    ],
)
def test_csv_malformed_line_is_named(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path = write(tmp_path, "bad.csv", text)
    with pytest.raises(DatasetError) as info:
        load_csv(path)
    assert f"bad.csv:{line}:" in str(info.value)
    assert fragment in str(info.value)


# --- format detection and paths ---------------------------------------------------------


def test_autodetect_picks_csv_by_content(tmp_path: Path) -> None:
    path = write(tmp_path, "data.txt", "1,2,1\n3,4,0\n")
    X, y = load_dataset(path)
    assert X.shape == (2, 2)
    assert y.tolist() == [1, -1]


def test_autodetect_picks_libsvm_by_content(tmp_path: Path) -> None:
    path = write(tmp_path, "data.csv.txt", "1 1:1 2:2\n")
    X, _ = load_dataset(path)
    np.testing.assert_array_equal(X, [[1.0, 2.0]])


def test_explicit_format_overrides_detection(tmp_path: Path) -> None:
    path = write(tmp_path, "data.csv", "1 1:1\n")
    with pytest.raises(DatasetError):
        load_dataset(path)  # sniffed as CSV by its suffix: one field is not enough
    X, _ = load_dataset(path, format="libsvm")
    assert X.shape == (1, 1)


def test_data_dir_honours_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABSTAIN_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    (tmp_path / "toy").mkdir()
    write(tmp_path / "toy", "toy", "1 1:1\n")
    assert resolve_dataset_path("toy") == tmp_path / "toy" / "toy"


def test_data_dir_default_is_next_to_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    # ../shared/data when a checkout has it beside; a clone alone (a new machine) fetches
    # into its own var/data
    monkeypatch.delenv("ABSTAIN_DATA_DIR", raising=False)
    repo = Path(__file__).resolve().parent.parent
    shared = repo.parent / "shared" / "data"
    if shared.is_dir():
        assert data_dir() == shared
    else:
        assert data_dir() == fetched_dir() == repo / "var" / "data"


def test_unknown_dataset_name_lists_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ABSTAIN_DATA_DIR", str(tmp_path))
    with pytest.raises(DatasetError, match="not found") as info:
        resolve_dataset_path("nope")
    assert str(tmp_path / "nope") in str(info.value)


# --- the shared files (counts from the data README) -------------------------------------


def test_phishing_has_documented_shape_and_label_counts() -> None:
    X, y = load_dataset(resolve_dataset_path("phishing"), format="libsvm")
    assert X.shape == (11055, 68)
    assert int((y == -1).sum()) == 4898
    assert int((y == 1).sum()) == 6157
    # one-hot rows: 30 non-zeros of 0.18257 each
    assert set(np.count_nonzero(X, axis=1).tolist()) == {30}
    assert set(np.unique(X).tolist()) == {0.0, 0.18257}


@needs_shared_guide
def test_svmguide1_has_documented_shape_and_label_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ABSTAIN_DATA_DIR", raising=False)
    path = resolve_dataset_path("svmguide1")
    assert path == SHARED_GUIDE / "svmguide1"
    X, y = load_dataset(path)
    assert X.shape == (3089, 4)
    assert int((y == -1).sum()) == 1089
    assert int((y == 1).sum()) == 2000


@needs_shared_guide
def test_svmguide1_test_split_has_documented_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ABSTAIN_DATA_DIR", raising=False)
    path = resolve_dataset_path("svmguide1/svmguide1.t")
    assert path == SHARED_GUIDE / "svmguide1.t"
    X, y = load_dataset(path)
    assert X.shape == (4000, 4)
    assert int((y == -1).sum()) == 2000
    assert int((y == 1).sum()) == 2000


# --- gzip and the packaged demo dataset -------------------------------------------------


@pytest.fixture
def no_shared_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``ABSTAIN_DATA_DIR`` is an empty directory and ``../shared/data`` cannot be reached."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("ABSTAIN_DATA_DIR", str(empty))
    assert data_dir() == empty
    return empty


def test_gzipped_libsvm_given_as_a_path_loads(tmp_path: Path) -> None:
    path = tmp_path / "a.svm.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("1 1:0.5 3:-2\n0 2:1.5\n")
    assert resolve_dataset_path(path) == path
    X, y = load_dataset(path)
    np.testing.assert_array_equal(X, [[0.5, 0.0, -2.0], [0.0, 1.5, 0.0]])
    np.testing.assert_array_equal(y, [1, -1])


def test_gzipped_csv_is_sniffed_by_its_inner_suffix(tmp_path: Path) -> None:
    path = tmp_path / "a.csv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("a,label\n1.5,0\n2.5,1\n")
    X, y = load_dataset(path)
    np.testing.assert_array_equal(X, [[1.5], [2.5]])
    np.testing.assert_array_equal(y, [-1, 1])


@pytest.mark.parametrize("content", [b"not gzip at all\n", b""])
def test_damaged_gzip_is_a_dataset_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.svm.gz"
    if content:
        path.write_bytes(content)
    else:  # a gzip stream cut short
        path.write_bytes(gzip.compress(b"1 1:1\n" * 1000)[:40])
    with pytest.raises(DatasetError, match=r"bad\.svm\.gz: cannot read"):
        load_dataset(path, format="libsvm")


def test_packaged_phishing_is_package_data() -> None:
    packaged = packaged_dataset_path("phishing")
    assert packaged is not None
    assert packaged == files("service").joinpath("data", "phishing.gz")
    assert packaged.is_file()
    assert packaged.with_name("README.md").is_file()  # the attribution ships beside it
    assert packaged_dataset_path("svmguide1") is None  # only the names shipped


def test_without_shared_data_phishing_resolves_to_the_packaged_copy(
    no_shared_data: Path,
) -> None:
    path = resolve_dataset_path("phishing")
    assert path == packaged_dataset_path("phishing")
    assert path.name == "phishing.gz"
    X, y = load_dataset(path)
    assert X.shape == (11055, 68)
    assert set(np.unique(y).tolist()) == {-1, 1}
    assert int((y == -1).sum()) == 4898
    assert int((y == 1).sum()) == 6157


def test_without_shared_data_the_default_location_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ABSTAIN_DATA_DIR and no ``../shared``: the packaged copy is found all the same."""
    monkeypatch.delenv("ABSTAIN_DATA_DIR", raising=False)
    missing = tmp_path / "no-such-shared" / "data"
    monkeypatch.setattr(datasets, "data_dir", lambda: missing)
    assert resolve_dataset_path("phishing") == packaged_dataset_path("phishing")


def test_unshipped_name_without_shared_data_names_every_place(no_shared_data: Path) -> None:
    with pytest.raises(DatasetError, match="not found") as info:
        resolve_dataset_path("svmguide1")
    message = str(info.value)
    assert str(no_shared_data / "svmguide1" / "svmguide1") in message
    assert str(no_shared_data / "svmguide1") in message
    assert "svmguide1.gz" not in message


def test_environment_data_dir_wins_over_the_packaged_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ABSTAIN_DATA_DIR", str(tmp_path))
    (tmp_path / "phishing").mkdir()
    own = write(tmp_path / "phishing", "phishing", "1 1:1\n")
    assert resolve_dataset_path("phishing") == own
    flat = tmp_path / "flat"
    flat.mkdir()
    monkeypatch.setenv("ABSTAIN_DATA_DIR", str(flat))
    flat_file = write(flat, "phishing", "0 1:1\n")
    assert resolve_dataset_path("phishing") == flat_file


@pytest.mark.skipif(not SHARED_PHISHING.is_file(), reason="no ../shared/data/phishing beside")
def test_packaged_phishing_equals_the_shared_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ABSTAIN_DATA_DIR", raising=False)
    assert resolve_dataset_path("phishing") == SHARED_PHISHING  # the shared copy is preferred
    packaged = packaged_dataset_path("phishing")
    assert packaged is not None
    with gzip.open(packaged, "rb") as handle:
        assert handle.read() == SHARED_PHISHING.read_bytes()
    X_packaged, y_packaged = load_dataset(packaged)
    X_shared, y_shared = load_dataset(SHARED_PHISHING)
    np.testing.assert_array_equal(X_packaged, X_shared)
    np.testing.assert_array_equal(y_packaged, y_shared)


def test_phishing_feature_names_are_one_value_of_each_attribute_per_row(
    no_shared_data: Path,
) -> None:
    names = feature_names("phishing", 68)
    assert names is not None
    X, _ = load_dataset(resolve_dataset_path("phishing"))
    attributes: dict[str, list[int]] = {}
    for column, name in enumerate(names):
        attribute, _, value = name.partition("=")
        assert value in {"-1", "0", "1"}, name
        attributes.setdefault(attribute, []).append(column)
    assert len(attributes) == 30
    assert sorted(len(c) for c in attributes.values()) == [2] * 22 + [3] * 8
    for columns in attributes.values():  # exactly one value of each attribute in every row
        assert ((X[:, columns] != 0).sum(axis=1) == 1).all()
    assert feature_names(resolve_dataset_path("phishing"), 68) == names  # by its file too
