"""The house rules of ARCHITECTURE.md that a test can hold: no import circle between tpuft's modules (imports at
module level; those inside functions and under TYPE_CHECKING are lazy by design), dependencies pointing down the flow
(nothing below the CLI imports it; the worker side imports nothing of the controller side), and no shared module
naming a backend."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tpuft"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def eager_imports(path: Path) -> set[str]:
    """tpuft modules imported at module level (not in a function, not under ``if TYPE_CHECKING``)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else []:
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("tpuft"):
                found.add(sub.module)
                found.update(f"{sub.module}.{a.name}" for a in sub.names)
            elif isinstance(sub, ast.Import):
                found.update(a.name for a in sub.names if a.name.startswith("tpuft"))
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in eager_imports(path) if m in modules and m != name} for name, path in modules.items()}


def test_no_import_circle() -> None:
    edges = graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    # a package's __init__ importing its own submodules is how packages are made, not a circle
    real = [c for c in cycles if not all(c[0].startswith(m) or m.startswith(c[0]) for m in c)]
    assert real == [], real


def test_nothing_below_the_cli_imports_it() -> None:
    for name, deps in graph().items():
        if not name.startswith(("tpuft.cli", "tpuft.launcher", "tpuft.__main__")):
            assert not any(d.startswith("tpuft.cli") for d in deps), name


def test_the_worker_side_imports_nothing_of_the_controller_side() -> None:
    for name, deps in graph().items():
        if name.startswith("tpuft.worker"):
            bad = [d for d in deps if d.startswith(("tpuft.cli", "tpuft.ops", "tpuft.providers", "tpuft.fleet", "tpuft.runs"))]
            assert bad == [], (name, bad)


def test_no_shared_module_names_a_backend() -> None:
    """Only a backend's own two files, the registry and the converters of its checkpoint format know its name."""
    own = {"tpuft/backends/torch_xla.py", "tpuft/worker/torch_xla_train.py", "tpuft/backends/registry.py"}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel in own or rel.startswith("tpuft/convert/"):
            continue
        code = ast.parse(path.read_text())
        names = [n for n in ast.walk(code) if isinstance(n, (ast.ImportFrom, ast.Import))]
        text = " ".join(ast.unparse(n) for n in names)
        assert "torch_xla" not in text, rel
        strings = [n.value for n in ast.walk(code) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        assert not any(s == "torch_xla" for s in strings), rel
