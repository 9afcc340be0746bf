"""Everything about a recipe that can be checked on this machine before a cluster is created or a worker
started.

Loading a recipe checks its keys and values; this checks it against the cluster (the batch splits over the
workers) and reads its data files through (JSON lines, CSV, TSV or Parquet; a ``gs://`` one through the
storage layer), record by record, with the reader the workers use: an invalid line, a missing field or column,
a non-UTF-8 byte, a ``null`` target or an empty eval file is reported here, at file:line, in seconds, instead
of on the workers after set-up. Used by ``recipes validate``, ``train`` and ``up``. And reading the two files
for a verb (:func:`load_files`): every problem of both, and of the recipe against the cluster, at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tpuft.backends.base import ClusterShape, get_backend
from tpuft.config import ClusterConfig, KeyPath, Loaded, Problems, RecipeConfig, check_cluster, check_recipe
from tpuft.config.cluster import SHAPE_KEYS
from tpuft.core.errors import ConfigError
from tpuft.data import DataError, Fields, FileCheck, check_file, file_format
from tpuft.data.text_transforms import HookError

DataProgress = Callable[[Path, int, int], None]
"""(file, bytes read, file size): called now and then while a big data file is read."""


@dataclass
class Preflight:
    workers: int
    files: dict[str, FileCheck] = field(default_factory=dict)
    """Per data key (train, eval): what reading the file found."""

    def examples(self, key: str) -> int | None:
        found = self.files.get(key)
        return found.examples if found is not None else None


def cluster_problems(
    recipe: Loaded[RecipeConfig],
    shape: ClusterShape,
    cluster: ClusterConfig | None = None,
    *,
    keep: Callable[[KeyPath], bool] = lambda path: True,
) -> list[str]:
    """Recipe settings that are only wrong for this cluster (the backend says which), located in the recipe
    file and, given the cluster, at the cluster file's line that sets the worker count too; ``keep``: which
    findings to report (a recipe with problems: not those about a key left out of it)."""
    backend = get_backend(recipe.value.backend.kind)
    workers = f" (the workers: {cluster.shape_origin()})" if cluster is not None else ""
    found = [
        recipe.problem(path, message + workers)
        for path, message in backend.check(recipe.value, shape)
        if keep(path)
    ]
    why = backend.capabilities.unsupported_generations.get(shape.generation)
    if shape.target == "tpu" and why and keep(("backend", "kind")):
        from tpuft.backends.registry import capabilities

        where = f" (the cluster: accelerator {cluster.accelerator})" if cluster is not None else ""
        able = [
            kind
            for kind, can in capabilities().items()
            if shape.generation not in can.unsupported_generations
        ]
        found.append(
            recipe.problem(
                ("backend", "kind"),
                f"backend {backend.kind} cannot run on {shape.generation} TPUs: {why}{where}; backends that "
                f"can: {', '.join(able) or 'none'}",
            )
        )
    return found


def load_files(
    recipe: Path,
    overrides: list[str] | None,
    config: Path | None,
    *,
    check_files: bool = True,
    against_cluster: bool = True,
) -> tuple[Loaded[RecipeConfig], Loaded[ClusterConfig]]:
    """The recipe and the cluster file, with every problem of both in one pass: each file's own (its keys,
    its values, its models' checks on what is valid) and, with ``against_cluster``, the recipe against the
    cluster's workers (run on what is valid of both, unless a key that decides the cluster's shape has a
    problem); one :class:`ConfigError` (exit code 2) lists them all. A check of the two files together adds
    its problems to the same :class:`~tpuft.config.Problems` before it is raised."""
    checked_recipe = check_recipe(recipe, overrides, check_files=check_files)
    checked_cluster = check_cluster(config)
    problems = Problems()
    problems.add(checked_recipe.source, checked_recipe.problems)
    problems.add(checked_cluster.source, checked_cluster.problems)
    loaded, cluster = checked_recipe.loaded, checked_cluster.loaded
    if (
        against_cluster
        and loaded is not None
        and cluster is not None
        and not any(checked_cluster.affected(key) for key in SHAPE_KEYS)
    ):
        found = cluster_problems(
            loaded,
            cluster.value.shape(),
            cluster.value,
            keep=lambda path: not checked_recipe.affected(path),
        )
        problems.add(checked_recipe.source, found)
    problems.raise_if_any()
    return checked_recipe.or_raise(), checked_cluster.or_raise()  # no problem: both are whole


def check_against_cluster(recipe: Loaded[RecipeConfig], shape: ClusterShape) -> None:
    problems = cluster_problems(recipe, shape)
    if problems:
        raise ConfigError(problems, source=recipe.source)


PARQUET_READERS = ("pyarrow", "datasets")
"""Requirements that put pyarrow in a worker venv (``datasets`` depends on it)."""


def _format_problem(
    recipe: Loaded[RecipeConfig], key: str, path: object, shape: ClusterShape | None
) -> str | None:
    """The file's format unknown, or Parquet on a backend whose worker venv has no pyarrow to read it."""
    try:
        kind, _ = file_format(str(path), recipe.value.data.format)
    except DataError as exc:
        return recipe.problem(("data", key), exc.message)
    if kind != "parquet" or shape is None:
        return None
    backend = get_backend(recipe.value.backend.kind)
    spec = backend.env_spec(recipe.value.backend, shape.target, "3")
    names = {requirement.split(";")[0].strip().lower().replace("_", "-") for requirement in spec.requirements}
    if any(
        name.startswith(reader) and not name[len(reader) : len(reader) + 1].isalnum()
        for name in names
        for reader in PARQUET_READERS
    ):
        return None
    return recipe.problem(
        ("data", key),
        f"{path} is Parquet, and the {backend.kind} backend's worker venv has no "
        "pyarrow to read it: add pyarrow to backend.extra_requirements, or use JSON lines, CSV or TSV",
    )


def data_problems(
    recipe: Loaded[RecipeConfig],
    workers: int,
    progress: DataProgress | None = None,
    shape: ClusterShape | None = None,
) -> tuple[list[str], dict[str, FileCheck]]:
    data = recipe.value.data
    try:
        fields = Fields.of(data)
    except HookError as exc:  # the preprocess hook does not load: nothing can be checked without it
        return [recipe.problem(("data", "preprocess"), str(exc).split(": ", 1)[-1])], {}
    problems: list[str] = []
    checks: dict[str, FileCheck] = {}
    for key in ("train", "eval", "test"):
        path = getattr(data, key)
        if path is None:
            continue
        unreadable = _format_problem(recipe, key, path, shape)
        if unreadable is not None:
            problems.append(unreadable)
            continue
        report = (lambda done, total, p=path: progress(p, done, total)) if progress is not None else None
        check = check_file(path, fields, progress=report)
        checks[key] = check
        wrong_field = _field_missing_everywhere(check)
        if wrong_field is not None:  # not the data's fault: the recipe names a field no line has
            side, name = wrong_field
            key_path = ("data", f"{side}_template" if getattr(data, f"{side}_template") else f"{side}_field")
            problems.append(
                recipe.problem(
                    key_path,
                    f"no line of {path} has a field {name!r} (they have: {check.problems[0].fields})",
                )
            )
            continue
        problems += [f"{p.where}: data.{key}: {p.message}" for p in check.problems]
        if check.more_problems:
            problems.append(f"{path}: data.{key}: ... and {check.more_problems} more problem(s) like these")
        if check.problems:
            continue
        if key == "train" and check.examples < workers:
            problems.append(
                recipe.problem(
                    ("data", "train"),
                    f"{path} has {check.examples} example(s) for {workers} workers; every worker needs at "
                    "least one",
                )
            )
        if key in ("eval", "test") and check.examples == 0:
            problems.append(
                recipe.problem(
                    ("data", key),
                    f"{path} has no examples (it would report a perfect {key} loss of 0): fill it, or remove "
                    f"data.{key}",
                )
            )
    return problems, checks


def _field_missing_everywhere(check: FileCheck) -> tuple[str, str] | None:
    if check.examples == 0 and len(check.missing) == 1 and check.problems:
        if all(p.missing is not None for p in check.problems):
            return next(iter(check.missing))
    return None


def preflight(
    config: ClusterConfig, recipe: Loaded[RecipeConfig], progress: DataProgress | None = None
) -> Preflight:
    """Every problem at once (the recipe against the cluster, then the data), as one ConfigError: exit code
    2."""
    shape = config.shape()
    launched = len(get_backend(recipe.value.backend.kind).plan(recipe.value, shape).workers)
    problems = cluster_problems(recipe, shape, config)
    found, checks = data_problems(recipe, launched, progress, shape)
    problems += found
    if problems:
        raise ConfigError(problems, source=recipe.source)
    return Preflight(workers=launched, files=checks)
