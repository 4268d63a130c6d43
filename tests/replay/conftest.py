"""Shared fixtures of the replay tests: the shared datasets, loaded once per session."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from service.datasets import load_dataset, resolve_dataset_path

Dataset = tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]


@pytest.fixture(scope="session")
def guide() -> Dataset:
    return load_dataset(resolve_dataset_path("svmguide1"))


@pytest.fixture(scope="session")
def phishing() -> Dataset:
    return load_dataset(resolve_dataset_path("phishing"))
