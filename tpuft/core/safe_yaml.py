"""Read YAML that a user, or an attacker, wrote: bounded in size, depth and alias expansion, YAML 1.2 scalars.

A recipe is a small file, but YAML lets a 1 KB file describe a billion-node tree (nested aliases), a cycle
(``steps: &r [*r]``), or nesting that overflows the Python stack; PyYAML's own scalar rules (YAML 1.1) read
``no`` as false, ``012`` as 10, ``1:20`` as 80 and ``1e-3`` as a string. Everything here is checked on
PyYAML's event stream and node graph before a single Python object is built, and every refusal is located as
``file:line``.

Scalars follow the YAML 1.2 core schema, which is what people mean: ``true``/``false`` only, decimal, ``0x``
and ``0o`` integers, ``1e-3`` is a float, and anything else is a string. Mapping keys are always strings. Only
the core tags are allowed: an explicit ``!!python/...`` (or any other) tag is refused, not ignored.

Framework-free (PyYAML only): the worker imports it too, through ``tpuft.config``.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20
"""A recipe or cluster file over 1 MiB is a mistake (data belongs in data files)."""
MAX_DEPTH = 32
"""Recipes are 3 levels deep; a tree 32 levels deep is not a config."""
MAX_NODES = 100_000
"""Nodes after alias expansion: a shared anchor used in many places counts once per use."""

KeyPath = tuple[str | int, ...]


class YamlProblem(ValueError):
    """One located problem: ``line`` is 1-based, None when it concerns the whole file."""

    def __init__(
        self, message: str, line: int | None = None, path: KeyPath | None = None, *, syntax: bool = False
    ) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.path = path
        """The key path the problem is at, when it is one key's (a duplicate)."""
        self.syntax = syntax
        """Not YAML at all (as opposed to YAML that breaks a limit or uses a refused tag)."""


# ----------------------------------------------------------------------------------------------------------
# YAML 1.2 core schema on top of PyYAML's safe loader

_CORE_TAGS = {
    "tag:yaml.org,2002:str",
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map",
    "tag:yaml.org,2002:seq",
    "tag:yaml.org,2002:merge",
}
_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_NULL = re.compile(r"^(?:~|null|Null|NULL|)$")


class CoreLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars and string keys."""

    yaml_implicit_resolvers: dict = {}

    def construct_yaml_int(self, node: yaml.Node) -> int:  # type: ignore[override]
        text = str(self.construct_scalar(node))  # type: ignore[arg-type]
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        if digits.startswith("0o"):
            return sign * int(digits[2:], 8)
        if digits.startswith("0x"):
            return sign * int(digits[2:], 16)
        return sign * int(digits, 10)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        self.flatten_mapping(node)  # `<<: *defaults` merges
        mapping: dict[str, Any] = {}
        for key_node, value_node in node.value:
            mapping[str(key_node.value)] = self.construct_object(value_node, deep=deep)
        return mapping


CoreLoader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
CoreLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
CoreLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
CoreLoader.add_implicit_resolver("tag:yaml.org,2002:null", _NULL, ["~", "n", "N", ""])
CoreLoader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])
CoreLoader.add_constructor("tag:yaml.org,2002:int", CoreLoader.construct_yaml_int)
CoreLoader.add_constructor("tag:yaml.org,2002:map", CoreLoader.construct_yaml_map)


class CoreDumper(yaml.SafeDumper):
    """Quotes exactly the strings that :class:`CoreLoader` would read as something else (``1e-3``, ``0o17``),
    so a dumped recipe reads back as it was."""

    yaml_implicit_resolvers = CoreLoader.yaml_implicit_resolvers


def _represent_text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    """``no``, ``on``, ``y``... quoted: they are text here, and tpuft refuses them unquoted where a boolean
    could go too, so a resolved recipe must read back as written (the workers and ``resume`` load it
    again)."""
    if YAML11_WORDS.match(value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="'")
    return dumper.represent_str(value)


CoreDumper.add_representer(str, _represent_text)


def dump(data: Any) -> str:
    return yaml.dump(data, Dumper=CoreDumper, sort_keys=False, allow_unicode=True)


# ----------------------------------------------------------------------------------------------------------
# Reading


def read_config_text(path: Path, what: str) -> str:
    """The file's text, refusing what is not a small regular UTF-8 file (a FIFO would block, /dev/zero never
    ends)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise YamlProblem(f"{what} not found") from None
    except OSError as exc:
        raise YamlProblem(f"cannot read {what}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise YamlProblem(f"{what} is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise YamlProblem(f"{what} is not a regular file (a device, FIFO or socket)")
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise YamlProblem(f"cannot read {what}: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise _too_big(raw, what, max(info.st_size, len(raw)))
    return decode_utf8(raw, what)


def _too_big(raw: bytes, what: str, size: int) -> YamlProblem:
    """Located where the file passes the limit, with the key being written there: a value of megabytes (a
    pasted data set, a runaway template) is the usual cause, and the user needs to know which one."""
    line = raw.count(b"\n", 0, MAX_BYTES) + 1
    text = raw.decode("utf-8", "replace")  # up to and including the byte past the limit: its line is in it
    return YamlProblem(
        f"{what} is {size:,} bytes, over the limit of {MAX_BYTES:,}, and passes it here: a value this "
        "long belongs in a data file",
        line,
        key_path_at(text, line),
    )


def decode_utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise YamlProblem(
            f"{what} is not UTF-8: byte 0x{raw[exc.start]:02x} at column {column} (save it as UTF-8)", line
        ) from None


YAML11_WORDS = re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF)$")
"""Plain words that YAML 1.1 (PyYAML, many editors and tools) reads as booleans and YAML 1.2 reads as text."""


def load(
    text: str, *, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH
) -> tuple[Any, dict[KeyPath, int]]:
    """Parse one YAML document into plain Python values and a map from each key path to its line.

    Raises :class:`YamlProblem` for syntax errors, several documents, excessive depth or expansion, cycles,
    complex keys, duplicate keys and non-core tags; a problem on a key's line names that key's path.
    """
    data, lines, _ = load_noting_words(text, max_nodes=max_nodes, max_depth=max_depth)
    return data, lines


def load_noting_words(
    text: str, *, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH
) -> tuple[Any, dict[KeyPath, int], set[KeyPath]]:
    """:func:`load`, plus the key paths whose value is an unquoted YAML 1.1 boolean word (``no``, ``on``,
    ``y``): text here, a boolean to whoever wrote it with YAML 1.1 in mind, so the schema decides whether that
    is clear."""
    if len(text) > MAX_BYTES:
        raise YamlProblem(f"the text is over {MAX_BYTES:,} characters")
    try:
        _check_events(text, max_depth)
        loader = CoreLoader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, {}, set()
            lines = _check_graph(node, max_nodes)
            words: set[KeyPath] = set()
            _note_words(node, (), words)
            return loader.construct_document(node), lines, words
        except yaml.YAMLError as exc:
            raise _located(exc, text) from None
        finally:
            loader.dispose()
    except YamlProblem as problem:
        if problem.path is None and problem.line is not None:
            problem.path = key_path_at(text, problem.line)
        raise


def _note_words(node: yaml.Node, path: KeyPath, words: set[KeyPath]) -> None:
    if isinstance(node, yaml.ScalarNode):
        if node.style is None and node.tag == "tag:yaml.org,2002:str" and YAML11_WORDS.match(str(node.value)):
            words.add(path)
    elif isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if key_node.tag != "tag:yaml.org,2002:merge":
                _note_words(value_node, path + (str(key_node.value),), words)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _note_words(item, path + (index,), words)


_BLOCK_KEY = re.compile(
    r"^(\s*)(?:-\s+)?(?:\"([^\"]+)\"|'([^']+)'|([^\s#'\"{}\[\],&*!|>%@`][^:#{}\[\]]*?))\s*:(?:\s|$)"
)


def key_path_at(text: str, line: int) -> KeyPath | None:
    """The block-mapping key path on ``line`` (1-based) as the indentation above it gives it, read from the
    text itself: for a problem found before there is a node graph to ask (a syntax error, an undefined alias,
    a tag). None when the line holds no key and sits under none."""
    stack: list[tuple[int, str]] = []
    found: KeyPath | None = None
    for number, whole in enumerate(text.splitlines()[:line], start=1):
        raw = whole[:1000]  # a key is short; a value of megabytes is not read through
        match = _BLOCK_KEY.match(raw)
        if match is None:
            if number == line and stack:
                indent = len(raw) - len(raw.lstrip())
                found = tuple(key for at, key in stack if at < indent) or None
            continue
        indent = len(match.group(1)) + (
            len(raw[len(match.group(1)) :]) - len(raw[len(match.group(1)) :].lstrip("- "))
        )
        key = next(group for group in match.group(2, 3, 4) if group is not None).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        if number == line:
            found = tuple(key for _, key in stack)
    return found


def _located(exc: yaml.YAMLError, text: str) -> YamlProblem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    line = mark.line + 1 if mark is not None else None
    if isinstance(exc, yaml.reader.ReaderError):  # a control character: located by position, not by mark
        line = text.count("\n", 0, exc.position) + 1
        return YamlProblem(
            f"not valid YAML: character #x{exc.character:04x} is not allowed in YAML text", line, syntax=True
        )
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if "single document" in (getattr(exc, "context", None) or ""):
        problem = "more than one YAML document (a '---' line): give one mapping of keys"
    return YamlProblem(f"not valid YAML: {problem}", line, syntax=True)


def _check_events(text: str, max_depth: int) -> None:
    """Depth on the event stream, which PyYAML produces without recursion (its composer recurses per
    level)."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=CoreLoader):
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > max_depth:
                    raise YamlProblem(f"nested more than {max_depth} levels deep", event.start_mark.line + 1)
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError as exc:
        raise _located(exc, text) from None


def _check_graph(root: yaml.Node, max_nodes: int) -> dict[KeyPath, int]:
    """Refuse cycles, over-large expansions, complex keys, duplicate keys and foreign tags; then record
    lines."""
    sizes: dict[int, int] = {}
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            size = 1 + sum(sizes[id(child)] for child in _children(node))
            if size > max_nodes:
                raise YamlProblem(
                    f"expands to more than {max_nodes:,} values (anchors and aliases used to blow it up?)",
                    node.start_mark.line + 1,
                )
            sizes[key] = size
            state[key] = 2
            continue
        if state.get(key) == 2:
            continue
        if state.get(key) == 1:
            raise YamlProblem(
                "an alias refers to the node that contains it (a cycle)", node.start_mark.line + 1
            )
        _check_node(node)
        state[key] = 1
        stack.append((node, True))
        for child in _children(node):
            if state.get(id(child)) == 1:
                raise YamlProblem(
                    "an alias refers to the node that contains it (a cycle)", child.start_mark.line + 1
                )
            if state.get(id(child)) != 2:
                stack.append((child, False))
    lines: dict[KeyPath, int] = {(): root.start_mark.line + 1}
    _record_lines(root, (), lines)
    return lines


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [child for pair in node.value for child in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_node(node: yaml.Node) -> None:
    line = node.start_mark.line + 1
    if node.tag not in _CORE_TAGS:
        raise YamlProblem(f"the tag {node.tag.replace('tag:yaml.org,2002:', '!!')} is not allowed here", line)
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise YamlProblem(
                    "a key must be a plain name, not a list or a mapping ('? [...]')",
                    key_node.start_mark.line + 1,
                )


def _record_lines(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int]) -> None:
    """Depth is bounded by the event check and size by the graph check, so plain recursion is safe here."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key, line = str(key_node.value), key_node.start_mark.line + 1
            if key in seen:  # plain PyYAML keeps the last one silently
                raise YamlProblem(f"duplicate key (first set on line {seen[key]})", line, path + (key,))
            seen[key] = line
            child = path + (key,)
            lines[child] = line
            _record_lines(value_node, child, lines)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[path + (index,)] = item.start_mark.line + 1
            _record_lines(item, path + (index,), lines)


def load_value(text: str) -> Any:
    """A ``--set`` value: the same rules and a smaller budget; text that is not YAML at all (``{q} {a}``, a
    template) is taken as the string it is, and the recipe's types decide whether that is acceptable."""
    try:
        value, _ = load(text, max_nodes=10_000, max_depth=16)
    except YamlProblem as exc:
        if exc.syntax:
            return text
        raise
    return value


def resolved_section(text: str | None, section: str) -> dict[str, Any]:
    """A section (``train``) of a resolved recipe as tpuft wrote it in a run dir, for the few numbers a
    supervisor or the controller needs without validating the whole recipe; {} for no text or an unreadable
    one."""
    try:
        recipe = yaml.safe_load(text or "") or {}
    except yaml.YAMLError:
        return {}
    found = recipe.get(section) if isinstance(recipe, dict) else None
    return found if isinstance(found, dict) else {}
