"""The docs that live in the repository stay true: the key references are what the schema says now, the layer
table and diagram of docs/ARCHITECTURE.md are what tests/layers.py says now, the README stays a five-minute
read, and every relative link in README.md and docs/ reaches a file that exists."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README_MAX_LINES = 300

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|<a\s+href=\"([^\"]+)\"")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def generator(name: str = "gen_reference") -> ModuleType:
    """A generator of docs/ (``gen_reference``, ``gen_architecture``), loaded by path: docs/ is no package,
    and the script is meant to be run as a file (docs/docgen.py, which it imports, is found beside it)."""
    if str(DOCS) not in sys.path:
        sys.path.insert(0, str(DOCS))
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_the_key_references_are_what_the_schema_says_now() -> None:
    gen = generator()
    for path, text in gen.outputs().items():
        assert path.is_file(), f"{path.relative_to(REPO)} is missing: run {gen.COMMAND}"
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(REPO)} is stale: run {gen.COMMAND}"
        )
    assert gen.main(["--check"]) == 0


def test_the_recipe_reference_holds_every_key_and_every_backend_section() -> None:
    gen = generator()
    from tpuft.config import RecipeConfig

    text = gen.recipe_reference()
    for name in RecipeConfig.model_fields:
        assert f"| `{name}` |" in text, name
    for key in (
        "train.steps",
        "train.grad_accum_steps",
        "data.hf.path",
        "model.config.d_model",
        "eval.metric",
    ):
        assert f"| `{key}` |" in text, key
    models = gen.backend_models()
    assert len(models) >= 3
    for model in models:
        assert f"## `backend` with `kind: {gen._kind_of(model)}`" in text
        for name in model.model_fields:
            assert f"| `backend.{name}` |" in text, (gen._kind_of(model), name)


def test_the_check_mode_notices_a_stale_copy(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    gen = generator()
    stale = tmp_path / "recipe-reference.md"
    stale.write_text(gen.recipe_reference().replace("Optimizer steps in total.", "Steps."), encoding="utf-8")
    monkeypatch.setattr(gen, "RECIPE_REFERENCE", stale)
    monkeypatch.setattr(gen, "REPO", tmp_path.parent)
    assert gen.stale()[0] == stale
    assert gen.main(["--check"]) == 1


def test_the_architecture_layers_are_what_tests_layers_says_now() -> None:
    gen = generator("gen_architecture")
    for path, text in gen.outputs().items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(REPO)} is stale: run {gen.COMMAND}"
        )
    assert gen.main(["--check"]) == 0
    from tests.layers import LAYERS

    text = gen.generated()
    assert "```mermaid" in text
    for layer in LAYERS:
        assert f"| **{layer.name}** |" in text, layer.name
        for below in layer.imports:
            assert f"  {layer.name} --> {below}\n" in text, (layer.name, below)


def test_the_architecture_check_notices_a_stale_table(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    gen = generator("gen_architecture")
    page = tmp_path / "ARCHITECTURE.md"
    page.write_text(gen.ARCHITECTURE.read_text(encoding="utf-8").replace("  cli --> ops", "  cli --> worker"))
    monkeypatch.setattr(gen, "ARCHITECTURE", page)
    monkeypatch.setattr(gen, "REPO", tmp_path.parent)
    assert gen.stale() == [page]
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.stale() == []  # rewritten: only the part between the markers


def test_the_readme_is_a_five_minute_read() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


def test_the_readme_keeps_the_two_commands_that_ci_runs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    test_command = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/pytest"
    assert test_command in readme and test_command in ci
    assert "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/tpuft up quickstart" in readme


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def _relative_links(path: Path) -> list[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    found = []
    for match in _LINK.finditer(text):
        target = match.group(1) or match.group(2)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#"):
            found.append(target)
    return found


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors (lowercase, punctuation dropped, spaces to dashes) and explicit ``<a
    id>``s."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    anchors = set(re.findall(r"<a id=\"([^\"]+)\"", text))
    for heading in re.findall(r"^#+\s+(.*)$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_every_relative_link_reaches_a_file_that_exists() -> None:
    broken = []
    for page in _markdown_files():
        for link in _relative_links(page):
            target, _, anchor = link.partition("#")
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {link}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(REPO)}: {link} (no such heading)")
    assert broken == [], broken


def test_the_link_check_sees_links() -> None:
    """The check above is not vacuous: the README links into docs/."""
    assert any(link.startswith("docs/") for link in _relative_links(REPO / "README.md"))


_REPO_PATH = re.compile(r"`((?:tpuft|tests|benchmarks|recipes|docs|\.ci)/[^`\s]*)`")


def test_every_repository_path_the_docs_name_exists() -> None:
    """A module that moves takes its mentions along: `tpuft/...`, `tests/...` paths in code spans must exist
    (placeholders such as `<kind>` and globs are skipped; `path:line` and `path::test` name the path)."""
    missing = []
    for page in _markdown_files():
        for path in _REPO_PATH.findall(page.read_text(encoding="utf-8")):
            if any(mark in path for mark in ("<", "*", "{", "NAME")):
                continue
            path = re.split(r"::|:|\(", path)[0]
            if not (REPO / path).exists():
                missing.append(f"{page.relative_to(REPO)}: {path}")
    assert missing == [], missing


def test_the_code_cites_the_architecture_page_where_it_is() -> None:
    """Docstrings cite the rulebook by its path in the repository (docs/), the only place a clone has it."""
    bare = []
    for path in [*sorted((REPO / "tpuft").rglob("*.py")), *sorted((REPO / "tests").rglob("*.py"))]:
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if re.search(r"(?<![/\w])ARCHITECTURE\.md", line):
                bare.append(f"{path.relative_to(REPO)}:{number}")
    assert bare == [], bare
    assert (DOCS / "ARCHITECTURE.md").is_file()
