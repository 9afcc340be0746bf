"""The commands README.md and docs/ show are true and stay true: every ``tpuft ...`` line (in code blocks and
inline code) parses with the real command tree (the verb exists, each option exists for it, values have the
option's type unless they are placeholders such as RUN or <run>), the recipes it names exist (shipped, or
copied by an earlier ``tpuft recipes cp`` of the same page), and its ``--set`` keys are recipe keys. Figures
the code computes (the ``recipes show --summary`` transcripts, the quickstart's size) are computed here and
compared, not copied.

``python -m tests.test_readme_commands --write`` rewrites the transcripts with what the code prints now."""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TRANSCRIPT_COLUMNS = 116
"""The terminal width the docs' transcripts were printed at (Rich wraps its tables to it)."""

_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"`((?:\.venv/bin/)?tpuft [^`]*)`")  # a bare `tpuft` is a name (W&B's default project)
_PLACEHOLDER = re.compile(r"\[?(<[^>]+>|[A-Z][A-Z0-9_]*(\.\.\.)?|\.\.\.)\]?")
"""RUN, CKPT, OUT_DIR, CMD..., <run>, [RUN]: a value the reader supplies."""


@dataclass
class Command:
    page: Path
    line: int
    text: str
    created: dict[str, str] = field(default_factory=dict)
    """Files an earlier ``tpuft recipes cp SRC DEST`` on the page made: DEST -> SRC."""

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}: {self.text}"


def commands_on(page: Path) -> Iterator[Command]:
    """Every tpuft command of the page, in page order, with the recipes copied before it."""
    text = page.read_text(encoding="utf-8")
    found: list[tuple[int, str]] = []
    for block in _FENCE.finditer(text):
        first = text.count("\n", 0, block.start(2)) + 1
        lines = block.group(2).replace("\\\n", " ").splitlines()
        prompted = any(line.lstrip().startswith("$ ") for line in lines)
        for offset, line in enumerate(lines):
            line = line.strip()
            if prompted and not line.startswith("$ "):
                continue  # a transcript's output
            found += [(first + offset, part) for part in tpuft_parts(line.removeprefix("$ "))]
    prose = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for match in _INLINE.finditer(prose):
        found += [(prose.count("\n", 0, match.start()) + 1, part) for part in tpuft_parts(match.group(1))]
    created: dict[str, str] = {}
    for line, command in sorted(found):
        yield Command(page, line, command, dict(created))
        words = command.split()
        if words[1:3] == ["recipes", "cp"] and len(words) >= 5:
            created[words[4]] = words[3]


def tpuft_parts(line: str) -> list[str]:
    """The tpuft commands of a shell line (``a && tpuft x | head``: ``tpuft x``)."""
    parts = (part.strip() for part in re.split(r"&&|;|\|\|?", line))
    return [
        p for p in parts if p.startswith(("tpuft ", ".venv/bin/tpuft ")) or p in ("tpuft", ".venv/bin/tpuft")
    ]


ALL = [c for page in PAGES for c in commands_on(page)]


def is_placeholder(value: str) -> bool:
    return bool(_PLACEHOLDER.fullmatch(value))


def parse(command: Command) -> tuple[object, dict[str, object]]:
    """The verb's click command and its parsed parameters; AssertionError naming what is wrong."""
    from typer.main import get_command

    from tpuft.cli import app

    try:
        words = shlex.split(command.text, comments=True)[1:]
    except ValueError as exc:
        raise AssertionError(f"{command}: not a shell line ({exc})") from None
    # [RUN]: optional
    words = [w for w in words if not (w.startswith("[") and w.endswith("]") and is_placeholder(w))]
    node = get_command(app)
    path = ["tpuft"]
    while True:
        _disarm(node)
        context = _context(node, path, words, command)
        rest = [*getattr(context, "_protected_args", []), *context.args]
        subcommands = getattr(node, "commands", None)
        if subcommands is None or not rest:
            return node, context.params
        name, words = rest[0], rest[1:]
        if "/" in name and all(part in subcommands for part in name.split("/")):
            return node, {}  # `recipes ls/show/cp/validate`: a table's shorthand for several verbs
        assert name in subcommands, f"{command}: {' '.join(path)} has no command {name!r}"
        node, path = subcommands[name], [*path, name]


def _disarm(node) -> None:  # type: ignore[no-untyped-def]
    """Parse without acting: no option callback runs (``--install-completion`` would edit the shell's rc file,
    ``--help`` and ``--version`` would print)."""
    import typer

    for param in node.get_params(typer.Context(node)):
        param.callback = None


def _context(node, path: list[str], words: list[str], command: Command):  # type: ignore[no-untyped-def]
    import typer

    try:
        return node.make_context(" ".join(path), list(words))  # type: ignore[attr-defined]
    except typer.Exit:  # --help, --version: they parsed
        return node.make_context(" ".join(path), [], resilient_parsing=True)  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - Click's (vendored by Typer) usage errors have no common base here
        kind = type(exc).__name__
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if kind == "MissingParameter":  # prose that names a verb without its arguments
            return node.make_context(" ".join(path), list(words), resilient_parsing=True)  # type: ignore[attr-defined]
        if kind == "BadParameter" and any(is_placeholder(w) for w in words):
            return node.make_context(" ".join(path), list(words), resilient_parsing=True)  # type: ignore[attr-defined]
        raise AssertionError(f"{command}: {message}") from None


def recipe_of(command: Command, params: dict[str, object]) -> Path | None:
    """The recipe the command names, checked to exist; None for a placeholder or no recipe."""
    from tpuft.core.paths import shipped_recipe

    named = params.get("recipe") if params.get("recipe") is not None else params.get("name")
    if named is None or is_placeholder(str(named)):
        return None
    name = str(named)
    for copied in (name, f"{name}.yaml"):  # `recipes validate mine` finds ./mine.yaml by its stem
        if copied in command.created:
            name = command.created[copied]
            break
    found = shipped_recipe(name) or next(
        (p for p in (REPO / name, REPO / "tpuft" / "recipes" / name) if p.is_file()), None
    )
    assert found is not None, f"{command}: no shipped recipe {name!r} (see: tpuft recipes ls)"
    return found


@pytest.mark.parametrize("command", ALL, ids=[f"{c.page.name}:{c.line}" for c in ALL])
def test_every_documented_command_parses(command: Command) -> None:
    from tpuft.config import load_recipe

    _, params = parse(command)
    recipe = recipe_of(command, params)
    overrides = [str(v) for v in params.get("overrides") or ()]
    if overrides:
        target = recipe or shipped_quickstart()
        try:
            load_recipe(target, overrides, check_files=False)
        except Exception as exc:  # noqa: BLE001 - whatever the recipe loader raises, the README's command is wrong
            raise AssertionError(f"{command}: --set does not apply to {target.name}: {exc}") from None


def shipped_quickstart() -> Path:
    from tpuft.core.paths import shipped_recipe

    found = shipped_recipe("quickstart")
    assert found is not None
    return found


def test_the_pages_show_commands() -> None:
    """The extraction finds what is there (a test that finds nothing checks nothing)."""
    readme = [c.text for c in ALL if c.page.name == "README.md"]
    assert ".venv/bin/tpuft up quickstart" in readme and any(c.startswith("tpuft monitor ") for c in readme)
    assert len(ALL) > 100


def test_a_wrong_command_fails_the_check() -> None:
    page = REPO / "README.md"
    for wrong, why in [
        ("tpuft -c path/to/tpuft.yaml status", "No such option"),
        ("tpuft trian quickstart", "no command 'trian'"),
        ("tpuft train quickstart --no-such-flag", "No such option"),
        ("tpuft recipes show --summary t5_11b.yaml", "no shipped recipe"),
        ("tpuft train quickstart --set ssh.port=2222", "--set does not apply"),
    ]:
        with pytest.raises(AssertionError, match=re.escape(why)):
            test_every_documented_command_parses(Command(page, 1, wrong))
    test_every_documented_command_parses(
        Command(page, 1, "tpuft recipes validate mine.yaml", {"mine.yaml": "quickstart"})
    )


def test_the_readme_lists_every_verb() -> None:
    from tpuft.commands import RECIPE_VERBS, VERBS

    table = REPO.joinpath("README.md").read_text(encoding="utf-8").split("## ", 1)[0]
    first_cells = [row.split("|")[1] for row in table.splitlines() if row.startswith("| `")]
    named = {word for cell in first_cells for word in re.findall(r"`(?:tpuft )?([a-z]+)", cell)}
    assert {v.name for v in VERBS} <= named, sorted({v.name for v in VERBS} - named)
    recipes_row = next(cell for cell in first_cells if "tpuft recipes" in cell)
    assert all(v.name in recipes_row for v in RECIPE_VERBS)


# Figures the code computes


@dataclass
class Transcript:
    page: Path
    start: int
    """Index in the page's lines of the ``$ tpuft ...`` line."""
    command: str
    quoted: list[str]


def transcripts(page: Path) -> list[Transcript]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Transcript] = []
    for index, line in enumerate(lines):
        if line.startswith("$ tpuft recipes show --summary"):
            end = index + 1
            while end < len(lines) and not lines[end].startswith(("$ ", "```")):
                end += 1
            while end > index + 1 and not lines[end - 1].strip():
                end -= 1  # the blank line between two commands is no output
            found.append(Transcript(page, index, line[2:], lines[index + 1 : end]))
    return found


TRANSCRIPTS = [t for page in PAGES for t in transcripts(page)]


def printed(command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What ``command`` prints (``| grep WORD`` applied), at the docs' terminal width."""
    from tests.conftest import run_cli

    shell, _, grep = command.partition(" | grep ")
    grep = " ".join(shlex.split(grep))
    monkeypatch.setenv("COLUMNS", str(TRANSCRIPT_COLUMNS))
    result = run_cli(shlex.split(shell)[1:], monkeypatch, capsys)
    assert result.code == 0, (command, result.err)
    lines = [line.rstrip() for line in result.out.splitlines()]
    return [line for line in lines if grep in line] if grep else lines


@pytest.mark.parametrize("transcript", TRANSCRIPTS, ids=[f"{t.page.name}:{t.start + 1}" for t in TRANSCRIPTS])
def test_the_summary_transcripts_are_what_the_code_prints(
    transcript: Transcript, monkeypatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    assert [line.rstrip() for line in transcript.quoted] == printed(
        transcript.command, monkeypatch, capsys
    ), (
        f"{transcript.page.relative_to(REPO)}:{transcript.start + 1}: the output differs; "
        "rewrite it with: python -m tests.test_readme_commands --write"
    )


def test_the_readme_states_the_quickstarts_size(cli) -> None:  # type: ignore[no-untyped-def]
    import json

    text = REPO.joinpath("README.md").read_text(encoding="utf-8")
    quoted = re.search(r"quickstart trains a tiny T5 \(([\d.]+) M parameters", text)
    assert quoted is not None
    total = json.loads(cli("recipes", "show", "--summary", "quickstart", "--json").out)["parameters"]["total"]
    assert quoted.group(1) == f"{total / 1e6:.1f}", total


def _write() -> None:
    """Rewrite every transcript with what the code prints now."""
    import tempfile

    with tempfile.TemporaryDirectory() as home, pytest.MonkeyPatch.context() as patch:
        patch.setenv("TPUFT_HOME", home)
        for page in PAGES:
            for transcript in reversed(transcripts(page)):  # from the bottom up: earlier indices stay right
                lines = page.read_text(encoding="utf-8").splitlines()
                fresh = _printed_outside_pytest(transcript.command)
                lines[transcript.start + 1 : transcript.start + 1 + len(transcript.quoted)] = fresh
                page.write_text("\n".join(lines) + "\n", encoding="utf-8")
                print(f"{page.relative_to(REPO)}:{transcript.start + 1}: {len(fresh)} lines")


def _printed_outside_pytest(command: str) -> list[str]:
    import os
    import subprocess

    shell, _, grep = command.partition(" | grep ")
    grep = " ".join(shlex.split(grep))
    env = {**os.environ, "COLUMNS": str(TRANSCRIPT_COLUMNS)}
    out = subprocess.run(
        [sys.executable, "-m", "tpuft", *shlex.split(shell)[1:]],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    lines = [line.rstrip() for line in out.splitlines()]
    return [line for line in lines if grep in line] if grep else lines


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        _write()
    else:
        sys.exit("usage: python -m tests.test_readme_commands --write")
