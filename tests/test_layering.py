"""The house rules that a test can hold: no import circle between tpuft's modules, dependencies pointing down
the flow (nothing below the CLI imports it; the worker side imports nothing of the controller side; the fleet
is a leaf), and no shared module naming a backend.

Every import statement counts, wherever it is written: at module level, inside a function, or under
``if TYPE_CHECKING``. A function-local import only delays an arrow, and a type-only one is an arrow a reader
and a type checker follow all the same; a circle of either kind means that no module of it can be read (or
moved) alone.

What is not an arrow: the registry's by-name lookups (``importlib.import_module`` of ``MODULES[kind]``), the
one sanctioned inversion that lets the recipe find a backend's section without the backend being imported by
name.

``python -m tests.test_layering`` prints the import graph's circles (the measure quoted in the closing notes).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tpuft"

CONVERTERS_OF_A_FORMAT = {
    "tpuft/convert/hf_ckpt.py": {"torch_xla"},  # reads the torch checkpoints that backend writes (its LAYOUT)
    "tpuft/convert/verify_worker.py": {
        "keras"
    },  # compares a conversion with the TF model of a Keras checkpoint
}
"""A converter of one checkpoint format may name the backend that writes that format (its ``LAYOUT``)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_nodes(path: Path) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of a file: module level, in functions and classes, and under
    ``TYPE_CHECKING``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def imported_tpuft_names(path: Path) -> set[str]:
    """The tpuft modules (and ``module.name`` candidates, for ``from package import submodule``) a file
    imports."""
    found: set[str] = set()
    for node in import_nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpuft"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("tpuft"))
    return found


def graph() -> dict[str, set[str]]:
    """module -> the tpuft modules it imports (every kind of import)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in imported_tpuft_names(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def import_circles(edges: dict[str, set[str]] | None = None) -> list[list[str]]:
    """The import graph's circles, as its strongly connected components of two modules or more (each sorted).
    A package's ``__init__`` importing its own submodules is how packages are made, not a circle: those arrows
    are left out."""
    edges = graph() if edges is None else edges
    edges = {name: {d for d in deps if not d.startswith(name + ".")} for name, deps in edges.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(edges):
            if node not in index:
                connect(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(components)


def describe(circle: list[str], edges: dict[str, set[str]]) -> str:
    members = set(circle)
    return "; ".join(f"{m} -> {', '.join(sorted(edges[m] & members))}" for m in circle)


def test_no_import_circle() -> None:
    edges = graph()
    circles = import_circles(edges)
    assert circles == [], "\n".join(describe(c, edges) for c in circles)


def test_the_circle_finder_sees_function_local_and_type_only_imports(tmp_path: Path) -> None:
    """The finder itself: a circle closed by a TYPE_CHECKING import and one closed inside a function are both
    found."""
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import tpuft.b\n"
    )
    (tmp_path / "b.py").write_text("def f():\n    from tpuft.a import x\n")
    names = {"tpuft.a": tmp_path / "a.py", "tpuft.b": tmp_path / "b.py"}
    edges = {
        name: {m for m in imported_tpuft_names(path) if m in names and m != name}
        for name, path in names.items()
    }
    assert import_circles(edges) == [["tpuft.a", "tpuft.b"]]


def test_nothing_below_the_cli_imports_it() -> None:
    for name, deps in graph().items():
        if not name.startswith(("tpuft.cli", "tpuft.launcher", "tpuft.__main__")):
            assert not any(d.startswith("tpuft.cli") for d in deps), name


def test_the_worker_side_imports_nothing_of_the_controller_side() -> None:
    for name, deps in graph().items():
        if name.startswith("tpuft.worker"):
            bad = [
                d
                for d in deps
                if d.startswith(("tpuft.cli", "tpuft.ops", "tpuft.providers", "tpuft.fleet", "tpuft.readers"))
            ]
            assert bad == [], (name, bad)


def test_the_fleet_is_a_leaf() -> None:
    """The fleet keeps connections to workers; building a fleet from a cluster belongs above it (beside
    ops)."""
    allowed = ("tpuft.fleet", "tpuft.core.records", "tpuft.core.errors", "tpuft.core.waiting")
    for name, deps in graph().items():
        if name.startswith("tpuft.fleet"):
            bad = sorted(d for d in deps if not (d in allowed or d.startswith("tpuft.fleet.")))
            assert bad == [], (name, bad)


def backend_kinds() -> list[str]:
    from tpuft.backends.registry import kinds

    return kinds()


def is_own_file(rel: str, kind: str) -> bool:
    """A backend's own files are named after it: ``backends/<kind>.py`` (planning),
    ``backends/<kind>_schema.py`` (its recipe section, capabilities and run layout) and its other planning
    parts (``backends/<kind>_*.py``, e.g. ``t5x_compile.py``), and its room on the worker side,
    ``worker/<kind>/`` (``train.py`` and its parts)."""
    return rel == f"tpuft/backends/{kind}.py" or rel.startswith(
        (f"tpuft/backends/{kind}_", f"tpuft/worker/{kind}/")
    )


def test_no_shared_module_names_a_backend() -> None:
    """Only a backend's own files, the registry and the converters of its checkpoint format know its name: in
    an import (wherever written) or as a string constant."""
    kinds = backend_kinds()
    assert {"keras", "t5x", "torch_xla"} <= set(kinds), kinds
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel == "tpuft/backends/registry.py":
            continue
        imported = " ".join(ast.unparse(n) for n in import_nodes(path))
        code = ast.parse(path.read_text())
        strings = {
            n.value for n in ast.walk(code) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        for kind in kinds:
            if is_own_file(rel, kind) or kind in CONVERTERS_OF_A_FORMAT.get(rel, ()):
                continue
            named = f"tpuft.backends.{kind}" in imported or f"tpuft.worker.{kind}" in imported
            assert not named, (rel, kind)
            assert kind not in strings, (rel, kind)


def test_loading_the_config_imports_no_backend_planner() -> None:
    """``import tpuft.config`` finds each backend's recipe section through the registry (its ``_schema``
    module) without importing the backend's planner, a trainer, or the controller's run and provider code."""
    code = (
        "import sys, tpuft.config; print(' '.join(sorted(m for m in sys.modules if m.startswith('tpuft'))))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=PACKAGE.parent
        ).stdout.split()
    )
    planners = {f"tpuft.backends.{kind}" for kind in backend_kinds()}
    assert {f"tpuft.backends.{kind}_schema" for kind in backend_kinds()} <= loaded
    bad = sorted(
        m
        for m in loaded
        if m in planners
        or m.startswith(
            ("tpuft.worker", "tpuft.readers", "tpuft.providers", "tpuft.ops", "tpuft.cli", "tpuft.fleet")
        )
    )
    assert bad == [], bad


if __name__ == "__main__":
    found = import_circles()
    every = graph()
    print(
        f"{len(every)} modules, {sum(map(len, every.values()))} import arrows (all kinds), {len(found)} "
        "circle(s)"
    )
    for circle in found:
        print(f"  {len(circle)} modules: {describe(circle, every)}")
