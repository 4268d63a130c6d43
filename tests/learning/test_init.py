"""The package surface: an explicit public API and a pure learning core."""

from __future__ import annotations

import subprocess
import sys

import service.learning as learning


def test_learning_imports_no_framework() -> None:
    probe = "import sys, service.learning; print(*sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert not {"faust", "aiokafka", "prometheus_client", "mode", "pydantic"} & set(
        out.stdout.split()
    )


def test_everything_in_all_is_importable_and_documented() -> None:
    for name in learning.__all__:
        obj = getattr(learning, name)
        if callable(obj) and not isinstance(obj, dict):
            assert obj.__doc__, f"{name} has no docstring"


def test_the_contract_names_are_exported() -> None:
    expected = {
        "DRAL",
        "DSAL",
        "DSOL",
        "KernelDRAL",
        "KernelDSAL",
        "KernelDSOL",
        "make_learner",
        "learner_from_state",
        "Pipeline",
        "OnlineStandardizer",
        "Intercept",
        "LearningError",
        "StateError",
        "BatchLearner",
    }
    assert expected <= set(learning.__all__)


def test_every_error_is_a_value_error_under_learning_error() -> None:
    for name in (
        "HyperparameterError",
        "InputError",
        "DimensionError",
        "NonFiniteError",
        "LabelError",
        "StateError",
    ):
        cls = getattr(learning, name)
        assert issubclass(cls, learning.LearningError)
        assert issubclass(cls, ValueError)
