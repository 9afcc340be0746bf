"""Shipping a recipe's files to workers on other machines: the files a launch plan names (``data.train``,
``data.preprocess``'s hook file, ``backend.gin_files``, ...) are copied to each worker under
``~/.tpuft/data/<run>/``, the recipe is pointed at the copies, and run.json keeps this machine's paths so that
a resume can ship them again; a ``data.hf`` only this machine can read is named.

Apart from :mod:`tpuft.ops.train` because it is about the recipe's values and this machine's files, not about
starting or following a run: ``train``, ``resume`` and ``predict`` call it; ``gs://`` paths and names that
are not files stay as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpuft.backends.base import LaunchPlan
from tpuft.config import RecipeConfig
from tpuft.ops.common import Session


def remote_fleet(session: Session) -> bool:
    """Workers on other machines (SSH) cannot read the controller's files: the data has to be shipped."""
    return any(w.home is None for w in session.cluster.workers)


def recipe_value(recipe: RecipeConfig, key: str) -> Any:
    """A plan's ``ship`` key: a ``data`` key (``train``), or a dotted one of another section
    (``backend.gin_files``)."""
    section, _, name = key.rpartition(".")
    return getattr(getattr(recipe, section or "data"), name, None)


def _local_file(value: Any) -> bool:
    """Only files of this machine travel; ``gs://`` URLs and names such as ``byt5`` stay as they are."""
    path, _ = hook_parts(value)
    return path is not None and not str(path).startswith("gs://") and Path(str(path)).is_file()


def hook_parts(value: Any) -> tuple[Any, str]:
    """``data.preprocess`` names a file and a function (``/x/hooks.py:clean``): the file travels, the function
    name stays; any other value is all path."""
    text = str(value) if value is not None else ""
    head, sep, tail = text.rpartition(":")
    if sep and head.endswith(".py") and tail.isidentifier():
        return head, sep + tail
    return value, ""


def local_only_dataset(recipe: RecipeConfig) -> str | None:
    """A ``data.hf`` that only this machine can read (a local folder or local data files), or None."""
    hf = recipe.data.hf
    if hf is None:
        return None
    files = (
        hf.data_files if isinstance(hf.data_files, list) else [f for fs in hf.data_files.values() for f in fs]
    )
    local = [f for f in files if not f.startswith("gs://")]
    if local:
        return f"data.hf.data_files: {local[0]} is on this machine"
    if Path(hf.path).is_dir():
        return f"data.hf.path: {hf.path} is a folder on this machine"
    return None


def shipped_data(recipe: RecipeConfig, plan: LaunchPlan) -> dict[str, Any]:
    """The files the plan ships (key -> this machine's path, or paths for a list such as ``data.corpus``):
    kept in run.json so that a resume can ship them again to a worker that lost its copy."""
    shipped: dict[str, Any] = {}
    for key in plan.ship:
        value = recipe_value(recipe, key)
        if isinstance(value, list):
            shipped[key] = [str(item) for item in value]
        elif _local_file(value):
            shipped[key] = str(value)
    return shipped


def ship_data(session: Session, recipe: RecipeConfig, run_id: str, plan: LaunchPlan) -> RecipeConfig:
    """Copy the recipe's files that the plan names to its workers; point the recipe at the copies
    (HOME-relative). ``gs://`` paths stay: the workers read the bucket themselves."""
    folder = f".tpuft/data/{run_id}"
    updates: dict[str, dict[str, Any]] = {}

    def ship(value: Any, name: str) -> Any:
        if not _local_file(value):
            return value
        path, function = hook_parts(value)
        remote = f"{folder}/{name}-{Path(str(path)).name}"
        session.fleet.put(Path(str(path)), remote, workers=plan.workers)
        return type(value)(remote) if isinstance(value, Path) else remote + function

    for key in plan.ship:
        value = recipe_value(recipe, key)
        section, _, name = key.rpartition(".")
        label = key.replace(".", "-")
        if isinstance(value, list):
            shipped = [ship(item, f"{label}-{index}") for index, item in enumerate(value)]
        else:
            shipped = ship(value, label)
        if shipped != value:
            updates.setdefault(section or "data", {})[name] = shipped
    return recipe.model_copy(
        update={
            section: getattr(recipe, section).model_copy(update=fields) for section, fields in updates.items()
        }
    )
