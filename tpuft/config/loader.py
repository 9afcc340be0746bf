"""Loading the two files with locations: the YAML is read with a line for every key path (:mod:`tpuft.safe_yaml`),
``--set a.b=c`` overrides are applied to the raw YAML first, and every problem, from pydantic or from a model's
``cross_problems``, is reported as ``file:line: key.path: what is wrong (got X)`` (or ``--set a.b: ...``), all at once,
as a :class:`~tpuft.errors.ConfigError` (exit code 2), before anything runs.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from tpuft import safe_yaml
from tpuft.config.cluster import ClusterConfig
from tpuft.config.recipe import RecipeConfig
from tpuft.config_types import KeyPath, StrictModel
from tpuft.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


@dataclass
class Loaded(Generic[M]):
    """A validated config plus where each key came from, for errors found later (e.g. against the cluster)."""

    value: M
    source: str
    lines: dict[KeyPath, int] = field(default_factory=dict)
    overrides: dict[KeyPath, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    def where(self, path: KeyPath) -> str:
        return _locate(path, self.source, self.lines, self.overrides)

    def problem(self, path: KeyPath, message: str) -> str:
        return f"{self.where(path)}: {_dotted(path)}: {message}"


def _dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _locate(path: KeyPath, source: str, lines: dict[KeyPath, int], overrides: dict[KeyPath, str]) -> str:
    for depth in range(len(path), 0, -1):
        if path[:depth] in overrides:
            return f"--set {overrides[path[:depth]]}"
    for depth in range(len(path), -1, -1):
        if path[:depth] in lines:
            return f"{source}:{lines[path[:depth]]}"
    return source


def _read_yaml(text: str, source: str) -> tuple[Any, dict[KeyPath, int]]:
    try:
        return safe_yaml.load(text)
    except safe_yaml.YamlProblem as exc:
        where = f"{source}:{exc.line}" if exc.line is not None else source
        key = f"{_dotted(exc.path)}: " if exc.path else ""
        raise ConfigError([f"{where}: {key}{exc.message}"], source=source) from None


MAX_OVERRIDE_CHARS = 16_384


def parse_overrides(items: list[str]) -> list[tuple[KeyPath, Any, str]]:
    """``train.steps=50`` -> (("train", "steps"), 50, "train.steps=50"); values are parsed as YAML scalars."""
    parsed = []
    problems = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part.strip() for part in key.split(".")):
            problems.append(f"--set {item}: expected KEY.PATH=VALUE, e.g. --set train.steps=50")
            continue
        if len(value) > MAX_OVERRIDE_CHARS:
            problems.append(f"--set {key}=...: the value is over {MAX_OVERRIDE_CHARS:,} characters")
            continue
        try:
            parsed_value = safe_yaml.load_value(value) if value.strip() else ""
        except safe_yaml.YamlProblem as exc:
            problems.append(f"--set {item}: the value is not valid: {exc.message}")
            continue
        path: KeyPath = tuple(int(p) if p.isdigit() else p for p in key.split("."))
        parsed.append((path, parsed_value, item))
    if problems:
        raise ConfigError(problems, source="--set")
    return parsed


def _apply_overrides(data: Any, overrides: list[tuple[KeyPath, Any, str]]) -> tuple[Any, dict[KeyPath, str]]:
    where: dict[KeyPath, str] = {}
    problems = []
    if not isinstance(data, dict):
        data = {}
    for path, value, text in overrides:
        node: Any = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part) if isinstance(node, dict) else None
            if child is None:
                child = {}
                node[part] = child
            if not isinstance(child, dict):
                problems.append(f"--set {text}: {_dotted(path[: i + 1])} is not a mapping (got {child!r})")
                break
            node = child
        else:
            node[path[-1]] = value
            where[path] = text
    if problems:
        raise ConfigError(problems, source="--set")
    return data, where


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        out.extend(_models_in(arg))
    return out


def _walk_loc(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[KeyPath, type[BaseModel] | None]:
    """Turn pydantic's error location into the user's key path, dropping discriminated-union tags
    (("backend", "torch_xla", "x") -> ("backend", "x")) and type tags ("function-after[...]", "int"), and return
    the model owning the last key."""
    path: list[str | int] = []
    owner: type[BaseModel] | None = model
    parts = [p for p in loc if not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
    while parts:
        part = parts.pop(0)
        path.append(part)
        if not parts:
            break
        info = owner.model_fields.get(part) if owner is not None and isinstance(part, str) else None
        if info is None:
            owner = None
            continue
        candidates = _models_in(info.annotation)
        if info.discriminator is not None and parts and isinstance(parts[0], str):
            tag = parts.pop(0)
            candidates = [c for c in candidates if c.model_fields["kind"].default == tag]
        owner = candidates[0] if len(candidates) == 1 else None
    return tuple(path), owner


_TYPE_TAGS = {"int", "float", "str", "bool", "list", "dict", "none", "is-instance", "lax-or-strict", "json-or-python"}

_FRIENDLY = {
    "int_type": "expected a whole number",
    "int_from_float": "expected a whole number",
    "int_parsing": "expected a whole number",
    "int_parsing_size": "expected a whole number of sensible size",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "finite_number": "expected a finite number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected text (quote it in YAML)",
    "dict_type": "expected a mapping of keys",
    "model_type": "expected a mapping of keys",
    "model_attributes_type": "expected a mapping of keys",
    "list_type": "expected a list",
    "path_type": "expected a file path",
    "none_required": "expected nothing (null)",
}


def _describe_error(model: type[BaseModel], err: dict[str, Any]) -> tuple[KeyPath, str]:
    path, owner = _walk_loc(model, tuple(err["loc"]))
    kind = err["type"]
    got = err.get("input")
    last = path[-1] if path else None
    if kind == "extra_forbidden":
        allowed = list(owner.model_fields) if owner is not None else []
        close = difflib.get_close_matches(str(last), allowed, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return path, f"unknown key{hint} (allowed: {', '.join(allowed)})"
    if kind == "missing":
        info = owner.model_fields.get(last) if owner is not None and isinstance(last, str) else None
        desc = info.description if info is not None and info.description else ""
        return path, "required key is missing" + (f": {desc}" if desc else "")
    msg = _FRIENDLY.get(kind) or err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind in {"literal_error", "union_tag_invalid"}:
        expected = re.findall(r"'([^']+)'", msg.split("expected", 1)[-1])
        probe = got.get("kind", "") if isinstance(got, dict) else got
        close = difflib.get_close_matches(str(probe), expected, n=1, cutoff=0.5)
        if close:
            msg += f"; did you mean {close[0]!r}?"
    if got is not None and not isinstance(got, (dict, list)) and kind not in {"value_error", "assertion_error"}:
        shown = repr(got)
        msg += f" (got {shown if len(shown) <= 80 else shown[:77] + '...'})"
    return path, msg


def _cross_problems(value: BaseModel, prefix: KeyPath = ()) -> list[tuple[KeyPath, str]]:
    own = value.cross_problems() if isinstance(value, StrictModel) else []
    return [(prefix + path, message) for path, message in own]


def _validate(
    model: type[M], data: Any, source: str, lines: dict[KeyPath, int], overrides: dict[KeyPath, str], context: dict
) -> M:
    try:
        value = model.model_validate(data, context=context)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            path, message = _describe_error(model, err)
            problems.append(f"{_locate(path, source, lines, overrides)}: {_dotted(path)}: {message}")
        raise ConfigError(problems, source=source) from None
    found = _cross_problems(value)
    if found:
        raise ConfigError(
            [f"{_locate(path, source, lines, overrides)}: {_dotted(path)}: {message}" for path, message in found],
            source=source,
        )
    return value


def _load(
    model: type[M], text: str, source: str, base_dir: Path | None, overrides: list[str], check_files: bool
) -> Loaded[M]:
    data, lines = _read_yaml(text, source)
    if data is not None and not isinstance(data, dict):
        raise ConfigError([f"{source}:1: expected a mapping of keys at the top level"], source=source)
    data, where = _apply_overrides(data or {}, parse_overrides(overrides))
    context = {"base_dir": base_dir, "check_files": check_files}
    value = _validate(model, data, source, lines, where, context)
    return Loaded(value=value, source=source, lines=lines, overrides=where, raw=data)


def _read_text(path: Path, what: str) -> str:
    try:
        return safe_yaml.read_config_text(path, what)
    except safe_yaml.YamlProblem as exc:
        where = f"{path}:{exc.line}" if exc.line is not None else str(path)
        raise ConfigError([f"{where}: {exc.message}"], source=str(path)) from None


DEFAULT_CLUSTER_FILE = "tpuft.yaml"


def cluster_file(explicit: Path | None = None) -> Path | None:
    """``--config`` > ``$TPUFT_CONFIG`` > ``./tpuft.yaml`` > None (the embedded default)."""
    if explicit is not None:
        return explicit
    env = os.environ.get("TPUFT_CONFIG")
    if env:
        return Path(env)
    here = Path.cwd() / DEFAULT_CLUSTER_FILE
    return here if here.is_file() else None


def load_cluster(path: Path | None = None, overrides: list[str] | None = None) -> Loaded[ClusterConfig]:
    chosen = cluster_file(path)
    if chosen is None:
        from tpuft.paths import package_root

        default = package_root() / "_defaults" / "tpuft.yaml"
        return _load(ClusterConfig, default.read_text(), "(embedded default tpuft.yaml)", None, overrides or [], True)
    return _load(ClusterConfig, _read_text(chosen, "cluster file"), str(chosen), chosen.parent, overrides or [], True)


def load_recipe(path: Path, overrides: list[str] | None = None, *, check_files: bool = True) -> Loaded[RecipeConfig]:
    path = resolve_recipe_path(path)
    return _load(
        RecipeConfig, _read_text(path, "recipe"), str(path), path.parent.resolve(), overrides or [], check_files
    )


def resolve_recipe_path(path: Path) -> Path:
    """A recipe is a file path, or the name of a shipped recipe (``quickstart`` -> recipes/quickstart.yaml)."""
    if os.path.lexists(path):
        return path
    from tpuft.paths import shipped_recipe

    shipped = shipped_recipe(str(path))
    return shipped if shipped is not None else path


def dump_recipe(recipe: RecipeConfig) -> str:
    """The resolved recipe as YAML (absolute paths, defaults filled in), written to the run dir."""
    return safe_yaml.dump(recipe.model_dump(mode="json"))


def recipe_from_text(text: str, source: str, *, check_files: bool = True) -> RecipeConfig:
    """Load a resolved recipe (paths already absolute) on the worker side; on the controller (``resume``) without
    checking its files: a remote run's recipe names the workers' copies of its data (``~/.tpuft/data/<run>/...``)."""
    return _load(RecipeConfig, text, source, None, [], check_files).value
