"""Read the few bindings a converter needs from T5X's operative ``config.gin``, without gin or t5x.

T5X writes the operative config it trained with (``MODEL_DIR/config.gin``): one ``scope.Name.param = value``
per statement, macros as ``NAME = value``, references as ``@module.Name()`` and ``%MACRO``, long values
continued with a backslash or inside brackets. Parsing it with gin itself would mean importing every module it
names (t5x, seqio, the user's task modules); these statements are all a converter needs, so they are read as
text and the values with ``ast.literal_eval`` (references stay as their text).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Binding:
    value: Any
    line: int


class GinConfig:
    def __init__(self, path: Path, bindings: dict[str, Binding]) -> None:
        self.path = path
        self.bindings = bindings

    def get(self, key: str, default: Any = None) -> Any:
        """A binding's value with ``%MACRO`` references followed; ``default`` when unbound."""
        seen: set[str] = set()
        binding = self.bindings.get(key)
        while (
            binding is not None
            and isinstance(binding.value, str)
            and binding.value.startswith("%")
            and key not in seen
        ):
            seen.add(key)
            key = binding.value[1:]
            binding = self.bindings.get(key)
        return default if binding is None else binding.value

    def where(self, key: str) -> str:
        binding = self.bindings.get(key)
        return f"{self.path}:{binding.line}" if binding else str(self.path)


def parse_gin(path: Path) -> GinConfig:
    bindings: dict[str, Binding] = {}
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    i = 0
    while i < len(lines):
        start = i
        statement = _strip_comment(lines[i])
        i += 1
        while i < len(lines) and (statement.endswith("\\") or _open_brackets(statement) > 0):
            statement = statement.rstrip("\\") + " " + _strip_comment(lines[i]).strip()
            i += 1
        statement = statement.strip()
        if not statement or statement.startswith(("import ", "from ", "include ")) or "=" not in statement:
            continue
        key, _, raw = statement.partition("=")
        key = key.strip()
        if not key or " " in key:
            continue
        bindings[key] = Binding(_value(raw.strip()), start + 1)
    return GinConfig(path, bindings)


def _strip_comment(line: str) -> str:
    quote = None
    for pos, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#":
            return line[:pos].rstrip()
    return line.rstrip()


def _open_brackets(text: str) -> int:
    depth = 0
    quote = None
    for char in text:
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
    return depth


def _value(raw: str) -> Any:
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # a reference (@x.Y(), %MACRO) or an expression: kept as text
