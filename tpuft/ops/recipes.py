"""recipes ls / show / cp / validate, modelled on torchtune's ``tune ls`` and ``tune cp``; ``show
--summary``."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuft.config import load_recipe
from tpuft.core.data_fetch import fetch_command
from tpuft.core.errors import ConfigError, TpuftError, UsageError
from tpuft.core.paths import recipes_dir, shipped_recipe

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpuft.config import Loaded, RecipeConfig
    from tpuft.model.summary import Summary
    from tpuft.ops.compile_fit import FitReport

DATA_MISSING_EXIT = 3
"""``recipes validate``'s exit code when the recipe is valid but data files it names are not on this
machine."""


class DataMissing(TpuftError):
    """The recipe's keys are fine; its data is not here yet (one line per file, with the command that fetches
    it)."""

    exit_code = DATA_MISSING_EXIT


@dataclass
class RecipeInfo:
    name: str
    path: Path
    backend: str
    summary: str


def _summary(path: Path) -> str:
    """The first comment line: recipes open with what they are and how to run them."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""


def list_recipes() -> list[RecipeInfo]:
    found = []
    for path in sorted(recipes_dir().glob("*.yaml")):
        loaded = load_recipe(path, check_files=False)
        found.append(RecipeInfo(path.stem, path, loaded.value.backend.kind, _summary(path)))
    return found


def missing_data(loaded: Loaded[RecipeConfig]) -> list[str]:
    """One line per local data file the recipe names that is not on this machine (``file:line: data.train:
    missing PATH; fetch it: COMMAND`` where the file's folder ships a fetch.py). ``loaded`` is loaded without
    the file check, so that the schema and the data are told apart."""
    data = loaded.value.data
    # a bucket's file is looked up by the data check
    named = [
        (("data", key), getattr(data, key))
        for key in ("train", "eval", "test")
        if not str(getattr(data, key)).startswith("gs://")
    ]
    named += [(("data", "corpus"), Path(text)) for text in data.corpus if not text.startswith("gs://")]
    lines = []
    for key, path in named:
        if path is None or path.exists():
            continue
        command = fetch_command(path)
        how = f"; fetch it: {command}" if command else "; the recipe's header says where it comes from"
        lines.append(loaded.problem(key, f"missing {path}{how}"))
    return lines


def check_data_present(loaded: Loaded[RecipeConfig]) -> None:
    """:class:`DataMissing` (exit 3) when :func:`missing_data` finds any."""
    lines = missing_data(loaded)
    if lines:
        raise DataMissing(
            f"{loaded.source}: the recipe is valid, but {len(lines)} data file(s) are not here:\n"
            + "\n".join(f"  {line}" for line in lines),
            hint="Fetch them with the command shown, or check the rest without the data: "
            "tpuft recipes validate RECIPE --no-data-check",
        )


def recipe_file(name: str) -> Path:
    """What ``recipes show`` prints: a recipe file (a path, as every verb takes) or a shipped recipe's."""
    from tpuft.config.loader import resolve_recipe_path

    path = resolve_recipe_path(Path(name))
    return path if path.is_file() else find(name)


def find(name: str) -> Path:
    path = shipped_recipe(name)
    if path is None:
        known = ", ".join(r.stem for r in sorted(recipes_dir().glob("*.yaml")))
        from tpuft.config import recipe_suggestion

        close = recipe_suggestion(name, local=False)
        raise UsageError(
            f"unknown recipe {name!r}{close or ';'} shipped recipes: {known}",
            hint="List them: tpuft recipes ls",
        )
    return path


def copy(name: str, dest: Path, *, overwrite: bool = False) -> Path:
    source = find(name)
    if dest.exists() and not dest.is_dir() and not dest.is_file():
        raise UsageError(
            f"{dest} is not a file or a folder (a device or FIFO?); give a .yaml file name or a folder"
        )
    target = dest / source.name if dest.is_dir() else dest
    if target.suffix not in {".yaml", ".yml"}:
        target = target.with_suffix(".yaml")
    if target.exists() and not overwrite:
        raise UsageError(f"{target} exists; pass --overwrite to replace it")
    text = source.read_text(encoding="utf-8")
    # Data paths in shipped recipes are relative to recipes/; keep them pointing at the shipped data.
    loaded = load_recipe(source, check_files=False)
    data = loaded.value.data
    for key, value in (("train", data.train), ("eval", data.eval), ("test", data.test)):
        if value is None:
            continue
        relative = str(Path(loaded.raw["data"][key]))
        if not Path(relative).is_absolute():
            text = text.replace(f"{key}: {relative}", f"{key}: {value}", 1)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    shutil.copymode(source, target)
    return target


def summary(
    recipe: Path,
    overrides: list[str] | None = None,
    *,
    config: Path | None = None,
    accelerator: str | None = None,
) -> Summary:
    """The recipe's model, parameters and memory per device on the cluster's accelerator (``accelerator``
    instead: e.g. ``v4-64``); offline, nothing is created and the data is not read. A model the summary cannot
    size is a
    :class:`ConfigError` located at the recipe key to change (exit 2)."""
    from tpuft.config import load_cluster
    from tpuft.core.accelerators import lookup
    from tpuft.model.recipe_model import ModelUnknown
    from tpuft.model.summary import summarize

    loaded = load_recipe(recipe, overrides or [], check_files=False)
    cluster = load_cluster(config).value
    chosen = lookup(accelerator) if accelerator is not None else lookup(cluster.accelerator)
    slices = cluster.gcp.slices if cluster.provider == "gcp" and accelerator is None else 1
    try:
        return summarize(loaded.value, chosen, slices=slices, recipe_dir=Path(loaded.source).resolve().parent)
    except ModelUnknown as exc:
        error = ConfigError([loaded.problem(exc.path, exc.message)], source=loaded.source)
        error.hint = exc.hint
        raise error from None


def compile_fit(
    recipe: Path,
    overrides: list[str] | None = None,
    *,
    config: Path | None = None,
    accelerator: str | None = None,
    progress: Callable[[str], None] | None = None,
    force: bool = False,
    notice: Callable[[str], None] | None = None,
) -> FitReport:
    """``show --summary --compile``: the recipe's real train step compiled for the accelerator (the cluster's,
    or ``accelerator``) on this machine's CPU, against the chip's HBM (:mod:`tpuft.ops.compile_fit`); a
    backend that cannot compile offline gets its paper estimate, labelled. A decisive paper estimate answers
    without a compile unless ``force`` (``--force-compile``); ``notice`` hears the compile's expected time
    and memory before it starts."""
    from tpuft.config import load_cluster
    from tpuft.core.accelerators import lookup
    from tpuft.ops.compile_fit import fit_report

    loaded = load_recipe(recipe, overrides or [], check_files=False)
    cluster = load_cluster(config).value
    chosen = lookup(accelerator) if accelerator is not None else lookup(cluster.accelerator)
    return fit_report(
        loaded.value,
        chosen,
        python=cluster.local.python,
        recipe_dir=Path(loaded.source).resolve().parent,
        progress=progress,
        slices=cluster.slices if accelerator is None else 1,
        force=force,
        notice=notice,
        locate=loaded.problem,
        source=loaded.source,
    )
