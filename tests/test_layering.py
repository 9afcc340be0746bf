"""The house rules that a test can hold: no import circle between tpuft's modules, every import arrow allowed
by the layer table (``tests/layers.py``, the data docs/ARCHITECTURE.md's table and diagram are generated
from), dependencies pointing down the flow (nothing below the CLI imports it; nothing outside the worker
imports it; the worker side imports nothing of the controller side; the fleet is a leaf), and no shared module
naming a backend.

Every import statement counts, wherever it is written: at module level, inside a function, or under
``if TYPE_CHECKING``. A function-local import only delays an arrow, and a type-only one is an arrow a reader
and a type checker follow all the same; a circle of either kind means that no module of it can be read (or
moved) alone.

Importing a module also runs the ``__init__`` of every package above it, so that is an arrow too (to each
package above the imported module, other than the importer's own packages, which were loaded before it).

What is not an arrow: the registry's by-name lookups (``importlib.import_module`` of ``MODULES[kind]``), the
one sanctioned inversion that lets the recipe find a backend's section without the backend being imported by
name; and a module named in a string for ``python -m`` (``"tpuft.worker.supervisor.process"``), which runs it
in another process.

``python -m tests.test_layering`` prints the import graph's size, its circles and the arrows per layer (the
measure quoted in docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

from tests.layers import BY_NAME, LAYERS, allowed, layer_of

PACKAGE = Path(__file__).resolve().parents[1] / "tpuft"
RECIPES = PACKAGE / "recipes"
"""Package data, not modules: the shipped recipes' data scripts (``data/numbers/make.py``, ``fetch.py``) are
run by hand with ``python``, never imported."""


def package_files() -> list[Path]:
    """Every module of the package (the recipes' data scripts left out)."""
    return [path for path in PACKAGE.rglob("*.py") if RECIPES not in path.parents]


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


def ancestors(name: str) -> list[str]:
    """The packages above a module, nearest first: ``a.b.c`` -> ``a.b``, ``a``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def imported_modules(path: Path, name: str, modules: Collection[str]) -> set[str]:
    """The tpuft modules that importing the file ``path`` (module ``name``) loads: each module it names
    (``from package import submodule`` names the submodule; ``from package import name`` the package's
    ``__init__``), and each package ``__init__`` above a named module, which Python runs first. The packages
    above ``name`` itself are left out: they were loaded before it, and are no arrow of its."""
    named: set[str] = set()
    for node in import_nodes(path):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpuft"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                named.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            named.update(alias.name for alias in node.names if alias.name.startswith("tpuft"))
    own = set(ancestors(name))
    loaded = {m for target in named for m in (target, *ancestors(target)) if m not in own}
    return {m for m in loaded if m in modules and m != name}


def graph(modules: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """module -> the tpuft modules it imports (every kind of import), package ``__init__`` files included."""
    modules = {module_name(p): p for p in package_files()} if modules is None else modules
    return {name: imported_modules(path, name, modules) for name, path in modules.items()}


def import_circles(edges: dict[str, set[str]] | None = None) -> list[list[str]]:
    """The import graph's circles, as its strongly connected components of two modules or more (each sorted).
    A package's ``__init__`` importing its own submodules is how packages are made, not a circle: a submodule
    has no arrow to the packages above it (:func:`imported_modules`), so such an arrow closes a circle only
    when the way back leaves the package and comes in again from outside."""
    edges = graph() if edges is None else edges
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
    assert import_circles(graph(names)) == [["tpuft.a", "tpuft.b"]]


def test_the_circle_finder_counts_package_inits(tmp_path: Path) -> None:
    """A package's ``__init__`` importing its own submodules is no circle; one whose submodule's imports leave
    the package and come back to it (importing ``pkg.registry`` runs ``pkg/__init__`` first) is: the shape
    of the circle ``backends/__init__`` -> ``backends/base`` -> ``config/recipe`` -> ``backends.registry``
    had."""
    files = {
        "pkg/__init__.py": "from tpuft.pkg.registry import kinds\nfrom tpuft.pkg import leaf\n",
        "pkg/registry.py": "",
        "pkg/leaf.py": "from tpuft.pkg.registry import kinds\n",
        "pkg/base.py": "if TYPE_CHECKING:\n    from tpuft.recipe import R\n",
        "recipe.py": "from tpuft.pkg.registry import kinds\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    names = {
        "tpuft." + rel.removesuffix(".py").removesuffix("/__init__").replace("/", "."): tmp_path / rel
        for rel in files
    }
    edges = graph(names)
    assert edges["tpuft.recipe"] == {"tpuft.pkg", "tpuft.pkg.registry"}  # the package's __init__ runs first
    assert edges["tpuft.pkg.leaf"] == {"tpuft.pkg.registry"}  # no arrow to the package it is in
    assert import_circles(edges) == []
    (tmp_path / "pkg/__init__.py").write_text(files["pkg/__init__.py"] + "from tpuft.pkg import base\n")
    assert import_circles(graph(names)) == [["tpuft.pkg", "tpuft.pkg.base", "tpuft.recipe"]]


def test_nothing_below_the_cli_imports_it() -> None:
    for name, deps in graph().items():
        if not name.startswith(("tpuft.cli", "tpuft.launcher", "tpuft.__main__")):
            assert not any(d.startswith("tpuft.cli") for d in deps), name


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    """Every arrow the layer table does not allow, as ``module (layer) -> module (layer)``."""
    bad = []
    for name, deps in sorted(edges.items()):
        here = layer_of(name)
        for dep in sorted(deps):
            there = layer_of(dep)
            if here is None or there is None or there not in allowed(here):
                bad.append(f"{name} ({here}) -> {dep} ({there})")
    return bad


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(name for name in graph() if layer_of(name) is None)
    assert unplaced == [], f"name their layer in tests/layers.py: {unplaced}"


def test_the_layer_table_is_bottom_up() -> None:
    """A layer imports only layers before it in the table (so the table can be read bottom up and the
    allowed arrows have no circle), and every layer has modules."""
    seen: set[str] = set()
    for layer in LAYERS:
        assert set(layer.imports) <= seen, (layer.name, sorted(set(layer.imports) - seen))
        seen.add(layer.name)
    placed = {layer_of(name) for name in graph()}
    assert placed == set(BY_NAME), sorted(set(BY_NAME) - placed)


def test_every_import_arrow_is_allowed_by_the_layer_table() -> None:
    bad = layer_violations(graph())
    assert bad == [], "\n".join(bad)


def test_the_layer_check_sees_an_arrow_up() -> None:
    """The check itself: an arrow up (a foundation importing a verb), an arrow across (the worker importing a
    reader) and an unplaced module are reported; arrows down are not."""
    edges = {
        "tpuft.core.errors": {"tpuft.ops.train"},
        "tpuft.worker.loop": {"tpuft.readers.runs", "tpuft.run.rundir", "tpuft.data.examples"},
        "tpuft.ops.train": {"tpuft.worker.supervisor.process", "tpuft.host.supervisor_cli"},
        "tpuft.nowhere": set(),
        "tpuft.cli.app": {"tpuft.nowhere"},
    }
    assert layer_violations(edges) == [
        "tpuft.cli.app (cli) -> tpuft.nowhere (None)",
        "tpuft.core.errors (foundations) -> tpuft.ops.train (ops)",
        "tpuft.ops.train (ops) -> tpuft.worker.supervisor.process (worker)",
        "tpuft.worker.loop (worker) -> tpuft.readers.runs (readers)",
    ]


def outside_imports_of_the_worker(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{name} -> {dep}"
        for name, deps in edges.items()
        if not (name == "tpuft.worker" or name.startswith("tpuft.worker."))
        for dep in deps
        if dep == "tpuft.worker" or dep.startswith("tpuft.worker.")
    )


def test_nothing_outside_the_worker_imports_it() -> None:
    """What the controller and the workers both need lives in a layer both import (``data``, ``scoring``,
    ``host``, ``run``), not in ``worker/``. Naming a worker module for ``python -m`` is no import."""
    assert outside_imports_of_the_worker(graph()) == []


def test_the_worker_rule_sees_an_import_and_not_a_module_string(tmp_path: Path) -> None:
    (tmp_path / "verb.py").write_text(
        'SUPERVISOR = ("-m", "tpuft.worker.supervisor.process")\n'
        "def f():\n    from tpuft.worker.data import Fields\n"
    )
    (tmp_path / "other.py").write_text('MODULE = "tpuft.worker.data"\n')
    (tmp_path / "data.py").write_text("")
    names = {
        "tpuft.ops.verb": tmp_path / "verb.py",
        "tpuft.ops.other": tmp_path / "other.py",
        "tpuft.worker.data": tmp_path / "data.py",
    }
    assert outside_imports_of_the_worker(graph(names)) == ["tpuft.ops.verb -> tpuft.worker.data"]


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
    allowed = ("tpuft.fleet", "tpuft.core", "tpuft.core.records", "tpuft.core.errors", "tpuft.core.waiting")
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
    for path in package_files():
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
        f"{len(every)} modules, {sum(map(len, every.values()))} import arrows (all kinds, package __init__ "
        f"files counted), {len(found)} circle(s)"
    )
    for circle in found:
        print(f"  {len(circle)} modules: {describe(circle, every)}")
    for layer in LAYERS:
        members = [name for name in every if layer_of(name) == layer.name]
        arrows = sum(len(every[name]) for name in members)
        print(f"  {layer.name}: {len(members)} modules, {arrows} arrows out")
    for line in layer_violations(every):
        print(f"  not allowed: {line}")
