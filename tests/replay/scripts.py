"""Load a benchmark script of ``loadtest/`` as a module, for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

LOADTEST = Path(__file__).resolve().parents[2] / "loadtest"


def load_script(filename: str, name: str) -> ModuleType:
    """``loadtest/<filename>`` imported as the module ``name`` (registered in
    ``sys.modules``, so its dataclasses and pickling work)."""
    spec = importlib.util.spec_from_file_location(name, LOADTEST / filename)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
