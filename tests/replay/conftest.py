"""Shared fixtures of the replay tests, on data that is always there.

- ``guide_like_path`` (session): a generated two-class problem in the format of the shared
  Guide file (``svmguide1``: LIBSVM text, labels ``0`` / ``1``, four unscaled features of
  very different ranges), written to ``DIR/guide-like/guide-like`` in a fresh directory
  ``DIR`` so that it also resolves by name with ``ABSTAIN_DATA_DIR=DIR``. Same seed, same
  file: 600 rows,
  about a third of them negative, linearly separable up to 2 % flipped labels once
  standardised. The shared ``svmguide1`` is not shipped; the tests of its documented
  shape are in ``tests/test_datasets.py``.
- ``guide_like`` (session): that file loaded, ``(X, y)`` with ``y`` in ``{-1, +1}``.
- ``phishing`` (session): the Phishing dataset (the shared copy when ``../shared/data`` is
  beside the repository, else the copy shipped in the package).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from service.datasets import load_dataset, resolve_dataset_path

Dataset = tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]

GUIDE_LIKE = "guide-like"
GUIDE_LIKE_ROWS = 600
GUIDE_LIKE_SEED = 20_200_101

# raw feature i = LOC[i] + SCALE[i] * z_i, z standard normal: ranges as different as Guide's
_LOC = np.array([30.0, 110.0, 0.07, 115.0])
_SCALE = np.array([30.0, 90.0, 0.25, 35.0])
_NORMAL = np.array([1.0, 2.0, -0.5, 1.0]) / np.linalg.norm([1.0, 2.0, -0.5, 1.0])


def write_guide_like(path: Path, rows: int = GUIDE_LIKE_ROWS, seed: int = GUIDE_LIKE_SEED) -> Path:
    """Write ``rows`` rows of the Guide-like problem to ``path`` (LIBSVM, labels 0 / 1).

    The label is the side of the hyperplane ``z . normal = -0.4`` in standardised space;
    points within 0.25 of it are dropped (a margin), then 2 % of the labels are flipped.
    """
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((4 * rows, _LOC.size))
    side = z @ _NORMAL + 0.4
    keep = np.abs(side) > 0.25
    z, side = z[keep][:rows], side[keep][:rows]
    labels = (side > 0).astype(np.int64)
    flip = rng.random(rows) < 0.02
    labels[flip] = 1 - labels[flip]
    X = _LOC + _SCALE * z
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for label, row in zip(labels.tolist(), X.tolist(), strict=True):
            features = " ".join(f"{j}:{v:.6e}" for j, v in enumerate(row, start=1))
            handle.write(f"{label} {features}\n")
    return path


@pytest.fixture(scope="session")
def guide_like_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    return write_guide_like(root / GUIDE_LIKE / GUIDE_LIKE)


@pytest.fixture(scope="session")
def guide_like(guide_like_path: Path) -> Dataset:
    X, y = load_dataset(guide_like_path)
    assert X.shape == (GUIDE_LIKE_ROWS, 4)
    assert 0.25 < float((y == -1).mean()) < 0.45  # both classes, the larger one positive
    return X, y


@pytest.fixture(scope="session")
def phishing() -> Dataset:
    return load_dataset(resolve_dataset_path("phishing"))
