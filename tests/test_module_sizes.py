"""The house limits on a module's size (issue 38): a module under ``tpuft/`` has at most :data:`MODULE_LIMIT`
lines, and an engine's trainer (``tpuft/worker/<kind>/train.py``) at most :data:`TRAINER_LIMIT`, as ``ruff
format`` lays them out at 110 columns.

A module over its limit is split by what the code does (a concern with its own name and its own tests moves to
a module of its own, whose docstring says why it is separate), never by packing lines denser or deleting
docstrings. The trainer's limit is lower because it is the one file a reader of an engine starts from: its
control flow stays there, its parts (model and optimizer, data, replicas, checkpoints) live beside it.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tpuft"

MODULE_LIMIT = 600
"""Lines a module under ``tpuft/`` may have."""
TRAINER_LIMIT = 500
"""Lines an engine's trainer, ``tpuft/worker/<kind>/train.py``, may have."""


def line_count(path: Path) -> int:
    """The file's lines as an editor numbers them: ``wc -l``'s count, plus a last line that lacks its
    newline."""
    return len(path.read_text(encoding="utf-8").splitlines())


def limit_of(path: Path, package: Path = PACKAGE) -> int:
    """The limit that applies to ``path``, a file under ``package``."""
    parts = path.relative_to(package).parts
    if len(parts) == 3 and parts[0] == "worker" and parts[2] == "train.py":
        return TRAINER_LIMIT
    return MODULE_LIMIT


def over_limit(package: Path = PACKAGE) -> list[str]:
    """``path: N lines (limit L)`` for every module of ``package`` over its limit, largest first."""
    found = []
    for path in sorted(package.rglob("*.py")):
        count, limit = line_count(path), limit_of(path, package)
        if count > limit:
            found.append((count, f"{path.relative_to(package.parent)}: {count} lines (limit {limit})"))
    return [line for _, line in sorted(found, key=lambda item: -item[0])]


def test_every_module_is_within_its_limit() -> None:
    over = over_limit()
    assert over == [], "split these by what the code does:\n" + "\n".join(over)


def test_the_count_is_the_files_lines(tmp_path: Path) -> None:
    """``wc -l``'s count, plus a last line without its newline; blank lines count as any other."""
    file = tmp_path / "m.py"
    file.write_text('"""Doc.\n\nMore."""\n\nx = 1\n', encoding="utf-8")
    assert line_count(file) == 5
    file.write_text("x = 1\ny = 2", encoding="utf-8")  # no newline at the end
    assert line_count(file) == 2
    file.write_text("", encoding="utf-8")
    assert line_count(file) == 0


def test_a_trainer_has_the_lower_limit_and_the_rest_the_module_limit() -> None:
    assert limit_of(PACKAGE / "worker" / "torch_xla" / "train.py") == TRAINER_LIMIT
    assert limit_of(PACKAGE / "worker" / "loop.py") == MODULE_LIMIT
    assert limit_of(PACKAGE / "ops" / "train.py") == MODULE_LIMIT  # the controller's verb, not a trainer
    assert limit_of(PACKAGE / "worker" / "torch_xla" / "parts" / "train.py") == MODULE_LIMIT


def test_a_module_over_its_limit_is_named_with_its_count(tmp_path: Path) -> None:
    package = tmp_path / "tpuft"
    (package / "worker" / "keras").mkdir(parents=True)
    (package / "small.py").write_text("x = 1\n" * MODULE_LIMIT, encoding="utf-8")
    (package / "big.py").write_text("x = 1\n" * (MODULE_LIMIT + 1), encoding="utf-8")
    (package / "worker" / "keras" / "train.py").write_text("x = 1\n" * (TRAINER_LIMIT + 1), encoding="utf-8")
    assert over_limit(package) == [
        f"tpuft/big.py: {MODULE_LIMIT + 1} lines (limit {MODULE_LIMIT})",
        f"tpuft/worker/keras/train.py: {TRAINER_LIMIT + 1} lines (limit {TRAINER_LIMIT})",
    ]
