"""The run sequencer (:mod:`tpuft.worker.loop`) is the only place that decides what happens after a step and
at the end of a run: an engine's modules (``tpuft/worker/<kind>/``) supply acts and never call the run's
bookkeeping themselves. Read from the source (an AST walk), so it holds for code no test runs (a TPU-only
path)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "tpuft" / "worker"
ENGINES = ("keras", "t5x", "torch_xla")

FORBIDDEN_ATTRIBUTES = {"log_train", "judge", "finished", "record_eval", "record_test", "save_asked"}
"""Calls of the bookkeeping on whatever object (``loop.log_train(...)``, ``self.loop.judge(...)``)."""
FORBIDDEN_NAMES = {"serve", "CheckpointRequests", "hold"}
"""The request server, by the names it is imported as from :mod:`tpuft.worker.ondemand`."""
FORBIDDEN_MODULE_CALLS = {("events", "record"), ("ondemand", "serve")}
"""``events.record(...)``: the goodput events."""


def offences(source: str) -> list[str]:
    tree = ast.parse(source)
    served = {  # the request server's names as this module imports them (predict has a serve() of its own)
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "tpuft.worker.ondemand"
        for alias in node.names
        if alias.name in FORBIDDEN_NAMES
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if func.attr in FORBIDDEN_ATTRIBUTES or (owner, func.attr) in FORBIDDEN_MODULE_CALLS:
                found.append(f"line {node.lineno}: {ast.unparse(func)}()")
        elif isinstance(func, ast.Name) and func.id in served:
            found.append(f"line {node.lineno}: {func.id}()")
    return found


def engine_modules() -> list[Path]:
    return sorted(path for kind in ENGINES for path in (ROOT / kind).glob("*.py"))


def test_no_engine_module_calls_the_run_s_bookkeeping() -> None:
    modules = engine_modules()
    assert len(modules) > 20, modules  # the walk sees the engines' rooms
    bad = {str(path.relative_to(ROOT)): found for path in modules if (found := offences(path.read_text()))}
    assert not bad, f"engines call the sequencer's bookkeeping themselves (hand over instead): {bad}"


def test_the_check_fails_on_an_engine_that_keeps_its_own_books() -> None:
    """The negative control: what the engines did before the sequencer."""
    source = """
from tpuft.worker.ondemand import serve

def on_batch_end(self, step):
    logged = self.loop.log_train(step, loss=1.0, lr=0.1)
    serve(requests, step, save, say, beat)
    if self.loop.judge(step, row).stop:
        pass
    events.record("export", 0.0, 1.0, step=step)
    self.loop.finished(step)
"""
    assert sorted(line.split(": ", 1)[1] for line in offences(source)) == sorted(
        [
            "self.loop.log_train()",
            "serve()",
            "self.loop.judge()",
            "events.record()",
            "self.loop.finished()",
        ]
    )
    assert offences("loop.beat(3, phase='step')\nsequencer.after_step(loop, 3, self, requests)\n") == []
