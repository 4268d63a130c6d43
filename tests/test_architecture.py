"""The rules of the house (docs/reference/architecture.md), checked on the source.

- ``service.learning`` imports numpy, the standard library and the root error only;
- ``service.records`` imports neither faust/aiokafka nor the web, stream or metrics layers;
- no folder of ``service`` holds more than :data:`MAX_MODULES` modules;
- no import cycle, type-only imports included: neither between any two modules, nor between
  the units (subpackages and modules) that sit side by side in any package (``service``'s own,
  ``service.stream``'s, ``service.learning``'s, ...), so every folder is a layer cake;
- only ``service.stream`` (and the tools above it) may import faust/aiokafka;
- every use of a private faust/aiokafka attribute sits in ``service/stream/kafka/internals.py``;
- the worker's health check sees the learner through read-only protocols only (it imports
  nothing of ``service.stream.labels``);
- no function in ``service/`` is longer than 80 lines (``create_app`` 120), except the
  declarative tables listed below.

Each rule is a function of a source tree (``tree``), so the tests below also run it on a tree
made bad on purpose: a rule that cannot fail proves nothing.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

SERVICE = Path(__file__).resolve().parents[1] / "service"

#: functions that are declarative tables (one statement per item), not logic
DECLARATIVE = {("metrics.py", "__init__")}
MAX_LINES, MAX_CREATE_APP = 80, 120
#: the most modules (``__init__.py`` included) one folder may hold
MAX_MODULES = 15


@dataclass(frozen=True)
class Module:
    name: str  # service.stream.kafka.groups; a package by its own name (service.stream.kafka)
    path: Path
    tree: ast.Module

    @property
    def package(self) -> str:
        """The package its relative imports start from."""
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


def modules(root: Path = SERVICE) -> dict[str, Module]:
    """Every module under ``root`` (the directory of the top package), by dotted name."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        out[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    return out


def imports(module: Module, known: Mapping[str, Module]) -> set[str]:
    """The modules of ``known`` that ``module`` imports, wherever the import statement is (in a
    function, under ``TYPE_CHECKING``): ``from p import m`` is an import of ``p.m`` when that
    is a module, and importing ``a.b.c`` also imports the packages ``a.b`` and ``a`` (their
    ``__init__``), except the ones ``module`` itself lives in."""
    found: set[str] = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                base = module.package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in known else source)
    own = _ancestors(module.name) | {module.name}
    for target in list(found):
        found |= _ancestors(target) - own
    return {t for t in found if t in known} - {module.name}


def _ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def module_graph(known: Mapping[str, Module]) -> dict[str, set[str]]:
    return {name: imports(m, known) for name, m in known.items()}


def unit_graphs(known: Mapping[str, Module]) -> dict[str, dict[str, set[str]]]:
    """For every package, the imports between its direct children (its units): a module of
    the unit ``a`` importing one of the unit ``b`` is an edge ``a -> b``."""
    graph = module_graph(known)
    packages = {m.name for m in known.values() if m.path.name == "__init__.py"}
    out: dict[str, dict[str, set[str]]] = {}
    for package in sorted(packages):

        def unit(name: str, package: str = package) -> str | None:
            if not name.startswith(package + "."):
                return None
            return f"{package}.{name[len(package) + 1 :].split('.')[0]}"

        edges: dict[str, set[str]] = defaultdict(set)
        for name, targets in graph.items():
            source = unit(name)
            for target in targets:
                dest = unit(target)
                if source is not None and dest is not None and dest != source:
                    edges[source].add(dest)
        out[package] = dict(edges)
    return out


def crowded_folders(root: Path = SERVICE) -> dict[str, int]:
    """Folders holding more than :data:`MAX_MODULES` modules, with their count."""
    folders = [root, *(d for d in root.rglob("*") if d.is_dir())]
    counts = {str(d.relative_to(root.parent)): len(list(d.glob("*.py"))) for d in folders}
    return {d: n for d, n in counts.items() if n > MAX_MODULES}


def long_functions(root: Path = SERVICE) -> list[str]:
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            limit = MAX_CREATE_APP if node.name == "create_app" else MAX_LINES
            if lines > limit and (path.name, node.name) not in DECLARATIVE:
                long.append(f"{path.relative_to(root)}:{node.name} ({lines} lines)")
    return long


def private_uses(root: Path = SERVICE) -> list[str]:
    """Attributes with a leading underscore reached through anything but self/cls, in the
    stream layer outside its one module of framework internals."""
    private = re.compile(r"\b(?!self\b|cls\b)([A-Za-z_]\w*)\.(_[a-z]\w*)")
    offenders = []
    for path in sorted((root / "stream").rglob("*.py")):
        if path == root / "stream" / "kafka" / "internals.py":
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            found = private.findall(code)
            offenders += [f"{path.relative_to(root)}:{lineno}: {a}.{b}" for a, b in found]
    return offenders


def _run(probe: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


# -- the rules, on the real tree ------------------------------------------------------------


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


def test_no_folder_holds_more_than_fifteen_modules() -> None:
    assert crowded_folders() == {}


def test_no_two_modules_import_each_other_even_through_others() -> None:
    assert cycles(module_graph(modules())) == []


def test_the_units_side_by_side_in_every_package_import_each_other_without_cycles() -> None:
    graphs = unit_graphs(modules())
    assert {package: found for package, g in graphs.items() if (found := cycles(g))} == {}
    assert "service.stream" not in graphs["service"].get("service.metrics", set())
    assert "service.stream" not in graphs["service"].get("service.web", set())


def test_the_health_check_imports_nothing_of_the_learner() -> None:
    graph = module_graph(modules())
    health = {n: t for n, t in graph.items() if n.startswith("service.stream.health")}
    assert {
        n: sorted(t)
        for n, t in health.items()
        if any(x.startswith("service.stream.labels") for x in t)
    } == {}


def test_only_the_stream_layer_and_the_tools_on_top_import_kafka_clients() -> None:
    allowed = ("service.stream", "service.demo", "service.localkafka", "service.desk")
    for name, module in modules().items():
        found: set[str] = set()
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found.add(node.module or "")
        kafka = {t for t in found if t.split(".")[0] in {"faust", "aiokafka"}}
        assert not kafka or name.startswith(allowed), (name, kafka)


def test_private_faust_and_aiokafka_attributes_are_used_in_internals_only() -> None:
    assert private_uses() == []


def test_no_function_is_longer_than_a_screen() -> None:
    assert long_functions() == []


# -- the same rules can fail ----------------------------------------------------------------


@pytest.fixture
def bad_tree(tmp_path: Path) -> Path:
    """A small package that breaks each rule once."""
    root = tmp_path / "service"
    files = {
        "__init__.py": "",
        "low.py": "from service.high import thing\n",  # low <-> high: a cycle of modules
        "high.py": "import service.low\nthing = 1\n",
        "pkg/__init__.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from service.pkg.b import B\n",  # a type-only import still counts
        "pkg/b.py": "from service.pkg.c import C\nB = 1\n",
        "pkg/c.py": "from service.pkg import a\nC = 1\n",
        "units/__init__.py": "",
        "units/x/__init__.py": "",
        "units/x/one.py": "from service.units.y.two import TWO\n",
        "units/y/__init__.py": "",
        "units/y/two.py": "TWO = 2\n",
        "units/y/three.py": "from service.units.x import one\n",  # x -> y -> x, no module cycle
        "stream/__init__.py": "",
        "stream/web.py": "def view(request):\n    return request._private\n",
        **{f"crowd/m{i}.py": "" for i in range(MAX_MODULES)},
        "crowd/__init__.py": "",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    body = "".join(f"    x = {i}\n" for i in range(MAX_LINES))
    (root / "long.py").write_text(f"def f():\n{body}    return x\n")
    return root


def test_the_rules_find_what_breaks_them(bad_tree: Path) -> None:
    known = modules(bad_tree)
    assert cycles(module_graph(known)) == [
        ["service.high", "service.low"],
        ["service.pkg.a", "service.pkg.b", "service.pkg.c"],
    ]
    graphs = unit_graphs(known)
    assert cycles(graphs["service.units"]) == [["service.units.x", "service.units.y"]]
    assert crowded_folders(bad_tree) == {"service/crowd": MAX_MODULES + 1}
    assert private_uses(bad_tree) == ["stream/web.py:2: request._private"]
    assert long_functions(bad_tree) == [f"long.py:f ({MAX_LINES + 2} lines)"]
