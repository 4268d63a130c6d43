"""The rules of the house (docs/architecture.md), checked on the source.

- ``service.learning`` imports numpy, the standard library and the root error only;
- ``service.records`` imports neither faust/aiokafka nor the web, stream or metrics layers;
- the units of ``service`` (subpackages and top-level modules) import each other without
  cycles, and only ``service.stream`` (and the tools above it) may import faust/aiokafka;
- every use of a private faust/aiokafka attribute sits in ``service/stream/kafka/internals.py``;
- no function in ``service/`` is longer than 80 lines (``create_app`` 120), except the
  declarative tables listed below.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[1] / "service"

#: functions that are declarative tables (one statement per item), not logic
DECLARATIVE = {("metrics.py", "__init__")}
MAX_LINES, MAX_CREATE_APP = 80, 120


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(SERVICE.rglob("*.py")):
        name = ".".join(path.relative_to(SERVICE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = ast.parse(path.read_text(), str(path))
    return out


def _imports(module: str, tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = module.split(".")[: -node.level]
                found.add(".".join([*base, node.module or ""]).rstrip("."))
            else:
                found.add(node.module or "")
    return found


def _unit(module: str) -> str:
    """``service.stream.app`` -> ``service.stream``; ``service.config`` stays."""
    parts = module.split(".")
    return ".".join(parts[:2])


def _run(probe: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True)  # fmt: skip
    return set(out.stdout.split())


def test_learning_imports_numpy_the_standard_library_and_the_root_error_only() -> None:
    loaded = _run("import sys, service.learning; print(*sorted(sys.modules))")
    ours = {m for m in loaded if m.startswith("service")}
    assert ours == {"service", "service.errors"} | {
        m for m in ours if m.startswith("service.learning")
    }
    top = {m.split(".")[0] for m in loaded if not m.startswith("_")}
    assert top - set(sys.stdlib_module_names) - {"numpy", "service"} == set()


def test_records_import_neither_faust_nor_the_layers_above_them() -> None:
    loaded = _run("import sys, service.records; print(*sorted(sys.modules))")
    forbidden = {"faust", "aiokafka", "mode", "prometheus_client", "aiohttp"}
    assert not forbidden & {m.split(".")[0] for m in loaded}
    above = ("service.web", "service.stream", "service.metrics", "service.config")
    assert not [m for m in loaded if m.startswith(above)]


def test_units_of_the_package_import_each_other_without_cycles() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, tree in _modules().items():
        for target in _imports(module, tree):
            if target.startswith("service.") and _unit(target) != _unit(module):
                graph[_unit(module)].add(_unit(target))
    state: dict[str, int] = {}

    def visit(unit: str, path: list[str]) -> None:
        state[unit] = 1
        for nxt in sorted(graph[unit]):
            if state.get(nxt) == 1:
                pytest.fail(f"import cycle: {' -> '.join([*path, unit, nxt])}")
            if nxt not in state:
                visit(nxt, [*path, unit])
        state[unit] = 2

    for unit in sorted(graph):
        if unit not in state:
            visit(unit, [])
    assert "service.stream" not in graph["service.metrics"] | graph["service.web"]


def test_only_the_stream_layer_and_the_tools_on_top_import_kafka_clients() -> None:
    allowed = ("service.stream", "service.demo", "service.localkafka", "service.desk")
    for module, tree in _modules().items():
        kafka = {t for t in _imports(module, tree) if t.split(".")[0] in {"faust", "aiokafka"}}
        assert not kafka or module.startswith(allowed), (module, kafka)


def test_private_faust_and_aiokafka_attributes_are_used_in_internals_only() -> None:
    # an attribute with a leading underscore reached through anything but self/cls
    private = re.compile(r"\b(?!self\b|cls\b)([A-Za-z_]\w*)\.(_[a-z]\w*)")
    offenders = []
    for path in sorted((SERVICE / "stream").rglob("*.py")):
        if path == SERVICE / "stream" / "kafka" / "internals.py":
            continue
        name = path.relative_to(SERVICE)
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            offenders += [f"{name}:{lineno}: {a}.{b}" for a, b in private.findall(code)]
    assert offenders == []


def test_no_function_is_longer_than_a_screen() -> None:
    long = []
    for path in sorted(SERVICE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            limit = MAX_CREATE_APP if node.name == "create_app" else MAX_LINES
            if lines > limit and (path.name, node.name) not in DECLARATIVE:
                long.append(f"{path.relative_to(SERVICE)}:{node.name} ({lines} lines)")
    assert long == []
