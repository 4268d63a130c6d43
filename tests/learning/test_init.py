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


def test_the_package_exports_what_a_model_is_built_from_and_no_more() -> None:
    expected = {
        "DRAL",
        "DSAL",
        "DSOL",
        "KernelDRAL",
        "KernelDSAL",
        "KernelDSOL",
        "make_learner",
        "learner_from_state",
        "serving_learner",
        "Pipeline",
        "LearningError",
        "StateError",
    }
    assert expected <= set(learning.__all__)
    assert len(learning.__all__) <= 25
    assert len(set(learning.__all__)) == len(learning.__all__)


def test_each_family_exports_its_own_names() -> None:
    import importlib

    families = ("adaptive", "budget", "drift", "kernel", "linear", "risk")
    for family in families:
        module = importlib.import_module(f"service.learning.{family}")
        assert module.__all__, family
        for name in module.__all__:
            assert getattr(module, name) is not None, (family, name)


def test_every_error_is_a_value_error_under_learning_error() -> None:
    from service.learning import errors

    for name in (
        "HyperparameterError",
        "InputError",
        "DimensionError",
        "NonFiniteError",
        "LabelError",
        "StateError",
    ):
        cls = getattr(errors, name)
        assert issubclass(cls, learning.LearningError)
        assert issubclass(cls, ValueError)
