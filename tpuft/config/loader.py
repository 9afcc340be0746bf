"""Loading the two files with locations: the YAML is read with a line for every key path
(:mod:`tpuft.core.safe_yaml`), ``--set a.b=c`` overrides are applied to the raw YAML first, and every problem,
from pydantic or from a model's ``cross_problems``, is reported as ``file:line: key.path: what is wrong (got
X)`` (or ``--set a.b: ...``), all at once, as a :class:`~tpuft.core.errors.ConfigError` (exit code 2), before
anything runs. What each problem says is :mod:`tpuft.config.wording`'s; how far a file with problems is still
validated, :mod:`tpuft.config.validation`'s; where it was written is this module's.

``load_recipe`` / ``load_cluster`` raise at once; ``check_recipe`` / ``check_cluster`` return a
:class:`Checked` (the problems, and the config of the valid parts) so that a command that reads both files and
checks them against each other gathers every problem in a :class:`Problems` and raises once
(:func:`tpuft.ops.preflight.load_files`).
"""

from __future__ import annotations

import difflib
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from tpuft.config.cluster import ClusterConfig
from tpuft.config.recipe import RecipeConfig
from tpuft.config.validation import affected, validate
from tpuft.core import safe_yaml
from tpuft.core.config_types import KeyPath
from tpuft.core.errors import ConfigError, TpuftError, UsageError

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


def _read_yaml(text: str, source: str) -> tuple[Any, dict[KeyPath, int], set[KeyPath]]:
    try:
        return safe_yaml.load_noting_words(text)
    except safe_yaml.YamlProblem as exc:
        where = f"{source}:{exc.line}" if exc.line is not None else source
        key = f"{_dotted(exc.path)}: " if exc.path else ""
        raise ConfigError([f"{where}: {key}{exc.message}"], source=source) from None


def _nothing_in(text: str, source: str, what: str) -> ConfigError:
    """An empty file, or one of only comments, is one problem, not every required key missing without a
    line."""
    comments = any(line.strip().startswith("#") for line in text.splitlines())
    body = [
        line
        for line in text.splitlines()
        if line.strip() not in ("", "---", "...") and not line.strip().startswith("#")
    ]
    if body:  # `---`, `~` or `null`: a document with no keys
        message = f"the {what} has no keys (just {body[0].strip()!r}): give a mapping of keys"
    elif comments:
        message = f"the {what} has only comments: no key is set"
    else:
        message = f"the {what} is empty"
    if what == "recipe":
        message += " (start from a shipped one: tpuft recipes cp quickstart mine.yaml)"
    return ConfigError([f"{source}:1: {message}"], source=source)


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


@dataclass
class Checked(Generic[M]):
    """One file read and validated as far as it goes (:mod:`tpuft.config.validation`): every problem of it,
    located, and the config built from its valid parts, for the checks that span both files. ``loaded`` is
    None when no config could be built (the YAML does not parse, a required key is missing); with no problem
    it is the file's config, whole."""

    source: str
    problems: list[str] = field(default_factory=list)
    loaded: Loaded[M] | None = None
    pruned: frozenset[KeyPath] = frozenset()
    """The keys left out (dropped, or back to their default) to build ``loaded``."""

    def affected(self, path: KeyPath) -> bool:
        """Whether a finding at ``path`` is about a key that was left out (drop it: its own problem is
        reported, and a check saw its default instead)."""
        return affected(path, self.pruned)

    def or_raise(self) -> Loaded[M]:
        """The config, or every problem as one :class:`ConfigError` (exit code 2)."""
        if self.problems or self.loaded is None:
            raise ConfigError(self.problems, source=self.source)
        return self.loaded


class Problems:
    """Every located problem that one command finds in the user's files, gathered over the files and the
    checks that span them, then raised once as one :class:`ConfigError` (exit code 2). A new check adds its
    problems here (``add(source, lines)``, each line ``file:line: key.path: message``, e.g. from
    :meth:`Loaded.problem`) instead of raising, so that it neither hides nor is hidden by another."""

    def __init__(self) -> None:
        self._by_source: dict[str, list[str]] = {}

    def add(self, source: str, problems: list[str]) -> None:
        if problems:
            self._by_source.setdefault(source, []).extend(problems)

    def __bool__(self) -> bool:
        return bool(self._by_source)

    def raise_if_any(self) -> None:
        if self._by_source:
            every = [problem for found in self._by_source.values() for problem in found]
            raise ConfigError(every, source=" and ".join(self._by_source))


def _check(
    model: type[M],
    text: str,
    source: str,
    base_dir: Path | None,
    overrides: list[str],
    check_files: bool,
    what: str,
) -> Checked[M]:
    try:
        data, lines, words = _read_yaml(text, source)
        if data is None:
            raise _nothing_in(text, source, what)
        if not isinstance(data, dict):
            raise ConfigError([f"{source}:1: expected a mapping of keys at the top level"], source=source)
        parsed = parse_overrides(overrides)
        data, where = _apply_overrides(data, parsed)
    except ConfigError as exc:  # nothing to validate: the problems that stopped the reading are all
        return Checked(source, list(exc.problems))
    context = {"base_dir": base_dir, "check_files": check_files}
    words = {w for w in words if not any(w[:depth] in where for depth in range(1, len(w) + 1))}
    words |= {
        path for path, _, text in parsed if safe_yaml.YAML11_WORDS.match(text.partition("=")[2].strip())
    }
    found = validate(model, data, context, words)
    problems = [
        f"{_locate(path, source, lines, where)}: {_dotted(path)}: {message}"
        for path, message in found.problems
    ]
    loaded = (
        Loaded(value=found.value, source=source, lines=lines, overrides=where, raw=data)
        if found.value is not None
        else None
    )
    return Checked(source, problems, loaded, found.pruned)


def _load(
    model: type[M],
    text: str,
    source: str,
    base_dir: Path | None,
    overrides: list[str],
    check_files: bool,
    what: str,
) -> Loaded[M]:
    return _check(model, text, source, base_dir, overrides, check_files, what).or_raise()


def _read_text(path: Path, what: str) -> str:
    try:
        return safe_yaml.read_config_text(path, what)
    except safe_yaml.YamlProblem as exc:
        where = f"{path}:{exc.line}" if exc.line is not None else str(path)
        key = f"{_dotted(exc.path)}: " if exc.path else ""
        raise ConfigError([f"{where}: {key}{exc.message}"], source=str(path)) from None


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
    """The cluster file's config, or every problem of it at once (:class:`ConfigError`, exit code 2)."""
    return check_cluster(path, overrides).or_raise()


def check_cluster(path: Path | None = None, overrides: list[str] | None = None) -> Checked[ClusterConfig]:
    """The cluster file validated as far as it goes: every problem, and the config of its valid parts."""
    chosen = cluster_file(path)
    if chosen is None:
        from tpuft.core.paths import package_root

        text, source, base_dir = (
            (package_root() / "_defaults" / "tpuft.yaml").read_text(),
            "(embedded default tpuft.yaml)",
            None,
        )
    else:
        source, base_dir = str(chosen), chosen.parent
        try:
            text = _read_text(chosen, "cluster file")
        except ConfigError as exc:
            return Checked(source, list(exc.problems))
    checked = _check(ClusterConfig, text, source, base_dir, overrides or [], True, "cluster file")
    if checked.loaded is not None:
        _note_shape_origin(checked.loaded)
    return checked


def _note_shape_origin(loaded: Loaded[ClusterConfig]) -> None:
    """Where the worker count was written, for an error about the recipe and the cluster together."""
    cluster = loaded.value
    origins = []
    for key in cluster.shape_keys():
        value = (
            cluster.local.workers
            if key == ("local", "workers")
            else (
                cluster.slices
                if key in (("gcp", "slices"), ("local", "slices"))
                else f"{cluster.accelerator} ({cluster.num_workers} workers)"
            )
        )
        origins.append(f"{loaded.where(key)}: {_dotted(key)}: {value}")
    cluster._shape_origin = "; ".join(origins)


def load_recipe(
    path: Path, overrides: list[str] | None = None, *, check_files: bool = True
) -> Loaded[RecipeConfig]:
    """The recipe's config, or every problem of it at once (:class:`ConfigError`, exit code 2)."""
    return check_recipe(path, overrides, check_files=check_files).or_raise()


def check_recipe(
    path: Path, overrides: list[str] | None = None, *, check_files: bool = True
) -> Checked[RecipeConfig]:
    """The recipe validated as far as it goes: every problem, and the config of its valid parts. A RECIPE
    that names no file is a :class:`UsageError` (exit 2) at once."""
    path = resolve_recipe_path(path)
    try:
        text = _read_text(path, "recipe")
    except ConfigError as exc:
        return Checked(str(path), list(exc.problems))
    return _check(
        RecipeConfig, text, str(path), path.parent.resolve(), overrides or [], check_files, "recipe"
    )


def resolve_recipe_path(path: Path) -> Path:
    """What a verb's RECIPE names: a file path as given; else ``./NAME.yaml`` (or ``.yml``) in the current
    folder, which wins over a shipped recipe of the same name, as a path would; else a shipped recipe's name
    (``quickstart`` -> tpuft/recipes/quickstart.yaml). Anything else is a :class:`UsageError` (exit 2) that
    suggests the closest shipped or local name (with no shipped recipes at all: that the install lacks
    them)."""
    if os.path.lexists(path):
        return path
    text = str(path)
    bare = "/" not in text and os.sep not in text and text not in ("", ".", "..")
    if bare and not text.endswith((".yaml", ".yml")):
        for suffix in (".yaml", ".yml"):
            local = Path(text + suffix)
            if local.is_file():
                return local
    from tpuft.core.paths import no_shipped_recipes, shipped_recipe, shipped_recipes

    shipped = shipped_recipe(text) if bare else None
    if shipped is not None:
        return shipped
    if bare and not shipped_recipes():
        missing = no_shipped_recipes()  # the install's fault, not the name's: exit 1 as `recipes ls` does
        raise TpuftError(f"{text}: recipe not found; {missing.message}", hint=missing.hint)
    raise UsageError(
        f"{text}: recipe not found{recipe_suggestion(text)}",
        hint="List the shipped recipes: tpuft recipes ls",
    )


def recipe_suggestion(name: str, *, local: bool = True) -> str:
    """``; did you mean 'quickstart'?`` for a RECIPE that names nothing, over the shipped recipes and
    (``local``) the recipes in the current folder (or, for a path, the YAML files in its folder); a sentence
    of where it looked when nothing is close. For every verb that takes a recipe (``recipes cp``, which copies
    shipped ones: not local)."""
    from tpuft.core.paths import shipped_recipes

    path = Path(name)
    bare = "/" not in name and os.sep not in name
    folder = Path(".") if bare else path.parent
    try:
        # not all of a huge one
        entries = list(itertools.islice(folder.iterdir(), 10_000)) if local and folder.is_dir() else []
    except OSError:
        entries = []
    names = {
        p.stem: p.stem if bare else str(p) for p in entries if p.suffix in (".yaml", ".yml") and p.is_file()
    }
    if bare:
        names.update({p.stem: p.stem for p in shipped_recipes()})
    stem = path.name.rsplit(".", 1)[0] if path.suffix in (".yaml", ".yml") else path.name
    close = difflib.get_close_matches(stem, sorted(names), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {names[close[0]]!r}?"
    return " (not a file, ./NAME.yaml or a shipped recipe)" if bare and local else ""


def dump_recipe(recipe: RecipeConfig) -> str:
    """The resolved recipe as YAML (absolute paths, defaults filled in), written to the run dir."""
    return safe_yaml.dump(recipe.model_dump(mode="json"))


def recipe_from_text(text: str, source: str, *, check_files: bool = True) -> RecipeConfig:
    """Load a resolved recipe (paths already absolute) on the worker side; on the controller (``resume``)
    without checking its files: a remote run's recipe names the workers' copies of its data
    (``~/.tpuft/data/<run>/...``)."""
    return _load(RecipeConfig, text, source, None, [], check_files, "recipe").value
