"""The style the tree keeps: ``ruff format`` lays out every Python file and ``ruff check`` finds nothing, with
the settings in pyproject.toml (line length 110 for code, docstrings and comments alike). Run
``.venv/bin/ruff format . && .venv/bin/ruff check --fix .`` to mend what these tests report.

ruff comes pinned with the test extras, so a new release's rules cannot turn a green tree red on its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_tree_is_lint_clean() -> None:
    done = ruff("check", "--output-format", "concise", ".")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_the_tree_is_formatted() -> None:
    done = ruff("format", "--check", ".")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_the_checks_use_the_projects_settings(tmp_path: Path) -> None:
    """The negative control: a file that breaks the project's line length, unsorted imports and layout fails
    both checks when checked with pyproject.toml's settings (so the two tests above can fail)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import sys\nimport os\nx = {  'a':1}\n" + "# " + "word " * 24 + "\n")
    config = ["--config", str(ROOT / "pyproject.toml")]
    checked = ruff("check", *config, "--output-format", "concise", str(bad), cwd=tmp_path)
    assert checked.returncode == 1 and "E501" in checked.stdout and "I001" in checked.stdout, checked.stdout
    assert ruff("format", *config, "--check", str(bad), cwd=tmp_path).returncode == 1
